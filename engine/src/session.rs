//! A conversation with a model: one sequence of its own [`Context`], and generation.

use std::ops::{ControlFlow, Range};
use std::sync::Arc;

use crate::batch::Logits;
use crate::context::{Context, ContextParams, SeqId};
use crate::error::Result;
use crate::kv::KvLayout;
use crate::model::Model;
use crate::sampling::Sampler;
use crate::stop::StopStrings;
use crate::tokenizer::StreamDecoder;

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

/// One sequence in a context of its own: the simple API for one conversation. Its page pool
/// holds `2 * n_ctx` tokens, so a restore can fill free pages before it replaces the
/// conversation (the second half costs address space, not memory, until used).
pub struct Session {
    ctx: Context,
    seq: SeqId,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("context", &self.ctx)
            .field("n_tokens", &self.tokens().len())
            .finish()
    }
}

impl Session {
    /// Opens a session on `model` with an empty context. A session's pool holds twice its
    /// window when `params.kv_tokens` is 0 (room to restore or branch beside the live pages).
    pub fn new(model: Arc<Model>, params: ContextParams) -> Result<Session> {
        let most = if params.past_train {
            usize::MAX
        } else {
            model.hparams().n_ctx_train.max(1)
        };
        let n_ctx = params.n_ctx.clamp(1, most);
        let kv_tokens = match params.kv_tokens {
            0 => 2 * n_ctx,
            n => n,
        };
        let mut ctx = Context::new(
            model,
            ContextParams {
                n_ctx,
                kv_tokens,
                n_batch: params.n_batch.max(1),
                ..params
            },
        )?;
        // The first half of the pool (the context window) will be used: touch it now, as a
        // cache cleared at creation would be, so a restore or prefill pays no page faults
        // (not under a RAM budget, which most of the window is not to take).
        if ctx.params().kv_ram == 0 {
            ctx.prefault(1, 2);
        }
        let seq = ctx.new_sequence();
        ctx.keep_session_sequence(seq);
        Ok(Session { ctx, seq })
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        self.ctx.model()
    }

    /// The parameters in effect (after clamping).
    pub fn params(&self) -> ContextParams {
        self.ctx.params().clone()
    }

    /// The context the session's sequence lives in.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The context, for the step API or page import (the sequence is [`Session::seq`]). The
    /// session's own sequence cannot be removed through it ([`Error::SessionSequence`]).
    pub fn context_mut(&mut self) -> &mut Context {
        &mut self.ctx
    }

    /// The session's sequence in its context.
    pub fn seq(&self) -> SeqId {
        self.seq
    }

    /// Tokens held, position `i` being `tokens()[i]`.
    pub fn tokens(&self) -> &[u32] {
        self.ctx.tokens(self.seq).unwrap_or(&[])
    }

    /// Logits after the last evaluated token.
    pub fn logits(&self) -> Result<&[f32]> {
        self.ctx.logits(self.seq)
    }

    /// Evaluates `tokens` after those held and returns the logits following the last one.
    ///
    /// Tokens that would not fit in the context give [`Error::ContextFull`], and an id outside
    /// the vocabulary [`Error::BadToken`]; in both cases the session is left unchanged.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.ctx.feed(self.seq, tokens, Logits::Last)?;
        self.logits()
    }

    /// Tokenizes `text` (special tokens recognised; BOS added first when the session is empty
    /// and the model asks for it) and feeds it.
    pub fn feed_text(&mut self, text: &str) -> Result<&[f32]> {
        let add_special = self.tokens().is_empty();
        let ids = self.model().tokenizer().encode(text, add_special, true)?;
        self.feed(&ids)
    }

    /// Evaluates `tokens` and returns the logits after every one of them, `n_vocab` per token.
    pub fn feed_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.ctx.feed(self.seq, tokens, Logits::All)
    }

    /// Logits after the last token, computed when there are none (after a restore) without
    /// changing the KV (see [`Context::ensure_logits`]).
    pub fn ensure_logits(&mut self) -> Result<&[f32]> {
        self.ctx.ensure_logits(self.seq)
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
        let mut stops = StopStrings::new(&params.stop_strings);
        let stop = loop {
            if generated.len() >= params.max_tokens {
                break StopReason::MaxTokens;
            }
            if self.tokens().len() >= self.ctx.params().n_ctx {
                break StopReason::ContextFull;
            }
            self.ensure_logits()?;
            let token = sampler.sample(self.ctx.logits(self.seq)?, self.tokens());
            if self.model().tokenizer().is_eog(token) {
                break StopReason::EndOfGeneration;
            }
            self.feed(&[token])?;
            generated.push(token);
            text.push_str(&decoder.push(self.model().tokenizer(), token));
            if let Some((cut, _)) = stops.find(&text) {
                text.truncate(cut);
                if cut > emitted && on_text(&text[emitted..]).is_break() {
                    break StopReason::Cancelled;
                }
                emitted = text.len();
                break StopReason::StopString;
            }
            // Hold back a tail that could still become a stop string.
            let safe = stops.safe_prefix_len(&text).max(emitted);
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

    /// Forgets every token at or after position `len` (see [`Context::truncate`]): a
    /// recurrent model's session can only be cleared ([`Error::Recurrent`](crate::Error)
    /// otherwise, the session unchanged).
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        self.ctx.truncate(self.seq, len)
    }

    /// Context shift: keeps the first `n_keep` tokens, discards the `n_discard` after them
    /// and moves the rest down, re-rotating their cached K without evaluating anything (see
    /// [`Context::shift`]). A shifted session saves and restores like any other (its
    /// checkpoint records its chain roots).
    pub fn shift(&mut self, n_keep: usize, n_discard: usize) -> Result<()> {
        self.ctx.shift(self.seq, n_keep, n_discard)
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        // Cutting the session's own sequence to nothing always succeeds.
        let _ = self.truncate(0);
    }

    /// The byte layout of this session's KV cache.
    pub fn kv_layout(&self) -> &KvLayout {
        self.ctx.kv_layout()
    }

    /// Copies the K and V bytes of `positions` (within the tokens held) of `layer`.
    pub fn read_kv(
        &self,
        layer: usize,
        positions: Range<usize>,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<()> {
        self.ctx.read_kv(self.seq, layer, positions, k, v)
    }

    /// Every K and V byte the session holds, layer by layer, each layer's K rows then its V
    /// rows (to compare or hash whole states).
    pub fn kv_bytes(&self) -> Result<Vec<u8>> {
        let layout = self.kv_layout();
        let n = self.tokens().len();
        let mut all = Vec::with_capacity(n * layout.bytes_per_token());
        for layer in 0..layout.n_layers {
            let mut k = vec![0u8; n * layout.k_bytes_per_token[layer]];
            let mut v = vec![0u8; n * layout.v_bytes_per_token[layer]];
            self.read_kv(layer, 0..n, &mut k, &mut v)?;
            all.extend(k);
            all.extend(v);
        }
        Ok(all)
    }
}
