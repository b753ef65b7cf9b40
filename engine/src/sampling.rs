//! Picking the next token from logits: penalties, then top-k, top-p, min-p, temperature and a
//! seeded draw, in the order of llama.cpp's default sampler chain.
//!
//! The random numbers come from xoshiro256** (Blackman and Vigna), seeded by expanding the `u64`
//! seed with SplitMix64. Its whole state is four `u64`s, which [`Sampler::rng_state`] exposes as
//! 32 little-endian bytes so that a checkpoint can resume the exact same stream.

#![forbid(unsafe_code)]

use std::collections::HashMap;

use crate::{Error, Result};

/// Sampling settings. Each filter has an "off" value.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    /// Softmax temperature; `<= 0` means greedy (argmax after penalties).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1 = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 = off.
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens by this; 1 = off.
    pub repeat_penalty: f32,
    /// How many of the most recent history tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtract `count * frequency_penalty` from the logit of each recent token; 0 = off.
    pub frequency_penalty: f32,
    /// Subtract this from the logit of each token seen recently; 0 = off.
    pub presence_penalty: f32,
    /// Seed of the random stream.
    pub seed: u64,
}

impl Default for SamplerParams {
    /// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalties
    /// (over the last 64 tokens when enabled), seed `0xFFFF_FFFF`.
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0xFFFF_FFFF,
        }
    }
}

impl SamplerParams {
    /// Always the most likely token: temperature 0 and every filter and penalty off.
    pub fn greedy() -> Self {
        SamplerParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
        }
    }
}

/// xoshiro256**: a small, fast generator with a 256-bit state.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    fn from_seed(seed: u64) -> Self {
        // SplitMix64 expands the seed; it never yields the all-zero state from four outputs.
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Xoshiro256 {
            s: [next(), next(), next(), next()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A token sampler with its own random stream.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplerParams,
    rng: Xoshiro256,
    /// Scratch space reused between calls: (token, logit).
    cands: Vec<(u32, f32)>,
}

/// Number of bytes in [`Sampler::rng_state`].
pub const RNG_STATE_LEN: usize = 32;

impl Sampler {
    /// A sampler whose random stream starts from `params.seed`.
    pub fn new(params: SamplerParams) -> Sampler {
        Sampler {
            rng: Xoshiro256::from_seed(params.seed),
            params,
            cands: Vec::new(),
        }
    }

    /// The settings.
    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Picks a token from `logits` (one per vocabulary entry). Penalties look at the last
    /// `repeat_last_n` ids of `history`. The same seed, logits and history give the same token.
    ///
    /// # Panics
    /// If `logits` is empty.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        assert!(!logits.is_empty(), "sample needs at least one logit");
        let p = &self.params;
        let mut logits_buf;
        let mut logits = logits;
        let penalize =
            p.repeat_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0;
        if penalize && p.repeat_last_n > 0 && !history.is_empty() {
            logits_buf = logits.to_vec();
            apply_penalties(&mut logits_buf, history, p);
            logits = &logits_buf;
        }

        if p.temperature <= 0.0 {
            return argmax(logits);
        }

        let cands = &mut self.cands;
        cands.clear();
        cands.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, if l.is_nan() { f32::NEG_INFINITY } else { l })),
        );
        let by_logit_desc =
            |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));

        // top-k, leaving the kept candidates sorted by descending logit.
        let k = if p.top_k == 0 {
            cands.len()
        } else {
            p.top_k.min(cands.len())
        };
        if k < cands.len() {
            cands.select_nth_unstable_by(k - 1, by_logit_desc);
            cands.truncate(k);
        }
        cands.sort_unstable_by(by_logit_desc);

        // top-p over the softmax at temperature 1.
        if p.top_p < 1.0 {
            let max = cands[0].1;
            let total: f64 = cands.iter().map(|c| f64::from(c.1 - max).exp()).sum();
            let mut cum = 0.0;
            let mut keep = cands.len();
            for (i, c) in cands.iter().enumerate() {
                cum += f64::from(c.1 - max).exp() / total;
                if cum >= f64::from(p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep.max(1));
        }

        // min-p: p(token) >= min_p * p(best) is logit >= best + ln(min_p).
        if p.min_p > 0.0 {
            let threshold = cands[0].1 + p.min_p.ln();
            let keep = cands.iter().take_while(|c| c.1 >= threshold).count();
            cands.truncate(keep.max(1));
        }

        // Temperature, softmax and the draw.
        let max = cands[0].1;
        let inv_t = 1.0 / f64::from(p.temperature);
        let weights: Vec<f64> = cands
            .iter()
            .map(|c| (f64::from(c.1 - max) * inv_t).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut target = self.rng.next_f64() * total;
        for (c, w) in cands.iter().zip(&weights) {
            if target < *w {
                return c.0;
            }
            target -= w;
        }
        // Rounding left the target past the end: the last candidate with any weight.
        cands
            .iter()
            .zip(&weights)
            .rev()
            .find(|(_, &w)| w > 0.0)
            .map_or(cands[0].0, |(c, _)| c.0)
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
}

/// Index of the largest logit; the lowest index wins ties, NaN never wins.
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// llama.cpp's penalties: for each distinct token among the last `repeat_last_n` of `history`,
/// scale by `repeat_penalty` (divide if positive, multiply if not), then subtract
/// `count * frequency_penalty + presence_penalty`.
fn apply_penalties(logits: &mut [f32], history: &[u32], p: &SamplerParams) {
    let recent = &history[history.len().saturating_sub(p.repeat_last_n)..];
    let mut counts: HashMap<u32, u32> = HashMap::with_capacity(recent.len());
    for &id in recent {
        *counts.entry(id).or_insert(0) += 1;
    }
    for (id, count) in counts {
        let Some(l) = logits.get_mut(id as usize) else {
            continue;
        };
        if *l <= 0.0 {
            *l *= p.repeat_penalty;
        } else {
            *l /= p.repeat_penalty;
        }
        *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
    }
}
