//! SentencePiece (`tokenizer.ggml.model = "llama"`): spaces become `▁`, the text is split into
//! characters, and the adjacent pair whose concatenation is the vocabulary token with the highest
//! score is merged (ties leftmost) with the shared [`merge`](super::merge) loop. Characters that
//! never form a token are emitted as `<0xXX>` byte tokens.

use super::merge::{MergeRule, Merger, Score};
use super::Tokenizer;
use crate::error::TokenizerError;
use crate::{Error, Result};

/// SentencePiece merges: a pair merges when the joined text is a token; higher scores first.
struct SpmRule<'t>(&'t Tokenizer);

impl MergeRule for SpmRule<'_> {
    type Priority = Score;
    type Tag = ();

    fn tag(&self, _text: &str) {}

    fn priority(&self, _left: (), _right: (), joined: &str) -> Option<Score> {
        let id = *self.0.token_to_id.get(joined)?;
        Some(Score(self.0.tokens[id as usize].score))
    }
}

impl Tokenizer {
    /// SentencePiece merging of one whitespace-escaped fragment.
    pub(super) fn spm_encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        Merger::default().merge_word(&SpmRule(self), text, |piece| {
            match self.token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        out.push(self.byte_token(b)?);
                    }
                }
            }
            Ok::<(), Error>(())
        })
    }

    /// The token for one byte: `<0xXX>`, else the one-character token.
    fn byte_token(&self, b: u8) -> Result<u32> {
        let hex = format!("<0x{b:02X}>");
        self.token_id(&hex)
            .or_else(|| {
                std::str::from_utf8(&[b])
                    .ok()
                    .and_then(|s| self.token_id(s))
            })
            .ok_or_else(|| TokenizerError::NoByteToken(b).into())
    }
}
