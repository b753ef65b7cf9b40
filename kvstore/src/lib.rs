//! `kvstore`: the KV blocks of many sequences between a RAM budget and a disk
//! quota, with shared prefixes, eviction, prefetch and crash recovery, in a
//! directory that several processes may share.
//!
//! Built on `ckptfmt`'s contract: a block is `tokens_per_block` tokens of KV
//! named by [`BlockId::chain`] (so equal prefixes share blocks), a checkpoint
//! is a [`Manifest`], and the files are `ckptfmt`'s block records and
//! manifests in one `ckptfmt` store per model fingerprint.
//!
//! # API overview
//!
//! - [`KvStore::open`] (shared: any number of processes may open a
//!   directory at once), [`KvStore::open_read_only`] (writes nothing), or
//!   `open_with` / `open_read_only_with` over any [`BlockIo`], with a
//!   [`Config`]: RAM budget, disk quota and budget, eviction [`PolicyKind`], threads.
//! - [`KvStore::model`]`(fingerprint, geometry)` → [`ModelStore`], an owned
//!   handle (`Send + Sync + 'static`, `Clone`):
//!   - blocks: `block_id(prev, tokens)`, `put(prev, tokens, kv)`,
//!     `put_sequence`, `put_sequence_pinned` ([`PinGuard`]), `contains`,
//!     `get` (verified bytes), `is_resident`, `pin`/`unpin`/`pin_all`;
//!   - checkpoints: `save(&manifest)`, `read_manifest`, `load`,
//!     `load_pinned`, `list`, `checkpoints` ([`CheckpointInfo`]: tokens,
//!     bytes it alone holds, last use), `delete`, `checkpoint_health`
//!     ([`CheckpointHealth`]: how many leading blocks verify; damaged ones
//!     are quarantined), `longest_prefix` ([`PrefixMatch`]), `prefetch`
//!     ([`Prefetch`]), `collect_dropping` (a collection that may delete the
//!     given checkpoints, in order, as far as a budget needs).
//!   - recurrent state of hybrid models (`ckptfmt` state records at block
//!     boundaries, within [`Config::state_budget`]): `put_state`, `get_state`,
//!     `has_state`, `states`, `resume_point` ([`StateMatch`]: the last
//!     boundary of the longest stored prefix that has a snapshot).
//! - Store-wide: `flush`, `gc`, `gc_to(bytes)` ([`GcReport`]), `metrics`
//!   ([`Metrics`]), `recovery_report` ([`RecoveryReport`]), `close`.
//! - A remote tier shared by several machines ([`remote`]: [`RemoteTier`], Redis with the
//!   feature `redis`, on by default): `Config::remote`, then `fetch_remote` (read-through),
//!   `push_remote` / `push_remote_manifest` (write-behind), `fetch_remote_checkpoint`.
//! - Migration of a bare `ckptfmt` store directory: [`legacy`].
//! - Where stores live by default: [`default_cache_dir`], the user's cache directory.
//! - Disk budgets as people write them (`50MB`, `1GiB`): [`parse_size`],
//!   [`format_size`].
//! - The `ckpt` tool (feature `cli`, on by default): `ckpt ls | rm | gc |
//!   migrate | verify | inspect | bench` on a store directory.
//! - Errors: one enum, [`StoreError`]; the checkpoint format's refusals (a lock held,
//!   a read-only store) stay `ckptfmt`'s, inside [`StoreError::Refused`]
//!   ([`StoreError::busy_pids`] names the processes holding a lock this call needed).
//!
//! # Durability
//!
//! `put` stores in RAM. A block becomes durable when it is spilled
//! (write-behind, when evicted), at [`KvStore::flush`], or when a checkpoint
//! referencing it is saved; `save` returns after the manifest is durable.
//! After a crash, [`KvStore::open`] rebuilds the index from the files and
//! reports (never deletes) checkpoints whose blocks are missing or damaged.
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
//! let hit = model.longest_prefix(&[0, 1, 2, 3, 4, 5, 6, 7, 99], &[]);
//! assert_eq!(hit.n_tokens, 8);
//! let back = model.load("chat-1").unwrap();
//! assert_eq!(&back.blocks[1][..], &vec![1u8; block_bytes][..]);
//! ```
#![forbid(unsafe_code)]

pub mod bytes;
pub mod claim;
mod config;
mod dirs;
mod disk_index;
pub mod error;
#[cfg(feature = "test-util")]
pub mod fault;
mod gc;
mod handle;
pub mod io;
pub mod legacy;
pub mod metrics;
mod persist;
pub mod policy;
pub mod records;
mod recovery;
pub mod remote;
pub mod size;
mod snapshots;
mod state;
pub mod store;
mod tier;
mod watch;
mod worker;

pub use bytes::KvBytes;
#[cfg(feature = "test-util")]
pub use ckptfmt::CrashMode;
pub use ckptfmt::{BadBlock, BlockId, CheckpointHealth, Fingerprint, Geometry, Manifest};
pub use claim::{claim, Claim};
pub use config::{ChainReport, Config, DamagedCheckpoint, GcReport, RecoveryReport, VerifyLevel};
pub use dirs::default_cache_dir;
pub use error::{Result, StoreError};
#[cfg(feature = "test-util")]
pub use fault::{Fault, FaultIo};
pub use handle::{Checkpoint, CheckpointInfo, ModelStore, PinGuard, Prefetch, PrefixMatch};
pub use io::BlockIo;
pub use metrics::Metrics;
pub use policy::{EvictionPolicy, Lru, PolicyKind, S3Fifo};
pub use remote::{Remote, RemoteConfig, RemoteFetch, RemoteFigures, RemoteTier};
pub use size::{format_size, parse_size};
pub use snapshots::StateMatch;
pub use store::{KvStore, SharedDropOrder};

/// Metadata key of a checkpoint's expiry (seconds since the epoch, in decimal): once it has
/// passed, [`ModelStore::delete_expired`] (and `ckpt gc`) delete the checkpoint.
pub const EXPIRES_KEY: &str = "expires_unix";

/// Time since the Unix epoch (zero on a clock set before it), for the crates above.
pub use ckptfmt::since_epoch;

/// The current time in whole seconds since the Unix epoch (0 on a clock set before it): the
/// unit of checkpoints' creation times and of [`EXPIRES_KEY`].
pub fn unix_now() -> u64 {
    ckptfmt::since_epoch().as_secs()
}
