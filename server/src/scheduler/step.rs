//! Batching: one decode batch over the active slots, and what comes back of it.
//!
//! Invariants: every generating request gets its one decode token first; prefill chunks take
//! what is left of `n_batch`, the request with the fewest prompt tokens left first, and a
//! follower feeds nothing until the prefix it waits for is resolved. Logits are asked only for
//! a request's pending token or its prompt's last one. When the pool runs out of pages the
//! cached sequences give way first, then the newest request; any other decode error fails every
//! request of the batch.

use engine::{Batch, Logits};

use super::sample::pick;
use super::{Event, Progress, Scheduler};
use crate::error::ServerError;
use crate::metrics::Metrics;

impl Scheduler {
    /// One batch: a decode token of each generating request, prefill chunks of the others.
    pub(super) fn step(&mut self) {
        self.resolve_followers();
        let n_batch = self.ctx.params().n_batch;
        loop {
            let mut batch = Batch::new();
            // (slot, prompt tokens fed by the item, whether logits were asked for)
            let mut items: Vec<(usize, usize, bool)> = Vec::new();
            let mut budget = n_batch;
            for (i, slot) in self.slots.iter().enumerate() {
                if let Some(a) = &slot.active {
                    if let Some(t) = a.pending {
                        batch.add(a.seq, &[t], Logits::Last);
                        items.push((i, 0, true));
                        budget -= 1;
                    }
                }
            }
            // Prefill chunks, the request with the fewest prompt tokens left first: a request
            // that found most of its prompt cached is answered at the next step instead of
            // waiting behind a cold document (which takes what budget is left).
            let mut prefilling: Vec<(usize, u64, usize)> = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    s.active
                        .as_ref()
                        .map(|a| (a.prompt.len() - a.fed, a.ticket, i))
                })
                .filter(|&(left, _, _)| left > 0)
                .collect();
            prefilling.sort_unstable();
            for (_, _, i) in prefilling {
                let Some(a) = &self.slots[i].active else {
                    continue;
                };
                if budget == 0 || a.follow.is_some() {
                    continue;
                }
                let n = (a.prompt.len() - a.fed).min(budget);
                let last = a.fed + n == a.prompt.len();
                let logits = if last { Logits::Last } else { Logits::None };
                batch.add(a.seq, &a.prompt[a.fed..a.fed + n], logits);
                items.push((i, n, last));
                budget -= n;
            }
            if batch.is_empty() {
                return;
            }
            match self.ctx.decode(&batch) {
                Ok(out) => {
                    Metrics::add(&self.metrics.n_decode, 1);
                    Metrics::add(&self.metrics.n_busy_slots, items.len() as u64);
                    for (item, &(slot, n_prompt, wants_logits)) in items.iter().enumerate() {
                        let Some(a) = self.slots[slot].active.as_mut() else {
                            continue;
                        };
                        if n_prompt == 0 {
                            a.pending = None;
                        }
                        a.fed += n_prompt;
                        if n_prompt > 0 && a.params.return_progress {
                            let _ = a.events.send(Event::Progress(Progress {
                                total: a.prompt.len(),
                                cache: a.cache_n,
                                processed: a.fed,
                                time_ms: a.admitted.elapsed().as_secs_f64() * 1e3,
                            }));
                        }
                        if wants_logits {
                            let history = self.ctx.tokens(a.seq).unwrap_or(&[]);
                            // `ignore_eos` reaches the sampler as a ban of those tokens.
                            let logits = out.logits(item);
                            // A reasoning budget's end tag goes in as it is, not sampled.
                            if let Some(token) = a.forced.pop_front() {
                                self.on_token(slot, token, None);
                                continue;
                            }
                            match pick(a, logits, history) {
                                Ok((token, probs)) => self.on_token(slot, token, probs),
                                Err(e) => self.fail(slot, e),
                            }
                        }
                    }
                    return;
                }
                Err(engine::Error::OutOfPages { needed, .. }) => {
                    if !self.make_room(needed) {
                        // Even an empty cache is not enough: the newest request gives way.
                        let newest = self
                            .slots
                            .iter()
                            .enumerate()
                            .filter_map(|(i, s)| s.active.as_ref().map(|a| (a.ticket, i)))
                            .max();
                        if let Some((_, slot)) = newest {
                            self.fail(
                                slot,
                                ServerError::Busy(format!(
                                    "{needed} more pages were needed than the pool of {} has",
                                    self.ctx.stats().pages_total
                                )),
                            );
                        }
                    }
                }
                Err(e) => {
                    let msg = e.to_string();
                    for &(slot, _, _) in &items {
                        self.fail(slot, ServerError::Busy(msg.clone()));
                    }
                    return;
                }
            }
        }
    }
}
