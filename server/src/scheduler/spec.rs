//! Speculative decoding in the scheduler: each step, a generating request may feed a draft
//! after its pending token; the whole item's logits come back and are verified in order
//! ([`engine::speculative::accept`]), the rejected positions are cut off the sequence, and
//! every accepted token goes through [`Scheduler::on_token`] as if decoded alone.
//!
//! Invariants: a draft never takes a request past its context (no context shift can happen
//! inside a verified run) or past its `max_tokens`; a request finishing inside a run keeps
//! exactly what it would have held without speculation (`Active::spec_hold`); drafts come from
//! the request's own context, its namespace's history, or the draft model, never from another
//! namespace.

use engine::speculative::{self, DraftModel, DraftRequest, TokenHistory};
use promptcache::StoreExt as _;

use super::sample::pick;
use super::{Active, Scheduler};
use crate::args::SpecConfig;
use crate::error::ServerError;
use crate::metrics::Metrics;

/// A request's own speculative settings (llama-server's `speculative.*` fields).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpecRequest {
    /// `speculative.n_max`.
    pub n_max: Option<usize>,
    /// `speculative.n_min`.
    pub n_min: Option<usize>,
    /// `speculative.p_min`.
    pub p_min: Option<f32>,
}

/// Speculative decoding's state on the scheduler thread.
pub struct Speculation {
    /// What the server was started with.
    pub config: SpecConfig,
    /// The draft model's context, with `-md`.
    pub draft: Option<DraftModel>,
    /// Finished conversations' tokens, for n-gram drafts.
    pub history: Option<TokenHistory>,
}

impl Speculation {
    /// The state for `config`, with the draft model already loaded when it has one.
    pub fn new(config: SpecConfig, draft: Option<DraftModel>) -> Speculation {
        let history = config
            .ngram
            .filter(|_| config.history_tokens > 0)
            .map(|p| TokenHistory::new(config.history_tokens, p));
        Speculation {
            config,
            draft,
            history,
        }
    }
}

/// A generating request that may draft this step.
struct Want {
    slot: usize,
    /// Its tokens, the pending one last.
    context: Vec<u32>,
    /// Most draft tokens.
    k: usize,
    /// Fewest draft tokens worth verifying.
    n_min: usize,
    /// The draft model's probability floor.
    p_min: f32,
    /// Its namespace.
    ns: Option<engine::Namespace>,
}

impl Speculation {
    /// Records the prompts `store` cached most recently (with their replies, as the cache
    /// keeps them) into the n-gram history: after a restart each namespace drafts from its
    /// earlier conversations as before. At most 4,096 prompts are read.
    pub fn seed(&mut self, store: &engine::store::SessionStore) {
        let Some(h) = self.history.as_mut() else {
            return;
        };
        // Only a cache: a store that cannot be listed seeds nothing.
        if let Ok(prompts) = store
            .prompt_cache()
            .recent_prompts(self.config.history_tokens, 4096)
        {
            for (ns, tokens) in prompts {
                h.record(ns, &tokens);
            }
        }
    }
}

/// Counts of a request's drafts, for its `timings`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftCounts {
    /// Draft tokens verified.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
}

impl Scheduler {
    /// Drafts for the generating requests, by slot (empty: decode one token), within
    /// `budget` tokens of the batch besides each one's pending token.
    pub(super) fn drafts(&mut self, mut budget: usize) -> Vec<Vec<u32>> {
        let mut out = vec![Vec::new(); self.slots.len()];
        // A hybrid model's rejected drafts could not be cut back out of its recurrent state.
        if self.ctx.is_hybrid() {
            return out;
        }
        let Some(spec) = self.spec.as_mut() else {
            return out;
        };
        let n_ctx = self.ctx.params().n_ctx;
        let mut wants: Vec<Want> = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let Some(a) = &slot.active else { continue };
            let Some(pending) = a.pending else { continue };
            if !a.forced.is_empty() || a.params.reasoning_budget.is_some() {
                continue;
            }
            let held = a.prompt.len() + a.generated.len() - a.shifted;
            let room = n_ctx.saturating_sub(held + 1);
            let left = a.params.max_tokens.saturating_sub(a.generated.len() + 1);
            let own = a.params.speculative;
            let n_max = own
                .n_max
                .unwrap_or(spec.config.n_max.max(spec.config.ngram_n_max));
            let k = n_max.min(room).min(left);
            let k = if a.spec_k > 0 { k.min(a.spec_k) } else { k };
            if k == 0 {
                continue;
            }
            let Ok(tokens) = self.ctx.tokens(a.seq) else {
                continue;
            };
            let mut context = Vec::with_capacity(tokens.len() + 1);
            context.extend_from_slice(tokens);
            context.push(pending);
            let n_min = own.n_min.unwrap_or(spec.config.n_min).max(1);
            let p_min = own.p_min.unwrap_or(spec.config.p_min);
            let ns = a.params.namespace;
            wants.push(Want {
                slot: i,
                context,
                k,
                n_min,
                p_min,
                ns,
            });
        }
        let mut for_model = Vec::new();
        for w in wants {
            let Want {
                slot: i,
                ref context,
                k,
                n_min,
                ..
            } = w;
            let mut draft = Vec::new();
            if let Some(params) = spec.config.ngram {
                // The longer match wins: the context's own, or the namespace's history.
                let k = k.min(spec.config.ngram_n_max);
                let own = speculative::ngram::draft_from_context(context, &params, k);
                let earlier = spec.history.as_ref().map(|h| h.draft(w.ns, context, k));
                draft = match earlier {
                    Some(e) if e.matched > own.matched => e.tokens,
                    _ => own.tokens,
                };
            }
            if draft.is_empty() && spec.draft.is_some() {
                let k = k.min(spec.config.n_max);
                for_model.push(Want { k, ..w });
                continue;
            }
            if draft.len() >= n_min {
                out[i] = draft;
            }
        }
        if let Some(model) = spec.draft.as_mut().filter(|_| !for_model.is_empty()) {
            let reqs: Vec<DraftRequest> = for_model
                .iter()
                .map(|w| DraftRequest {
                    key: w.slot as u64,
                    context: &w.context,
                    n_max: w.k,
                    p_min: w.p_min,
                    namespace: w.ns,
                })
                .collect();
            // A draft model that fails (its pool too small) drafts nothing this step.
            let got = model.draft(&reqs);
            Metrics::set(
                &self.metrics.draft_tokens_from_store,
                model.restored_tokens() as u64,
            );
            if let Ok(drafts) = got {
                for (w, d) in for_model.iter().zip(drafts) {
                    if d.len() >= w.n_min {
                        out[w.slot] = d;
                    }
                }
            }
        }
        if let Some(synth) = &spec.config.synth {
            for d in &mut out {
                d.truncate(synth.len());
            }
        }
        // Within the batch: a draft shares what is left with the prompts' chunks.
        for d in &mut out {
            let n = d.len().min(budget);
            d.truncate(n);
            budget -= n;
        }
        out
    }

    /// Verifies the draft fed after the pending token of the request in `slot`: `rows` holds
    /// the logits after the pending token and after each draft token. Every accepted token
    /// goes on as if decoded alone; the rejected positions leave the sequence.
    pub(super) fn verify(&mut self, slot: usize, draft: &[u32], rows: &[f32]) {
        let n_vocab = self.model.tokenizer().n_vocab();
        let synth = self.spec.as_ref().and_then(|s| s.config.synth.clone());
        let model = std::sync::Arc::clone(&self.model);
        let Some(a) = self.slots[slot].active.as_mut() else {
            return;
        };
        let Ok(tokens) = self.ctx.tokens(a.seq) else {
            return;
        };
        // Position of the pending token.
        let base = tokens.len() - draft.len() - 1;
        let mut probs = Vec::new();
        let mut sample = |a: &mut Active, j: usize| {
            let row = &rows[j * n_vocab..(j + 1) * n_vocab];
            pick(a, row, &tokens[..base + 1 + j]).map(|(t, p)| {
                probs.push(p);
                t
            })
        };
        let got = match synth.filter(|_| a.constraint.is_none()) {
            Some(s) => {
                let mut rng = std::mem::take(&mut a.synth_rng);
                let r = s.accept(
                    draft,
                    || rng.next_f64(),
                    |t| model.tokenizer().is_eog(t),
                    |j| sample(a, j),
                );
                a.synth_rng = rng;
                r
            }
            None => speculative::accept(draft, |j| sample(a, j)),
        };
        let accepted = match got {
            Ok(t) => t,
            Err(e) => {
                self.fail(slot, e);
                return;
            }
        };
        let m = accepted.len() - 1;
        a.drafts.drafted += draft.len();
        a.drafts.accepted += m;
        Metrics::add(&self.metrics.draft_tokens, draft.len() as u64);
        Metrics::add(&self.metrics.draft_accepted, m as u64);
        Metrics::add(&self.metrics.drafts, 1);
        a.spec_k = 2 * m + 1;
        let seq = a.seq;
        if let Err(e) = self.ctx.truncate(seq, base + 1 + m) {
            self.fail(slot, ServerError::Busy(e.to_string()));
            return;
        }
        for (j, (token, p)) in accepted.into_iter().zip(probs).enumerate() {
            let Some(a) = self.slots[slot].active.as_mut() else {
                return;
            };
            a.spec_hold = Some(base + 1 + j);
            self.on_token(slot, token, p);
        }
        if let Some(a) = self.slots[slot].active.as_mut() {
            a.spec_hold = None;
        }
    }
}

/// The random stream of `--spec-synth-rates` (SplitMix64), seeded from the request's seed so
/// that a request repeated draws the same decisions.
#[derive(Clone, Copy, Debug, Default)]
pub struct SynthRng(u64);

impl SynthRng {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> SynthRng {
        SynthRng(seed)
    }

    /// A draw in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce5_e4b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Scheduler {
    /// Keeps a finished request's tokens (prompt and reply) for later n-gram drafts in its
    /// namespace.
    pub(super) fn remember(&mut self, slot: usize, a: &Active) {
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        if a.params.warm {
            return;
        }
        // The draft model's blocks of this conversation, for the next request or run (only
        // a cache: a failure loses nothing).
        if let Some(d) = spec.draft.as_mut() {
            let _ = d.save(slot as u64);
        }
        let Some(h) = spec.history.as_mut() else {
            return;
        };
        let mut tokens = Vec::with_capacity(a.prompt.len() + a.generated.len());
        tokens.extend_from_slice(&a.prompt);
        tokens.extend_from_slice(&a.generated);
        h.record(a.params.namespace, &tokens);
    }
}
