//! Sampling a request's next token (with its grammar) and sending its text as it is made.

use engine::sampling::ProbsMode;

use super::{Active, Chunk, Event, TokenProbs};
use crate::error::{Result, ServerError};

/// Samples the next token of `a`: with its grammar, a token the grammar refuses is drawn
/// again from the logits the grammar allows; the grammar then takes the token.
pub(super) fn pick(
    a: &mut Active,
    logits: &[f32],
    history: &[u32],
) -> Result<(u32, Option<TokenProbs>)> {
    let grammar_error = |e: engine::Error| ServerError::BadRequest(format!("the output's {e}"));
    let draw = |a: &mut Active, logits: &[f32]| match a.params.n_probs {
        None => (a.sampler.sample(logits, history), None),
        Some(n) => {
            let mode = if a.params.post_sampling_probs {
                ProbsMode::PostSampling
            } else {
                ProbsMode::PreSampling
            };
            let s = a.sampler.sample_detailed(logits, history, n, mode);
            (s.token, Some(s))
        }
    };
    let (mut token, mut probs) = draw(a, logits);
    if let Some(mut c) = a.constraint.take() {
        let allowed = c.is_allowed(token).map_err(grammar_error);
        let result = match allowed {
            Ok(true) => Ok(()),
            Ok(false) => {
                let mut masked = logits.to_vec();
                c.mask_logits(&mut masked).map_err(grammar_error).map(|()| {
                    (token, probs) = draw(a, &masked);
                })
            }
            Err(e) => Err(e),
        };
        let result = result.and_then(|()| c.accept(token).map_err(grammar_error));
        a.constraint = Some(c);
        result?;
    }
    Ok((token, probs))
}

/// Sends the text of `a` up to byte `upto` that was not sent yet.
pub(super) fn flush_text(a: &mut Active, upto: usize) {
    if upto > a.sent {
        let _ = a.events.send(Event::Text(Chunk {
            text: a.text[a.sent..upto].to_owned(),
            tokens: std::mem::take(&mut a.unsent),
            probs: std::mem::take(&mut a.unsent_probs),
        }));
        a.sent = upto;
    }
}
