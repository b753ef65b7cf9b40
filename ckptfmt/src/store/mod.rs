//! A directory of blocks and checkpoint manifests.
//!
//! ```text
//! ROOT/store.ckpt              store descriptor: a manifest with no tokens (fingerprint, geometry)
//! ROOT/blocks/<id-hex>.blk     one block record per file, named by its id
//! ROOT/manifests/<name>.ckpt   one manifest per checkpoint
//! ROOT/quarantine/             block files that failed verification, moved aside
//! ROOT/LOCK, ROOT/owners/      sharing between processes (see `sharing.rs`)
//! *.<owner>-<n>.tmp            files being written; removed once their owner is gone
//! ```
//!
//! Every file is written to a temporary name, synced, renamed into place and
//! the directory synced (FORMAT.md, "Commit protocol"). A save writes the
//! blocks the store lacks, then the manifest; the manifest's rename is the
//! commit point. Several processes may open a store for writing at once;
//! [`Store::open_read_only`] writes nothing at all.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

mod cleanup;
mod commit;
mod health;
mod states;

pub use health::{BadBlock, CheckpointHealth};
pub use states::OwnedState;

use std::time::Duration;

use commit::Staged;

use crate::block::{encode_block, BlockView, EncodedBlock, Encoding};
use crate::error::{FormatError, Result};
use crate::export::write_export;
use crate::geometry::Geometry;
use crate::ids::{BlockId, Fingerprint};
use crate::manifest::{Manifest, Metadata};
use crate::mmap::Mapped;
use crate::sharing::{self, Owner, DEFAULT_LOCK_TIMEOUT};
use crate::vfs::{create_dir_durable, FileLock, LockMode, StdFs, Vfs};

/// File name of the store descriptor.
pub const DESCRIPTOR_FILE: &str = "store.ckpt";
/// Directory of block files.
pub const BLOCKS_DIR: &str = "blocks";
/// Directory of manifests.
pub const MANIFESTS_DIR: &str = "manifests";
/// Suffix of block files.
pub const BLOCK_SUFFIX: &str = ".blk";
/// Suffix of state records (in the block directory, named by their block's id).
pub const STATE_SUFFIX: &str = ".sta";
/// Suffix of manifest files.
pub const MANIFEST_SUFFIX: &str = ".ckpt";
/// Directory of quarantined block files.
pub const QUARANTINE_DIR: &str = "quarantine";
/// Suffix of files being written.
pub const TMP_SUFFIX: &str = ".tmp";

/// Longest checkpoint name.
pub const MAX_NAME_LEN: usize = 200;

/// A directory-based store of blocks and manifests for one model and geometry.
#[derive(Debug)]
pub struct Store<V: Vfs = StdFs> {
    vfs: V,
    root: PathBuf,
    blocks_dir: PathBuf,
    manifests_dir: PathBuf,
    fingerprint: Fingerprint,
    geometry: Geometry,
    /// The registration of a store open for writing; `None` when read-only.
    owner: Option<Owner>,
    lock_timeout: Duration,
}

/// One block to write: its predecessor, its tokens and its raw KV bytes.
#[derive(Debug, Clone, Copy)]
pub struct BlockInput<'a> {
    /// Id of the previous block of the sequence, `None` for the first.
    pub prev: Option<&'a BlockId>,
    /// Exactly `tokens_per_block` token ids.
    pub tokens: &'a [u32],
    /// Exactly `block_bytes()` bytes of KV.
    pub kv: &'a [u8],
}

/// What a save wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SaveReport {
    /// Blocks written because the store lacked them.
    pub blocks_written: usize,
    /// Blocks already present and reused.
    pub blocks_reused: usize,
    /// Bytes written to files (blocks and manifest).
    pub bytes_written: u64,
}

/// A block read into memory and verified.
#[derive(Debug, Clone)]
pub struct OwnedBlock {
    bytes: Vec<u8>,
}

impl OwnedBlock {
    /// Verifies the whole record again (header, id, payload CRC) and returns
    /// it; for callers that keep blocks and re-check them before use.
    pub fn verify(&self) -> Result<BlockView<'_>> {
        BlockView::parse(&self.bytes)
    }

    /// The verified record.
    pub fn view(&self) -> Result<BlockView<'_>> {
        BlockView::parse_at(&self.bytes, 0, false)
    }

    /// The record's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// A block file mapped read-only and verified. Reading it touches no other file.
#[derive(Debug)]
pub struct MappedBlock {
    pub(crate) map: Mapped,
}

impl MappedBlock {
    /// Verifies the whole record again (header, id, payload CRC) and returns
    /// it; for callers that keep blocks and re-check them before use.
    pub fn verify(&self) -> Result<BlockView<'_>> {
        BlockView::parse(&self.map)
    }

    /// The verified record; its payload borrows the map.
    pub fn view(&self) -> Result<BlockView<'_>> {
        BlockView::parse_at(&self.map, 0, false)
    }

    /// The record's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.map
    }
}

/// Checks a checkpoint name: 1 to 200 bytes of `[A-Za-z0-9._-]`, not
/// starting with `.` and not ending with `.tmp`.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && !name.ends_with(TMP_SUFFIX)
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(FormatError::invalid("checkpoint name", format!("{name:?}")))
    }
}

impl Store<StdFs> {
    /// Opens the store at `root` for writing, creating it when absent. An
    /// existing store of another fingerprint or geometry is refused with a
    /// typed error. Other processes may have the store open at the same time.
    pub fn open(
        root: impl AsRef<Path>,
        fingerprint: Fingerprint,
        geometry: Geometry,
    ) -> Result<Self> {
        Self::open_with(StdFs, root, fingerprint, geometry)
    }

    /// Opens an existing store for writing, taking fingerprint and geometry
    /// from its descriptor.
    pub fn open_existing(root: impl AsRef<Path>) -> Result<Self> {
        Self::open_existing_with(StdFs, root)
    }

    /// Opens an existing store read-only: creates, removes, locks and
    /// recovers nothing (works on a read-only copy). Every call that would
    /// write fails with [`FormatError::ReadOnly`].
    pub fn open_read_only(root: impl AsRef<Path>) -> Result<Self> {
        Self::open_read_only_with(StdFs, root)
    }
}

impl<V: Vfs> Store<V> {
    /// [`Store::open`] over any [`Vfs`].
    pub fn open_with(
        vfs: V,
        root: impl AsRef<Path>,
        fingerprint: Fingerprint,
        geometry: Geometry,
    ) -> Result<Self> {
        let mut store = Self::new(vfs, root.as_ref(), fingerprint, geometry);
        // Make the new directories' entries durable before anything is
        // written into them.
        for d in [&store.root, &store.blocks_dir, &store.manifests_dir] {
            create_dir_durable(&store.vfs, d).map_err(|e| FormatError::io("mkdir", d, e))?;
        }
        {
            let _shared = store.lock(LockMode::Shared)?;
            store.owner = Some(sharing::register(&store.vfs, &store.root)?);
        }
        let desc = store.root.join(DESCRIPTOR_FILE);
        if store
            .vfs
            .exists(&desc)
            .map_err(|e| FormatError::io("stat", &desc, e))?
        {
            let bytes = store
                .vfs
                .read(&desc)
                .map_err(|e| FormatError::io("read", &desc, e))?;
            let m = Manifest::decode(&bytes)?;
            m.check_owner(&store.fingerprint, &store.geometry)?;
        } else {
            let m = Manifest::new(
                store.fingerprint,
                store.geometry.clone(),
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Metadata {
                    name: "store descriptor".into(),
                    ..Metadata::default()
                },
            )?;
            let root = store.root.clone();
            store.write_file_durable(&root, DESCRIPTOR_FILE, &[&m.encode()?])?;
        }
        store.recover()?;
        Ok(store)
    }

    /// [`Store::open_existing`] over any [`Vfs`].
    pub fn open_existing_with(vfs: V, root: impl AsRef<Path>) -> Result<Self> {
        let m = Self::read_descriptor(&vfs, root.as_ref())?;
        Self::open_with(vfs, root, m.fingerprint, m.geometry)
    }

    /// [`Store::open_read_only`] over any [`Vfs`].
    pub fn open_read_only_with(vfs: V, root: impl AsRef<Path>) -> Result<Self> {
        let m = Self::read_descriptor(&vfs, root.as_ref())?;
        Ok(Self::new(vfs, root.as_ref(), m.fingerprint, m.geometry))
    }

    fn read_descriptor(vfs: &V, root: &Path) -> Result<Manifest> {
        let desc = root.join(DESCRIPTOR_FILE);
        let bytes = vfs.read(&desc).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => FormatError::NotFound {
                what: "store descriptor",
                name: desc.display().to_string(),
            },
            _ => FormatError::io("read", &desc, e),
        })?;
        Manifest::decode(&bytes)
    }

    fn new(vfs: V, root: &Path, fingerprint: Fingerprint, geometry: Geometry) -> Self {
        Store {
            vfs,
            root: root.to_path_buf(),
            blocks_dir: root.join(BLOCKS_DIR),
            manifests_dir: root.join(MANIFESTS_DIR),
            fingerprint,
            geometry,
            owner: None,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        }
    }

    /// Whether the store was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.owner.is_none()
    }

    /// How long a call waits for the store lock before failing with
    /// [`FormatError::Busy`] (default [`DEFAULT_LOCK_TIMEOUT`]).
    pub fn set_lock_timeout(&mut self, timeout: Duration) {
        self.lock_timeout = timeout;
    }

    /// The registration of a writable store; `op` names the refused call.
    fn owner(&self, op: &'static str) -> Result<&Owner> {
        self.owner.as_ref().ok_or_else(|| FormatError::ReadOnly {
            path: self.root.clone(),
            op,
        })
    }

    fn lock(&self, mode: LockMode) -> Result<FileLock> {
        sharing::acquire(&self.vfs, &self.root, mode, self.lock_timeout, true)?
            .ok_or_else(|| FormatError::invalid("store lock", format!("{:?} missing", self.root)))
    }

    /// Takes the store lock shared, for a save's span from its presence
    /// checks to its manifest's commit: no collection deletes blocks
    /// meanwhile. Waits for a running collection (up to the lock timeout).
    pub fn lock_shared(&self) -> Result<FileLock> {
        self.owner("lock")?;
        self.lock(LockMode::Shared)
    }

    /// Takes the store lock exclusive (no save in progress in any process),
    /// waiting up to the lock timeout; [`FormatError::Busy`] names the live
    /// writers' pids when it cannot.
    pub fn lock_exclusive(&self) -> Result<FileLock> {
        self.owner("lock")?;
        self.lock(LockMode::Exclusive)
    }

    /// A reader's shared lock when the store has a lock file it can open;
    /// `None` on a store no writer opened or that cannot be locked (a
    /// read-only copy): readers never create anything.
    pub(crate) fn read_lock(&self) -> Option<FileLock> {
        sharing::acquire(
            &self.vfs,
            &self.root,
            LockMode::Shared,
            self.lock_timeout,
            false,
        )
        .ok()
        .flatten()
    }

    /// The model fingerprint of this store.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// The KV geometry of this store.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file system in use.
    pub fn vfs(&self) -> &V {
        &self.vfs
    }

    /// Path of a block's file.
    pub fn block_path(&self, id: &BlockId) -> PathBuf {
        self.blocks_dir
            .join(format!("{}{BLOCK_SUFFIX}", id.to_hex()))
    }

    /// Path of a checkpoint's manifest.
    pub fn manifest_path(&self, name: &str) -> Result<PathBuf> {
        check_name(name)?;
        Ok(self.manifests_dir.join(format!("{name}{MANIFEST_SUFFIX}")))
    }

    /// The stamp of checkpoint `name`'s manifest file ([`Vfs::stamp`]; `Ok(None)` when the
    /// file system gives none).
    pub fn manifest_stamp(&self, name: &str) -> Result<Option<crate::FileStamp>> {
        let p = self.manifest_path(name)?;
        self.vfs
            .stamp(&p)
            .map_err(|e| manifest_io_error(name, "stat", &p, e))
    }

    /// Whether checkpoint `name` has a committed manifest (one `stat`; not verified).
    pub fn has_manifest(&self, name: &str) -> Result<bool> {
        let p = self.manifest_path(name)?;
        self.vfs
            .exists(&p)
            .map_err(|e| FormatError::io("stat", &p, e))
    }

    /// Whether the store holds block `id` (a committed file; not verified).
    pub fn has_block(&self, id: &BlockId) -> Result<bool> {
        let p = self.block_path(id);
        self.vfs
            .exists(&p)
            .map_err(|e| FormatError::io("stat", &p, e))
    }

    /// Writes one block durably unless present. Returns its id and whether it was written.
    pub fn put_block(&self, block: BlockInput<'_>, encoding: Encoding) -> Result<(BlockId, bool)> {
        let report = self.put_blocks(&[block], encoding)?;
        let id = BlockId::chain(&self.fingerprint, block.prev, block.tokens);
        Ok((id, report.blocks_written == 1))
    }

    /// Writes the blocks the store lacks durably: each goes to a temporary
    /// file, all are synced, renamed into place, and the block directory is
    /// synced once.
    pub fn put_blocks(&self, blocks: &[BlockInput<'_>], encoding: Encoding) -> Result<SaveReport> {
        let (staged, report) = self.stage_blocks(blocks, encoding)?;
        self.commit(staged, None)?;
        Ok(report)
    }

    /// Stages (writes to temporary files) the blocks the store lacks. On
    /// failure the blocks staged so far are discarded. q8_0 blocks are
    /// quantised on several threads, a batch at a time.
    fn stage_blocks(
        &self,
        blocks: &[BlockInput<'_>],
        encoding: Encoding,
    ) -> Result<(Vec<Staged<V::File>>, SaveReport)> {
        let mut report = SaveReport::default();
        let mut staged: Vec<Staged<V::File>> = Vec::new();
        let res = (|| {
            // The id needs only the tokens: check for each block before
            // paying for its encoding.
            let mut ids = std::collections::HashSet::new();
            let mut missing = Vec::new();
            for b in blocks {
                let id = BlockId::chain(&self.fingerprint, b.prev, b.tokens);
                if ids.contains(&id) || self.has_block(&id)? {
                    report.blocks_reused += 1;
                } else {
                    ids.insert(id);
                    missing.push(*b);
                }
            }
            let batch = match encoding {
                Encoding::Raw => 1,
                Encoding::Q8_0 => std::thread::available_parallelism()
                    .map_or(1, |n| n.get())
                    .min(16),
            };
            for chunk in missing.chunks(batch) {
                let encoded = self.encode_all(chunk, encoding);
                for enc in encoded {
                    let enc = enc?;
                    let name = format!("{}{BLOCK_SUFFIX}", enc.id.to_hex());
                    let st = self.stage(&self.blocks_dir, &name, &enc.parts())?;
                    report.bytes_written += st.len;
                    report.blocks_written += 1;
                    staged.push(st);
                }
            }
            Ok(())
        })();
        match res {
            Ok(()) => Ok((staged, report)),
            Err(e) => {
                self.discard(staged.iter().map(|s| s.tmp.as_path()));
                Err(e)
            }
        }
    }

    /// Encodes blocks, on one thread per block when there are several.
    fn encode_all<'k>(
        &self,
        blocks: &[BlockInput<'k>],
        encoding: Encoding,
    ) -> Vec<Result<EncodedBlock<'k>>> {
        let one = |b: &BlockInput<'k>| {
            encode_block(
                &self.fingerprint,
                &self.geometry,
                b.prev,
                b.tokens,
                b.kv,
                encoding,
            )
        };
        if blocks.len() <= 1 {
            return blocks.iter().map(one).collect();
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = blocks.iter().map(|b| s.spawn(move || one(b))).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(FormatError::invalid(
                            "block encoding",
                            "encoder thread panicked",
                        ))
                    })
                })
                .collect()
        })
    }

    pub(crate) fn check_block(&self, bytes: &[u8], id: &BlockId) -> Result<()> {
        let v = BlockView::parse(bytes)?;
        v.check_owner(&self.fingerprint, &self.geometry)?;
        if v.id() != *id {
            return Err(FormatError::BlockIdMismatch {
                expected: id.to_hex(),
                found: v.id().to_hex(),
            });
        }
        Ok(())
    }

    /// Reads block `id` into memory and verifies it completely.
    pub fn read_block(&self, id: &BlockId) -> Result<OwnedBlock> {
        let p = self.block_path(id);
        let bytes = self.vfs.read(&p).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => FormatError::NotFound {
                what: "block",
                name: id.to_hex(),
            },
            _ => FormatError::io("read", &p, e),
        })?;
        self.check_block(&bytes, id)?;
        Ok(OwnedBlock { bytes })
    }

    /// Deletes block `id` durably. Checkpoints that reference it no longer verify.
    pub fn delete_block(&self, id: &BlockId) -> Result<()> {
        self.owner("delete_block")?;
        self.remove_durably(&self.block_path(id), &self.blocks_dir)
    }

    /// Ids of all committed blocks.
    pub fn list_blocks(&self) -> Result<Vec<BlockId>> {
        Ok(self
            .list_stems(&self.blocks_dir, BLOCK_SUFFIX)?
            .iter()
            .filter_map(|h| BlockId::from_hex(h).ok())
            .collect())
    }

    /// Removes `path` and makes the removal durable by syncing its directory `dir`.
    fn remove_durably(&self, path: &Path, dir: &Path) -> Result<()> {
        self.vfs
            .remove(path)
            .map_err(|e| FormatError::io("remove", path, e))?;
        self.vfs
            .sync_dir(dir)
            .map_err(|e| FormatError::io("fsync", dir, e))
    }

    /// Names of the files of `dir` ending in `suffix`, without it.
    fn list_stems(&self, dir: &Path, suffix: &str) -> Result<Vec<String>> {
        let names = self
            .vfs
            .list(dir)
            .map_err(|e| FormatError::io("list", dir, e))?;
        Ok(names
            .iter()
            .filter_map(|n| n.strip_suffix(suffix))
            .map(String::from)
            .collect())
    }

    /// Writes a manifest atomically under `manifest.meta.name`, replacing
    /// any checkpoint of that name. Does not check that its blocks exist: a
    /// caller that checked should hold [`Store::lock_shared`] from its check
    /// until this returns.
    pub fn write_manifest(&self, manifest: &Manifest) -> Result<u64> {
        let st = self.stage_manifest(manifest)?;
        let len = st.len;
        self.commit(Vec::new(), Some(st))?;
        Ok(len)
    }

    fn stage_manifest(&self, manifest: &Manifest) -> Result<Staged<V::File>> {
        check_name(&manifest.meta.name)?;
        manifest.check_owner(&self.fingerprint, &self.geometry)?;
        let bytes = manifest.encode()?;
        let name = format!("{}{MANIFEST_SUFFIX}", manifest.meta.name);
        self.stage(&self.manifests_dir, &name, &[&bytes])
    }

    /// Reads and verifies the manifest of checkpoint `name`, including that
    /// the name inside is `name` (a manifest copied over another's file is
    /// refused with [`FormatError::NameMismatch`]).
    pub fn read_manifest(&self, name: &str) -> Result<Manifest> {
        let p = self.manifest_path(name)?;
        let m = self.decode_manifest(name)?;
        m.check_owner(&self.fingerprint, &self.geometry)?;
        if m.meta.name != name {
            return Err(FormatError::NameMismatch {
                path: p,
                expected: name.to_string(),
                found: m.meta.name,
            });
        }
        Ok(m)
    }

    /// Reads and verifies (checksums, structure) the manifest file of checkpoint `name`,
    /// without checking that it belongs to this store's model or carries that name: what a
    /// collection needs to know which blocks the file keeps.
    pub fn decode_manifest(&self, name: &str) -> Result<Manifest> {
        let p = self.manifest_path(name)?;
        let bytes = self
            .vfs
            .read(&p)
            .map_err(|e| manifest_io_error(name, "read", &p, e))?;
        Manifest::decode(&bytes)
    }

    /// Deletes checkpoint `name` durably (its blocks stay; see [`Store::gc`]).
    pub fn delete_manifest(&self, name: &str) -> Result<()> {
        self.owner("delete_manifest")?;
        self.remove_durably(&self.manifest_path(name)?, &self.manifests_dir)
    }

    /// Names of all committed checkpoints.
    pub fn list_manifests(&self) -> Result<Vec<String>> {
        self.list_stems(&self.manifests_dir, MANIFEST_SUFFIX)
    }

    /// Saves a checkpoint: writes the blocks of `manifest` the store lacks
    /// (asking `block_kv(i)` for block `i`'s raw KV only for those), then the
    /// manifest. Either the whole checkpoint commits, or the previous state
    /// (including an older checkpoint of the same name) stays readable.
    pub fn save<'k, F>(
        &self,
        manifest: &Manifest,
        mut block_kv: F,
        encoding: Encoding,
    ) -> Result<SaveReport>
    where
        F: FnMut(usize) -> Result<Cow<'k, [u8]>>,
    {
        check_name(&manifest.meta.name)?;
        manifest.check_owner(&self.fingerprint, &self.geometry)?;
        manifest.validate()?;
        // No collection between the presence checks and the commit.
        let _shared = self.lock_shared()?;
        let mut kvs: Vec<(usize, Cow<'k, [u8]>)> = Vec::new();
        let mut reused = 0;
        for (i, id) in manifest.block_ids.iter().enumerate() {
            if self.has_block(id)? {
                reused += 1;
            } else {
                kvs.push((i, block_kv(i)?));
            }
        }
        let inputs: Vec<BlockInput<'_>> = kvs
            .iter()
            .map(|(i, kv)| BlockInput {
                prev: manifest.prev_id(*i),
                tokens: manifest.block_tokens(*i).unwrap_or(&[]),
                kv,
            })
            .collect();
        let (staged, mut report) = self.stage_blocks(&inputs, encoding)?;
        drop(inputs);
        drop(kvs);
        report.blocks_reused += reused;
        let man = match self.stage_manifest(manifest) {
            Ok(m) => m,
            Err(e) => {
                self.discard(staged.iter().map(|s| s.tmp.as_path()));
                return Err(e);
            }
        };
        report.bytes_written += man.len;
        self.commit(staged, Some(man))?;
        Ok(report)
    }

    /// Reads checkpoint `name` and verifies every block it references
    /// (present, intact, same owner) without keeping them: run before
    /// restoring so that a restore never stops half-way on bad data.
    pub fn verify_checkpoint(&self, name: &str) -> Result<Manifest> {
        let _shared = self.read_lock();
        let m = self.read_manifest(name)?;
        for id in &m.block_ids {
            self.read_block(id)?;
        }
        Ok(m)
    }

    /// The raw KV of every token of checkpoint `m`: each block in order, then
    /// the tail (each span laid out as in [`Geometry::layer_spans`]).
    pub fn load_kv_spans(&self, m: &Manifest) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::with_capacity(m.block_ids.len() + 1);
        for id in &m.block_ids {
            out.push(self.read_block(id)?.view()?.kv()?.into_owned());
        }
        out.push(m.tail_kv.clone());
        Ok(out)
    }

    /// Deletes blocks referenced by no checkpoint, the state records of such
    /// blocks, and temporary files of dead writers. Returns how many blocks
    /// (state records not counted). Holds the exclusive store lock,
    /// so no save in any process is between its presence checks and its
    /// commit (FORMAT.md §9.2); a damaged manifest stops the collection.
    pub fn gc(&self) -> Result<usize> {
        let _excl = self.lock_exclusive()?;
        self.remove_dead_tmps()?;
        let mut live = std::collections::HashSet::new();
        for name in self.list_manifests()? {
            live.extend(self.read_manifest(&name)?.block_ids);
        }
        let mut n = 0;
        let mut removed = 0;
        for id in self.list_blocks()? {
            if !live.contains(&id) {
                let p = self.block_path(&id);
                self.vfs
                    .remove(&p)
                    .map_err(|e| FormatError::io("remove", &p, e))?;
                n += 1;
            }
        }
        removed += n;
        for id in self.list_states()? {
            if !live.contains(&id) {
                let p = self.state_path(&id);
                self.vfs
                    .remove(&p)
                    .map_err(|e| FormatError::io("remove", &p, e))?;
                removed += 1;
            }
        }
        if removed > 0 {
            self.vfs
                .sync_dir(&self.blocks_dir)
                .map_err(|e| FormatError::io("fsync", &self.blocks_dir, e))?;
        }
        Ok(n)
    }

    /// Writes checkpoint `name` and all its blocks into one export file at
    /// `path` (atomically, through this store's [`Vfs`]). Returns its length.
    pub fn export(&self, name: &str, path: &Path) -> Result<u64> {
        let m = self.read_manifest(name)?;
        let blocks = m
            .block_ids
            .iter()
            .map(|id| self.read_block(id))
            .collect::<Result<Vec<_>>>()?;
        let records: Vec<&[u8]> = blocks.iter().map(OwnedBlock::as_bytes).collect();
        write_export(&self.vfs, path, &m, &records)
    }

    /// Imports an export: writes its blocks the store lacks and its manifest.
    pub fn import(&self, export: &crate::export::ExportView<'_>) -> Result<SaveReport> {
        let m = export.manifest();
        m.check_owner(&self.fingerprint, &self.geometry)?;
        let _shared = self.lock_shared()?;
        let mut report = SaveReport::default();
        let mut staged: Vec<Staged<V::File>> = Vec::new();
        let res = (|| {
            for (i, id) in m.block_ids.iter().enumerate() {
                if self.has_block(id)? {
                    report.blocks_reused += 1;
                    continue;
                }
                let v = export.block(i)?;
                debug_assert_eq!(v.id(), *id);
                let rec = export.block_record(i)?;
                let name = format!("{}{BLOCK_SUFFIX}", id.to_hex());
                let st = self.stage(&self.blocks_dir, &name, &[rec])?;
                report.bytes_written += st.len;
                report.blocks_written += 1;
                staged.push(st);
            }
            self.stage_manifest(m)
        })();
        let man = match res {
            Ok(man) => man,
            Err(e) => {
                self.discard(staged.iter().map(|s| s.tmp.as_path()));
                return Err(e);
            }
        };
        report.bytes_written += man.len;
        self.commit(staged, Some(man))?;
        Ok(report)
    }
}

/// An I/O error on checkpoint `name`'s manifest at `path`: [`FormatError::NotFound`] when the
/// file is absent.
fn manifest_io_error(
    name: &str,
    op: &'static str,
    path: &std::path::Path,
    e: std::io::Error,
) -> FormatError {
    match e.kind() {
        std::io::ErrorKind::NotFound => FormatError::NotFound {
            what: "checkpoint",
            name: name.to_string(),
        },
        _ => FormatError::io(op, path, e),
    }
}
