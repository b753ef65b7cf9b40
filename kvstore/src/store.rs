//! The store: one directory, one `ckptfmt` store per model, the shared
//! state behind the handles, and opening (read-write or read-only).
//!
//! # Layout
//!
//! ```text
//! ROOT/models/<fp-hex>/        one ckptfmt store per model fingerprint:
//!     store.ckpt               descriptor (fingerprint, geometry)
//!     blocks/<id-hex>.blk      one block record per file
//!     manifests/<name>.ckpt    one checkpoint per file
//!     quarantine/              block files that failed verification
//!     LOCK, owners/            sharing between processes (ckptfmt's `sharing`)
//! ```
//!
//! # States of a block
//!
//! A block is in RAM, on disk, or both. A block only in RAM is *dirty*: it
//! is lost by a crash. It becomes durable when it is written by a spill
//! (write-behind, when the eviction policy picks it), by [`KvStore::flush`],
//! or by saving a checkpoint that references it. Block files are written
//! by `ckptfmt` (temporary file, fsync, rename, fsync of the directory), so a
//! file with a block's name is always complete.
//!
//! # Invariants
//!
//! - A block leaves RAM only when a durable copy exists, unless it was never
//!   reported durable and the caller asked for it to go (rollback of a failed put).
//! - A block referenced by a committed checkpoint (of any process), or
//!   pinned in this process, is never deleted, and a pinned block never
//!   leaves RAM.
//! - A checkpoint's manifest is written only after all its blocks are
//!   durable, and the presence checks and the manifest's commit happen
//!   under the model store's shared lock, which collection takes exclusive.
//! - One file operation on a block at a time in this process: writers and
//!   the garbage collector claim a block (`in_flight`) under the state lock.
//!
//! # Several processes
//!
//! Any number of processes (or [`KvStore`]s of one process) may open a
//! directory at once. Each keeps its own index of the blocks it has seen and
//! looks on disk for the rest, so a block another process wrote is found
//! (and shared) by [`ModelStore::contains`], `put` and `longest_prefix`;
//! checkpoints are always listed and read from disk.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;

use ckptfmt::{create_dir_durable, Fingerprint, FormatError, Geometry, StdFs, Store};

use crate::config::{Config, GcReport, RecoveryReport};
use crate::error::{Result, StoreError};
use crate::handle::ModelStore;
use crate::io::BlockIo;
use crate::metrics::Metrics;
use crate::state::State;

/// Directory holding one `ckptfmt` store per model.
pub const MODELS_DIR: &str = "models";

/// Whether a store may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    ReadWrite,
    ReadOnly,
}

/// A block store under a RAM budget and a disk quota. `Send + Sync`.
///
/// Block and checkpoint operations go through a [`ModelStore`] handle
/// ([`KvStore::model`]); budget, quota, flush, gc and metrics are shared by
/// every model in the directory.
pub struct KvStore<V: BlockIo = StdFs> {
    shared: Arc<Shared<V>>,
    workers: Vec<JoinHandle<()>>,
    recovery: RecoveryReport,
}

/// A model's files and constants.
pub(crate) struct ModelInfo<V: BlockIo> {
    pub(crate) fp: Fingerprint,
    pub(crate) geometry: Geometry,
    pub(crate) store: Store<V>,
    pub(crate) blocks_dir: PathBuf,
    pub(crate) record_len: u64,
    pub(crate) block_bytes: u64,
    /// The files as this process last saw them (kept by gc).
    pub(crate) index: Mutex<crate::disk_index::DiskIndex>,
    /// State snapshots this process counted at its last listing (`u64::MAX` before the
    /// first), plus those it wrote since: the snapshot budget lists the directory again only
    /// when this could pass it (`snapshots.rs`).
    pub(crate) states_seen: std::sync::atomic::AtomicU64,
}

/// What the store and its handles share.
pub(crate) struct Shared<V: BlockIo> {
    pub(crate) io: V,
    pub(crate) root: PathBuf,
    pub(crate) cfg: Config,
    pub(crate) access: Access,
    pub(crate) state: Mutex<State>,
    pub(crate) cond: Condvar,
    pub(crate) models: RwLock<Vec<Arc<ModelInfo<V>>>>,
    /// Serialises this process's saves and deletes.
    pub(crate) save_lock: Mutex<()>,
    /// The order in which a write's reservation may drop one model's checkpoints when
    /// unreferenced blocks do not make room under the disk budget
    /// ([`ModelStore::set_budget_drop_order`](crate::ModelStore::set_budget_drop_order)).
    pub(crate) budget_drops: RwLock<Option<(usize, SharedDropOrder)>>,
}

/// A drop order that threads share: `None` keeps a checkpoint, `Some(key)` lets
/// it go (oldest-modified first, then by key). It must not wait on anything a collection's
/// caller may hold (it runs under the store's exclusive lock).
pub type SharedDropOrder = Arc<dyn Fn(&str) -> Option<u64> + Send + Sync>;

/// Locks a mutex, recovering the data of a poisoned one (every critical
/// section leaves the state consistent before it can panic).
pub(crate) fn lock_mutex<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<V: BlockIo> Shared<V> {
    /// Waits on the condition variable (poison-tolerant like [`lock_mutex`]).
    pub(crate) fn wait<'a>(&self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.cond.wait(st).unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn models_read(&self) -> RwLockReadGuard<'_, Vec<Arc<ModelInfo<V>>>> {
        self.models.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn models_write(&self) -> RwLockWriteGuard<'_, Vec<Arc<ModelInfo<V>>>> {
        self.models.write().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn model_info(&self, idx: usize) -> Arc<ModelInfo<V>> {
        Arc::clone(&self.models_read()[idx])
    }

    /// Fails with [`StoreError::Refused`] ([`FormatError::ReadOnly`]) on a read-only store.
    pub(crate) fn writable(&self, op: &'static str) -> Result<()> {
        match self.access {
            Access::ReadWrite => Ok(()),
            Access::ReadOnly => Err(StoreError::Refused(FormatError::ReadOnly {
                path: self.root.clone(),
                op,
            })),
        }
    }
}

impl KvStore<StdFs> {
    /// Opens (creating when absent) the store directory `root` on the real
    /// file system for reading and writing, recovering from any crash.
    /// Other processes may have it open at the same time.
    pub fn open(root: impl AsRef<Path>, cfg: Config) -> Result<Self> {
        Self::open_with(StdFs, root, cfg)
    }

    /// Opens an existing store directory read-only: nothing is created,
    /// removed, locked for writing or recovered, so it works on a read-only
    /// copy and never disturbs a writer. Writing calls fail with
    /// [`StoreError::Refused`] ([`FormatError::ReadOnly`]).
    pub fn open_read_only(root: impl AsRef<Path>, cfg: Config) -> Result<Self> {
        Self::open_read_only_with(StdFs, root, cfg)
    }
}

impl<V: BlockIo> KvStore<V> {
    /// [`KvStore::open`] over any [`BlockIo`].
    pub fn open_with(io: V, root: impl AsRef<Path>, cfg: Config) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let models_dir = root.join(MODELS_DIR);
        create_dir_durable(&io, &models_dir)
            .map_err(|e| StoreError::io("mkdir", &models_dir, e))?;
        Self::start(io, root, cfg, Access::ReadWrite)
    }

    /// [`KvStore::open_read_only`] over any [`BlockIo`].
    pub fn open_read_only_with(io: V, root: impl AsRef<Path>, cfg: Config) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let models_dir = root.join(MODELS_DIR);
        if !io
            .exists(&models_dir)
            .map_err(|e| StoreError::io("stat", &models_dir, e))?
        {
            return Err(StoreError::Invalid {
                what: "store directory",
                detail: format!("{root:?} holds no {MODELS_DIR}/ directory"),
            });
        }
        Self::start(io, root, cfg, Access::ReadOnly)
    }

    fn start(io: V, root: PathBuf, cfg: Config, access: Access) -> Result<Self> {
        let shared = Arc::new(Shared {
            io,
            root,
            state: Mutex::new(State::new(cfg.policy.build())),
            cfg,
            access,
            cond: Condvar::new(),
            models: RwLock::new(Vec::new()),
            save_lock: Mutex::new(()),
            budget_drops: RwLock::new(None),
        });
        let recovery = shared.recover()?;
        let workers = if shared.cfg.background {
            crate::worker::spawn(&shared)?
        } else {
            Vec::new()
        };
        Ok(KvStore {
            shared,
            workers,
            recovery,
        })
    }

    /// The handle of model `fp`, registering it (durably) with `geometry`
    /// when new. A model stored with another geometry is refused. The handle
    /// is owned (`Send + Sync + 'static`): a session or server may keep it.
    pub fn model(&self, fp: Fingerprint, geometry: Geometry) -> Result<ModelStore<V>> {
        let idx = self.shared.register_model(fp, geometry)?;
        Ok(ModelStore::new(Arc::clone(&self.shared), idx))
    }

    /// The handle of a model already in the store (any geometry).
    pub fn existing_model(&self, fp: &Fingerprint) -> Option<ModelStore<V>> {
        let idx = self.shared.models_read().iter().position(|m| m.fp == *fp)?;
        Some(ModelStore::new(Arc::clone(&self.shared), idx))
    }

    /// Fingerprints of the models in the store.
    pub fn models(&self) -> Vec<Fingerprint> {
        self.shared.models_read().iter().map(|m| m.fp).collect()
    }

    /// Makes every block in RAM durable (writes the dirty ones and waits for
    /// pending spills). When this returns `Ok`, every block put before the
    /// call survives a crash until it is garbage collected.
    pub fn flush(&self) -> Result<()> {
        self.shared.flush()
    }

    /// Deletes every reclaimable block file: referenced by no checkpoint of
    /// any process, not pinned in this one; least recently used first.
    pub fn gc(&self) -> Result<GcReport> {
        self.shared.gc_to(0)
    }

    /// Deletes reclaimable block files, least recently used first, until the
    /// block files of the directory take at most `target_bytes` (or nothing
    /// is left to reclaim).
    pub fn gc_to(&self, target_bytes: u64) -> Result<GcReport> {
        self.shared.gc_to(target_bytes)
    }

    /// A snapshot of the counters and gauges.
    pub fn metrics(&self) -> Metrics {
        lock_mutex(&self.shared.state).metrics()
    }

    /// What opening the store found.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.shared.root
    }

    /// The settings in use.
    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    /// Whether the store was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.shared.access == Access::ReadOnly
    }

    /// Flushes, then closes the store (joining its threads).
    pub fn close(self) -> Result<()> {
        if self.is_read_only() {
            return Ok(());
        }
        self.flush()
    }
}

impl<V: BlockIo> Drop for KvStore<V> {
    /// Stops and joins the background threads. Blocks that were never made
    /// durable are dropped with the RAM tier (call [`KvStore::flush`] first).
    /// Handles that outlive the store keep working, spilling inline.
    fn drop(&mut self) {
        lock_mutex(&self.shared.state).shutdown = true;
        self.shared.cond.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl<V: BlockIo> std::fmt::Debug for KvStore<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStore")
            .field("root", &self.shared.root)
            .field("cfg", &self.shared.cfg)
            .field("access", &self.shared.access)
            .finish_non_exhaustive()
    }
}
