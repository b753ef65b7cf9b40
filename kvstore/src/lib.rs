//! `kvstore`: the KV blocks of many sequences between a RAM budget and a disk
//! quota, with shared prefixes, eviction, prefetch and crash recovery.
//!
//! Built on `ckptfmt`'s contract: a block is `tokens_per_block` tokens of KV
//! named by [`BlockId::chain`] (so equal prefixes share blocks), a checkpoint
//! is a [`Manifest`], and the files are `ckptfmt`'s block records and
//! manifests in one `ckptfmt` store per model fingerprint.
//!
//! # API overview
//!
//! - [`KvStore::open`] (or [`KvStore::open_with`] over any [`BlockIo`]) with a
//!   [`Config`]: RAM budget, disk quota, eviction [`PolicyKind`], background
//!   threads. A second open of the same directory fails with
//!   [`StoreError::Locked`].
//! - [`KvStore::model`]`(fingerprint, geometry)` → [`Model`]: `put`,
//!   `put_sequence`, `put_sequence_pinned` (a live session), `get`,
//!   `contains`, `is_resident`, `pin`/`unpin`/`pin_all` ([`PinGuard`]),
//!   `save`, `load`, `load_pinned`, `read_manifest`, `list`, `delete`,
//!   `longest_prefix` ([`PrefixMatch`]), `prefetch` ([`Prefetch`]).
//! - Store-wide: `flush`, `gc`, `gc_to` ([`GcReport`]), `metrics`
//!   ([`Metrics`]), `recovery_report` ([`RecoveryReport`]), `close`.
//! - Eviction: [`EvictionPolicy`] with [`Lru`] and [`S3Fifo`] (the default,
//!   chosen by measurement: see the kvstore section of `docs/BENCHMARKS.md`).
//! - I/O: [`BlockIo`] (`ckptfmt`'s `Vfs` plus the directory lock), real
//!   ([`ckptfmt::StdFs`]) or fault-injecting ([`FaultIo`], [`Fault`]).
//! - Errors: one enum, [`StoreError`].
//!
//! A second open of a directory that is in use fails with
//! [`StoreError::Locked`]; directories are not shared between processes.
//!
//! # Durability
//!
//! `put` stores in RAM. A block becomes durable when it is spilled
//! (write-behind, when evicted), at [`KvStore::flush`], or when a checkpoint
//! referencing it is saved; `save` returns after the manifest is durable.
//! After a crash, [`KvStore::open`] rebuilds the index from the files: every
//! checkpoint's blocks exist (and verify, with [`VerifyLevel::Full`]);
//! temporary files of unfinished writes are removed.
//!
//! # Example
//!
//! ```
//! use ckptfmt::{ElemType, Fingerprint, Geometry, Manifest, Metadata};
//! use kvstore::{Config, KvStore};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = KvStore::open(dir.path(), Config::default()).unwrap();
//! let geometry = Geometry::uniform(2, 8, 8, ElemType::F16, 4).unwrap();
//! let fp = Fingerprint::of(b"my model");
//! let model = store.model(fp, geometry.clone()).unwrap();
//!
//! let tokens: Vec<u32> = (0..10).collect(); // two full blocks and a tail of two
//! let block_bytes = geometry.block_bytes() as usize;
//! model.put_sequence(&tokens, |i| vec![i as u8; block_bytes]).unwrap();
//!
//! let tail = vec![0u8; geometry.span_bytes(2) as usize];
//! let meta = Metadata { name: "chat-1".into(), ..Metadata::default() };
//! let positions = (0..10).collect();
//! let m = Manifest::new(fp, geometry, tokens.clone(), positions, tail, meta).unwrap();
//! model.save(&m).unwrap();
//!
//! // A new conversation with the same first eight tokens skips their prefill.
//! let hit = model.longest_prefix(&[0, 1, 2, 3, 4, 5, 6, 7, 99]);
//! assert_eq!(hit.n_tokens, 8);
//! let back = model.load("chat-1").unwrap();
//! assert_eq!(&back.blocks[1][..], &vec![1u8; block_bytes][..]);
//! ```
#![forbid(unsafe_code)]

pub mod bytes;
pub mod error;
pub mod io;
pub mod metrics;
pub mod policy;
pub mod store;

pub use bytes::KvBytes;
pub use ckptfmt::{BlockId, CrashMode, Fingerprint, Geometry, Manifest};
pub use error::{Result, StoreError};
pub use io::{BlockIo, Fault, FaultIo, LockGuard};
pub use metrics::Metrics;
pub use policy::{EvictionPolicy, Lru, PolicyKind, S3Fifo};
pub use store::{
    Checkpoint, Config, GcReport, KvStore, Model, PinGuard, Prefetch, PrefixMatch, RecoveryReport,
    VerifyLevel,
};
