//! The owned handles: [`ModelStore`] (one model's blocks and checkpoints)
//! and [`PinGuard`].

use std::path::PathBuf;
use std::sync::{mpsc, Arc};

use ckptfmt::{BlockId, ChainRoot, CheckpointHealth, Fingerprint, FormatError, Geometry, Manifest};

use crate::bytes::KvBytes;
use crate::config::GcReport;
use crate::error::{Result, StoreError};
use crate::io::BlockIo;
use crate::state::PrefetchJob;
use crate::store::{lock_mutex, ModelInfo, Shared};
use crate::tier::{Access, Hold};

/// A model's part of a store: its fingerprint and geometry, and the block
/// and checkpoint operations. Owned and cheap to clone (`Send + Sync +
/// 'static`); it stays usable after the [`crate::KvStore`] is dropped.
pub struct ModelStore<V: BlockIo = ckptfmt::StdFs> {
    pub(crate) shared: Arc<Shared<V>>,
    pub(crate) idx: usize,
    pub(crate) info: Arc<ModelInfo<V>>,
}

impl<V: BlockIo> Clone for ModelStore<V> {
    fn clone(&self) -> Self {
        ModelStore {
            shared: Arc::clone(&self.shared),
            idx: self.idx,
            info: Arc::clone(&self.info),
        }
    }
}

/// Pins blocks until dropped (see [`ModelStore::pin_all`]). Owned.
pub struct PinGuard<V: BlockIo = ckptfmt::StdFs> {
    shared: Arc<Shared<V>>,
    ids: Vec<BlockId>,
    pinned: bool,
}

/// A checkpoint read back: its manifest and the KV of each full block.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The manifest (tokens, positions, tail KV, metadata).
    pub manifest: Manifest,
    /// The raw KV of each block, in order.
    pub blocks: Vec<KvBytes>,
}

/// One checkpoint as listed by [`ModelStore::checkpoints`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// Its name.
    pub name: String,
    /// Tokens it holds (blocks and tail).
    pub n_tokens: usize,
    /// Bytes of the block files no other checkpoint references, plus its
    /// manifest: what deleting it (and collecting) frees.
    pub own_bytes: u64,
    /// When it was last saved (Unix seconds, from its metadata; 0 when unknown).
    pub last_used_unix: u64,
}

/// The longest stored prefix of a token sequence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Ids of the stored blocks covering the prefix, in order.
    pub block_ids: Vec<BlockId>,
    /// Tokens covered (`block_ids.len() * tokens_per_block`).
    pub n_tokens: usize,
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

impl<V: BlockIo> ModelStore<V> {
    pub(crate) fn new(shared: Arc<Shared<V>>, idx: usize) -> Self {
        let info = shared.model_info(idx);
        ModelStore { shared, idx, info }
    }

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
    /// `block_bytes()` bytes. A block the store already holds (in this
    /// process or on disk) is not stored again (equal ids, equal bytes).
    ///
    /// Fails with [`StoreError::RamFull`] when pinned blocks leave no room,
    /// or with the spill's error when making room required a write that
    /// failed (the block is then not stored, unless already in flight).
    pub fn put(&self, prev: Option<&BlockId>, tokens: &[u32], kv: Vec<u8>) -> Result<BlockId> {
        self.shared.put(
            self.idx,
            &self.info,
            prev,
            tokens,
            KvBytes::from_vec(kv),
            Hold::Cache,
        )
    }

    /// Puts every full block of `tokens`, asking `kv(i)` for block `i`'s
    /// bytes only for the blocks the store does not hold yet. Returns the ids.
    ///
    /// Blocks found on disk are not pinned: a concurrent collection may
    /// reclaim them before a later save. A live session should use
    /// [`ModelStore::put_sequence_pinned`].
    pub fn put_sequence(
        &self,
        tokens: &[u32],
        kv: impl FnMut(usize) -> Vec<u8>,
    ) -> Result<Vec<BlockId>> {
        self.put_sequence_with(tokens, kv, Hold::Cache)
            .map(|g| g.into_ids())
    }

    /// Like [`ModelStore::put_sequence`], but pins every block as it is
    /// stored (or found), so a live session's blocks cannot be evicted or
    /// collected between the put and a later save. All or none: on error,
    /// the pins taken so far are released.
    pub fn put_sequence_pinned(
        &self,
        tokens: &[u32],
        kv: impl FnMut(usize) -> Vec<u8>,
    ) -> Result<PinGuard<V>> {
        self.put_sequence_with(tokens, kv, Hold::Pin)
    }

    /// Both of the above: the guard holds pins only with [`Hold::Pin`].
    fn put_sequence_with(
        &self,
        tokens: &[u32],
        mut kv: impl FnMut(usize) -> Vec<u8>,
        hold: Hold,
    ) -> Result<PinGuard<V>> {
        let tpb = self.info.geometry.tokens_per_block() as usize;
        let mut prev: Option<BlockId> = None;
        let mut guard = PinGuard::empty(Arc::clone(&self.shared), hold);
        for (i, chunk) in tokens.chunks_exact(tpb).enumerate() {
            let id = BlockId::chain(&self.info.fp, prev.as_ref(), chunk);
            let found = match hold {
                Hold::Cache => self.contains(&id) && self.shared.touch_if_present(&id),
                Hold::Pin => self.contains(&id) && self.shared.get(&id, Access::Pin)?.is_some(),
            };
            if found {
                if hold == Hold::Pin {
                    let mut st = lock_mutex(&self.shared.state);
                    st.m.dedup_blocks += 1;
                    st.m.dedup_bytes += self.info.block_bytes;
                }
            } else {
                self.shared.put(
                    self.idx,
                    &self.info,
                    prev.as_ref(),
                    chunk,
                    KvBytes::from_vec(kv(i)),
                    hold,
                )?;
            }
            guard.push(id);
            prev = Some(id);
        }
        Ok(guard)
    }

    /// Writes blocks to disk now, keeping no copy in RAM: pages leaving an engine's RAM budget,
    /// which it then reads from their files ([`ModelStore::block_files`]). Each item is `(prev,
    /// tokens, kv)` as for [`ModelStore::put`]; a block whose file exists is not written again.
    /// The writes count against the disk quota and budget like any other, and are durable
    /// (fsync) when this returns. Returns the ids, in order.
    pub fn put_on_disk(
        &self,
        blocks: &[(Option<BlockId>, &[u32], Vec<u8>)],
    ) -> Result<Vec<BlockId>> {
        self.shared.writable("put_on_disk")?;
        let tpb = self.info.geometry.tokens_per_block() as usize;
        let mut ids = Vec::with_capacity(blocks.len());
        let mut items = Vec::new();
        for (prev, tokens, kv) in blocks {
            if tokens.len() != tpb || kv.len() as u64 != self.info.block_bytes {
                return Err(StoreError::Invalid {
                    what: "block",
                    detail: format!(
                        "{} tokens and {} bytes, a block holds {tpb} and {}",
                        tokens.len(),
                        kv.len(),
                        self.info.block_bytes
                    ),
                });
            }
            let id = BlockId::chain(&self.info.fp, prev.as_ref(), tokens);
            let on_disk = self.info.store.has_block(&id).unwrap_or(false);
            if !on_disk && !items.iter().any(|i: &crate::state::WriteItem| i.id == id) {
                items.push(crate::state::WriteItem {
                    id,
                    model: self.idx,
                    prev: *prev,
                    tokens: Arc::from(*tokens),
                    data: KvBytes::from_vec(kv.clone()),
                });
            }
            ids.push(id);
        }
        if !items.is_empty() {
            self.shared
                .write_batch(&items, crate::state::WriteKind::Spill)?;
        }
        // The index learns of the files (a block it held in RAM is now clean).
        for id in &ids {
            self.contains(id);
        }
        Ok(ids)
    }

    /// The block files of this model (ckptfmt's store): for a reader that maps a block's file
    /// and attends to it where it lies. Files are only ever replaced by rename or unlinked,
    /// never written in place, so a map of one stays valid.
    pub fn block_files(&self) -> &ckptfmt::Store<V> {
        &self.info.store
    }

    /// The verified KV of block `id`: from RAM, or read from disk, verified
    /// and promoted into RAM. `Ok(None)` when neither tier holds it. A file
    /// that fails verification is quarantined (and the error returned).
    pub fn get(&self, id: &BlockId) -> Result<Option<KvBytes>> {
        self.shared.get(id, Access::Get)
    }

    /// Like [`ModelStore::get`], but a block read from disk is not promoted into RAM: for a
    /// caller that copies the bytes elsewhere at once (restoring a session), where caching them
    /// would cost fresh memory and evict blocks more likely to be read again.
    pub fn get_uncached(&self, id: &BlockId) -> Result<Option<KvBytes>> {
        self.shared.get(id, Access::Peek)
    }

    /// Whether the store holds block `id` in either tier (a file written by
    /// another process counts; a quarantined one does not).
    pub fn contains(&self, id: &BlockId) -> bool {
        self.shared.contains(self.idx, &self.info, id)
    }

    /// Whether block `id` is in the RAM tier now.
    pub fn is_resident(&self, id: &BlockId) -> bool {
        lock_mutex(&self.shared.state)
            .entries
            .get(id)
            .is_some_and(|e| e.ram.is_some())
    }

    /// Path of checkpoint `name`'s manifest file (whether or not it exists).
    pub fn manifest_path(&self, name: &str) -> Result<PathBuf> {
        self.info
            .store
            .manifest_path(name)
            .map_err(|e| StoreError::format(self.info.store.root(), e))
    }

    /// Marks checkpoint `name` as used now: its manifest's modification time becomes the
    /// present, the same in every process, for a policy that drops checkpoints used longest
    /// ago first. Best effort: false when the manifest is gone or its time cannot be set.
    pub fn touch_manifest(&self, name: &str) -> bool {
        let Ok(path) = self.manifest_path(name) else {
            return false;
        };
        self.touch(&path)
    }

    /// Sets the modification time of `path` (a file of this model) to now: the use the
    /// store's least-recently-used policies read. Never on a read-only store (false).
    pub(crate) fn touch(&self, path: &std::path::Path) -> bool {
        self.shared.access != crate::store::Access::ReadOnly
            && std::fs::File::options()
                .write(true)
                .open(path)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()))
                .is_ok()
    }

    /// Path of block `id`'s file (whether or not it exists).
    pub fn block_path(&self, id: &BlockId) -> PathBuf {
        self.info.store.block_path(id)
    }

    /// Pins block `id` in RAM (promoting it when on disk). Pins nest; a
    /// pinned block is never evicted nor garbage collected by this process.
    pub fn pin(&self, id: &BlockId) -> Result<KvBytes> {
        self.shared
            .get(id, Access::Pin)?
            .ok_or_else(|| StoreError::BlockNotFound { id: id.to_hex() })
    }

    /// Releases one pin of block `id`.
    pub fn unpin(&self, id: &BlockId) -> Result<()> {
        self.shared.unpin(id)
    }

    /// Pins every block of `ids` until the guard is dropped (all or none).
    pub fn pin_all(&self, ids: &[BlockId]) -> Result<PinGuard<V>> {
        let mut guard = PinGuard::empty(Arc::clone(&self.shared), Hold::Pin);
        for id in ids {
            self.pin(id)?;
            guard.push(*id);
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
        self.load_with(name, Hold::Cache).map(|(c, _)| c)
    }

    /// Like [`ModelStore::load`], and pins every block until the guard drops
    /// (a resumed session's blocks stay in RAM while it runs).
    pub fn load_pinned(&self, name: &str) -> Result<(Checkpoint, PinGuard<V>)> {
        self.load_with(name, Hold::Pin)
    }

    fn load_with(&self, name: &str, hold: Hold) -> Result<(Checkpoint, PinGuard<V>)> {
        let manifest = self.read_manifest(name)?;
        let access = match hold {
            Hold::Cache => Access::Get,
            Hold::Pin => Access::Pin,
        };
        let mut guard = PinGuard::empty(Arc::clone(&self.shared), hold);
        let mut blocks = Vec::with_capacity(manifest.block_ids.len());
        for id in &manifest.block_ids {
            let b = match self.shared.get(id, access)? {
                Some(b) => Some(b),
                // A block another process wrote since this one last looked: its file is
                // found, indexed, and read.
                None if self.shared.contains(self.idx, &self.info, id) => {
                    self.shared.get(id, access)?
                }
                None => None,
            };
            let b = b.ok_or_else(|| StoreError::MissingBlock {
                checkpoint: name.to_string(),
                id: id.to_hex(),
            })?;
            guard.push(*id);
            blocks.push(b);
        }
        Ok((Checkpoint { manifest, blocks }, guard))
    }

    /// Reads the manifest of checkpoint `name` (verified, its name checked).
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

    /// How much of checkpoint `name` is restorable: its blocks are checked in
    /// order (from RAM when resident, else their files are verified) up to
    /// the first missing or damaged one, which is quarantined when damaged.
    pub fn checkpoint_health(&self, name: &str) -> Result<CheckpointHealth> {
        self.shared.checkpoint_health(&self.info, name)
    }

    /// Names of this model's checkpoints (from disk: those of every
    /// process), sorted.
    pub fn list(&self) -> Result<Vec<String>> {
        let mut v = self
            .info
            .store
            .list_manifests()
            .map_err(|e| StoreError::format(self.info.store.root(), e))?;
        v.sort();
        Ok(v)
    }

    /// Bytes one block takes on disk (its file: header, tokens and KV).
    pub fn block_file_bytes(&self) -> u64 {
        self.info.record_len
    }

    /// Whether checkpoint `name` exists (one `stat`: the manifest is not read).
    pub fn has_checkpoint(&self, name: &str) -> Result<bool> {
        self.info
            .store
            .has_manifest(name)
            .map_err(|e| StoreError::format(self.info.store.root(), e))
    }

    /// Every checkpoint with its size, the bytes only it holds and its last
    /// use, sorted by name. A damaged manifest is listed with 0 tokens.
    pub fn checkpoints(&self) -> Result<Vec<CheckpointInfo>> {
        self.shared.checkpoint_infos(&self.info)
    }

    /// Collects the store until its block files and this model's manifests take at most
    /// `budget` bytes: unreferenced blocks first, least recently used first; when they are not
    /// enough, this model's checkpoints for which `order` gives a key are deleted, those
    /// modified longest ago first (then by key), and their blocks that nothing else references
    /// go too. Its cost follows what changed in the store since the last collection, however
    /// many go; the report names the checkpoints deleted.
    pub fn collect_dropping(
        &self,
        budget: u64,
        order: &dyn Fn(&str) -> Option<u64>,
    ) -> Result<GcReport> {
        self.shared.gc_dropping(budget, Some((self.idx, order)))
    }

    /// The checkpoints of this model that the disk budget ([`crate::Config::disk_budget`])
    /// may drop, and in which order, when a write must make room and unreferenced blocks are
    /// not enough: the same order as [`ModelStore::collect_dropping`]'s. Without it (the
    /// default) a reservation drops no checkpoint. One model of a store has it at a time.
    pub fn set_budget_drop_order(&self, order: crate::SharedDropOrder) {
        let mut slot = self
            .shared
            .budget_drops
            .write()
            .unwrap_or_else(|e| e.into_inner());
        *slot = Some((self.idx, order));
    }

    /// Deletes what of this model chains from `root` (a namespace's root): the checkpoints
    /// whose first block chains from it and for which `which` says yes, and every block, on
    /// disk or in RAM, whose chain of predecessors leads to it and that no remaining
    /// checkpoint references. Blocks a live sequence holds pinned stay (counted as busy).
    pub fn delete_chain(
        &self,
        root: &BlockId,
        which: &dyn Fn(&str) -> bool,
    ) -> Result<crate::ChainReport> {
        self.shared.delete_chain(self.idx, root, which)
    }

    /// Deletes the checkpoints whose expiry ([`crate::EXPIRES_KEY`]) is at or before
    /// `now_unix` (reading every manifest); returns their names. One that cannot be read is
    /// left to `ckpt verify`.
    pub fn delete_expired(&self, now_unix: u64) -> Result<Vec<String>> {
        let mut gone = Vec::new();
        for name in self.list()? {
            let Ok(m) = self.read_manifest(&name) else {
                continue;
            };
            let expired = m
                .meta
                .kv
                .iter()
                .find(|(k, _)| k == crate::EXPIRES_KEY)
                .and_then(|(_, v)| v.parse::<u64>().ok())
                .is_some_and(|e| e <= now_unix);
            if expired {
                self.delete(&name)?;
                gone.push(name);
            }
        }
        Ok(gone)
    }

    /// Deletes checkpoint `name` durably. Its blocks stay until collected.
    pub fn delete(&self, name: &str) -> Result<()> {
        self.shared.delete(&self.info, name)
    }

    /// The longest chain of stored blocks that is a prefix of `tokens` chained from `roots`
    /// (a namespace's or a shifted sequence's chain roots, [`ChainRoot`]; none for plain
    /// tokens): the local tiers first (RAM and disk, saved in a checkpoint or not, written by
    /// any process), then the remote tier, if there is one, for the rest in one round trip
    /// (what it brings is kept locally). The one prefix walk of the workspace.
    pub fn longest_prefix(&self, tokens: &[u32], roots: &[ChainRoot]) -> PrefixMatch {
        let tpb = self.info.geometry.tokens_per_block();
        let mut block_ids = BlockId::chain_all_rooted(&self.info.fp, tokens, tpb, roots);
        let held = self.held_prefix(&block_ids);
        block_ids.truncate(held);
        PrefixMatch {
            n_tokens: held * tpb as usize,
            block_ids,
        }
    }

    /// How many of `ids` (a chain) are held from the first on: those the local tiers hold,
    /// then those the remote tier brings for the rest.
    pub(crate) fn held_prefix(&self, ids: &[BlockId]) -> usize {
        let local = ids.iter().take_while(|id| self.contains(id)).count();
        local + self.fetch_remote(&ids[local..]).blocks
    }

    /// Brings checkpoint `name`'s blocks into RAM on the background thread
    /// (inline when the store runs without one).
    pub fn prefetch(&self, name: &str) -> Result<Prefetch> {
        let ids = self.read_manifest(name)?.block_ids;
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

impl<V: BlockIo> PinGuard<V> {
    /// A guard that releases its blocks' pins on drop with [`Hold::Pin`];
    /// with [`Hold::Cache`] it only collects ids.
    fn empty(shared: Arc<Shared<V>>, hold: Hold) -> Self {
        PinGuard {
            shared,
            ids: Vec::new(),
            pinned: hold == Hold::Pin,
        }
    }

    fn push(&mut self, id: BlockId) {
        self.ids.push(id);
    }

    fn into_ids(mut self) -> Vec<BlockId> {
        std::mem::take(&mut self.ids)
    }

    /// The pinned blocks.
    pub fn ids(&self) -> &[BlockId] {
        &self.ids
    }
}

impl<V: BlockIo> Drop for PinGuard<V> {
    fn drop(&mut self) {
        if !self.pinned {
            return;
        }
        for id in &self.ids {
            let _ = self.shared.unpin(id);
        }
    }
}
