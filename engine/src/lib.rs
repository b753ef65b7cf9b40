//! `engine`: llama-family GGUF inference on ggml kernels.
//!
//! ```no_run
//! use engine::{Model, Session, ContextParams, sampling::{Sampler, SamplerParams}, GenerateParams};
//! # fn main() -> engine::Result<()> {
//! let model = Model::load("models/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let mut session = Session::new(model, ContextParams::default())?;
//! session.feed_text("The capital of France is")?;
//! let mut sampler = Sampler::new(SamplerParams::greedy());
//! let out = session.generate(&mut sampler, &GenerateParams::default(), |piece| {
//!     print!("{piece}");
//!     std::ops::ControlFlow::Continue(())
//! })?;
//! # let _ = out; Ok(()) }
//! ```
//!
//! Parts: [`gguf`] reads (and, for tests, writes) GGUF files over a memory map; [`tokenizer`]
//! and [`chat`] turn text and conversations into token ids; [`Model`] holds hyperparameters and
//! weights mapped in place; a [`Context`] owns the backend and a pool of [`kv`] pages shared by
//! many sequences, evaluated together in one [`Batch`] per step; [`Session`] is one sequence in
//! a context of its own; [`ingest`] reads a long document into one with a durable checkpoint
//! every few hundred tokens; [`sampling`] picks the next token. All FFI is fenced in one private
//! module (`ggml`).
//!
//! Many sequences, one step at a time:
//!
//! ```no_run
//! use engine::{Batch, Context, ContextParams, Logits, Model};
//! # fn main() -> engine::Result<()> {
//! let model = Model::load("models/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let mut ctx = Context::new(model, ContextParams { kv_tokens: 8192, ..Default::default() })?;
//! let (a, b) = (ctx.new_sequence(), ctx.new_sequence());
//! let mut batch = Batch::new();
//! batch.add(a, &[1, 2, 3], Logits::Last); // a prefill chunk
//! batch.add(b, &[4], Logits::Last); // a decode step
//! let out = ctx.decode(&batch)?;
//! let (logits_a, logits_b) = (out.logits(0), out.logits(1));
//! # let _ = (logits_a, logits_b); Ok(()) }
//! ```

#![deny(unsafe_code)]

mod arch;
mod batch;
pub mod chat;
pub mod constraint;
mod context;
mod error;
mod ggml;
pub mod gguf;
pub mod ingest;
pub mod kv;
pub mod memory;
mod model;
mod namespace;
mod pages;
mod params;
mod rank;
mod recurrent;
pub mod sampling;
mod session;
mod shift;
pub mod speculative;
mod spill;
mod stop;
pub mod store;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod tokenizer;
mod window;

pub use batch::{Batch, BatchOutput, Logits};
pub use context::{Context, ContextParams, SeqId};
pub use error::{Error, GgufProblem, Result, StoreErrorKind, TokenizerError};
pub use ggml::{cpu_path, CpuPath, CpuRequest};
pub use ingest::{IngestParams, IngestReport, Progress};
pub use kv::{KvLayout, KvStats, KvType, PAGE_TOKENS};
pub use model::{
    Arch, DeltaNet, Experts, FingerprintOrigin, HParams, Mamba2, MixerKind, Model, ModelParams,
    OffloadDevice, PoolingType, Ranking, RopeScaling, ShortConv, SlidingWindow,
    FINGERPRINT_VERSION,
};
pub use namespace::Namespace;
pub use pages::ImportSummary;
pub use params::Evaluation;
pub use session::{GenerateParams, Generation, Session, StopReason};
pub use stop::StopStrings;

// Types of the checkpoint format (`ckptfmt`) and the block store (`kvstore`) that this API hands
// out, re-exported on purpose so a user can name them without depending on those crates
// (`cargo xtask api` fails on any other type of theirs in the API; `store` re-exports the remote
// tier's settings).
/// A KV block's content id: [`Context::block_ids`], [`Context::import`]'s reader, stored blocks.
pub use ckptfmt::BlockId;
/// Where a sequence's block chain starts (or restarts after a shift): [`Context::chain_roots`].
pub use ckptfmt::ChainRoot;
/// A KV element type as checkpoints record it: [`KvType::elem`].
pub use ckptfmt::ElemType;
/// A model's identity as checkpoints record it: [`Context::fingerprint`].
pub use ckptfmt::Fingerprint;
/// The KV geometry of a checkpoint store: [`store::geometry`].
pub use ckptfmt::Geometry;
/// The block store's counters: [`store::SessionStore::metrics`].
pub use kvstore::Metrics;

/// How many leading tokens `a` and `b` share: the length of their common prefix.
pub fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Rewrites llama.cpp's single-dash `-ctk`, `-ctv` and `-ngl` into `--cache-type-k`,
/// `--cache-type-v` and `--n-gpu-layers` (also in their `-ctk=TYPE` form), leaving every other
/// argument as it is: for command lines parsed with long options only.
pub fn expand_llama_cpp_flags<I>(args: I) -> Vec<std::ffi::OsString>
where
    I: IntoIterator<Item = std::ffi::OsString>,
{
    const FLAGS: [(&str, &str); 3] = [
        ("-ctk", "--cache-type-k"),
        ("-ctv", "--cache-type-v"),
        ("-ngl", "--n-gpu-layers"),
    ];
    args.into_iter()
        .map(|a| {
            let Some(text) = a.to_str() else {
                return a;
            };
            for (short, long) in FLAGS {
                if text == short {
                    return long.into();
                }
                if let Some(value) = text.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                    return format!("{long}={value}").into();
                }
            }
            a
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::common_prefix_len;

    #[test]
    fn common_prefix_len_counts_the_shared_leading_tokens() {
        assert_eq!(common_prefix_len(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix_len(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(common_prefix_len(&[1, 2, 3], &[1, 2]), 2);
        assert_eq!(common_prefix_len(&[7], &[8]), 0);
        assert_eq!(common_prefix_len(&[], &[1]), 0);
        assert_eq!(common_prefix_len(&[4, 5], &[4, 5]), 2);
    }
}
