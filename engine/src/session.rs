//! A conversation with a model: its KV cache, the tokens it holds, and generation.

use std::ops::{ControlFlow, Range};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ggml::{Backend, Compute};
use crate::kv::{KvCache, KvLayout};
use crate::llama::{self, Outputs};
use crate::model::Model;
use crate::sampling::Sampler;
use crate::tokenizer::StreamDecoder;

/// How a session runs.
#[derive(Clone, Debug)]
pub struct SessionParams {
    /// Context window in tokens (the KV cache's capacity). Clamped to the model's training
    /// context length.
    pub n_ctx: usize,
    /// Threads for ggml's kernels.
    pub n_threads: usize,
    /// Largest number of tokens evaluated in one graph during prefill.
    pub n_ubatch: usize,
    /// Attention through ggml's fused flash-attention kernel (the default, and faster here:
    /// see docs/BENCHMARKS.md) or as separate matrix products and a softmax.
    pub flash_attn: bool,
}

impl Default for SessionParams {
    fn default() -> Self {
        SessionParams {
            n_ctx: 4096,
            n_threads: std::thread::available_parallelism().map_or(4, |n| n.get()),
            n_ubatch: 512,
            flash_attn: true,
        }
    }
}

/// Limits and stop conditions of [`Session::generate`].
#[derive(Clone, Debug)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Generation stops when the text contains one of these; the text is cut before it.
    pub stop_strings: Vec<String>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 256,
            stop_strings: Vec::new(),
        }
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token (not added to the session).
    EndOfGeneration,
    /// `max_tokens` were generated.
    MaxTokens,
    /// A stop string appeared.
    StopString,
    /// The callback asked to stop.
    Cancelled,
    /// The context window is full.
    ContextFull,
}

/// What [`Session::generate`] produced.
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated token ids, all of which were fed to the session.
    pub tokens: Vec<u32>,
    /// Their text (cut before a stop string, if one ended generation).
    pub text: String,
    /// Why generation ended.
    pub stop: StopReason,
}

/// One sequence being evaluated: a KV cache, the tokens in it and the latest logits.
pub struct Session {
    model: Arc<Model>,
    params: SessionParams,
    backend: Backend,
    compute: Compute,
    kv: KvCache,
    tokens: Vec<u32>,
    logits: Option<Vec<f32>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("params", &self.params)
            .field("n_tokens", &self.tokens.len())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Opens a session on `model` with an empty context.
    pub fn new(model: Arc<Model>, mut params: SessionParams) -> Result<Session> {
        params.n_ctx = params.n_ctx.clamp(1, model.hparams().n_ctx_train.max(1));
        params.n_ubatch = params.n_ubatch.max(1);
        let backend = Backend::cpu(params.n_threads)?;
        let kv = KvCache::new(&backend, model.hparams(), params.n_ctx)?;
        Ok(Session {
            model,
            params,
            backend,
            compute: Compute::new()?,
            kv,
            tokens: Vec::new(),
            logits: None,
        })
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The parameters in effect (after clamping).
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// Tokens held, position `i` being `tokens()[i]`.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Logits after the last evaluated token.
    pub fn logits(&self) -> Result<&[f32]> {
        self.logits.as_deref().ok_or(Error::NoLogits)
    }

    /// Evaluates `tokens` after those held and returns the logits following the last one.
    ///
    /// Tokens that would not fit in the context give [`Error::ContextFull`], and an id outside
    /// the vocabulary [`Error::BadToken`]; in both cases the session is left unchanged.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.eval(tokens, Outputs::Last)?;
        self.logits()
    }

    /// Tokenizes `text` (special tokens recognised; BOS added first when the session is empty
    /// and the model asks for it) and feeds it.
    pub fn feed_text(&mut self, text: &str) -> Result<&[f32]> {
        let add_special = self.tokens.is_empty();
        let ids = self.model.tokenizer().encode(text, add_special, true)?;
        self.feed(&ids)
    }

    /// Evaluates `tokens` and returns the logits after every one of them, `n_vocab` per token.
    pub fn feed_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.eval(tokens, Outputs::All)
    }

    /// Refuses token ids outside the vocabulary.
    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let n_vocab = self.model.hparams().n_vocab;
        match tokens.iter().find(|&&t| t as usize >= n_vocab) {
            Some(&id) => Err(Error::BadToken { id, n_vocab }),
            None => Ok(()),
        }
    }

    fn eval(&mut self, tokens: &[u32], outputs: Outputs) -> Result<Vec<f32>> {
        self.check_tokens(tokens)?;
        let n_vocab = self.model.hparams().n_vocab;
        let needed = self.tokens.len() + tokens.len();
        if needed > self.params.n_ctx {
            return Err(Error::ContextFull {
                needed,
                n_ctx: self.params.n_ctx,
            });
        }
        let mut all = Vec::new();
        let chunks = tokens.chunks(self.params.n_ubatch);
        let n_chunks = chunks.len();
        for (i, chunk) in chunks.enumerate() {
            let last_chunk = i + 1 == n_chunks;
            // Logits of earlier micro-batches are needed only when every position is asked for.
            let want = if outputs == Outputs::All {
                Outputs::All
            } else {
                Outputs::Last
            };
            let model = &self.model;
            let kv = &self.kv;
            let flash_attn = self.params.flash_attn;
            let logits = self.compute.run(&self.backend, |g| {
                llama::build(g, model, kv, chunk, want, flash_attn)
            })?;
            self.kv.advance(chunk.len());
            self.tokens.extend_from_slice(chunk);
            if outputs == Outputs::All {
                all.extend_from_slice(&logits);
            }
            if last_chunk {
                let tail = logits.len() - n_vocab;
                self.logits = Some(logits[tail..].to_vec());
            }
        }
        Ok(all)
    }

    /// Samples and feeds tokens until a stop condition; `on_text` receives the text as it
    /// grows (never a partial UTF-8 character, never part of a stop string) and may cancel.
    pub fn generate(
        &mut self,
        sampler: &mut Sampler,
        params: &GenerateParams,
        mut on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Generation> {
        let mut decoder = StreamDecoder::new();
        let mut generated = Vec::new();
        let mut text = String::new();
        let mut emitted = 0; // bytes of `text` already given to `on_text`
        let stop = loop {
            if generated.len() >= params.max_tokens {
                break StopReason::MaxTokens;
            }
            if self.tokens.len() >= self.params.n_ctx {
                break StopReason::ContextFull;
            }
            let logits = self.logits()?;
            let token = sampler.sample(logits, &self.tokens);
            if self.model.tokenizer().is_eog(token) {
                break StopReason::EndOfGeneration;
            }
            self.feed(&[token])?;
            generated.push(token);
            text.push_str(&decoder.push(self.model.tokenizer(), token));
            if let Some(cut) = find_stop(&text, &params.stop_strings) {
                text.truncate(cut);
                if cut > emitted && on_text(&text[emitted..]).is_break() {
                    break StopReason::Cancelled;
                }
                emitted = text.len();
                break StopReason::StopString;
            }
            // Hold back a tail that could still become a stop string.
            let safe = safe_prefix_len(&text, &params.stop_strings).max(emitted);
            if safe > emitted {
                let flow = on_text(&text[emitted..safe]);
                emitted = safe;
                if flow.is_break() {
                    break StopReason::Cancelled;
                }
            }
        };
        if stop != StopReason::StopString && stop != StopReason::Cancelled {
            text.push_str(&decoder.flush());
            if text.len() > emitted {
                let _ = on_text(&text[emitted..]);
            }
        }
        Ok(Generation {
            tokens: generated,
            text,
            stop,
        })
    }

    /// Forgets every token at or after position `len`.
    pub fn truncate(&mut self, len: usize) {
        if len < self.tokens.len() {
            self.tokens.truncate(len);
            self.kv.truncate(len);
            self.logits = None;
        }
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.kv.clear();
        self.logits = None;
    }

    /// The byte layout of this session's KV cache.
    pub fn kv_layout(&self) -> &KvLayout {
        self.kv.layout()
    }

    /// Copies the K and V bytes of `positions` (within the tokens held) of `layer`.
    pub fn read_kv(
        &self,
        layer: usize,
        positions: Range<usize>,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<()> {
        self.kv.read(layer, positions, k, v)
    }

    /// Writes K and V bytes of `positions` of `layer` (up to the capacity). They count only
    /// after [`Session::commit_restored`].
    pub fn write_kv(
        &mut self,
        layer: usize,
        positions: Range<usize>,
        k: &[u8],
        v: &[u8],
    ) -> Result<()> {
        self.kv.write(layer, positions, k, v)
    }

    /// Declares that the KV cache now holds `tokens` at positions `0..tokens.len()`, written
    /// with [`Session::write_kv`] for every layer. The next [`Session::feed`] continues after
    /// them; there are no logits until then.
    pub fn commit_restored(&mut self, tokens: Vec<u32>) -> Result<()> {
        self.check_tokens(&tokens)?;
        self.kv.set_len(tokens.len())?;
        self.tokens = tokens;
        self.logits = None;
        Ok(())
    }
}

/// Byte offset where the earliest stop string starts, if any occurs.
fn find_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
}

/// Length of the longest prefix of `text` that no continuation can turn into a stop string.
fn safe_prefix_len(text: &str, stops: &[String]) -> usize {
    let mut safe = text.len();
    for stop in stops.iter().filter(|s| !s.is_empty()) {
        // The longest suffix of text that is a proper prefix of `stop`.
        for (start, _) in text.char_indices().rev().take(stop.len()) {
            if stop.starts_with(&text[start..]) {
                safe = safe.min(start);
            }
        }
    }
    safe
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_prefixes_are_held_back() {
        let stops = vec!["</end>".to_owned()];
        assert_eq!(safe_prefix_len("hello </e", &stops), 6);
        assert_eq!(safe_prefix_len("hello", &stops), 5);
        assert_eq!(safe_prefix_len("a<", &stops), 1);
        assert_eq!(find_stop("ab</end>cd", &stops), Some(2));
        assert_eq!(find_stop("ab</en", &stops), None);
    }
}
