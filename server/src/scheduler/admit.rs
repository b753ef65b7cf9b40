//! Admission: waiting requests move into free slots, first come first served, and each starts
//! from the longest cached prefix of its prompt.
//!
//! Invariants: a request for a particular slot waits for that one without holding up the
//! others, and a request whose blocks the loader is reading lets the others go first. A new
//! sequence takes over a resident one (cut to the shared prefix, never forked; a warm-up forks
//! it, so the sequence it branches from stays) when that covers at least as much as the stored
//! blocks, then shares pool pages, then imports what the loader read; the last prompt token is
//! always evaluated, for its logits. KV moved into place by `--cache-reuse` marks the request
//! `moved`, so its sequence is not cached afterwards. A
//! request whose prompt shares a longer prefix with one still computing it follows that one
//! instead of computing the same tokens beside it.

use std::collections::VecDeque;
use std::time::Instant;

use engine::sampling::Sampler;
use engine::store::LoadedPrefix;
use engine::tokenizer::StreamDecoder;
use engine::PAGE_TOKENS;
use tokio::sync::mpsc;

use super::loader::{Load, Queued};
use super::{Active, Event, Job, Progress, Scheduler};
use crate::error::ServerError;
use crate::metrics::Metrics;

impl Scheduler {
    /// Moves waiting requests into free slots, first come first served (a request for a
    /// particular slot waits for that one without holding up the others).
    pub(super) fn admit(&mut self) {
        self.ask_loads();
        let mut i = 0;
        while i < self.queue.len() {
            // A request whose blocks are being read lets the others go first.
            if matches!(self.queue[i].load, Load::Asked(_)) {
                i += 1;
                continue;
            }
            let want = self.queue[i].job.params.id_slot;
            let free = match want {
                Some(id) => {
                    (id < self.slots.len() && self.slots[id].active.is_none()).then_some(id)
                }
                None => self.slots.iter().position(|s| s.active.is_none()),
            };
            let Some(slot) = free else {
                if want.is_none() {
                    break;
                }
                i += 1;
                continue;
            };
            let Some(Queued { job, load }) = self.queue.remove(i) else {
                break;
            };
            let loaded = match load {
                Load::Done(prefix) => prefix,
                _ => None,
            };
            match self.start(job, loaded) {
                Ok(active) => {
                    // The first progress report, before any prompt token is evaluated.
                    if active.params.return_progress {
                        let _ = active.events.send(Event::Progress(Progress {
                            total: active.prompt.len(),
                            cache: active.cache_n,
                            processed: active.fed,
                            time_ms: 0.0,
                        }));
                    }
                    // The slot's previous conversation stays in the cache list.
                    self.slots[slot].active = Some(active);
                }
                Err((events, e)) => {
                    let _ = events.send(Event::Failed(e));
                }
            }
        }
    }

    /// Takes finished sequence `src` over for a new request sharing its first `n` tokens with
    /// `usable` (cut to them, or moved by `--cache-reuse`): the kept length, whether KV was
    /// moved, and the export the new request inherits. `None`, with `src` dropped, when it
    /// could not be cut.
    ///
    /// It is taken over rather than forked: no page is copied, the pool does not grow with
    /// every repeat, and its pages stay where they were (attention adds cells up in pool
    /// order, so the same prompt gets the same reply). What the cut drops (the pages from the
    /// shared prefix's end on, its tails) goes to the store first; the pages kept go with the
    /// new request's export, off every request's path: once [`super::reuse::EXPORT_DELAY`]
    /// has passed since the first finish of a chain of such takeovers, a piece at a time
    /// between the new request's steps ([`Scheduler::export_due`]). KV moved by
    /// `--cache-reuse` is never cached: all of it goes first then.
    fn take_over(
        &mut self,
        src: engine::SeqId,
        n: usize,
        usable: &[u32],
        params: &super::GenParams,
    ) -> Option<(usize, bool, Option<super::Inherited>)> {
        let keeps_pages = params.cache_reuse == 0 || self.ctx.is_hybrid();
        let prior = self.exports.iter().find(|e| e.seq == src);
        let prior = prior.map(|e| (e.since, e.sent));
        let from = if keeps_pages { n / PAGE_TOKENS } else { 0 };
        self.export_from(src, from);
        self.cached.retain(|&s| s != src);
        for s in &mut self.slots {
            if s.last == Some(src) {
                s.last = None;
            }
        }
        // A hybrid's sequence cannot be shifted: it is cut back (to where it kept its
        // recurrent state, `longest_resident`).
        let kept = match params.cache_reuse {
            _ if self.ctx.is_hybrid() => self.ctx.truncate(src, n).map(|()| (n, false)),
            0 => self.ctx.truncate(src, n).map(|()| (n, false)),
            chunk => self.reuse_chunks(src, usable, n, chunk),
        };
        match kept {
            Ok((n, moved)) => {
                let inherited = prior
                    .filter(|_| from > 0)
                    .map(|(since, sent)| super::Inherited {
                        since,
                        sent: sent.min(from),
                        kept: from,
                    });
                Some((n, moved, inherited))
            }
            Err(_) => {
                let _ = self.ctx.remove_sequence(src);
                None
            }
        }
    }

    /// A new sequence for `job`, starting from the longest cached prefix of its prompt: in
    /// memory, or `loaded` from the store by the loader.
    fn start(
        &mut self,
        job: Job,
        loaded: Option<Box<LoadedPrefix>>,
    ) -> std::result::Result<Active, (mpsc::UnboundedSender<Event>, ServerError)> {
        let mut seq = self.ctx.new_sequence();
        let namespace = job.params.namespace;
        // A new sequence is empty: this cannot fail.
        let _ = self.ctx.set_namespace(seq, namespace);
        let prompt = job.prompt;
        // One token is always evaluated, for its logits.
        let usable = &prompt[..prompt.len().saturating_sub(1)];
        let mut from_ram = 0;
        let mut from_store = 0;
        // KV moved into place by `--cache-reuse`: the sequence is not the plain evaluation of
        // its tokens, so it is not cached afterwards.
        let mut shifted = false;
        let mut inherited = None;
        if job.params.cache_prompt {
            // A resident sequence that shares more than the stored blocks is forked, partly
            // filled last page included (a repeated or extended prompt costs nothing).
            let resident = self.longest_resident(usable, namespace);
            let stored = loaded.as_ref().map_or(0, |l| l.tokens());
            let resident = resident.filter(|&(n, _)| n > 0 && n >= stored);
            if let Some((n, src)) = resident.filter(|_| job.params.warm) {
                // A warm-up starts from a copy: the conversation it branches from stays
                // cached for a client that sends it back as it was.
                if let Ok(copy) = self.ctx.fork(src, n) {
                    let _ = self.ctx.remove_sequence(seq);
                    seq = copy;
                    from_ram = n;
                }
            } else if let Some((n, src)) = resident {
                if let Some((n, moved, inh)) = self.take_over(src, n, usable, &job.params) {
                    let _ = self.ctx.remove_sequence(seq);
                    seq = src;
                    from_ram = n;
                    shifted = moved;
                    inherited = inh;
                }
            }
            if from_ram == 0 {
                from_ram = self.ctx.attach_prefix(seq, usable).unwrap_or(0);
            }
            if let (Some(store), Some(loaded)) =
                (self.store.clone(), loaded.filter(|_| stored > from_ram))
            {
                let mut result = store.import_loaded(&mut self.ctx, seq, usable, &loaded);
                if let Err(engine::Error::OutOfPages { needed, .. }) = result {
                    self.make_room(needed);
                    result = store.import_loaded(&mut self.ctx, seq, usable, &loaded);
                }
                match result {
                    Ok(n) => from_store = n.saturating_sub(from_ram),
                    Err(e) => self
                        .metrics
                        .cache_error(format!("restore failed, computed instead: {e}")),
                }
            }
        }
        let cache_n = from_ram + from_store;
        // Concurrent requests with one long system prompt: the first computes it, the others
        // wait for those pages rather than computing the same tokens beside it.
        let follow = if job.params.cache_prompt {
            let usable = &prompt[..prompt.len().saturating_sub(1)];
            self.slots
                .iter()
                .filter_map(|s| s.active.as_ref())
                .filter(|a| a.follow.is_none() && a.fed < a.prompt.len())
                .filter(|a| a.params.namespace == namespace)
                .map(|a| (engine::common_prefix_len(&a.prompt, usable), a.seq))
                .filter(|&(n, _)| n >= cache_n + PAGE_TOKENS)
                .max()
                .map(|(n, seq)| (seq, n))
        } else {
            None
        };
        let m = &self.metrics;
        Metrics::add(&m.prompt_tokens, prompt.len() as u64);
        Metrics::add(&m.prompt_tokens_from_ram, from_ram as u64);
        Metrics::add(&m.prompt_tokens_from_store, from_store as u64);
        Metrics::add(&m.prompt_tokens_computed, (prompt.len() - cache_n) as u64);
        self.tickets += 1;
        let stops = engine::StopStrings::new(&job.params.stop);
        let synth_rng = super::spec::SynthRng::new(job.params.sampler.seed);
        Ok(Active {
            events: job.events,
            sampler: Sampler::new(job.params.sampler.clone()),
            params: job.params,
            seq,
            fed: cache_n,
            cache_n,
            inherited,
            prompt,
            decoder: StreamDecoder::new(),
            generated: Vec::new(),
            stops,
            stopping_word: String::new(),
            text: String::new(),
            sent: 0,
            unsent: Vec::new(),
            unsent_probs: Vec::new(),
            probs: Vec::new(),
            pending: None,
            constraint: job.constraint,
            admitted: Instant::now(),
            first_token: None,
            ticket: self.tickets,
            arrival_work: self.work,
            follow,
            shifted: 0,
            truncated: false,
            moved: shifted,
            thinking: 0,
            forced: VecDeque::new(),
            spec_hold: None,
            drafts: Default::default(),
            synth_rng,
            spec_k: 0,
        })
    }
}
