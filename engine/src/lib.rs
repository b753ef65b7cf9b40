//! `engine`: llama-family GGUF inference on ggml kernels.
//!
//! Parts: [`gguf`] reads (and, for tests, writes) GGUF files over a memory map; [`tokenizer`]
//! and [`chat`] turn text and conversations into token ids; [`sampling`] picks the next token.

pub mod chat;
mod error;
pub mod gguf;
pub mod sampling;
pub mod tokenizer;

pub use error::{Error, Result};
