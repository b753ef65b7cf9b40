//! Long documents into a session: evaluated in micro-batches, a durable checkpoint every
//! `interval` tokens through the one persistence path ([`SessionStore`]), progress reported after
//! each micro-batch, and a clean stop on request with everything so far kept.
//!
//! Resuming needs no journal: the same ingestion run again against the same store starts from
//! the longest prefix of the document's tokens whose blocks the store holds (chained block ids
//! name a prefix exactly, so a document that changed matches up to where it changed) and
//! evaluates the rest. Micro-batch boundaries are fixed by absolute position (multiples of the
//! session's `n_batch` and of the interval), so an interrupted and resumed ingestion computes
//! every token in the same graphs, and ends with the same KV bytes and logits, as an
//! uninterrupted one.
//!
//! A document longer than the context window is read to its end with a [`ShiftPolicy`]: when
//! the next micro-batch would not fit, the session is shifted ([`Session::shift`]: the first
//! `n_keep` tokens stay, the oldest after them are discarded, the rest re-rotated in place).
//! Checkpoints go on across shifts (a shifted sequence's checkpoint records its chain roots, see
//! [`crate::store`]), each noting how much of the document it covers, how many shifts it took
//! and a hash of the tokens read: a resumed ingestion restores the last one by name when it
//! matches the document, and goes on shifting at the same places as an uninterrupted one.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::batch::Logits;
use crate::error::{Error, Result};
use crate::kv::PAGE_TOKENS;
use crate::session::Session;
use crate::store::{CheckpointMeta, SessionStore};

/// Default tokens between two durable checkpoints.
pub const DEFAULT_INTERVAL: usize = 512;

/// Application metadata key (in [`CheckpointMeta::app`]) holding the document's token count.
pub const TOTAL_KEY: &str = "ingest.total";
/// Application metadata key: the document tokens the checkpoint covers (after shifts, more
/// than it holds).
pub const DONE_KEY: &str = "ingest.done";
/// Application metadata key: the context shifts made to get there.
pub const SHIFTS_KEY: &str = "ingest.shifts";
/// Application metadata key: BLAKE3 (hex) of the covered document tokens, as u32 LE, so that a
/// resumed ingestion of a changed document does not continue from a shifted checkpoint.
pub const DIGEST_KEY: &str = "ingest.digest";

/// How an ingestion runs.
#[derive(Clone, Debug)]
pub struct IngestParams {
    /// The checkpoint the ingestion saves (see [`checkpoint_name`]).
    pub name: String,
    /// Tokens between durable checkpoints, rounded up to whole KV pages ([`PAGE_TOKENS`]);
    /// at most this many tokens are evaluated again after a crash.
    pub interval: usize,
    /// What to do when the document outgrows the context: shift it, or (`None`) refuse a
    /// document longer than the context before evaluating anything.
    pub shift: Option<ShiftPolicy>,
}

/// Context shift during an ingestion, with llama.cpp's `--context-shift` semantics: when the
/// next micro-batch does not fit in the context, keep the first `n_keep` tokens (a title, a
/// system prompt), discard the oldest `n_discard` after them and move the rest down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShiftPolicy {
    /// Tokens kept at the start.
    pub n_keep: usize,
    /// Tokens discarded per shift; `None` for half of those after `n_keep` (llama.cpp's
    /// default). At least as many as the next micro-batch needs are discarded.
    pub n_discard: Option<usize>,
}

impl IngestParams {
    /// Parameters saving under `name` with the default interval.
    pub fn new(name: impl Into<String>) -> IngestParams {
        IngestParams {
            name: name.into(),
            interval: DEFAULT_INTERVAL,
            shift: None,
        }
    }

    /// The interval in effect: at least one page, rounded up to whole pages.
    pub fn effective_interval(&self) -> usize {
        self.interval.max(1).div_ceil(PAGE_TOKENS) * PAGE_TOKENS
    }
}

/// Where an ingestion stands, as reported to its progress callback.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// Tokens held so far (restored and computed).
    pub done: usize,
    /// Tokens in the document.
    pub total: usize,
    /// Tokens taken from the store.
    pub restored: usize,
    /// Tokens evaluated by this ingestion.
    pub computed: usize,
    /// Time spent evaluating and saving since the restore.
    pub elapsed: Duration,
    /// Evaluated tokens per second over `elapsed` (checkpoints included).
    pub tokens_per_s: f64,
    /// Context shifts so far.
    pub shifts: usize,
}

/// What an ingestion did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IngestReport {
    /// Tokens in the document.
    pub tokens: usize,
    /// Document tokens taken from the store (or already held by the session); after shifts,
    /// the tokens the restored checkpoint covers.
    pub restored: usize,
    /// Tokens evaluated.
    pub computed: usize,
    /// Context shifts made since the document's start (those of a resumed ingestion's
    /// checkpoint included).
    pub shifts: usize,
    /// Checkpoints saved.
    pub checkpoints: usize,
    /// Whether the whole document was read (false when the callback stopped it).
    pub finished: bool,
}

/// A checkpoint name for a document known by `label` (a path, a title): its characters that
/// checkpoint names allow, shortened, then 12 hex digits of its BLAKE3 hash, so different labels
/// that read alike get different names.
pub fn checkpoint_name(label: &str) -> String {
    let readable: String = label
        .chars()
        .rev()
        .take(60)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let hash = blake3::hash(label.as_bytes()).to_hex();
    format!("doc-{readable}-{}", &hash[..12])
}

/// Reads `tokens` into `session`, saving checkpoint `params.name` in `store` every
/// `params.interval` tokens and at the end.
///
/// An empty session first restores checkpoint `params.name` when it was shifted and covers a
/// prefix of `tokens` (its digest and tokens match, with the same `n_keep`), else the longest
/// prefix of `tokens` that `store` holds (from any checkpoint), rounded down to a micro-batch
/// boundary; a session that already holds a prefix of `tokens` continues from it.
/// `on_progress` is called after the restore and after every micro-batch; returning
/// [`ControlFlow::Break`] stops the ingestion cleanly: what was read is saved, and a later
/// ingestion resumes from there. At the end the session holds the document (after shifts: its
/// first `n_keep` tokens and its end) and the logits after its last token (evaluated again
/// when a finished, shifted checkpoint was restored whole).
///
/// Errors: [`Error::EmptyDocument`]; [`Error::ContextFull`] when the document exceeds the
/// session's context and `params.shift` is `None` (checked before anything is evaluated), or
/// when a shift cannot make room (`n_keep` leaves no room for a micro-batch);
/// [`Error::NotAPrefix`] when the session holds other tokens; a failed save (a full disk, say)
/// stops the ingestion with the store's error, every checkpoint saved before it intact and
/// resumable.
pub fn ingest(
    session: &mut Session,
    store: &SessionStore,
    tokens: &[u32],
    params: &IngestParams,
    mut on_progress: impl FnMut(&Progress) -> ControlFlow<()>,
) -> Result<IngestReport> {
    let total = tokens.len();
    if total == 0 {
        return Err(Error::EmptyDocument);
    }
    let n_ctx = session.params().n_ctx;
    if total > n_ctx && params.shift.is_none() {
        return Err(Error::ContextFull {
            needed: total,
            n_ctx,
        });
    }
    let held = session.tokens().len();
    if held > total || session.tokens() != &tokens[..held] {
        return Err(Error::NotAPrefix {
            seq: session.seq(),
            held,
        });
    }
    let interval = params.effective_interval();
    let n_ubatch = session.params().n_batch.max(1);
    let (restored, prior_shifts) = if held > 0 {
        (held, 0)
    } else if let Some((done, shifts)) = shifted_checkpoint(store, params, tokens, n_ctx)? {
        store.restore(session, &params.name)?;
        if done == total {
            let seq = session.seq();
            session.context_mut().ensure_logits(seq)?;
        }
        (done, shifts)
    } else {
        let n = store.restore_prefix(session, tokens)?;
        let aligned = grid_floor(n, n_ubatch, interval);
        session.truncate(aligned)?;
        (aligned, 0)
    };

    let mut report = IngestReport {
        tokens: total,
        restored,
        shifts: prior_shifts,
        ..IngestReport::default()
    };
    let meta = |done: usize, shifts: usize| CheckpointMeta {
        app: BTreeMap::from([
            (TOTAL_KEY.to_owned(), total.to_string()),
            (DONE_KEY.to_owned(), done.to_string()),
            (SHIFTS_KEY.to_owned(), shifts.to_string()),
            (DIGEST_KEY.to_owned(), digest(&tokens[..done])),
        ]),
        ..CheckpointMeta::default()
    };
    let started = Instant::now();
    let progress = |done: usize, computed: usize, shifts: usize| {
        let elapsed = started.elapsed();
        let secs = elapsed.as_secs_f64();
        Progress {
            done,
            total,
            restored,
            computed,
            elapsed,
            tokens_per_s: if secs > 0.0 {
                computed as f64 / secs
            } else {
                0.0
            },
            shifts,
        }
    };
    if on_progress(&progress(restored, 0, prior_shifts)).is_break() {
        return Ok(report);
    }

    let seq = session.seq();
    let mut done = restored;
    let mut saved = restored;
    while done < total {
        let end = next_boundary(done, n_ubatch, interval).min(total);
        let want = if end == total {
            Logits::Last
        } else {
            Logits::None
        };
        let held = session.tokens().len();
        if held + (end - done) > n_ctx {
            let policy = params.shift.ok_or(Error::ContextFull {
                needed: held + end - done,
                n_ctx,
            })?;
            let n_left = held.saturating_sub(policy.n_keep);
            let needed = held + (end - done) - n_ctx;
            let n_discard = policy.n_discard.unwrap_or(n_left / 2).max(needed);
            if n_discard > n_left {
                return Err(Error::ContextFull {
                    needed: policy.n_keep + (end - done),
                    n_ctx,
                });
            }
            session.shift(policy.n_keep, n_discard)?;
            report.shifts += 1;
        }
        session.context_mut().feed(seq, &tokens[done..end], want)?;
        report.computed += end - done;
        done = end;
        if done.is_multiple_of(interval) || done == total {
            store.save(session, &params.name, &meta(done, report.shifts))?;
            report.checkpoints += 1;
            saved = done;
        }
        if on_progress(&progress(done, report.computed, report.shifts)).is_break() {
            if saved < done {
                store.save(session, &params.name, &meta(done, report.shifts))?;
                report.checkpoints += 1;
            }
            return Ok(report);
        }
    }
    report.finished = true;
    Ok(report)
}

/// BLAKE3 (hex) of `tokens` as u32 LE.
fn digest(tokens: &[u32]) -> String {
    let mut h = blake3::Hasher::new();
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    h.finalize().to_hex().to_string()
}

/// When checkpoint `params.name` was shifted and continues this document exactly (digest of
/// the tokens it covers, its tokens: the first `n_keep` and those just before where it
/// stopped, and it fits the context): the document tokens it covers and its shifts.
fn shifted_checkpoint(
    store: &SessionStore,
    params: &IngestParams,
    tokens: &[u32],
    n_ctx: usize,
) -> Result<Option<(usize, usize)>> {
    let Some(policy) = params.shift else {
        return Ok(None);
    };
    if !store.exists(&params.name)? {
        return Ok(None);
    }
    let (held, meta) = store.read_checkpoint(&params.name)?;
    let number = |key: &str| meta.app.get(key).and_then(|v| v.parse::<usize>().ok());
    let (Some(done), Some(shifts)) = (number(DONE_KEY), number(SHIFTS_KEY)) else {
        return Ok(None);
    };
    if shifts == 0 || done > tokens.len() || held.len() > done || held.len() > n_ctx {
        return Ok(None);
    }
    if meta.app.get(DIGEST_KEY) != Some(&digest(&tokens[..done])) {
        return Ok(None);
    }
    let keep = policy.n_keep.min(held.len());
    let recent = &tokens[done - (held.len() - keep)..done];
    if held[..keep] != tokens[..keep] || held[keep..] != *recent {
        return Ok(None);
    }
    Ok(Some((done, shifts)))
}

/// The largest micro-batch boundary at or below `n`.
fn grid_floor(n: usize, n_ubatch: usize, interval: usize) -> usize {
    (n - n % n_ubatch).max(n - n % interval)
}

/// The first micro-batch boundary after `n`: the next multiple of `n_ubatch` or of `interval`.
fn next_boundary(n: usize, n_ubatch: usize, interval: usize) -> usize {
    let next = |m: usize| (n / m + 1) * m;
    next(n_ubatch).min(next(interval))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_depend_only_on_position() {
        // From 0 and from a restored 640 (a multiple of the interval), the same boundaries.
        let walk = |mut n: usize| {
            let mut b = Vec::new();
            while n < 2000 {
                n = next_boundary(n, 512, 320);
                b.push(n);
            }
            b
        };
        assert_eq!(
            walk(0),
            [320, 512, 640, 960, 1024, 1280, 1536, 1600, 1920, 2048]
        );
        assert!(walk(0).ends_with(&walk(640)));
        assert_eq!(grid_floor(700, 512, 320), 640);
        assert_eq!(grid_floor(1100, 512, 320), 1024);
        assert_eq!(grid_floor(63, 512, 64), 0);
    }

    #[test]
    fn names_are_valid_and_distinct() {
        let a = checkpoint_name("/home/me/books/War and Peace.txt");
        let b = checkpoint_name("/home/me/books/War_and_Peace.txt");
        assert_ne!(a, b);
        for name in [&a, &b, &checkpoint_name(".hidden"), &checkpoint_name("ü")] {
            assert!(ckptfmt::store::check_name(name).is_ok(), "{name}");
        }
        assert!(a.starts_with("doc-"));
    }

    #[test]
    fn interval_is_whole_pages() {
        let mut p = IngestParams::new("x");
        assert_eq!(p.effective_interval(), 512);
        p.interval = 0;
        assert_eq!(p.effective_interval(), PAGE_TOKENS);
        p.interval = PAGE_TOKENS + 1;
        assert_eq!(p.effective_interval(), 2 * PAGE_TOKENS);
    }
}
