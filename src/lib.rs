//! llama-hdd: run llama-family models locally with an inference state that survives on disk.
//!
//! This crate only re-exports the workspace's parts; see `ARCHITECTURE.md` for the codemap.

pub use ckptfmt;
pub use engine;
pub use kvstore;
