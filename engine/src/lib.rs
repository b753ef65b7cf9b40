//! `engine`: llama-family GGUF inference on ggml kernels.
//!
//! ```no_run
//! use engine::{Model, Session, SessionParams, sampling::{Sampler, SamplerParams}, GenerateParams};
//! # fn main() -> engine::Result<()> {
//! let model = Model::load("models/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let mut session = Session::new(model, SessionParams::default())?;
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
//! weights mapped in place; [`Session`] evaluates tokens on ggml and keeps the [`kv`] cache;
//! [`sampling`] picks the next token. All FFI is fenced in one private module (`ggml`).

#![deny(unsafe_code)]

pub mod chat;
pub mod checkpoint;
mod error;
mod ggml;
pub mod gguf;
pub mod kv;
mod llama;
mod model;
pub mod sampling;
mod session;
pub mod tokenizer;

pub use error::{Error, GgufProblem, Result, TokenizerError};
pub use kv::{KvCache, KvLayout};
pub use model::{Arch, HParams, Model, RopeScaling, FINGERPRINT_VERSION};
pub use session::{GenerateParams, Generation, Session, SessionParams, StopReason};
