//! Batching: one decode batch over the active slots, and what comes back of it.
//!
//! Invariants: every generating request gets its one decode token first; prefill chunks take
//! what is left of `n_batch`: first the requests whose prompt ends within one step (fewest
//! tokens left first), then the others by when their prompt would be read had it run alone
//! (see [`prefill_order`]); a follower feeds nothing until the prefix it waits for is
//! resolved. Logits are asked only for a request's pending token or its prompt's last one.
//! When the pool runs out of pages the cached sequences give way first, then the newest
//! request; any other decode error fails every request of the batch.

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
            let n_decoding = self
                .slots
                .iter()
                .filter(|s| s.active.as_ref().is_some_and(|a| a.pending.is_some()))
                .count();
            let mut drafts = self.drafts(n_batch.saturating_sub(n_decoding));
            let mut budget = n_batch;
            for (i, slot) in self.slots.iter().enumerate() {
                if let Some(a) = &slot.active {
                    if let Some(t) = a.pending {
                        let draft = &drafts[i];
                        if draft.is_empty() {
                            batch.add(a.seq, &[t], Logits::Last);
                        } else {
                            let mut run = Vec::with_capacity(draft.len() + 1);
                            run.push(t);
                            run.extend_from_slice(draft);
                            batch.add(a.seq, &run, Logits::All);
                        }
                        items.push((i, 0, true));
                        budget -= 1 + draft.len();
                    }
                }
            }
            let mut prefilling: Vec<((bool, u64, u64), usize)> = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    let a = s.active.as_ref()?;
                    let left = a.prompt.len() - a.fed;
                    (left > 0).then(|| (prefill_order(left, a.arrival_work, a.ticket, n_batch), i))
                })
                .collect();
            prefilling.sort_unstable();
            for (_, i) in prefilling {
                let Some(a) = &self.slots[i].active else {
                    continue;
                };
                if budget == 0 || a.follow.is_some() {
                    continue;
                }
                let mut n = (a.prompt.len() - a.fed).min(budget);
                // A hybrid model's chunk ends at the last page boundary it crosses, where the
                // sequence keeps its recurrent state (a later prompt resumes there).
                let boundary = (a.fed + n) / engine::PAGE_TOKENS * engine::PAGE_TOKENS;
                if self.ctx.is_hybrid() && boundary > a.fed && boundary < a.fed + n {
                    n = boundary - a.fed;
                }
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
                        self.work += n_prompt as u64;
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
                            if n_prompt == 0 && !drafts[slot].is_empty() {
                                let draft = std::mem::take(&mut drafts[slot]);
                                self.verify(slot, &draft, logits);
                                continue;
                            }
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

/// The order of prefill chunks (smallest first) for a request with `left` prompt tokens to
/// read, admitted when [`Scheduler::work`] was `arrival_work`, as the `ticket`-th request.
///
/// A prompt that ends within one step (a request that found most of its prompt cached) goes
/// first, the fewest tokens left first: it is answered at the next step instead of waiting
/// behind a cold document. The others go by `arrival_work + left`, the point of the work clock
/// by which each would be read had it run alone: a later prompt passes an earlier one only
/// when it is that much shorter, so no prompt waits behind an endless stream of shorter ones
/// (with the fewest tokens first, a cold document could be passed by every later one of about
/// its size, and waited for all of them), and one that has begun keeps its place.
fn prefill_order(left: usize, arrival_work: u64, ticket: u64, n_batch: usize) -> (bool, u64, u64) {
    if left <= n_batch {
        (false, left as u64, ticket)
    } else {
        (true, arrival_work + left as u64, ticket)
    }
}

#[cfg(test)]
mod tests {
    use super::prefill_order;

    /// The slots' order for prompts given as (tokens left, work clock at admission, ticket).
    fn order(prompts: &[(usize, u64, u64)], n_batch: usize) -> Vec<u64> {
        let mut v: Vec<_> = prompts
            .iter()
            .map(|&(left, at, t)| (prefill_order(left, at, t, n_batch), t))
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, t)| t).collect()
    }

    #[test]
    fn a_prompt_that_ends_within_a_step_goes_first() {
        // A cold document admitted first, then a cached request with 40 tokens left.
        assert_eq!(order(&[(3000, 0, 1), (40, 900, 2)], 512), [2, 1]);
        // Two such: the fewest tokens left first.
        assert_eq!(
            order(&[(300, 0, 1), (40, 900, 2), (3000, 0, 3)], 512),
            [2, 1, 3]
        );
    }

    #[test]
    fn a_cold_prompt_is_not_passed_by_later_ones_of_its_size() {
        // Three documents of about 1,530 tokens admitted together; a fourth, a few tokens
        // shorter, admitted after 2,500 tokens of work: it goes last.
        let v = order(
            &[
                (1545, 1000, 1),
                (1531, 1000, 2),
                (1552, 1000, 3),
                (1520, 2530, 4),
            ],
            512,
        );
        assert_eq!(v[3], 4, "{v:?}");
        // One that has begun keeps its place before an untouched one admitted later.
        assert_eq!(order(&[(1520, 3000, 5), (900, 1000, 3)], 512), [3, 5]);
    }

    #[test]
    fn a_much_shorter_later_prompt_passes_a_long_one() {
        // 8,000 tokens left of a prompt admitted at 0; 1,000 admitted after 2,000 of work.
        assert_eq!(order(&[(8000, 0, 1), (1000, 2000, 2)], 512), [2, 1]);
    }
}
