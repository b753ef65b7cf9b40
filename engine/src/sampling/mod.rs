//! Picking the next token from logits with llama.cpp's sampler chain: logit biases, then the
//! configurable chain of steps (by default penalties, DRY, top-n-sigma, top-k, typical-p,
//! top-p, min-p, XTC, temperature) and a seeded draw; or mirostat.
//!
//! The random numbers come from xoshiro256** (Blackman and Vigna), seeded by expanding the `u64`
//! seed with SplitMix64. Its whole state is four `u64`s, which [`Sampler::rng_state`] exposes as
//! 32 little-endian bytes so that a checkpoint can resume the exact same stream. The draw and
//! XTC share that one stream; XTC only uses it when it is on. Mirostat's running estimate is
//! separate: [`Sampler::mirostat_mu`].

#![forbid(unsafe_code)]

mod cands;
mod dry;
mod params;
mod rng;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_params;

use std::collections::HashMap;

use crate::{Error, Result};
use cands::Cands;
use rng::Xoshiro256;

pub use dry::dry_breakers_from_strings;
pub use params::{
    sampler_chain_from_letters, sampler_chain_from_names, InvalidSamplerParam, SamplerKind,
    SamplerParams, DEFAULT_DRY_SEQUENCE_BREAKERS,
};

/// Number of bytes in [`Sampler::rng_state`].
pub const RNG_STATE_LEN: usize = 32;

/// Mirostat 1's number of top tokens for its estimate of the distribution's exponent.
const MIROSTAT_M: usize = 100;

/// Where [`Sampler::sample_detailed`] takes its probabilities from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ProbsMode {
    /// The candidates left by the chain, with the probabilities of the draw (llama-server's
    /// `post_sampling_probs: true`).
    #[default]
    PostSampling,
    /// The softmax of the raw logits, before biases, penalties and filters (llama-server's
    /// default, `post_sampling_probs: false`, and OpenAI's `logprobs`).
    PreSampling,
}

/// A candidate token and its probability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenProb {
    /// The token.
    pub id: u32,
    /// Its probability, in [0, 1].
    pub prob: f32,
    /// Its natural log, computed without going through `prob` (so it stays finite when `prob`
    /// underflows); `-inf` for a token that cannot be drawn.
    pub logprob: f32,
}

/// A token picked by [`Sampler::sample_detailed`], with probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// The token picked.
    pub token: u32,
    /// The token's own probability and log-probability.
    pub prob: TokenProb,
    /// The most likely tokens, most likely first (then lowest id), at most `n_probs` of them;
    /// after sampling, only tokens with a probability above 0.
    pub top: Vec<TokenProb>,
}

/// A token sampler with its own random stream and mirostat state.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplerParams,
    rng: Xoshiro256,
    /// Mirostat's running maximum surprise.
    mu: f32,
    /// DRY's sequence breakers by first token.
    breakers: dry::Breakers,
    /// Scratch space reused between calls.
    cands: Cands,
    /// The last draw's unnormalised weights, one per candidate, and their sum.
    weights: Vec<f64>,
    total: f64,
}

impl Sampler {
    /// A sampler whose random stream starts from `params.seed`. The settings are not checked:
    /// see [`SamplerParams::check`].
    pub fn new(params: SamplerParams) -> Sampler {
        Sampler {
            rng: Xoshiro256::from_seed(params.seed),
            mu: 2.0 * params.mirostat_tau,
            breakers: dry::index_breakers(&params.dry_sequence_breakers),
            params,
            cands: Cands::default(),
            weights: Vec::new(),
            total: 0.0,
        }
    }

    /// The settings.
    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Picks a token from `logits` (one per vocabulary entry). The penalties and DRY look at
    /// the end of `history`. The same seed, logits and history give the same token.
    ///
    /// # Panics
    /// If `logits` is empty.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        self.pick(logits, history)
    }

    /// Picks a token like [`sample`](Self::sample) and returns it with the `n_probs` most
    /// likely candidates left by the chain and their probabilities (the top of the softmax of
    /// the logits when sampling is greedy).
    pub fn sample_with_probs(
        &mut self,
        logits: &[f32],
        history: &[u32],
        n_probs: usize,
    ) -> (u32, Vec<(u32, f32)>) {
        let s = self.sample_detailed(logits, history, n_probs, ProbsMode::PostSampling);
        (s.token, s.top.iter().map(|t| (t.id, t.prob)).collect())
    }

    /// Picks a token like [`sample`](Self::sample) (same token, same random stream) and reports
    /// its probability and the `n_probs` most likely tokens, taken from `mode`. When sampling
    /// is greedy (a temperature `<= 0`), both modes report the softmax of the raw logits, as
    /// llama-server does.
    pub fn sample_detailed(
        &mut self,
        logits: &[f32],
        history: &[u32],
        n_probs: usize,
        mode: ProbsMode,
    ) -> Sampled {
        let token = self.pick(logits, history);
        if mode == ProbsMode::PreSampling || self.cands.greedy {
            let (prob, top) = softmax_report(logits, token, n_probs);
            return Sampled { token, prob, top };
        }
        // The candidates are in draw order: by logit, so by probability.
        let ln_total = self.total.ln();
        let entry = |(c, &w): (&(u32, f32), &f64)| TokenProb {
            id: c.0,
            prob: (w / self.total) as f32,
            logprob: if w > 0.0 {
                (w.ln() - ln_total) as f32
            } else {
                f32::NEG_INFINITY
            },
        };
        let all = self.cands.v.iter().zip(&self.weights);
        let prob = all
            .clone()
            .find(|(c, _)| c.0 == token)
            .map(entry)
            .unwrap_or(TokenProb {
                id: token,
                prob: 0.0,
                logprob: f32::NEG_INFINITY,
            });
        let top = all
            .take(n_probs)
            .map(entry)
            .take_while(|t| t.prob > 0.0)
            .collect();
        Sampled { token, prob, top }
    }

    /// Mirostat's current maximum surprise (mu), `2 * mirostat_tau` at first. Save it with
    /// [`rng_state`](Self::rng_state) to resume a mirostat stream exactly.
    pub fn mirostat_mu(&self) -> f32 {
        self.mu
    }

    /// Restores mirostat's mu from [`mirostat_mu`](Self::mirostat_mu).
    pub fn set_mirostat_mu(&mut self, mu: f32) {
        self.mu = mu;
    }

    /// The random stream's state as 32 opaque bytes.
    pub fn rng_state(&self) -> Vec<u8> {
        self.rng.s.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// Restores a state from [`rng_state`](Self::rng_state); the following samples are then
    /// identical to those the saved sampler would have drawn.
    pub fn set_rng_state(&mut self, state: &[u8]) -> Result<()> {
        if state.len() != RNG_STATE_LEN {
            return Err(Error::RngState { len: state.len() });
        }
        let mut s = [0u64; 4];
        for (w, chunk) in s.iter_mut().zip(state.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *w = u64::from_le_bytes(b);
        }
        if s == [0; 4] {
            // The all-zero state is a fixed point of xoshiro: never a saved state.
            return Err(Error::RngState { len: state.len() });
        }
        self.rng.s = s;
        Ok(())
    }

    /// Runs the logit biases and the chain (or mirostat) and draws; leaves the final
    /// candidates in `self.cands` and, unless greedy, the draw's weights in `self.weights`.
    fn pick(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        assert!(!logits.is_empty(), "sample needs at least one logit");
        self.cands.fill(logits);
        self.weights.clear();
        self.apply_logit_bias();

        if self.params.mirostat != 0 {
            self.temperature(false);
            return self.mirostat(logits.len());
        }

        let chain = std::mem::take(&mut self.params.samplers);
        let skip_from = self.greedy_shortcut(&chain);
        for (i, &kind) in chain.iter().enumerate() {
            if self.cands.greedy {
                break;
            }
            let filter = matches!(
                kind,
                SamplerKind::TopK | SamplerKind::TopP | SamplerKind::MinP | SamplerKind::TopNSigma
            );
            if filter && i >= skip_from {
                continue;
            }
            self.step(kind, history);
        }
        self.params.samplers = chain;

        let i = self.draw();
        self.cands.v[i].0
    }

    /// With a greedy end (a temperature step at `<= 0`), the filters that always keep the most
    /// likely token change nothing once no step before the temperature can move it: the index
    /// from which those filters are skipped (`usize::MAX` when none are).
    fn greedy_shortcut(&self, chain: &[SamplerKind]) -> usize {
        let p = &self.params;
        let greedy = p.temperature <= 0.0 && p.dynatemp_range <= 0.0;
        if !greedy {
            return usize::MAX;
        }
        let Some(t) = chain.iter().position(|&k| k == SamplerKind::Temperature) else {
            return usize::MAX;
        };
        let disturbs = |k: SamplerKind| match k {
            SamplerKind::Penalties => penalties_on(p),
            SamplerKind::Dry => p.dry_multiplier != 0.0,
            SamplerKind::TypicalP => p.typical_p < 1.0,
            SamplerKind::Xtc => p.xtc_probability > 0.0,
            _ => false,
        };
        chain[..t]
            .iter()
            .rposition(|&k| disturbs(k))
            .map_or(0, |last| last + 1)
    }

    fn step(&mut self, kind: SamplerKind, history: &[u32]) {
        let p = &self.params;
        match kind {
            SamplerKind::Penalties => {
                if penalties_on(p) && p.repeat_last_n > 0 && !history.is_empty() {
                    let recent = &history[history.len().saturating_sub(p.repeat_last_n)..];
                    let mut counts: HashMap<u32, u32> = HashMap::with_capacity(recent.len());
                    for &id in recent {
                        *counts.entry(id).or_insert(0) += 1;
                    }
                    let (rp, fp, pp) = (p.repeat_penalty, p.frequency_penalty, p.presence_penalty);
                    self.cands.adjust(&counts, |l, count| {
                        if *l <= 0.0 {
                            *l *= rp;
                        } else {
                            *l /= rp;
                        }
                        *l -= count as f32 * fp + pp;
                    });
                }
            }
            SamplerKind::Dry => {
                let pen = dry::penalties(history, p, &self.breakers);
                self.cands.adjust(&pen, |l, d| *l -= d);
            }
            SamplerKind::TopNSigma => self.top_n_sigma(),
            SamplerKind::TopK => {
                if p.top_k > 0 {
                    self.cands.top_k(p.top_k);
                }
            }
            SamplerKind::TypicalP => self.typical(),
            SamplerKind::TopP => self.top_p(),
            SamplerKind::MinP => self.min_p(),
            SamplerKind::Xtc => self.xtc(),
            SamplerKind::Temperature => self.temperature(true),
            SamplerKind::Infill => {}
        }
    }

    fn apply_logit_bias(&mut self) {
        let bias = &self.params.logit_bias;
        if bias.is_empty() {
            return;
        }
        // The candidates are the whole vocabulary, in id order.
        for &(id, b) in bias {
            if let Some(c) = self.cands.v.get_mut(id as usize) {
                c.1 += b;
                if c.1.is_nan() {
                    c.1 = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Keeps the tokens whose logit is within `top_n_sigma` standard deviations of the best.
    fn top_n_sigma(&mut self) {
        let n = self.params.top_n_sigma;
        let c = &mut self.cands;
        if n <= 0.0 || c.len() <= 1 {
            return;
        }
        // The bound scales with the logits, so the pending temperature does not matter.
        let finite = c.v.iter().map(|x| f64::from(x.1)).filter(|l| l.is_finite());
        let (count, sum) = finite
            .clone()
            .fold((0usize, 0.0), |(n, s), l| (n + 1, s + l));
        if count == 0 {
            return;
        }
        let mean = sum / count as f64;
        let var = finite.clone().map(|l| (l - mean).powi(2)).sum::<f64>() / count as f64;
        let max = finite.fold(f64::NEG_INFINITY, f64::max);
        let bound = max - f64::from(n) * var.sqrt();
        let kept = c.v.iter().filter(|x| f64::from(x.1) >= bound).count();
        let min_keep = self.params.min_keep.min(c.len());
        if kept == c.len() {
            return;
        }
        if kept >= min_keep {
            c.v.retain(|x| f64::from(x.1) >= bound);
            c.identity = false;
        } else {
            c.top_k(min_keep);
        }
    }

    /// Locally typical sampling.
    fn typical(&mut self) {
        let p = &self.params;
        let c = &mut self.cands;
        if p.typical_p >= 1.0 || c.len() <= 1 {
            return;
        }
        c.sort();
        let Some(probs) = c.probs() else {
            return;
        };
        let entropy: f64 = probs
            .iter()
            .filter(|&&q| q > 0.0)
            .map(|&q| -q * q.ln())
            .sum();
        let score = |q: f64| {
            if q > 0.0 {
                (-q.ln() - entropy).abs()
            } else {
                f64::INFINITY
            }
        };
        let mut order: Vec<usize> = (0..c.len()).collect();
        order.sort_by(|&a, &b| score(probs[a]).total_cmp(&score(probs[b])));
        let mut keep = order.len();
        let mut cum = 0.0;
        for (i, &idx) in order.iter().enumerate() {
            cum += probs[idx];
            if cum > f64::from(p.typical_p) && i + 1 >= p.min_keep {
                keep = i + 1;
                break;
            }
        }
        c.v = order[..keep].iter().map(|&i| c.v[i]).collect();
        c.sorted = false;
        c.identity = false;
    }

    /// Top-p over the softmax of the current (effective) logits.
    fn top_p(&mut self) {
        let p = &self.params;
        let c = &mut self.cands;
        if p.top_p >= 1.0 {
            return;
        }
        c.sort();
        let Some(probs) = c.probs() else {
            return;
        };
        let mut cum = 0.0;
        let mut keep = c.len();
        for (i, q) in probs.iter().enumerate() {
            cum += q;
            if cum >= f64::from(p.top_p) && i + 1 >= p.min_keep {
                keep = i + 1;
                break;
            }
        }
        c.truncate(keep.max(1));
    }

    /// Min-p: p(token) >= min_p * p(best) is logit >= best + ln(min_p) (at temperature 1).
    fn min_p(&mut self) {
        let p = &self.params;
        let c = &mut self.cands;
        if p.min_p <= 0.0 {
            return;
        }
        c.sort();
        let keep = if c.scale == 1.0 {
            let threshold = c.v[0].1 + p.min_p.ln();
            c.v.iter().take_while(|x| x.1 >= threshold).count()
        } else {
            let threshold = f64::from(c.v[0].1) + f64::from(p.min_p).ln() / c.scale;
            c.v.iter()
                .take_while(|x| f64::from(x.1) >= threshold)
                .count()
        };
        c.truncate(keep.max(p.min_keep).max(1));
    }

    /// XTC: with probability `xtc_probability`, removes every token at least `xtc_threshold`
    /// likely but the least likely of them.
    fn xtc(&mut self) {
        let p = &self.params;
        if p.xtc_probability <= 0.0 || p.xtc_threshold > 0.5 || self.cands.len() < 2 {
            return;
        }
        if self.rng.next_f64() > f64::from(p.xtc_probability) {
            return;
        }
        let c = &mut self.cands;
        c.sort();
        let Some(probs) = c.probs() else {
            return;
        };
        let above = probs
            .iter()
            .take_while(|&&q| q >= f64::from(p.xtc_threshold))
            .count();
        let drop = above.saturating_sub(1);
        if drop > 0 && c.len() - drop >= p.min_keep {
            c.v.drain(..drop);
            c.identity = false;
        }
    }

    /// Temperature: greedy at `<= 0`; dynamic when `dynamic` and `dynatemp_range > 0`.
    fn temperature(&mut self, dynamic: bool) {
        let p = &self.params;
        let c = &mut self.cands;
        let mut t = f64::from(p.temperature);
        if dynamic && p.dynatemp_range > 0.0 {
            if c.len() <= 1 {
                return;
            }
            let lo = (t - f64::from(p.dynatemp_range)).max(0.0);
            let hi = t + f64::from(p.dynatemp_range);
            let Some(probs) = c.probs() else {
                return;
            };
            let entropy: f64 = probs
                .iter()
                .filter(|&&q| q > 0.0)
                .map(|&q| -q * q.ln())
                .sum();
            let normalized = entropy / (c.len() as f64).ln();
            t = lo + (hi - lo) * normalized.powf(f64::from(p.dynatemp_exponent));
        }
        if t <= 0.0 {
            let best = c.argmax();
            c.keep_only(best);
            c.greedy = true;
        } else {
            c.scale *= 1.0 / t;
        }
    }

    /// Mirostat 1 or 2 on the candidates: truncates, draws, and updates mu from the surprise
    /// of the token drawn.
    fn mirostat(&mut self, n_vocab: usize) -> u32 {
        let c = &mut self.cands;
        c.sort();
        if !c.greedy {
            if let Some(probs) = c.probs() {
                let mu = f64::from(self.mu);
                let keep = if self.params.mirostat == 1 {
                    mirostat1_k(&probs, mu, n_vocab)
                } else {
                    // Tokens more surprising than mu go.
                    probs.iter().take_while(|&&q| -q.log2() <= mu).count()
                };
                c.truncate(keep.max(1));
            }
        }
        let i = self.draw();
        let surprise = if self.cands.greedy || self.weights.is_empty() {
            0.0
        } else {
            -(self.weights[i] / self.total).log2()
        };
        let e = surprise - f64::from(self.params.mirostat_tau);
        self.mu = (f64::from(self.mu) - f64::from(self.params.mirostat_eta) * e) as f32;
        self.cands.v[i].0
    }

    /// Draws a candidate, in [`cands::by_logit_desc`] order, with weight
    /// `exp((logit - max) * scale)`; returns its index. Greedy: the single candidate, without
    /// touching the random stream.
    fn draw(&mut self) -> usize {
        let c = &mut self.cands;
        if c.greedy {
            return 0;
        }
        c.sort();
        let max = c.v[0].1;
        let scale = c.scale;
        self.weights.clear();
        self.weights
            .extend(c.v.iter().map(|x| (f64::from(x.1 - max) * scale).exp()));
        let total: f64 = self.weights.iter().sum();
        self.total = total;
        let mut target = self.rng.next_f64() * total;
        for (i, w) in self.weights.iter().enumerate() {
            if target < *w {
                return i;
            }
            target -= w;
        }
        // Rounding left the target past the end: the last candidate with any weight.
        self.weights.iter().rposition(|&w| w > 0.0).unwrap_or(0)
    }
}

/// Whether any of the repeat, frequency and presence penalties is on.
fn penalties_on(p: &SamplerParams) -> bool {
    p.repeat_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0
}

/// Mirostat 1's number of candidates to keep: from the Zipf exponent estimated over the top
/// [`MIROSTAT_M`] probabilities (sorted, descending) and the target surprise `mu`.
fn mirostat1_k(probs: &[f64], mu: f64, n_vocab: usize) -> usize {
    let (mut num, mut den) = (0.0, 0.0);
    for i in 0..(MIROSTAT_M - 1).min(probs.len().saturating_sub(1)) {
        let t = ((i + 2) as f64 / (i + 1) as f64).ln();
        let b = (probs[i] / probs[i + 1]).ln();
        if b.is_finite() {
            num += t * b;
            den += t * t;
        }
    }
    let s_hat = num / den;
    let eps = s_hat - 1.0;
    let k = ((eps * 2f64.powf(mu)) / (1.0 - (n_vocab as f64).powf(-eps))).powf(1.0 / s_hat);
    if k.is_finite() {
        (k as usize).clamp(1, probs.len())
    } else {
        probs.len()
    }
}

/// The probability of `token` and the `n` most likely tokens under the softmax of `logits`
/// (NaN counted as `-inf`).
fn softmax_report(logits: &[f32], token: u32, n: usize) -> (TokenProb, Vec<TokenProb>) {
    let clean = |l: f32| if l.is_nan() { f32::NEG_INFINITY } else { l };
    let max = logits
        .iter()
        .fold(f32::NEG_INFINITY, |m, &l| m.max(clean(l)));
    let total: f64 = logits
        .iter()
        .map(|&l| f64::from(clean(l) - max).exp())
        .sum();
    let valid = total.is_finite() && total > 0.0;
    let ln_total = total.ln();
    let entry = |id: u32| {
        let x = f64::from(clean(logits[id as usize]) - max);
        if valid && x > f64::NEG_INFINITY {
            TokenProb {
                id,
                prob: (x.exp() / total) as f32,
                logprob: (x - ln_total) as f32,
            }
        } else {
            TokenProb {
                id,
                prob: 0.0,
                logprob: f32::NEG_INFINITY,
            }
        }
    };
    let n = n.min(logits.len());
    let mut top: Vec<(u32, f32)> = Vec::new();
    if n > 0 {
        top = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, clean(l)))
            .collect();
        if n < top.len() {
            top.select_nth_unstable_by(n - 1, cands::by_logit_desc);
            top.truncate(n);
        }
        top.sort_unstable_by(cands::by_logit_desc);
    }
    (
        entry(token),
        top.into_iter().map(|(id, _)| entry(id)).collect(),
    )
}
