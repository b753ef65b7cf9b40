//! `ckptfmt`: the on-disk checkpoint format of llama-hdd: zero-copy,
//! checksummed, incremental and crash-consistent. `FORMAT.md` next to this
//! crate is the normative specification.
//!
//! # API overview
//!
//! Geometry and identity (plain data, no model code):
//! - [`Geometry`] (`n_layers()`, per-layer [`LayerGeometry`], [`ElemType`],
//!   `tokens_per_block()`, `bytes_per_token()`, `block_bytes()`,
//!   `layer_spans(n_tokens)`, `block_layer_span(layer_idx)`,
//!   `split_span(&span, n_tokens)` → per-layer `(K, V)` slices, `gather_span`).
//! - [`Fingerprint`]`([u8; 32])`: the caller's model identity.
//! - [`BlockId`]`([u8; 32])`: `BlockId::chain(&fp, prev, &tokens)` (BLAKE3),
//!   `BlockId::chain_all(&fp, &tokens, tokens_per_block)`.
//!
//! Structures:
//! - Block records: [`encode_block`] → [`EncodedBlock`]; [`BlockView::parse`]
//!   verifies and borrows (`payload()`, `kv()`, `tokens()`, `id()`).
//! - Checkpoints: [`Manifest`] (tokens, positions, block ids, tail KV,
//!   sampler state, [`Metadata`]); `encode()` / `decode()`, or
//!   [`ManifestView::parse`] for a borrowed tail.
//! - State records (hybrid models): [`encode_state`] → bytes;
//!   [`StateView::parse`] verifies and borrows (`state()`, `block_id()`,
//!   `n_tokens()`); a manifest's `tail_state` is the state after its last token.
//! - Exports: [`write_export`] / [`Export::read`] / `Export::map` (unsafe) →
//!   [`ExportView`] (`manifest()`, `block(i)`, `verify_all()`).
//!
//! The store ([`Store`], a directory; generic over [`Vfs`]):
//! - `Store::open(root, fp, geometry)` creates or opens (refusing another
//!   owner), `Store::open_existing(root)`.
//! - Blocks: `put_block(BlockInput, Encoding)`, `put_blocks(&[BlockInput], _)`,
//!   `has_block(&id)`, `read_block(&id)` → [`OwnedBlock`],
//!   `unsafe map_block(&id)` → [`MappedBlock`] (borrowed payload),
//!   `delete_block(&id)`, `list_blocks()`, `gc()`.
//! - Recurrent state at block boundaries: `put_state(&id, n_tokens, &state)`,
//!   `has_state(&id)`, `read_state(&id)` → [`OwnedState`], `delete_state(&id)`,
//!   `list_states()`.
//! - Checkpoints: `save(&manifest, |block_idx| kv, Encoding)` writes only
//!   the missing blocks then the manifest (the commit point);
//!   `write_manifest`, `read_manifest(name)`, `verify_checkpoint(name)`,
//!   `load_kv_spans(&manifest)`, `list_manifests()`, `delete_manifest(name)`.
//! - `export(name, path)` and `import(&ExportView)`.
//!
//! Errors: one enum, [`FormatError`]. Crash tests use `FaultFs` (feature
//! `test-util`).
//!
//! # Example
//!
//! ```
//! use std::borrow::Cow;
//! use ckptfmt::{ElemType, Encoding, Fingerprint, Geometry, Manifest, Metadata, Store};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let geometry = Geometry::uniform(2, 8, 8, ElemType::F16, 4).unwrap();
//! let fp = Fingerprint::of(b"my model");
//! let store = Store::open(dir.path(), fp, geometry.clone()).unwrap();
//!
//! let tokens: Vec<u32> = (0..10).collect(); // two full blocks and a tail of two
//! let positions: Vec<i32> = (0..10).collect();
//! let tail = vec![7u8; geometry.span_bytes(2) as usize];
//! let meta = Metadata { name: "chat-1".into(), ..Metadata::default() };
//! let m = Manifest::new(fp, geometry.clone(), tokens, positions, tail, meta).unwrap();
//! let block = vec![1u8; geometry.block_bytes() as usize];
//! let report = store.save(&m, |_idx| Ok(Cow::Borrowed(&block[..])), Encoding::Raw).unwrap();
//! assert_eq!(report.blocks_written, 2);
//!
//! let back = store.verify_checkpoint("chat-1").unwrap();
//! assert_eq!(back, m);
//! let first = store.read_block(&back.block_ids[0]).unwrap();
//! assert_eq!(first.view().unwrap().kv().unwrap().as_ref(), &block[..]);
//! ```
#![deny(unsafe_code)]

pub mod block;
pub mod error;
pub mod export;
#[cfg(any(test, feature = "test-util"))]
pub mod fault;
pub mod geometry;
pub mod ids;
pub mod layout;
pub mod manifest;
pub mod mmap;
pub mod quant;
pub mod sharing;
pub mod state;
pub mod store;
pub mod vfs;

pub use block::{encode_block, BlockView, EncodedBlock, Encoding};
pub use error::{FormatError, Result};
pub use export::{write_export, Export, ExportView};
#[cfg(any(test, feature = "test-util"))]
pub use fault::{CrashMode, FaultFs, FaultMode};
pub use geometry::{ElemType, Geometry, LayerGeometry, LayerSpan, DEFAULT_TOKENS_PER_BLOCK};
pub use ids::{BlockId, ChainRoot, Fingerprint};
pub use manifest::{Manifest, ManifestView, Metadata};
pub use state::{encode_state, StateView};
pub use store::{
    BadBlock, BlockInput, CheckpointHealth, MappedBlock, OwnedBlock, OwnedState, SaveReport, Store,
};
pub use vfs::{create_dir_durable, FileLock, FileStamp, LockMode, StdFs, Vfs, VfsFile};

/// Time since the Unix epoch by the wall clock now, zero on a clock set before it: the one
/// reading of the clock that creation times, expiries and time-seeded ids are made from.
pub fn since_epoch() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}
