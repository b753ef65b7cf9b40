//! Speculative decoding: drafts of the next few tokens, from repetition ([`ngram`]) or from a
//! smaller model ([`DraftModel`]), verified in one batch of the target model.
//!
//! Verification samples the target at every drafted position in order and keeps each draft
//! token only while it equals what the target sampled ([`accept`]): every output token is
//! one draw from the target's own distribution, with the sampler's random stream consumed
//! exactly as without speculation. With batch-invariant evaluation (the default), a token's
//! logits are the same whether it was verified in a batch of drafts or decoded alone, so the
//! output is the same tokens as without speculation, at any temperature and seed.

mod draft;
pub mod ngram;

pub use draft::DraftModel;
pub use ngram::{NgramParams, TokenHistory};

pub use draft::DraftRequest;

/// Verifies `draft`: `sample(j)` draws the target's token after the pending token and
/// `draft[..j]` (row `j` of the verifying batch), and is called for j = 0, 1, … in order while
/// each draw equals `draft[j]`. Returns the draws: the accepted draft tokens, then the one
/// that replaced the first rejected token (or followed a draft accepted whole), so always at
/// least one token and at most `draft.len() + 1`.
pub fn accept<E>(
    draft: &[u32],
    mut sample: impl FnMut(usize) -> Result<u32, E>,
) -> Result<Vec<u32>, E> {
    let mut out = Vec::with_capacity(draft.len() + 1);
    for j in 0..=draft.len() {
        let token = sample(j)?;
        out.push(token);
        if draft.get(j) != Some(&token) {
            break;
        }
    }
    Ok(out)
}

/// llama-server's synthetic acceptance (`--spec-synth-rates`), for benchmarks only: draft
/// token `j` is kept with probability `rates[j]` in all (so `rates[j] / rates[j-1]` once the
/// ones before it were kept), whatever the target drew; the output is then not the model's.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthAcceptance {
    /// Probability of keeping token `j` once the tokens before it were kept.
    keep: Vec<f64>,
}

impl SynthAcceptance {
    /// From the unconditional rates, one per draft position: each in [0, 1] and none above
    /// the one before it.
    pub fn from_rates(rates: &[f64]) -> Result<SynthAcceptance, String> {
        if rates.is_empty() {
            return Err("synthetic acceptance needs at least one rate".into());
        }
        if rates.iter().any(|r| !(0.0..=1.0).contains(r)) {
            return Err("synthetic acceptance rates must be within [0, 1]".into());
        }
        if rates.windows(2).any(|w| w[1] > w[0]) {
            return Err("synthetic acceptance rates must not increase".into());
        }
        let keep = rates
            .iter()
            .enumerate()
            .map(|(j, &r)| {
                let before = if j == 0 { 1.0 } else { rates[j - 1] };
                if before > 0.0 {
                    r / before
                } else {
                    0.0
                }
            })
            .collect();
        Ok(SynthAcceptance { keep })
    }

    /// Draft positions it has rates for (drafts are cut to this).
    pub fn len(&self) -> usize {
        self.keep.len()
    }

    /// Always false: [`SynthAcceptance::from_rates`] refuses no rates.
    pub fn is_empty(&self) -> bool {
        self.keep.is_empty()
    }

    /// Like [`accept`], but draft token `j` is kept when `uniform()` (a draw in [0, 1)) falls
    /// below its keep probability, unless `is_eog` says it ends the generation; the target's
    /// draw at `j` is still made (and is the token taken when the draft token is not).
    pub fn accept<E>(
        &self,
        draft: &[u32],
        mut uniform: impl FnMut() -> f64,
        is_eog: impl Fn(u32) -> bool,
        mut sample: impl FnMut(usize) -> Result<u32, E>,
    ) -> Result<Vec<u32>, E> {
        let mut out = Vec::with_capacity(draft.len() + 1);
        for (j, &d) in draft.iter().enumerate() {
            let drawn = sample(j)?;
            let keep = self.keep.get(j).is_some_and(|&p| uniform() < p);
            if keep && !is_eog(d) {
                out.push(d);
            } else {
                out.push(drawn);
                return Ok(out);
            }
        }
        out.push(sample(draft.len())?);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{accept, SynthAcceptance};

    /// A target that draws `truth[j]` at row `j`, recording the rows asked for.
    fn target<'a>(
        truth: &'a [u32],
        asked: &'a mut Vec<usize>,
    ) -> impl FnMut(usize) -> Result<u32, ()> + 'a {
        move |j| {
            asked.push(j);
            Ok(truth[j])
        }
    }

    #[test]
    fn accept_keeps_draft_tokens_while_they_match() {
        let mut asked = Vec::new();
        let out = accept(&[5, 6, 7], target(&[5, 6, 9, 1], &mut asked)).unwrap();
        assert_eq!(out, [5, 6, 9]);
        assert_eq!(asked, [0, 1, 2]);
        let mut asked = Vec::new();
        let out = accept(&[5, 6], target(&[5, 6, 8], &mut asked)).unwrap();
        assert_eq!(out, [5, 6, 8], "a draft accepted whole gets one token more");
        let mut asked = Vec::new();
        let out = accept(&[], target(&[3], &mut asked)).unwrap();
        assert_eq!(out, [3]);
        let mut asked = Vec::new();
        let out = accept(&[4, 6], target(&[5, 6, 7], &mut asked)).unwrap();
        assert_eq!(out, [5]);
        assert_eq!(asked, [0], "nothing is drawn after the first rejection");
    }

    #[test]
    fn synthetic_rates_are_checked_and_made_conditional() {
        assert!(SynthAcceptance::from_rates(&[]).is_err());
        assert!(SynthAcceptance::from_rates(&[0.5, 0.6]).is_err());
        assert!(SynthAcceptance::from_rates(&[1.2]).is_err());
        let s = SynthAcceptance::from_rates(&[0.8, 0.4, 0.0]).unwrap();
        assert_eq!(s.keep, [0.8, 0.5, 0.0]);
        let z = SynthAcceptance::from_rates(&[0.0, 0.0]).unwrap();
        assert_eq!(z.keep, [0.0, 0.0]);
    }

    #[test]
    fn synthetic_acceptance_ignores_the_target_but_not_an_end() {
        let all = SynthAcceptance::from_rates(&[1.0, 1.0, 1.0]).unwrap();
        let mut asked = Vec::new();
        let out = all
            .accept(
                &[5, 6, 7],
                || 0.5,
                |_| false,
                target(&[1, 2, 3, 4], &mut asked),
            )
            .unwrap();
        assert_eq!(out, [5, 6, 7, 4]);
        let mut asked = Vec::new();
        let out = all
            .accept(
                &[5, 6, 7],
                || 0.5,
                |t| t == 6,
                target(&[1, 2, 3, 4], &mut asked),
            )
            .unwrap();
        assert_eq!(out, [5, 2], "a drafted end of generation is never kept");
        let none = SynthAcceptance::from_rates(&[0.0, 0.0]).unwrap();
        let mut asked = Vec::new();
        let out = none
            .accept(&[1, 2], || 0.0, |_| false, target(&[1, 2, 3], &mut asked))
            .unwrap();
        assert_eq!(
            out,
            [1],
            "rate 0 keeps nothing, even a draft token the target agrees with"
        );
    }
}
