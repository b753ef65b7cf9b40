//! The store: RAM tier, disk tier, checkpoints, prefix lookup, background workers.
//!
//! # Layout
//!
//! ```text
//! ROOT/LOCK                    exclusive lock of the directory (one owner at a time)
//! ROOT/models/<fp-hex>/        one ckptfmt store per model fingerprint:
//!     store.ckpt               descriptor (fingerprint, geometry)
//!     blocks/<id-hex>.blk      one block record per file
//!     manifests/<name>.ckpt    one checkpoint per file
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
//! - A block referenced by a committed checkpoint, or pinned, is never deleted
//!   and a pinned block never leaves RAM.
//! - A checkpoint's manifest is written only after all its blocks are durable.
//! - One file operation on a block at a time: writers and the garbage
//!   collector claim a block (`in_flight`) under the state lock.
//!
//! # Concurrency
//!
//! All bookkeeping sits behind one mutex; file I/O runs outside it. One
//! background thread spills evicted blocks, another serves prefetches.
//! Dropping the store joins both. A second [`KvStore::open`] of the same
//! directory (in this or another process) fails with [`StoreError::Locked`].

use std::borrow::Cow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;

use ckptfmt::store::{BLOCKS_DIR, DESCRIPTOR_FILE, MANIFESTS_DIR};
use ckptfmt::{
    encode_block, BlockId, BlockInput, BlockView, Encoding, Fingerprint, FormatError, Geometry,
    Manifest, StdFs, Store,
};

use crate::bytes::KvBytes;
use crate::error::{Result, StoreError};
use crate::io::{BlockIo, LockGuard};
use crate::metrics::Metrics;
use crate::policy::{EvictionPolicy, PolicyKind};

/// Name of the lock file.
pub const LOCK_FILE: &str = "LOCK";
/// Directory holding one `ckptfmt` store per model.
pub const MODELS_DIR: &str = "models";

/// How much checking [`KvStore::open`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VerifyLevel {
    /// Every checkpoint's blocks must exist (one directory listing); block
    /// contents are verified when read.
    #[default]
    Exists,
    /// Every block file is read and verified (CRC, id, owner); damaged files
    /// are removed before checkpoints are checked.
    Full,
}

/// Settings of a store.
#[derive(Debug, Clone)]
pub struct Config {
    /// Bytes of KV the RAM tier may hold (pinned blocks included).
    pub ram_budget: u64,
    /// Bytes of block files the disk tier may hold.
    pub disk_quota: u64,
    /// Eviction policy of the RAM tier.
    pub policy: PolicyKind,
    /// Spill and prefetch on background threads. When false, spills run in
    /// the calling thread and prefetches run inline (deterministic; tests).
    pub background: bool,
    /// Most bytes waiting to be spilled before a put waits for the spiller.
    pub max_spill_backlog: u64,
    /// Bytes written per spill batch (one directory sync per batch).
    pub spill_batch_bytes: u64,
    /// Concurrent file reads of one prefetch (a disk serves several reads
    /// at once faster than one after the other).
    pub prefetch_readers: usize,
    /// How block payloads are stored on disk.
    pub encoding: Encoding,
    /// Checks run by [`KvStore::open`].
    pub verify: VerifyLevel,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ram_budget: 1 << 30,
            disk_quota: 16 << 30,
            policy: PolicyKind::default(),
            background: true,
            max_spill_backlog: 256 << 20,
            spill_batch_bytes: 32 << 20,
            prefetch_readers: 4,
            encoding: Encoding::Raw,
            verify: VerifyLevel::default(),
        }
    }
}

/// What [`KvStore::open`] found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Models found.
    pub models: usize,
    /// Block files found (after removing damaged ones).
    pub blocks: usize,
    /// Checkpoints kept.
    pub checkpoints: usize,
    /// Block files removed because they did not verify (only with [`VerifyLevel::Full`]).
    pub removed_blocks: usize,
    /// Checkpoints removed because a block was missing or damaged, or the
    /// manifest itself was damaged (`(model fingerprint hex, name)`).
    pub removed_checkpoints: Vec<(String, String)>,
}

/// What a garbage collection reclaimed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Block files deleted.
    pub blocks: u64,
    /// Bytes of those files.
    pub bytes: u64,
}

/// A checkpoint read back: its manifest and the KV of each full block.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The manifest (tokens, positions, tail KV, metadata).
    pub manifest: Manifest,
    /// The raw KV of each block, in order.
    pub blocks: Vec<KvBytes>,
}

/// The longest stored prefix of a token sequence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Ids of the stored blocks covering the prefix, in order.
    pub block_ids: Vec<BlockId>,
    /// Tokens covered (`block_ids.len() * tokens_per_block`).
    pub n_tokens: usize,
}

/// A block store under a RAM budget and a disk quota. `Send + Sync`.
///
/// Block and checkpoint operations go through a [`Model`] handle
/// ([`KvStore::model`]); budget, quota, flush, gc and metrics are shared by
/// every model in the directory.
pub struct KvStore<V: BlockIo = StdFs> {
    shared: Arc<Shared<V>>,
    workers: Vec<JoinHandle<()>>,
    recovery: RecoveryReport,
    _lock: LockGuard,
}

/// A model's view of a store: its fingerprint and geometry, and the block
/// and checkpoint operations.
pub struct Model<'s, V: BlockIo = StdFs> {
    shared: &'s Shared<V>,
    idx: usize,
    info: Arc<ModelInfo<V>>,
}

/// Pins blocks until dropped (see [`Model::pin_all`]).
pub struct PinGuard<'s, V: BlockIo = StdFs> {
    shared: &'s Shared<V>,
    ids: Vec<BlockId>,
}

/// Completion of a prefetch request.
#[derive(Debug)]
pub struct Prefetch {
    rx: mpsc::Receiver<Result<usize>>,
}

impl Prefetch {
    /// Waits until the checkpoint's blocks are in RAM; returns how many were
    /// read from disk.
    pub fn wait(self) -> Result<usize> {
        self.rx.recv().map_err(|_| StoreError::ShutDown)?
    }
}

struct ModelInfo<V: BlockIo> {
    fp: Fingerprint,
    geometry: Geometry,
    store: Store<V>,
    blocks_dir: PathBuf,
    record_len: u64,
    block_bytes: u64,
}

#[derive(Debug)]
struct Entry {
    model: usize,
    len: u64,
    ram: Option<KvBytes>,
    on_disk: bool,
    in_flight: bool,
    evict_after_write: bool,
    pins: u32,
    last_access: u64,
    /// Predecessor and tokens, needed to write the block; known once the
    /// block was put or read.
    chain: Option<(Option<BlockId>, Arc<[u32]>)>,
}

struct PrefetchJob {
    ids: Vec<BlockId>,
    done: mpsc::Sender<Result<usize>>,
}

struct State {
    entries: HashMap<BlockId, Entry>,
    policy: Box<dyn EvictionPolicy>,
    checkpoints: HashMap<(usize, String), Vec<BlockId>>,
    refs: HashMap<BlockId, u32>,
    ram_bytes: u64,
    evicting_bytes: u64,
    pinned_bytes: u64,
    disk_bytes: u64,
    disk_reserved: u64,
    writes_in_progress: usize,
    spill_queue: VecDeque<BlockId>,
    last_spill_error: Option<(String, bool)>,
    prefetch_queue: VecDeque<PrefetchJob>,
    tick: u64,
    shutdown: bool,
    m: Metrics,
}

struct Shared<V: BlockIo> {
    io: V,
    root: PathBuf,
    cfg: Config,
    state: Mutex<State>,
    cond: Condvar,
    models: RwLock<Vec<Arc<ModelInfo<V>>>>,
    save_lock: Mutex<()>,
}

/// One block to write, captured under the lock.
struct WriteItem {
    id: BlockId,
    model: usize,
    prev: Option<BlockId>,
    tokens: Arc<[u32]>,
    data: KvBytes,
}

fn lock_mutex<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl KvStore<StdFs> {
    /// Opens (creating when absent) the store directory `root` on the real
    /// file system, taking its lock and recovering from any crash.
    pub fn open(root: impl AsRef<Path>, cfg: Config) -> Result<Self> {
        Self::open_with(StdFs, root, cfg)
    }
}

impl<V: BlockIo> KvStore<V> {
    /// [`KvStore::open`] over any [`BlockIo`].
    pub fn open_with(io: V, root: impl AsRef<Path>, cfg: Config) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        io.create_dir_all(&root)
            .map_err(|e| StoreError::io("mkdir", &root, e))?;
        let lock_path = root.join(LOCK_FILE);
        let lock = io.lock(&lock_path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                StoreError::Locked {
                    path: lock_path.clone(),
                }
            } else {
                StoreError::io("lock", &lock_path, e)
            }
        })?;
        let models_dir = root.join(MODELS_DIR);
        io.create_dir_all(&models_dir)
            .map_err(|e| StoreError::io("mkdir", &models_dir, e))?;
        let state = State {
            entries: HashMap::new(),
            policy: cfg.policy.build(),
            checkpoints: HashMap::new(),
            refs: HashMap::new(),
            ram_bytes: 0,
            evicting_bytes: 0,
            pinned_bytes: 0,
            disk_bytes: 0,
            disk_reserved: 0,
            writes_in_progress: 0,
            spill_queue: VecDeque::new(),
            last_spill_error: None,
            prefetch_queue: VecDeque::new(),
            tick: 0,
            shutdown: false,
            m: Metrics::default(),
        };
        let shared = Arc::new(Shared {
            io,
            root,
            cfg,
            state: Mutex::new(state),
            cond: Condvar::new(),
            models: RwLock::new(Vec::new()),
            save_lock: Mutex::new(()),
        });
        let recovery = shared.recover()?;
        let mut workers = Vec::new();
        if shared.cfg.background {
            let s = Arc::clone(&shared);
            workers.push(
                std::thread::Builder::new()
                    .name("kvstore-spill".into())
                    .spawn(move || s.spill_worker())
                    .map_err(|e| StoreError::io("spawn", "kvstore-spill", e))?,
            );
            let s = Arc::clone(&shared);
            workers.push(
                std::thread::Builder::new()
                    .name("kvstore-prefetch".into())
                    .spawn(move || s.prefetch_worker())
                    .map_err(|e| StoreError::io("spawn", "kvstore-prefetch", e))?,
            );
        }
        Ok(KvStore {
            shared,
            workers,
            recovery,
            _lock: lock,
        })
    }

    /// The handle of model `fp`, registering it (durably) with `geometry`
    /// when new. A model stored with another geometry is refused.
    pub fn model(&self, fp: Fingerprint, geometry: Geometry) -> Result<Model<'_, V>> {
        let idx = self.shared.register_model(fp, geometry)?;
        let info = self.shared.model_info(idx);
        Ok(Model {
            shared: &self.shared,
            idx,
            info,
        })
    }

    /// Fingerprints of the models in the store.
    pub fn models(&self) -> Vec<Fingerprint> {
        self.shared
            .models
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|m| m.fp)
            .collect()
    }

    /// Makes every block in RAM durable (writes the dirty ones and waits for
    /// pending spills). When this returns `Ok`, every block put before the
    /// call survives a crash until it is garbage collected.
    pub fn flush(&self) -> Result<()> {
        self.shared.flush()
    }

    /// Deletes every reclaimable block file: referenced by no checkpoint,
    /// not pinned; least recently used first.
    pub fn gc(&self) -> Result<GcReport> {
        self.shared.gc_to(0)
    }

    /// Deletes reclaimable block files, least recently used first, until the
    /// disk tier holds at most `target_bytes` (or nothing is left to reclaim).
    pub fn gc_to(&self, target_bytes: u64) -> Result<GcReport> {
        self.shared.gc_to(target_bytes)
    }

    /// A snapshot of the counters and gauges.
    pub fn metrics(&self) -> Metrics {
        let st = lock_mutex(&self.shared.state);
        st.metrics()
    }

    /// What opening the store found and repaired.
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

    /// Flushes, then closes the store (joining its threads, releasing the lock).
    pub fn close(self) -> Result<()> {
        self.flush()
    }
}

impl<V: BlockIo> Drop for KvStore<V> {
    /// Stops and joins the background threads. Blocks that were never made
    /// durable are dropped with the RAM tier (call [`KvStore::flush`] first).
    fn drop(&mut self) {
        {
            let mut st = lock_mutex(&self.shared.state);
            st.shutdown = true;
        }
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
            .finish_non_exhaustive()
    }
}

impl<'s, V: BlockIo> Model<'s, V> {
    /// The model's fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        self.info.fp
    }

    /// The model's KV geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.info.geometry
    }

    /// The id of the block holding `tokens` after `prev`.
    pub fn block_id(&self, prev: Option<&BlockId>, tokens: &[u32]) -> BlockId {
        BlockId::chain(&self.info.fp, prev, tokens)
    }

    /// Stores a block in RAM (it becomes durable when spilled, flushed or
    /// saved). `tokens` holds exactly `tokens_per_block` ids and `kv` exactly
    /// `block_bytes()` bytes. A block the store already holds is not stored
    /// again (its bytes are equal by construction of the id).
    ///
    /// Fails with [`StoreError::RamFull`] when pinned blocks leave no room,
    /// or with the spill's error when making room required a write that
    /// failed (the block is then not stored, unless already in flight).
    pub fn put(&self, prev: Option<&BlockId>, tokens: &[u32], kv: Vec<u8>) -> Result<BlockId> {
        self.shared
            .put(self.idx, &self.info, prev, tokens, kv, false)
    }

    /// Puts every full block of `tokens`, asking `kv(i)` for block `i`'s
    /// bytes only for the blocks the store does not hold yet. Returns the ids.
    ///
    /// Blocks found on disk are not pinned: a concurrent [`KvStore::gc`] may
    /// reclaim them before a later save. A live session should use
    /// [`Model::put_sequence_pinned`].
    pub fn put_sequence(
        &self,
        tokens: &[u32],
        mut kv: impl FnMut(usize) -> Vec<u8>,
    ) -> Result<Vec<BlockId>> {
        let tpb = self.info.geometry.tokens_per_block() as usize;
        let mut prev: Option<BlockId> = None;
        let mut ids = Vec::new();
        for (i, chunk) in tokens.chunks_exact(tpb).enumerate() {
            let id = BlockId::chain(&self.info.fp, prev.as_ref(), chunk);
            if !self.shared.touch_if_present(&id) {
                self.shared
                    .put(self.idx, &self.info, prev.as_ref(), chunk, kv(i), false)?;
            }
            ids.push(id);
            prev = Some(id);
        }
        Ok(ids)
    }

    /// Like [`Model::put_sequence`], but pins every block as it is stored
    /// (or found), so a live session's blocks cannot be evicted or
    /// collected between the put and a later save. All or none: on error,
    /// the pins taken so far are released.
    pub fn put_sequence_pinned(
        &self,
        tokens: &[u32],
        mut kv: impl FnMut(usize) -> Vec<u8>,
    ) -> Result<PinGuard<'s, V>> {
        let tpb = self.info.geometry.tokens_per_block() as usize;
        let mut prev: Option<BlockId> = None;
        let mut guard = PinGuard {
            shared: self.shared,
            ids: Vec::new(),
        };
        for (i, chunk) in tokens.chunks_exact(tpb).enumerate() {
            let id = BlockId::chain(&self.info.fp, prev.as_ref(), chunk);
            let found = self.contains(&id) && self.shared.get(&id, true, false)?.is_some();
            if found {
                let mut st = lock_mutex(&self.shared.state);
                st.m.dedup_blocks += 1;
                st.m.dedup_bytes += self.info.block_bytes;
            } else {
                self.shared
                    .put(self.idx, &self.info, prev.as_ref(), chunk, kv(i), true)?;
            }
            guard.ids.push(id);
            prev = Some(id);
        }
        Ok(guard)
    }

    /// The KV of block `id`: from RAM, or read from disk, verified and
    /// promoted into RAM. `Ok(None)` when neither tier holds it.
    pub fn get(&self, id: &BlockId) -> Result<Option<KvBytes>> {
        self.shared.get(id, false, true)
    }

    /// Whether the store holds block `id` in either tier.
    pub fn contains(&self, id: &BlockId) -> bool {
        lock_mutex(&self.shared.state).entries.contains_key(id)
    }

    /// Whether block `id` is in the RAM tier now.
    pub fn is_resident(&self, id: &BlockId) -> bool {
        lock_mutex(&self.shared.state)
            .entries
            .get(id)
            .is_some_and(|e| e.ram.is_some())
    }

    /// Path of block `id`'s file (whether or not it exists).
    pub fn block_path(&self, id: &BlockId) -> PathBuf {
        self.info.store.block_path(id)
    }

    /// Pins block `id` in RAM (promoting it when on disk). Pins nest; a
    /// pinned block is never evicted nor garbage collected.
    pub fn pin(&self, id: &BlockId) -> Result<KvBytes> {
        self.shared
            .get(id, true, true)?
            .ok_or_else(|| StoreError::BlockNotFound { id: id.to_hex() })
    }

    /// Releases one pin of block `id`.
    pub fn unpin(&self, id: &BlockId) -> Result<()> {
        self.shared.unpin(id)
    }

    /// Pins every block of `ids` until the guard is dropped (all or none).
    pub fn pin_all(&self, ids: &[BlockId]) -> Result<PinGuard<'s, V>> {
        let mut guard = PinGuard {
            shared: self.shared,
            ids: Vec::with_capacity(ids.len()),
        };
        for id in ids {
            self.pin(id)?;
            guard.ids.push(*id);
        }
        Ok(guard)
    }

    /// Saves checkpoint `manifest.meta.name` durably: writes the blocks of
    /// the manifest that are not durable yet, then the manifest (the commit
    /// point), replacing any checkpoint of that name. Every block of the
    /// manifest must be in the store. On error, either the old or the new
    /// checkpoint remains.
    pub fn save(&self, manifest: &Manifest) -> Result<()> {
        self.shared.save(self.idx, &self.info, manifest)
    }

    /// Reads checkpoint `name`: its manifest and every block's KV (from RAM,
    /// or from disk with promotion).
    pub fn load(&self, name: &str) -> Result<Checkpoint> {
        let manifest = self.read_manifest(name)?;
        let mut blocks = Vec::with_capacity(manifest.block_ids.len());
        for id in &manifest.block_ids {
            match self.shared.get(id, false, true)? {
                Some(b) => blocks.push(b),
                None => {
                    return Err(StoreError::MissingBlock {
                        checkpoint: name.to_string(),
                        id: id.to_hex(),
                    })
                }
            }
        }
        Ok(Checkpoint { manifest, blocks })
    }

    /// Like [`Model::load`], and pins every block until the guard drops (a
    /// resumed session's blocks stay in RAM while it runs).
    pub fn load_pinned(&self, name: &str) -> Result<(Checkpoint, PinGuard<'s, V>)> {
        let manifest = self.read_manifest(name)?;
        let mut guard = PinGuard {
            shared: self.shared,
            ids: Vec::with_capacity(manifest.block_ids.len()),
        };
        let mut blocks = Vec::with_capacity(manifest.block_ids.len());
        for id in &manifest.block_ids {
            match self.shared.get(id, true, true)? {
                Some(b) => {
                    guard.ids.push(*id);
                    blocks.push(b);
                }
                None => {
                    return Err(StoreError::MissingBlock {
                        checkpoint: name.to_string(),
                        id: id.to_hex(),
                    })
                }
            }
        }
        Ok((Checkpoint { manifest, blocks }, guard))
    }

    /// Reads the manifest of checkpoint `name`.
    pub fn read_manifest(&self, name: &str) -> Result<Manifest> {
        let path = self
            .info
            .store
            .manifest_path(name)
            .map_err(|e| StoreError::format(&self.shared.root, e))?;
        self.info.store.read_manifest(name).map_err(|e| match e {
            FormatError::NotFound { .. } => StoreError::CheckpointNotFound {
                name: name.to_string(),
            },
            e => StoreError::format(path, e),
        })
    }

    /// Names of this model's checkpoints, sorted.
    pub fn list(&self) -> Vec<String> {
        let st = lock_mutex(&self.shared.state);
        let mut v: Vec<String> = st
            .checkpoints
            .keys()
            .filter(|(m, _)| *m == self.idx)
            .map(|(_, n)| n.clone())
            .collect();
        v.sort();
        v
    }

    /// Deletes checkpoint `name` durably. Its blocks stay until garbage
    /// collected.
    pub fn delete(&self, name: &str) -> Result<()> {
        self.shared.delete(self.idx, &self.info, name)
    }

    /// The longest chain of stored blocks (in either tier, saved in a
    /// checkpoint or not) that is a prefix of `tokens`.
    pub fn longest_prefix(&self, tokens: &[u32]) -> PrefixMatch {
        let tpb = self.info.geometry.tokens_per_block();
        let ids = BlockId::chain_all(&self.info.fp, tokens, tpb);
        let st = lock_mutex(&self.shared.state);
        let block_ids: Vec<BlockId> = ids
            .into_iter()
            .take_while(|id| st.entries.contains_key(id))
            .collect();
        PrefixMatch {
            n_tokens: block_ids.len() * tpb as usize,
            block_ids,
        }
    }

    /// Brings checkpoint `name`'s blocks into RAM on the background thread
    /// (inline when the store runs without one).
    pub fn prefetch(&self, name: &str) -> Result<Prefetch> {
        let ids = {
            let st = lock_mutex(&self.shared.state);
            st.checkpoints
                .get(&(self.idx, name.to_string()))
                .cloned()
                .ok_or_else(|| StoreError::CheckpointNotFound {
                    name: name.to_string(),
                })?
        };
        let (tx, rx) = mpsc::channel();
        if self.shared.cfg.background {
            let mut st = lock_mutex(&self.shared.state);
            if st.shutdown {
                return Err(StoreError::ShutDown);
            }
            st.prefetch_queue.push_back(PrefetchJob { ids, done: tx });
            drop(st);
            self.shared.cond.notify_all();
        } else {
            let _ = tx.send(self.shared.prefetch_ids(&ids));
        }
        Ok(Prefetch { rx })
    }
}

impl<V: BlockIo> Drop for PinGuard<'_, V> {
    fn drop(&mut self) {
        for id in &self.ids {
            let _ = self.shared.unpin(id);
        }
    }
}

impl<V: BlockIo> PinGuard<'_, V> {
    /// The pinned blocks.
    pub fn ids(&self) -> &[BlockId] {
        &self.ids
    }
}

impl State {
    fn metrics(&self) -> Metrics {
        let mut m = self.m;
        m.ram_bytes = self.ram_bytes;
        m.pinned_bytes = self.pinned_bytes;
        m.disk_bytes = self.disk_bytes;
        m.ram_blocks = self.entries.values().filter(|e| e.ram.is_some()).count() as u64;
        m.disk_blocks = self.entries.values().filter(|e| e.on_disk).count() as u64;
        m
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Drops an entry's RAM copy (bookkeeping only).
    fn drop_ram(&mut self, id: &BlockId) {
        let Some(e) = self.entries.get_mut(id) else {
            return;
        };
        if e.ram.take().is_some() {
            self.ram_bytes -= e.len;
            self.policy.remove(id);
            if !e.on_disk {
                self.entries.remove(id);
            }
        }
    }

    fn add_refs(&mut self, ids: &[BlockId]) {
        for id in ids {
            *self.refs.entry(*id).or_insert(0) += 1;
        }
    }

    fn drop_refs(&mut self, ids: &[BlockId]) {
        for id in ids {
            if let Some(r) = self.refs.get_mut(id) {
                *r -= 1;
                if *r == 0 {
                    self.refs.remove(id);
                }
            }
        }
    }

    /// Picks victims until RAM (not counting blocks already leaving) fits
    /// `budget`; drops clean ones, claims dirty ones for writing.
    fn pick_victims(&mut self, budget: u64) -> Vec<WriteItem> {
        let mut out = Vec::new();
        while self.ram_bytes - self.evicting_bytes > budget {
            let Some(v) = self.policy.victim() else {
                break;
            };
            let Some(e) = self.entries.get_mut(&v) else {
                continue;
            };
            debug_assert!(e.ram.is_some() && e.pins == 0);
            if e.on_disk && !e.in_flight {
                self.m.evictions += 1;
                self.drop_ram(&v);
                continue;
            }
            e.evict_after_write = true;
            self.evicting_bytes += e.len;
            if !e.in_flight {
                if let (Some(data), Some((prev, tokens))) = (&e.ram, &e.chain) {
                    e.in_flight = true;
                    out.push(WriteItem {
                        id: v,
                        model: e.model,
                        prev: *prev,
                        tokens: Arc::clone(tokens),
                        data: data.clone(),
                    });
                }
            }
        }
        out
    }

    /// Claims a dirty RAM block for writing; `None` when it is clean, gone or
    /// already claimed.
    fn claim_dirty(&mut self, id: &BlockId) -> Option<WriteItem> {
        let e = self.entries.get_mut(id)?;
        if e.on_disk || e.in_flight {
            return None;
        }
        let (data, (prev, tokens)) = (e.ram.as_ref()?, e.chain.as_ref()?);
        let item = WriteItem {
            id: *id,
            model: e.model,
            prev: *prev,
            tokens: Arc::clone(tokens),
            data: data.clone(),
        };
        e.in_flight = true;
        Some(item)
    }

    /// Records the outcome of writing `ids`.
    fn finish_writes(&mut self, ids: &[(BlockId, u64)], ok: bool, spill: bool) {
        for (id, record_len) in ids {
            let Some(e) = self.entries.get_mut(id) else {
                continue;
            };
            e.in_flight = false;
            let evict = std::mem::take(&mut e.evict_after_write);
            let (len, pins) = (e.len, e.pins);
            if evict {
                self.evicting_bytes -= len;
            }
            if ok {
                if !e.on_disk {
                    e.on_disk = true;
                    self.disk_bytes += record_len;
                }
                if spill {
                    self.m.spills += 1;
                } else {
                    self.m.writes += 1;
                }
                self.m.bytes_written += record_len;
                if evict && pins == 0 {
                    self.m.evictions += 1;
                    self.drop_ram(id);
                }
            } else if evict && pins == 0 {
                self.policy.insert(*id, len);
            }
        }
    }
}

impl<V: BlockIo> Shared<V> {
    fn model_info(&self, idx: usize) -> Arc<ModelInfo<V>> {
        Arc::clone(&self.models.read().unwrap_or_else(|e| e.into_inner())[idx])
    }

    fn open_model_store(&self, dir: &Path, store: Store<V>) -> Result<ModelInfo<V>> {
        let fp = *store.fingerprint();
        let geometry = store.geometry().clone();
        let tpb = geometry.tokens_per_block() as usize;
        let block_bytes = geometry.block_bytes();
        let zeros_kv = vec![0u8; block_bytes as usize];
        let zeros_tok = vec![0u32; tpb];
        let record_len = encode_block(
            &fp,
            &geometry,
            None,
            &zeros_tok,
            &zeros_kv,
            self.cfg.encoding,
        )
        .map_err(|e| StoreError::format(dir, e))?
        .len();
        Ok(ModelInfo {
            fp,
            geometry,
            store,
            blocks_dir: dir.join(BLOCKS_DIR),
            record_len,
            block_bytes,
        })
    }

    fn register_model(&self, fp: Fingerprint, geometry: Geometry) -> Result<usize> {
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        if let Some((idx, m)) = models.iter().enumerate().find(|(_, m)| m.fp == fp) {
            if let Some(detail) = m.geometry.diff(&geometry) {
                return Err(StoreError::GeometryMismatch {
                    fingerprint: fp.to_hex(),
                    detail,
                });
            }
            return Ok(idx);
        }
        let models_dir = self.root.join(MODELS_DIR);
        let dir = models_dir.join(fp.to_hex());
        let store = Store::open_with(self.io.clone(), &dir, fp, geometry)
            .map_err(|e| StoreError::format(&dir, e))?;
        self.io
            .sync_dir(&models_dir)
            .map_err(|e| StoreError::io("fsync", &models_dir, e))?;
        let info = self.open_model_store(&dir, store)?;
        models.push(Arc::new(info));
        Ok(models.len() - 1)
    }

    /// Opens every model directory and rebuilds the index from the files.
    fn recover(&self) -> Result<RecoveryReport> {
        let mut report = RecoveryReport::default();
        let models_dir = self.root.join(MODELS_DIR);
        let names = self
            .io
            .list(&models_dir)
            .map_err(|e| StoreError::io("list", &models_dir, e))?;
        for name in names {
            let Ok(fp) = Fingerprint::from_hex(&name) else {
                continue;
            };
            let dir = models_dir.join(&name);
            let desc = dir.join(DESCRIPTOR_FILE);
            // A model whose descriptor never committed holds nothing yet.
            if !self
                .io
                .exists(&desc)
                .map_err(|e| StoreError::io("stat", &desc, e))?
            {
                continue;
            }
            let store = Store::open_existing_with(self.io.clone(), &dir)
                .map_err(|e| StoreError::format(&dir, e))?;
            if *store.fingerprint() != fp {
                return Err(StoreError::Invalid {
                    what: "model directory",
                    detail: format!("{dir:?} holds model {}", store.fingerprint()),
                });
            }
            let info = self.open_model_store(&dir, store)?;
            let idx = {
                let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
                models.push(Arc::new(info));
                models.len() - 1
            };
            self.recover_model(idx, &mut report)?;
            report.models += 1;
        }
        Ok(report)
    }

    fn recover_model(&self, idx: usize, report: &mut RecoveryReport) -> Result<()> {
        let info = self.model_info(idx);
        let store = &info.store;
        let mut blocks: HashSet<BlockId> = store
            .list_blocks()
            .map_err(|e| StoreError::format(&info.blocks_dir, e))?
            .into_iter()
            .collect();
        if self.cfg.verify == VerifyLevel::Full {
            let mut bad = Vec::new();
            for id in &blocks {
                match store.read_block(id) {
                    Ok(_) => {}
                    Err(e) if e.is_corruption() => bad.push(*id),
                    Err(e) => return Err(StoreError::format(store.block_path(id), e)),
                }
            }
            for id in bad {
                let p = store.block_path(&id);
                self.io
                    .remove(&p)
                    .map_err(|e| StoreError::io("remove", &p, e))?;
                blocks.remove(&id);
                report.removed_blocks += 1;
            }
            if report.removed_blocks > 0 {
                self.io
                    .sync_dir(&info.blocks_dir)
                    .map_err(|e| StoreError::io("fsync", &info.blocks_dir, e))?;
            }
        }
        let names = store
            .list_manifests()
            .map_err(|e| StoreError::format(store.root(), e))?;
        let mut kept: Vec<(String, Vec<BlockId>)> = Vec::new();
        for name in names {
            let ok = match store.read_manifest(&name) {
                Ok(m) => {
                    if m.block_ids.iter().all(|id| blocks.contains(id)) {
                        kept.push((name.clone(), m.block_ids));
                        true
                    } else {
                        false
                    }
                }
                Err(e) if e.is_corruption() => false,
                Err(e) => return Err(StoreError::format(store.root(), e)),
            };
            if !ok {
                store
                    .delete_manifest(&name)
                    .map_err(|e| StoreError::format(store.root(), e))?;
                report
                    .removed_checkpoints
                    .push((info.fp.to_hex(), name.clone()));
            }
        }
        let mut st = lock_mutex(&self.state);
        for id in &blocks {
            st.entries.insert(
                *id,
                Entry {
                    model: idx,
                    len: info.block_bytes,
                    ram: None,
                    on_disk: true,
                    in_flight: false,
                    evict_after_write: false,
                    pins: 0,
                    last_access: 0,
                    chain: None,
                },
            );
            st.disk_bytes += info.record_len;
        }
        report.blocks += blocks.len();
        report.checkpoints += kept.len();
        for (name, ids) in kept {
            st.add_refs(&ids);
            st.checkpoints.insert((idx, name), ids);
        }
        Ok(())
    }

    fn touch_if_present(&self, id: &BlockId) -> bool {
        let mut st = lock_mutex(&self.state);
        let t = st.next_tick();
        let len = match st.entries.get_mut(id) {
            Some(e) => {
                e.last_access = t;
                e.len
            }
            None => return false,
        };
        st.m.dedup_blocks += 1;
        st.m.dedup_bytes += len;
        st.policy.touch(id);
        true
    }

    fn put(
        &self,
        model: usize,
        info: &ModelInfo<V>,
        prev: Option<&BlockId>,
        tokens: &[u32],
        kv: Vec<u8>,
        pin: bool,
    ) -> Result<BlockId> {
        let tpb = info.geometry.tokens_per_block() as usize;
        if tokens.len() != tpb {
            return Err(StoreError::Invalid {
                what: "block tokens",
                detail: format!("{} tokens, a block holds {tpb}", tokens.len()),
            });
        }
        if kv.len() as u64 != info.block_bytes {
            return Err(StoreError::Invalid {
                what: "block KV",
                detail: format!("{} bytes, a block holds {}", kv.len(), info.block_bytes),
            });
        }
        let id = BlockId::chain(&info.fp, prev, tokens);
        let len = kv.len() as u64;
        let mut kv = Some(kv);
        let mut st = lock_mutex(&self.state);
        let t = st.next_tick();
        while let Some(e) = st.entries.get_mut(&id) {
            e.last_access = t;
            if e.ram.is_none() && e.in_flight {
                // Its file is being collected: wait for the outcome.
                st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            if e.ram.is_none() {
                // On disk only: the caller hands us the bytes, keep them.
                e.ram = kv.take().map(KvBytes::from_vec);
                e.chain = Some((prev.copied(), Arc::from(tokens)));
                st.ram_bytes += len;
                st.policy.insert(id, len);
            } else {
                st.policy.touch(&id);
            }
            st.m.dedup_blocks += 1;
            st.m.dedup_bytes += len;
            if pin {
                self.pin_locked(&mut st, &id)?;
            }
            let (st, r) = self.make_room(st);
            drop(st);
            r?;
            return Ok(id);
        }
        if st.pinned_bytes + len > self.cfg.ram_budget {
            return Err(StoreError::RamFull {
                needed: len,
                pinned: st.pinned_bytes,
                budget: self.cfg.ram_budget,
            });
        }
        st.entries.insert(
            id,
            Entry {
                model,
                len,
                ram: kv.take().map(KvBytes::from_vec),
                on_disk: false,
                in_flight: false,
                evict_after_write: false,
                pins: u32::from(pin),
                last_access: t,
                chain: Some((prev.copied(), Arc::from(tokens))),
            },
        );
        st.ram_bytes += len;
        if pin {
            st.pinned_bytes += len;
        } else {
            st.policy.insert(id, len);
        }
        let (mut st, r) = self.make_room(st);
        if let Err(e) = r {
            // Roll back: the block was never reported stored.
            let undo = st.entries.get_mut(&id).filter(|e| {
                e.ram.is_some() && !e.on_disk && !e.in_flight && e.pins == u32::from(pin)
            });
            if let Some(e) = undo {
                e.pins = 0;
                if pin {
                    st.pinned_bytes -= len;
                }
                st.drop_ram(&id);
            }
            return Err(e);
        }
        Ok(id)
    }

    /// Evicts until the RAM tier fits its budget. Clean victims are dropped;
    /// dirty ones are spilled (queued for the spiller, or written inline).
    fn make_room<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
    ) -> (MutexGuard<'a, State>, Result<()>) {
        let errors_at_start = st.m.spill_errors;
        loop {
            let items = st.pick_victims(self.cfg.ram_budget);
            let background = self.cfg.background && !st.shutdown;
            if items.is_empty() {
                if background && st.evicting_bytes > self.cfg.max_spill_backlog {
                    if st.m.spill_errors > errors_at_start {
                        let (detail, no_space) = st
                            .last_spill_error
                            .clone()
                            .unwrap_or_else(|| ("spill failed".into(), false));
                        return (st, Err(spill_error(detail, no_space)));
                    }
                    st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
                    continue;
                }
                if background && st.m.spill_errors > errors_at_start {
                    let (detail, no_space) = st
                        .last_spill_error
                        .clone()
                        .unwrap_or_else(|| ("spill failed".into(), false));
                    return (st, Err(spill_error(detail, no_space)));
                }
                return (st, Ok(()));
            }
            if background {
                st.spill_queue.extend(items.iter().map(|i| i.id));
                self.cond.notify_all();
                continue;
            }
            let r;
            (st, r) = self.write_unlocked(st, &items, true);
            self.cond.notify_all();
            if let Err(e) = r {
                st.m.spill_errors += 1;
                return (st, Err(e));
            }
        }
    }

    /// Writes `items` with the state lock released (counted in `writes_in_progress`), then
    /// retakes it and records the outcome; returns the guard and the write's result.
    fn write_unlocked<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        items: &[WriteItem],
        spill: bool,
    ) -> (MutexGuard<'a, State>, Result<()>) {
        st.writes_in_progress += 1;
        drop(st);
        let r = self.write_batch(items);
        let mut st = lock_mutex(&self.state);
        st.writes_in_progress -= 1;
        let done = self.item_lens(items);
        st.finish_writes(&done, r.is_ok(), spill);
        (st, r)
    }

    fn item_lens(&self, items: &[WriteItem]) -> Vec<(BlockId, u64)> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        items
            .iter()
            .map(|i| (i.id, models[i.model].record_len))
            .collect()
    }

    /// Writes blocks durably (no lock held), within the disk quota.
    fn write_batch(&self, items: &[WriteItem]) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let need: u64 = self.item_lens(items).iter().map(|(_, l)| l).sum();
        self.reserve_disk(need)?;
        let r = self.write_reserved(items);
        lock_mutex(&self.state).disk_reserved -= need;
        r
    }

    fn write_reserved(&self, items: &[WriteItem]) -> Result<()> {
        let mut by_model: HashMap<usize, Vec<&WriteItem>> = HashMap::new();
        for i in items {
            by_model.entry(i.model).or_default().push(i);
        }
        for (model, group) in by_model {
            let info = self.model_info(model);
            let inputs: Vec<BlockInput<'_>> = group
                .iter()
                .map(|i| BlockInput {
                    prev: i.prev.as_ref(),
                    tokens: &i.tokens,
                    kv: &i.data,
                })
                .collect();
            let report = info
                .store
                .put_blocks(&inputs, self.cfg.encoding)
                .map_err(|e| StoreError::format(&info.blocks_dir, e))?;
            if report.blocks_reused > 0 {
                // A file left by an earlier, failed batch may not have had its
                // directory entry synced: sync it before calling it durable.
                self.io
                    .sync_dir(&info.blocks_dir)
                    .map_err(|e| StoreError::io("fsync", &info.blocks_dir, e))?;
            }
        }
        Ok(())
    }

    /// Reserves `need` bytes of the disk quota, collecting garbage if needed.
    fn reserve_disk(&self, need: u64) -> Result<()> {
        let quota = self.cfg.disk_quota;
        for attempt in 0..2 {
            {
                let mut st = lock_mutex(&self.state);
                let used = st.disk_bytes + st.disk_reserved;
                if used + need <= quota {
                    st.disk_reserved += need;
                    return Ok(());
                }
                if attempt == 1 {
                    return Err(StoreError::QuotaExceeded {
                        needed: need,
                        used,
                        quota,
                    });
                }
            }
            self.gc_to(quota.saturating_sub(need))?;
        }
        unreachable!("the loop returns on its second pass")
    }

    fn gc_to(&self, target: u64) -> Result<GcReport> {
        let victims: Vec<(BlockId, usize, u64)> = {
            let mut st = lock_mutex(&self.state);
            let mut cands: Vec<(u64, BlockId)> = st
                .entries
                .iter()
                .filter(|(id, e)| {
                    e.on_disk && !e.in_flight && e.pins == 0 && !st.refs.contains_key(id)
                })
                .map(|(id, e)| (e.last_access, *id))
                .collect();
            cands.sort_unstable();
            let models = self.models.read().unwrap_or_else(|e| e.into_inner());
            let mut used = st.disk_bytes + st.disk_reserved;
            let mut out = Vec::new();
            for (_, id) in cands {
                if used <= target {
                    break;
                }
                let Some(e) = st.entries.get_mut(&id) else {
                    continue;
                };
                let rl = models[e.model].record_len;
                e.in_flight = true;
                out.push((id, e.model, rl));
                used = used.saturating_sub(rl);
            }
            out
        };
        if victims.is_empty() {
            return Ok(GcReport::default());
        }
        let mut removed = Vec::new();
        let mut first_err = None;
        let mut dirs: HashSet<usize> = HashSet::new();
        for (id, model, rl) in &victims {
            let info = self.model_info(*model);
            let p = info.store.block_path(id);
            match self.io.remove(&p) {
                Ok(()) => {
                    removed.push((*id, *rl));
                    dirs.insert(*model);
                }
                Err(e) => {
                    first_err.get_or_insert(StoreError::io("remove", &p, e));
                }
            }
        }
        for model in dirs {
            let info = self.model_info(model);
            if let Err(e) = self.io.sync_dir(&info.blocks_dir) {
                // The removals may come back after a crash: harmless, the
                // blocks are complete and unreferenced.
                first_err.get_or_insert(StoreError::io("fsync", &info.blocks_dir, e));
            }
        }
        let mut report = GcReport::default();
        let mut st = lock_mutex(&self.state);
        let removed_set: HashSet<BlockId> = removed.iter().map(|(id, _)| *id).collect();
        for (id, _, rl) in &victims {
            let Some(e) = st.entries.get_mut(id) else {
                continue;
            };
            e.in_flight = false;
            if !removed_set.contains(id) {
                // Still on disk: a pending eviction of its RAM copy can complete.
                if std::mem::take(&mut e.evict_after_write) {
                    let (len, pins) = (e.len, e.pins);
                    st.evicting_bytes -= len;
                    if pins == 0 {
                        st.m.evictions += 1;
                        st.drop_ram(id);
                    }
                }
                continue;
            }
            e.on_disk = false;
            let had_ram = e.ram.is_some();
            let evict = std::mem::take(&mut e.evict_after_write);
            let (len, pins) = (e.len, e.pins);
            st.disk_bytes -= rl;
            report.blocks += 1;
            report.bytes += rl;
            if !had_ram {
                st.entries.remove(id);
            } else if evict {
                // It was picked for eviction while its file was going away:
                // it is dirty again and stays in RAM.
                st.evicting_bytes -= len;
                if pins == 0 {
                    st.policy.insert(*id, len);
                }
            }
        }
        st.m.gc_blocks += report.blocks;
        st.m.gc_bytes += report.bytes;
        drop(st);
        self.cond.notify_all();
        match first_err {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Reads and verifies a block file.
    fn read_block_file(
        &self,
        info: &ModelInfo<V>,
        id: &BlockId,
    ) -> Result<(KvBytes, Option<BlockId>, Vec<u32>, u64)> {
        let p = info.store.block_path(id);
        let bytes = self
            .io
            .read(&p)
            .map_err(|e| StoreError::io("read", &p, e))?;
        let file_len = bytes.len() as u64;
        let (range, owned, prev, tokens) = {
            let v = BlockView::parse(&bytes).map_err(|e| StoreError::format(&p, e))?;
            v.check_owner(&info.fp, &info.geometry)
                .map_err(|e| StoreError::format(&p, e))?;
            if v.id() != *id {
                return Err(StoreError::format(
                    &p,
                    FormatError::BlockIdMismatch {
                        expected: id.to_hex(),
                        found: v.id().to_hex(),
                    },
                ));
            }
            let kv = v.kv().map_err(|e| StoreError::format(&p, e))?;
            let (range, owned) = match kv {
                Cow::Borrowed(s) => {
                    let start = s.as_ptr() as usize - bytes.as_ptr() as usize;
                    (Some((start, s.len())), None)
                }
                Cow::Owned(o) => (None, Some(o)),
            };
            (range, owned, v.prev(), v.tokens())
        };
        let data = match (range, owned) {
            (Some((start, len)), _) => KvBytes::slice_of(bytes, start, len),
            (None, Some(o)) => Some(KvBytes::from_vec(o)),
            (None, None) => None,
        }
        .ok_or_else(|| StoreError::Invalid {
            what: "block payload",
            detail: format!("payload outside the record in {p:?}"),
        })?;
        Ok((data, prev, tokens, file_len))
    }

    /// Gets (and optionally pins) a block, promoting it from disk.
    fn get(&self, id: &BlockId, pin: bool, count: bool) -> Result<Option<KvBytes>> {
        let mut st = lock_mutex(&self.state);
        loop {
            let t = st.next_tick();
            let Some(e) = st.entries.get_mut(id) else {
                if count {
                    st.m.misses += 1;
                }
                return Ok(None);
            };
            e.last_access = t;
            if let Some(data) = e.ram.clone() {
                let (len, evicting) = (e.len, e.evict_after_write);
                if count {
                    st.m.ram_hits += 1;
                }
                if pin {
                    self.pin_locked(&mut st, id)?;
                } else if evicting {
                    // Read while its spill is pending: keep it after all.
                    if let Some(e) = st.entries.get_mut(id) {
                        e.evict_after_write = false;
                    }
                    st.evicting_bytes -= len;
                    st.policy.insert(*id, len);
                } else {
                    st.policy.touch(id);
                }
                return Ok(Some(data));
            }
            if e.in_flight {
                // Its file is being deleted by the collector: wait for the outcome.
                st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let model = e.model;
            let len = e.len;
            if pin && st.pinned_bytes + len > self.cfg.ram_budget {
                return Err(StoreError::RamFull {
                    needed: len,
                    pinned: st.pinned_bytes,
                    budget: self.cfg.ram_budget,
                });
            }
            drop(st);
            let info = self.model_info(model);
            let read = self.read_block_file(&info, id);
            st = lock_mutex(&self.state);
            let (data, prev, tokens, file_len) = match read {
                Ok(r) => r,
                Err(e) => {
                    let gone = e
                        .io_error()
                        .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound);
                    if gone && !st.entries.get(id).is_some_and(|e| e.on_disk) {
                        // Collected while we read: retry (it is a miss now).
                        continue;
                    }
                    return Err(e);
                }
            };
            st.m.bytes_read += file_len;
            let Some(e) = st.entries.get_mut(id) else {
                continue;
            };
            if e.ram.is_some() {
                // Promoted by someone else meanwhile.
                continue;
            }
            e.ram = Some(data.clone());
            e.chain = Some((prev, Arc::from(tokens)));
            st.ram_bytes += len;
            st.m.promotions += 1;
            if count {
                st.m.disk_hits += 1;
            }
            if pin {
                if let Err(e) = self.pin_locked(&mut st, id) {
                    st.policy.insert(*id, len);
                    return Err(e);
                }
            } else {
                st.policy.insert(*id, len);
            }
            let (mut st, r) = self.make_room(st);
            if r.is_err() && !pin {
                // The copy could not be kept; the caller still gets the data.
                if st
                    .entries
                    .get(id)
                    .is_some_and(|e| e.on_disk && !e.in_flight)
                {
                    st.drop_ram(id);
                }
            }
            return Ok(Some(data));
        }
    }

    /// Adds a pin to a block that is in RAM.
    fn pin_locked(&self, st: &mut State, id: &BlockId) -> Result<()> {
        let pinned = st.pinned_bytes;
        let Some(e) = st.entries.get_mut(id) else {
            return Err(StoreError::BlockNotFound { id: id.to_hex() });
        };
        if e.pins == 0 {
            if pinned + e.len > self.cfg.ram_budget {
                return Err(StoreError::RamFull {
                    needed: e.len,
                    pinned,
                    budget: self.cfg.ram_budget,
                });
            }
            let len = e.len;
            if std::mem::take(&mut e.evict_after_write) {
                st.evicting_bytes -= len;
            }
            e.pins = 1;
            st.pinned_bytes += len;
            st.policy.remove(id);
        } else {
            e.pins += 1;
        }
        Ok(())
    }

    fn unpin(&self, id: &BlockId) -> Result<()> {
        let mut st = lock_mutex(&self.state);
        let Some(e) = st.entries.get_mut(id).filter(|e| e.pins > 0) else {
            return Err(StoreError::NotPinned { id: id.to_hex() });
        };
        e.pins -= 1;
        if e.pins == 0 {
            let len = e.len;
            st.pinned_bytes -= len;
            st.policy.insert(*id, len);
            let (_st, r) = self.make_room(st);
            r?;
        }
        Ok(())
    }

    fn save(&self, model: usize, info: &ModelInfo<V>, manifest: &Manifest) -> Result<()> {
        let name = &manifest.meta.name;
        let path = info
            .store
            .manifest_path(name)
            .map_err(|e| StoreError::format(&self.root, e))?;
        manifest
            .check_owner(&info.fp, &info.geometry)
            .map_err(|e| StoreError::format(&path, e))?;
        manifest
            .validate()
            .map_err(|e| StoreError::format(&path, e))?;
        let _serial = lock_mutex(&self.save_lock);
        let ids = manifest.block_ids.clone();
        let mut st = lock_mutex(&self.state);
        loop {
            if let Some(id) = ids.iter().find(|id| !st.entries.contains_key(*id)) {
                return Err(StoreError::MissingBlock {
                    checkpoint: name.clone(),
                    id: id.to_hex(),
                });
            }
            if ids
                .iter()
                .any(|id| st.entries.get(id).is_some_and(|e| e.in_flight))
            {
                st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            break;
        }
        let mut seen = HashSet::new();
        let items: Vec<WriteItem> = ids
            .iter()
            .filter(|id| seen.insert(**id))
            .filter_map(|id| st.claim_dirty(id))
            .collect();
        st.add_refs(&ids);
        let r;
        (st, r) = self.write_unlocked(st, &items, false);
        self.cond.notify_all();
        if let Err(e) = r {
            st.m.spill_errors += 1;
            st.drop_refs(&ids);
            return Err(e);
        }
        drop(st);
        let written = info
            .store
            .write_manifest(manifest)
            .map_err(|e| StoreError::format(&path, e));
        let mut st = lock_mutex(&self.state);
        match written {
            Ok(n) => {
                st.m.bytes_written += n;
                st.m.saves += 1;
                if let Some(old) = st.checkpoints.insert((model, name.clone()), ids) {
                    st.drop_refs(&old);
                }
                Ok(())
            }
            // The manifest may or may not have replaced the old one: keep the
            // references of both until the next open recounts them.
            Err(e) => Err(e),
        }
    }

    fn delete(&self, model: usize, info: &ModelInfo<V>, name: &str) -> Result<()> {
        let _serial = lock_mutex(&self.save_lock);
        let key = (model, name.to_string());
        if !lock_mutex(&self.state).checkpoints.contains_key(&key) {
            return Err(StoreError::CheckpointNotFound {
                name: name.to_string(),
            });
        }
        let path = info
            .store
            .manifest_path(name)
            .map_err(|e| StoreError::format(&self.root, e))?;
        // On error the checkpoint may still exist: keep its references.
        match info.store.delete_manifest(name) {
            Ok(()) => {}
            Err(FormatError::Io {
                op: "remove",
                source,
                ..
            }) if source.kind() == std::io::ErrorKind::NotFound => {
                // An earlier delete removed the file but failed to sync the
                // directory: finish its job.
                let dir = info.store.root().join(MANIFESTS_DIR);
                self.io
                    .sync_dir(&dir)
                    .map_err(|e| StoreError::io("fsync", &dir, e))?;
            }
            Err(e) => return Err(StoreError::format(&path, e)),
        }
        let mut st = lock_mutex(&self.state);
        if let Some(old) = st.checkpoints.remove(&key) {
            st.drop_refs(&old);
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        for _round in 0..3 {
            let mut st = lock_mutex(&self.state);
            while !st.spill_queue.is_empty() || st.writes_in_progress > 0 {
                st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            let dirty: Vec<BlockId> = st
                .entries
                .iter()
                .filter(|(_, e)| e.ram.is_some() && !e.on_disk && !e.in_flight)
                .map(|(id, _)| *id)
                .collect();
            if dirty.is_empty() {
                return Ok(());
            }
            let items: Vec<WriteItem> = dirty.iter().filter_map(|id| st.claim_dirty(id)).collect();
            st.writes_in_progress += 1;
            drop(st);
            let mut result = Ok(());
            let mut start = 0;
            while start < items.len() {
                let mut end = start;
                let mut bytes = 0u64;
                while end < items.len() && (end == start || bytes < self.cfg.spill_batch_bytes) {
                    bytes += items[end].data.len() as u64;
                    end += 1;
                }
                let chunk = &items[start..end];
                let r = self.write_batch(chunk);
                let mut st = lock_mutex(&self.state);
                let done = self.item_lens(chunk);
                st.finish_writes(&done, r.is_ok(), false);
                if r.is_err() {
                    st.m.spill_errors += 1;
                    // Release the claims of the chunks not written.
                    let rest = self.item_lens(&items[end..]);
                    st.finish_writes(&rest, false, false);
                    result = r;
                    break;
                }
                start = end;
            }
            let mut st = lock_mutex(&self.state);
            st.writes_in_progress -= 1;
            drop(st);
            self.cond.notify_all();
            result?;
        }
        Ok(())
    }

    /// Brings `ids` into RAM with up to `prefetch_readers` concurrent
    /// readers (scoped threads, joined before returning). Returns how many
    /// blocks were read from disk.
    fn prefetch_ids(&self, ids: &[BlockId]) -> Result<usize> {
        let readers = self.cfg.prefetch_readers.clamp(1, 64).min(ids.len().max(1));
        let read_part = |k: usize| -> Result<usize> {
            let mut n = 0;
            for id in ids.iter().skip(k).step_by(readers) {
                let was_cold = {
                    let st = lock_mutex(&self.state);
                    st.entries.get(id).is_some_and(|e| e.ram.is_none())
                };
                self.get(id, false, false)?;
                if was_cold {
                    n += 1;
                }
            }
            Ok(n)
        };
        let n = if readers == 1 {
            read_part(0)?
        } else {
            std::thread::scope(|scope| -> Result<usize> {
                let mut handles = Vec::with_capacity(readers - 1);
                for k in 1..readers {
                    let h = std::thread::Builder::new()
                        .name("kvstore-prefetch-reader".into())
                        .spawn_scoped(scope, move || read_part(k))
                        .map_err(|e| StoreError::io("spawn", "kvstore-prefetch-reader", e))?;
                    handles.push(h);
                }
                let mut total = read_part(0);
                for h in handles {
                    let r = h.join().unwrap_or(Err(StoreError::ShutDown));
                    total = match (total, r) {
                        (Ok(a), Ok(b)) => Ok(a + b),
                        (Err(e), _) | (_, Err(e)) => Err(e),
                    };
                }
                total
            })?
        };
        lock_mutex(&self.state).m.prefetched_blocks += n as u64;
        Ok(n)
    }

    fn spill_worker(&self) {
        loop {
            let mut st = lock_mutex(&self.state);
            while st.spill_queue.is_empty() && !st.shutdown {
                st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.shutdown {
                return;
            }
            let mut ids = Vec::new();
            let mut bytes = 0u64;
            while bytes < self.cfg.spill_batch_bytes {
                let Some(id) = st.spill_queue.pop_front() else {
                    break;
                };
                if let Some(e) = st.entries.get(&id) {
                    bytes += e.len;
                    ids.push(id);
                }
            }
            let items: Vec<WriteItem> = ids
                .iter()
                .filter_map(|id| {
                    let e = st.entries.get(id)?;
                    let (prev, tokens) = e.chain.as_ref()?;
                    Some(WriteItem {
                        id: *id,
                        model: e.model,
                        prev: *prev,
                        tokens: Arc::clone(tokens),
                        data: e.ram.clone()?,
                    })
                })
                .collect();
            let (mut st, r) = self.write_unlocked(st, &items, true);
            let unwritten: Vec<(BlockId, u64)> = ids
                .iter()
                .filter(|id| !items.iter().any(|i| i.id == **id))
                .map(|id| (*id, 0))
                .collect();
            st.finish_writes(&unwritten, false, true);
            if let Err(e) = r {
                st.m.spill_errors += 1;
                st.last_spill_error = Some((e.to_string(), e.is_no_space()));
            }
            drop(st);
            self.cond.notify_all();
        }
    }

    fn prefetch_worker(&self) {
        loop {
            let job = {
                let mut st = lock_mutex(&self.state);
                loop {
                    if st.shutdown {
                        return;
                    }
                    if let Some(job) = st.prefetch_queue.pop_front() {
                        break job;
                    }
                    st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            let r = self.prefetch_ids(&job.ids);
            let _ = job.done.send(r);
        }
    }
}

fn spill_error(detail: String, no_space: bool) -> StoreError {
    StoreError::Spill { detail, no_space }
}
