//! The candidate list the chain's steps narrow down: (token, logit) pairs, with a pending
//! temperature factor so that a draw at temperature `t` weighs `exp((logit - max) / t)` exactly
//! as the sampler always has.

use std::cmp::Ordering;
use std::collections::HashMap;

/// The candidates' order: higher logit first, then lower id.
pub(crate) fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Cands {
    /// (token, logit); logits are never NaN.
    pub v: Vec<(u32, f32)>,
    /// `v` is in [`by_logit_desc`] order.
    pub sorted: bool,
    /// `v[i].0 == i` for every `i`: a token's candidate is found by its id.
    pub identity: bool,
    /// The effective logits are `logit * scale` (temperatures not yet applied).
    pub scale: f64,
    /// A temperature `<= 0` left the single most likely candidate: no draw needed.
    pub greedy: bool,
}

impl Cands {
    /// Every token of `logits`, NaN counted as `-inf`.
    pub fn fill(&mut self, logits: &[f32]) {
        self.v.clear();
        self.v.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, if l.is_nan() { f32::NEG_INFINITY } else { l })),
        );
        self.sorted = false;
        self.identity = true;
        self.scale = 1.0;
        self.greedy = false;
    }

    pub fn len(&self) -> usize {
        self.v.len()
    }

    pub fn sort(&mut self) {
        if !self.sorted {
            self.v.sort_unstable_by(by_logit_desc);
            self.sorted = true;
            self.identity = false;
        }
    }

    /// Keeps the first `n` candidates.
    pub fn truncate(&mut self, n: usize) {
        self.v.truncate(n);
    }

    /// Keeps the `k` best candidates, sorted.
    pub fn top_k(&mut self, k: usize) {
        if k < self.v.len() {
            if !self.sorted {
                self.v.select_nth_unstable_by(k - 1, by_logit_desc);
                self.identity = false;
            }
            self.v.truncate(k);
        }
        self.sort();
    }

    /// Applies the pending temperature to the logits themselves.
    pub fn materialize(&mut self) {
        if self.scale != 1.0 {
            for c in &mut self.v {
                c.1 = (f64::from(c.1) * self.scale) as f32;
                if c.1.is_nan() {
                    c.1 = f32::NEG_INFINITY;
                }
            }
            self.scale = 1.0;
            // Rounding may have made ties whose ids are out of order.
            self.sorted = false;
        }
    }

    /// Changes the logits of the tokens in `deltas` with `f(logit, delta)`.
    pub fn adjust<D: Copy>(&mut self, deltas: &HashMap<u32, D>, f: impl Fn(&mut f32, D)) {
        if deltas.is_empty() {
            return;
        }
        self.materialize();
        let apply = |l: &mut f32, d: D| {
            f(l, d);
            if l.is_nan() {
                *l = f32::NEG_INFINITY;
            }
        };
        if self.identity {
            for (&id, &d) in deltas {
                if let Some(c) = self.v.get_mut(id as usize) {
                    apply(&mut c.1, d);
                }
            }
        } else {
            for c in &mut self.v {
                if let Some(&d) = deltas.get(&c.0) {
                    apply(&mut c.1, d);
                }
            }
        }
        self.sorted = false;
    }

    /// The largest logit.
    pub fn max_logit(&self) -> f32 {
        if self.sorted {
            self.v[0].1
        } else {
            self.v.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1))
        }
    }

    /// The softmax of the effective logits, in the candidates' order; `None` when it is not a
    /// distribution (every logit `-inf`, or an infinite one).
    pub fn probs(&self) -> Option<Vec<f64>> {
        let max = self.max_logit();
        let w: Vec<f64> = self
            .v
            .iter()
            .map(|c| (f64::from(c.1 - max) * self.scale).exp())
            .collect();
        let total: f64 = w.iter().sum();
        if !(total.is_finite() && total > 0.0) {
            return None;
        }
        Some(w.into_iter().map(|x| x / total).collect())
    }

    /// Index of the most likely candidate; the lowest id wins ties.
    pub fn argmax(&self) -> usize {
        let mut best = 0;
        for (i, c) in self.v.iter().enumerate().skip(1) {
            let b = self.v[best];
            if c.1 > b.1 || (c.1 == b.1 && c.0 < b.0) {
                best = i;
            }
        }
        best
    }

    /// Keeps only the candidate at `i`.
    pub fn keep_only(&mut self, i: usize) {
        let c = self.v[i];
        self.v.clear();
        self.v.push(c);
        self.sorted = true;
        self.identity = c.0 == 0;
    }
}
