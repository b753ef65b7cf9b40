//! Per-token handling and the end of a request: each sampled token is checked against the
//! request's limits (end of generation, stop strings, reasoning budget, grammar, length, time,
//! context) and its text streamed as it is made; `finish` and `fail` end the request.
//!
//! Invariants: text is sent only up to where no stop string can still begin, never while a
//! character is incomplete (a token's text goes out with its probabilities), and a stop string
//! found is cut from it; a request ends once, through `finish` or `fail`, which take it out of
//! its slot, publish the gauges before the answer goes out and count it finished. A finished
//! sequence stays cached unless a context shift truncated it or `--cache-reuse` moved its KV;
//! a failed one is dropped.

use std::sync::Arc;
use std::time::Instant;

use super::sample::flush_text;
use super::{Event, Finish, FinishReason, Scheduler, TokenProbs};
use crate::error::ServerError;
use crate::metrics::Metrics;

impl Scheduler {
    /// Handles a token sampled for the request in `slot`.
    pub(super) fn on_token(&mut self, slot: usize, token: u32, probs: Option<TokenProbs>) {
        if self.slots[slot]
            .active
            .as_ref()
            .is_some_and(|a| a.first_token.is_none())
        {
            self.export_prompt(slot);
        }
        let model = Arc::clone(&self.model);
        let tok = model.tokenizer();
        let n_ctx = self.ctx.params().n_ctx;
        let Some(a) = self.slots[slot].active.as_mut() else {
            return;
        };
        if a.first_token.is_none() {
            a.first_token = Some(Instant::now());
        }
        // `n_predict: 0` evaluates the prompt and generates nothing.
        if a.params.max_tokens == 0 {
            self.finish(slot, FinishReason::Length);
            return;
        }
        if tok.is_eog(token) {
            self.finish(slot, FinishReason::EndOfGeneration);
            return;
        }
        a.generated.push(token);
        a.unsent.push(token);
        if let Some(p) = probs {
            a.unsent_probs.push(p.clone());
            a.probs.push(p);
        }
        Metrics::add(&self.metrics.tokens_predicted, 1);
        a.text.push_str(&a.decoder.push(tok, token));
        if let Some((cut, word)) = a.stops.find(&a.text) {
            a.stopping_word = word.to_owned();
            a.text.truncate(cut);
            flush_text(a, cut);
            self.finish(slot, FinishReason::StopString);
            return;
        }
        if let Some(b) = &a.params.reasoning_budget {
            // Inside the thinking block (opened by the prompt or by the reply, not closed):
            // count, and close it once the budget is spent.
            let inside = (b.opened || a.text.contains(b.start)) && !a.text.contains(b.end);
            if inside && a.forced.is_empty() {
                a.thinking += 1;
                if a.thinking >= b.tokens {
                    a.forced.extend(b.close.iter().copied());
                }
            }
        }
        // As llama-server does, nothing is sent while a character is incomplete: the text of a
        // token and its probabilities go out together, in the chunk that completes it.
        if !a.decoder.is_holding() {
            let safe = a.stops.safe_prefix_len(&a.text).max(a.sent);
            flush_text(a, safe);
        }
        // A grammar that is complete admits nothing more.
        if a.constraint.as_ref().is_some_and(|c| c.is_done()) {
            let rest = a.decoder.flush();
            a.text.push_str(&rest);
            let end = a.text.len();
            flush_text(a, end);
            self.finish(slot, FinishReason::EndOfGeneration);
            return;
        }
        let held = a.prompt.len() + a.generated.len() - a.shifted;
        // llama-server's `t_max_predict_ms`: out of time once a line has ended.
        let out_of_time = a.params.t_max_predict_ms.is_some_and(|ms| {
            a.first_token
                .is_some_and(|t| t.elapsed().as_millis() >= u128::from(ms))
                && a.text.contains('\n')
        });
        let full = held >= n_ctx;
        if full && a.params.context_shift && a.generated.len() < a.params.max_tokens && !out_of_time
        {
            if self.shift_context(slot) {
                if let Some(a) = self.slots[slot].active.as_mut() {
                    a.pending = Some(token);
                }
                return;
            }
            self.finish_at_length(slot);
            return;
        }
        if a.generated.len() >= a.params.max_tokens || full || out_of_time {
            self.finish_at_length(slot);
            return;
        }
        a.pending = Some(token);
    }

    /// Ends the request in `slot`: sends its figures, keeps its sequence cached and queues its
    /// new blocks for the store.
    pub(super) fn finish(&mut self, slot: usize, reason: FinishReason) {
        let Some(mut a) = self.slots[slot].active.take() else {
            return;
        };
        if reason == FinishReason::EndOfGeneration {
            let rest = a.decoder.flush();
            a.text.push_str(&rest);
            let end = a.text.len();
            flush_text(&mut a, end);
        }
        self.remember(slot, &a);
        let now = Instant::now();
        let first = a.first_token.unwrap_or(now);
        let finish = Finish {
            reason,
            slot,
            n_prompt: a.prompt.len(),
            cache_n: a.cache_n,
            prompt_n: a.prompt.len() - a.cache_n,
            prompt_ms: (first - a.admitted).as_secs_f64() * 1e3,
            predicted_n: a.generated.len(),
            predicted_ms: (now - first).as_secs_f64() * 1e3,
            tokens: std::mem::take(&mut a.generated),
            stopping_word: std::mem::take(&mut a.stopping_word),
            probs: std::mem::take(&mut a.probs),
            truncated: a.truncated,
            drafts: a.drafts,
        };
        // The gauges first: a client that reads them once it has its answer sees this request
        // done.
        self.publish_gauges();
        let m = &self.metrics;
        Metrics::add(&m.prompt_us, (finish.prompt_ms * 1e3) as u64);
        Metrics::add(&m.predicted_us, (finish.predicted_ms * 1e3) as u64);
        m.window_add(
            finish.prompt_n as u64,
            (finish.prompt_ms * 1e3) as u64,
            finish.predicted_n as u64,
            (finish.predicted_ms * 1e3) as u64,
        );
        Metrics::raise(
            &m.n_tokens_max,
            (finish.n_prompt + finish.predicted_n) as u64,
        );
        let _ = a.events.send(Event::Done(Box::new(finish)));
        Metrics::add(&self.metrics.requests_finished, 1);
        // Ended inside a verified draft: the tokens after the one it ended at go.
        if let Some(len) = a.spec_hold {
            let _ = self.ctx.truncate(a.seq, len);
        }
        if a.truncated || a.moved {
            let _ = self.ctx.remove_sequence(a.seq);
        } else {
            let expires = a.params.cache_ttl.map(|t| crate::routes::unix_now() + t);
            let lens = (a.cache_n, a.prompt.len());
            self.keep(slot, a.seq, lens, a.inherited, expires);
        }
    }

    /// Fails the request in `slot` and drops its sequence.
    pub(super) fn fail(&mut self, slot: usize, e: ServerError) {
        if let Some(a) = self.slots[slot].active.take() {
            self.publish_gauges();
            let _ = a.events.send(Event::Failed(e));
            // The pages of the sequence it took over, left for its export, go to the store.
            if let Some(inherited) = a.inherited.filter(|_| self.store.is_some()) {
                self.exports.push(super::Export {
                    seq: a.seq,
                    cache_n: a.cache_n,
                    prompt_len: 0,
                    since: inherited.since,
                    expires: None,
                    sent: inherited.sent,
                });
                self.export(a.seq);
            }
            let _ = self.ctx.remove_sequence(a.seq);
            Metrics::add(&self.metrics.requests_finished, 1);
        }
    }
}
