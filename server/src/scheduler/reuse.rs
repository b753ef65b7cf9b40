//! The prompt cache's side of the scheduler: the finished sequences kept resident (the longest
//! match, eviction when the pool runs short), requests that wait for a prefix another request is
//! computing (followers), and the copy of finished sequences' pages for the store, done when the
//! scheduler has a moment.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use engine::SeqId;
use promptcache::StoreExt as _;
use tokio::sync::mpsc;

use super::{Command, Scheduler};
use crate::cache::Work;
use crate::metrics::Metrics;

impl Scheduler {
    /// The finished sequence sharing the longest token prefix with `tokens`, and its length.
    pub(super) fn longest_resident(
        &self,
        tokens: &[u32],
        ns: Option<engine::Namespace>,
    ) -> Option<(usize, SeqId)> {
        self.cached
            .iter()
            .filter(|&&s| self.ctx.namespace(s).ok().flatten() == ns)
            .filter_map(|&s| {
                let held = self.ctx.tokens(s).ok()?;
                let n = engine::common_prefix_len(held, tokens);
                // Not past where it can go on (its sliding-window rows released before that).
                Some((self.ctx.resumable_len(s, n).ok()?, s))
            })
            .max()
    }

    /// Drops cached sequences, least recently finished first, until `pages` are free or none
    /// is left. Returns whether that many are free.
    pub(super) fn make_room(&mut self, pages: usize) -> bool {
        loop {
            let stats = self.ctx.stats();
            if stats.pages_total - stats.pages_used >= pages {
                return true;
            }
            let Some(seq) = self.cached.pop_front() else {
                return false;
            };
            self.export(seq);
            let _ = self.ctx.remove_sequence(seq);
            for slot in &mut self.slots {
                if slot.last == Some(seq) {
                    slot.last = None;
                }
            }
            Metrics::add(&self.metrics.cache_evictions, 1);
        }
    }

    /// Starts each waiting follower whose leader has computed the shared prefix (or stopped
    /// computing): it forks the leader's pages. A follower whose leader is gone computes the
    /// prefix itself.
    pub(super) fn resolve_followers(&mut self) {
        for i in 0..self.slots.len() {
            let Some((src, n)) = self.slots[i].active.as_ref().and_then(|a| a.follow) else {
                continue;
            };
            let held = self.ctx.tokens(src).map(<[u32]>::len).ok();
            let leader_computing = self.slots.iter().any(|s| {
                s.active
                    .as_ref()
                    .is_some_and(|a| a.seq == src && a.fed < n.min(a.prompt.len()))
            });
            if held.is_some_and(|h| h < n) && leader_computing {
                continue;
            }
            let Some(a) = self.slots[i].active.as_mut() else {
                continue;
            };
            a.follow = None;
            let take = held.unwrap_or(0).min(n);
            if take <= a.fed {
                continue;
            }
            if let Ok(forked) = self.ctx.fork(src, take) {
                let _ = self.ctx.remove_sequence(a.seq);
                let gained = (take - a.fed) as u64;
                a.seq = forked;
                a.fed = take;
                a.cache_n = take;
                Metrics::add(&self.metrics.prompt_tokens_from_ram, gained);
                self.metrics
                    .prompt_tokens_computed
                    .fetch_sub(gained, Ordering::Relaxed);
            }
        }
    }

    /// Copies out the finished sequences waiting for it: all of them at once (`all`, when
    /// idle or closing); else, under steady load, pieces of [`PIECE_PAGES`] pages of the
    /// exports that waited longer than [`EXPORT_DELAY`], finished or inherited by a running
    /// request: one piece after a step, or as many pages as the step fed prompt tokens, so
    /// that no step waits for more than a copy of what it computed, and the copies keep up.
    pub(super) fn export_due(&mut self, all: bool) {
        let mut released = 0;
        if all {
            let due: Vec<SeqId> = self.exports.iter().map(|e| e.seq).collect();
            for seq in due {
                if self.export(seq) {
                    // Its blocks are on their way to the store: the rows of sliding-window
                    // layers that no sequence attends any more leave memory (a later prompt
                    // that needs them reads those blocks back).
                    released += self.ctx.release_windows(seq).unwrap_or(0);
                }
            }
        } else {
            let fed = (self.work - self.exported_work) as usize / engine::PAGE_TOKENS;
            self.exported_work = self.work;
            for _ in 0..(fed / PIECE_PAGES).max(1) {
                match self.export_piece() {
                    Piece::Copied => {}
                    Piece::Completed(seq) => {
                        released += self.ctx.release_windows(seq).unwrap_or(0);
                    }
                    Piece::None => break,
                }
            }
        }
        if released > 0 {
            self.publish_gauges();
        }
    }

    /// One piece of the first due export: the next [`PIECE_PAGES`] full pages of a running
    /// request's inherited ones, or of a finished sequence (whose tails go with its last
    /// piece).
    fn export_piece(&mut self) -> Piece {
        let (Some(store), Some(_)) = (&self.store, &self.writer) else {
            return Piece::None;
        };
        let running = self.slots.iter_mut().filter_map(|s| s.active.as_mut());
        let inherited = running
            .filter_map(|a| Some((a.seq, a.inherited.as_mut()?)))
            .find(|(_, i)| i.sent < i.kept && i.since.elapsed() >= EXPORT_DELAY);
        let (seq, sent, end) = match inherited {
            Some((seq, i)) => {
                let sent = i.sent;
                i.sent = (sent + PIECE_PAGES).min(i.kept);
                (seq, sent, i.sent)
            }
            None => {
                let Some(e) = self
                    .exports
                    .iter_mut()
                    .find(|e| e.since.elapsed() >= EXPORT_DELAY)
                else {
                    return Piece::None;
                };
                let full = self.ctx.tokens(e.seq).map_or(0, <[u32]>::len) / engine::PAGE_TOKENS;
                if e.sent + PIECE_PAGES >= full {
                    let seq = e.seq;
                    return if self.export(seq) {
                        Piece::Completed(seq)
                    } else {
                        Piece::Copied
                    };
                }
                let sent = e.sent;
                e.sent += PIECE_PAGES;
                (e.seq, sent, e.sent)
            }
        };
        let work = store
            .copy_block_range(&self.ctx, seq, sent..end)
            .map(|blocks| Work {
                blocks,
                ..Work::default()
            });
        self.hand_over(work);
        Piece::Copied
    }

    /// Sends pages copied out for the store to the writer, or counts the failure to read them.
    /// Returns whether they were sent.
    fn hand_over(&self, work: engine::Result<Work>) -> bool {
        let Some(writer) = &self.writer else {
            return false;
        };
        match work {
            Ok(work) => {
                writer.send(work);
                true
            }
            Err(e) => {
                self.metrics
                    .cache_error(format!("reading pages failed: {e}"));
                false
            }
        }
    }

    /// Hands `pin` to the writer with the blocks of a finished sequence holding its tokens that
    /// the store lacks; answers at once when there is no such sequence or no store.
    pub(super) fn pin(&mut self, mut pin: crate::cache::PinWork) {
        let full = pin.tokens.len() / engine::PAGE_TOKENS * engine::PAGE_TOKENS;
        pin.tokens.truncate(full);
        let (Some(store), Some(writer)) = (self.store.clone(), self.writer.as_ref()) else {
            let _ = pin
                .reply
                .send(Err("the server keeps no cache (--no-cache)".into()));
            return;
        };
        let held = self
            .longest_resident(&pin.tokens, pin.namespace)
            .filter(|&(n, _)| full > 0 && n >= full);
        let Some((_, seq)) = held else {
            let _ = pin.reply.send(Err(
                "the prompt's blocks are not in memory any more; pin again".into(),
            ));
            return;
        };
        match store.copy_blocks(&self.ctx, seq, 0) {
            Ok(blocks) => writer.send(Work {
                urgent: false,
                blocks,
                tails: Vec::new(),
                pins: vec![pin],
                clears: Vec::new(),
            }),
            Err(e) => {
                let _ = pin.reply.send(Err(format!("reading pages failed: {e}")));
            }
        }
    }

    /// Keeps a finished sequence resident as the slot's last one; its full blocks from
    /// `cache_n` on (the ones before came from a cache) go to the store soon after
    /// ([`Scheduler::export_due`]).
    pub(super) fn keep(
        &mut self,
        slot: usize,
        seq: SeqId,
        (cache_n, prompt_len): (usize, usize),
        inherited: Option<super::Inherited>,
        expires: Option<u64>,
    ) {
        if self.store.is_some() {
            self.exports.push(super::Export {
                seq,
                cache_n,
                prompt_len,
                since: inherited.map_or_else(Instant::now, |i| i.since),
                expires,
                sent: inherited.map_or(0, |i| i.sent),
            });
        }
        self.slots[slot].last = Some(seq);
        self.cached.push_back(seq);
        while self.cached.len() > super::MAX_CACHED {
            if let Some(old) = self.cached.pop_front() {
                self.export(old);
                let _ = self.ctx.remove_sequence(old);
                for s in &mut self.slots {
                    if s.last == Some(old) {
                        s.last = None;
                    }
                }
            }
        }
    }

    /// Drops the finished sequences of `clear`'s namespace (not stored: they are being
    /// cleared), then hands `clear` to the writer, behind whatever it has queued.
    pub(super) fn clear(&mut self, clear: crate::cache::ClearWork) {
        let ns = Some(clear.namespace);
        let doomed: Vec<SeqId> = self
            .cached
            .iter()
            .copied()
            .filter(|&s| self.ctx.namespace(s).ok().flatten() == ns)
            .collect();
        for seq in doomed {
            self.cached.retain(|&s| s != seq);
            self.exports.retain(|e| e.seq != seq);
            let _ = self.ctx.remove_sequence(seq);
            for slot in &mut self.slots {
                if slot.last == Some(seq) {
                    slot.last = None;
                }
            }
        }
        match &self.writer {
            Some(writer) => writer.send(Work {
                urgent: false,
                blocks: Vec::new(),
                tails: Vec::new(),
                pins: Vec::new(),
                clears: vec![clear],
            }),
            None => {
                let _ = clear.reply.send(Ok(promptcache::Cleared::default()));
            }
        }
    }

    /// With a remote tier: the new full pages of the prompt in `slot` and its tail, handed to
    /// the writer as soon as the prompt is evaluated (at its first token), so that other
    /// replicas find them while this one generates. What the request adds is exported when it
    /// finishes, as without a remote tier.
    pub(super) fn export_prompt(&mut self, slot: usize) {
        let (Some(store), Some(_)) = (&self.store, &self.writer) else {
            return;
        };
        let Some(a) = self.slots[slot].active.as_ref() else {
            return;
        };
        let full = a.prompt.len() / engine::PAGE_TOKENS;
        if !store.has_remote() || a.moved || full <= a.cache_n / engine::PAGE_TOKENS {
            return;
        }
        let expires = a.params.cache_ttl.map(|t| crate::routes::unix_now() + t);
        let (seq, from, prompt_len) = (a.seq, a.cache_n / engine::PAGE_TOKENS, a.prompt.len());
        let cache_n = a.cache_n;
        let work = (|| -> engine::Result<Work> {
            let blocks = store.copy_blocks(&self.ctx, seq, from)?;
            let tails = store.prompt_cache().prompt_tails(
                &self.ctx,
                seq,
                (cache_n, prompt_len),
                expires,
            )?;
            Ok(Work {
                urgent: true,
                blocks,
                tails,
                ..Work::default()
            })
        })();
        self.hand_over(work);
    }

    /// Copies the new full pages and the tails of finished sequence `seq`, if it waits for
    /// that, and hands them to the writer thread (a memory copy; the writing is the writer's).
    /// Returns whether they were handed over.
    pub(super) fn export(&mut self, seq: SeqId) -> bool {
        self.export_from(seq, 0)
    }

    /// [`Scheduler::export`] of the full pages from page `from` on (and the tails), for a
    /// sequence whose earlier pages stay resident in a sequence that will be exported later.
    pub(super) fn export_from(&mut self, seq: SeqId, from: usize) -> bool {
        let Some(i) = self.exports.iter().position(|e| e.seq == seq) else {
            return false;
        };
        let super::Export {
            cache_n,
            prompt_len,
            expires,
            sent,
            ..
        } = self.exports.swap_remove(i);
        // The pages before `sent` went in pieces already.
        let from = from.max(sent);
        let (Some(store), Some(_)) = (&self.store, &self.writer) else {
            return false;
        };
        let work = (|| -> engine::Result<Work> {
            // Every page the store lacks, the ones that came from a cache too: another process
            // may have collected their blocks since (the store looks for each file again).
            let blocks = store.copy_blocks(&self.ctx, seq, from)?;
            let tails = store.prompt_cache().finished_tails(
                &self.ctx,
                seq,
                (cache_n, prompt_len),
                expires,
            )?;
            Ok(Work {
                urgent: false,
                blocks,
                tails,
                pins: Vec::new(),
                clears: Vec::new(),
            })
        })();
        self.hand_over(work)
    }
}

/// How long a finished sequence's pages may wait for the scheduler to be idle before they are
/// copied out for the store anyway.
pub(super) const EXPORT_DELAY: Duration = Duration::from_millis(200);

/// What [`Scheduler::export_piece`] did.
enum Piece {
    /// Nothing was due.
    None,
    /// A piece went to the writer (or failed to be read, counted).
    Copied,
    /// A finished sequence's last piece and tails went: its export is done.
    Completed(SeqId),
}

/// Full pages of one piece of an export that is due under steady load
/// ([`Scheduler::export_due`]): a few MB, a few milliseconds of one core.
pub(super) const PIECE_PAGES: usize = 4;

/// How long the idle scheduler waits for another request before it copies finished pages out.
pub(super) const EXPORT_IDLE: Duration = Duration::from_millis(20);

/// Waits up to `d` for a command: `Some(Some(cmd))`, `Some(None)` when every sender is gone,
/// `None` when nothing came.
pub(super) fn recv_within(
    rx: &mut mpsc::UnboundedReceiver<Command>,
    d: Duration,
) -> Option<Option<Command>> {
    let until = Instant::now() + d;
    loop {
        match rx.try_recv() {
            Ok(c) => return Some(Some(c)),
            Err(mpsc::error::TryRecvError::Disconnected) => return Some(None),
            Err(mpsc::error::TryRecvError::Empty) if Instant::now() >= until => return None,
            Err(mpsc::error::TryRecvError::Empty) => {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Waits up to `d` for a command without polling (a timer of a small runtime of this thread's
/// own): `Some(Some(cmd))`, `Some(None)` when every sender is gone, `None` when nothing came.
pub(super) fn recv_timeout(
    rx: &mut mpsc::UnboundedReceiver<Command>,
    d: Duration,
) -> Option<Option<Command>> {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    else {
        return recv_within(rx, d);
    };
    rt.block_on(async { tokio::time::timeout(d, rx.recv()).await.ok() })
}
