//! A directory of blocks and checkpoint manifests.
//!
//! ```text
//! ROOT/store.ckpt              store descriptor: a manifest with no tokens (fingerprint, geometry)
//! ROOT/blocks/<id-hex>.blk     one block record per file, named by its id
//! ROOT/manifests/<name>.ckpt   one manifest per checkpoint
//! *.tmp                        files being written; removed by recovery
//! ```
//!
//! Every file is written to a temporary name, synced, renamed into place and
//! the directory synced (FORMAT.md, "Commit protocol"). A save writes the
//! blocks the store lacks, then the manifest; the manifest's rename is the
//! commit point. A store has one writer at a time.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use crate::block::{encode_block, BlockView, EncodedBlock, Encoding};
use crate::error::{FormatError, Result};
use crate::export::write_export;
use crate::geometry::Geometry;
use crate::ids::{BlockId, Fingerprint};
use crate::manifest::{Manifest, Metadata};
use crate::mmap::Mapped;
use crate::vfs::{StdFs, Vfs, VfsFile};

/// File name of the store descriptor.
pub const DESCRIPTOR_FILE: &str = "store.ckpt";
/// Directory of block files.
pub const BLOCKS_DIR: &str = "blocks";
/// Directory of manifests.
pub const MANIFESTS_DIR: &str = "manifests";
/// Suffix of block files.
pub const BLOCK_SUFFIX: &str = ".blk";
/// Suffix of manifest files.
pub const MANIFEST_SUFFIX: &str = ".ckpt";
/// Suffix of files being written.
pub const TMP_SUFFIX: &str = ".tmp";
/// Counter that makes temporary file names unique within the process.
static TMP_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

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

/// A file written to its temporary name, not yet synced or renamed.
#[derive(Debug)]
struct Staged<F> {
    tmp: PathBuf,
    dst: PathBuf,
    file: F,
    len: u64,
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
    /// Opens the store at `root`, creating it when absent. An existing store
    /// of another fingerprint or geometry is refused with a typed error.
    pub fn open(
        root: impl AsRef<Path>,
        fingerprint: Fingerprint,
        geometry: Geometry,
    ) -> Result<Self> {
        Self::open_with(StdFs, root, fingerprint, geometry)
    }

    /// Opens an existing store, taking fingerprint and geometry from its descriptor.
    pub fn open_existing(root: impl AsRef<Path>) -> Result<Self> {
        Self::open_existing_with(StdFs, root)
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
        let store = Self::new(vfs, root.as_ref(), fingerprint, geometry);
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
            for d in [&store.root, &store.blocks_dir, &store.manifests_dir] {
                store
                    .vfs
                    .create_dir_all(d)
                    .map_err(|e| FormatError::io("mkdir", d, e))?;
            }
            // Make the new directories' entries durable before anything is
            // written into them.
            if let Some(parent) = store.root.parent().filter(|p| !p.as_os_str().is_empty()) {
                store
                    .vfs
                    .sync_dir(parent)
                    .map_err(|e| FormatError::io("fsync", parent, e))?;
            }
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
        let desc = root.as_ref().join(DESCRIPTOR_FILE);
        let bytes = vfs
            .read(&desc)
            .map_err(|e| FormatError::io("read", &desc, e))?;
        let m = Manifest::decode(&bytes)?;
        Self::open_with(vfs, root, m.fingerprint, m.geometry)
    }

    fn new(vfs: V, root: &Path, fingerprint: Fingerprint, geometry: Geometry) -> Self {
        Store {
            vfs,
            root: root.to_path_buf(),
            blocks_dir: root.join(BLOCKS_DIR),
            manifests_dir: root.join(MANIFESTS_DIR),
            fingerprint,
            geometry,
        }
    }

    /// Removes leftover temporary files (from a save that did not commit).
    /// Returns how many were removed. Called by `open`.
    pub fn recover(&self) -> Result<usize> {
        let mut n = 0;
        for dir in [&self.root, &self.blocks_dir, &self.manifests_dir] {
            for name in self
                .vfs
                .list(dir)
                .map_err(|e| FormatError::io("list", dir, e))?
            {
                if name.ends_with(TMP_SUFFIX) {
                    let p = dir.join(&name);
                    self.vfs
                        .remove(&p)
                        .map_err(|e| FormatError::io("remove", &p, e))?;
                    n += 1;
                }
            }
        }
        Ok(n)
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

    /// Writes `parts` to `dir/name` durably: temporary file, write, sync,
    /// rename, sync of the directory. Any failure fails the call; nothing is retried.
    fn write_file_durable(&self, dir: &Path, name: &str, parts: &[&[u8]]) -> Result<u64> {
        let (tmp, n) = self.write_tmp_synced(dir, name, parts)?;
        let dst = dir.join(name);
        self.vfs
            .rename(&tmp, &dst)
            .map_err(|e| FormatError::io("rename", &dst, e))?;
        self.vfs
            .sync_dir(dir)
            .map_err(|e| FormatError::io("fsync", dir, e))?;
        Ok(n)
    }

    fn write_tmp_synced(&self, dir: &Path, name: &str, parts: &[&[u8]]) -> Result<(PathBuf, u64)> {
        let mut staged = self.stage(dir, name, parts)?;
        staged
            .file
            .sync()
            .map_err(|e| FormatError::io("fsync", &staged.tmp, e))?;
        Ok((staged.tmp, staged.len))
    }

    /// Creates a unique `dir/name.<pid>-<n>.tmp` and writes `parts` to it, without syncing.
    fn stage(&self, dir: &Path, name: &str, parts: &[&[u8]]) -> Result<Staged<V::File>> {
        // A unique temporary name, so concurrent saves in one process never
        // write the same temporary file.
        let seq = TMP_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!("{name}.{}-{seq}{TMP_SUFFIX}", std::process::id()));
        let mut file = self
            .vfs
            .create(&tmp)
            .map_err(|e| FormatError::io("create", &tmp, e))?;
        let mut len = 0u64;
        for p in parts {
            if let Err(e) = file.write_all(p) {
                drop(file);
                self.discard([tmp.as_path()]);
                return Err(FormatError::io("write", &tmp, e));
            }
            len += p.len() as u64;
        }
        Ok(Staged {
            tmp,
            dst: dir.join(name),
            file,
            len,
        })
    }

    /// The commit protocol for staged files: sync every file (in parallel
    /// where the [`Vfs`] allows), rename the blocks into place and sync the
    /// block directory, then rename the manifest (the commit point) and sync
    /// its directory.
    /// On failure, removes the temporary files (best effort).
    fn commit(
        &self,
        blocks: Vec<Staged<V::File>>,
        manifest: Option<Staged<V::File>>,
    ) -> Result<()> {
        let tmps: Vec<PathBuf> = blocks
            .iter()
            .chain(&manifest)
            .map(|s| s.tmp.clone())
            .collect();
        let res = self.commit_inner(blocks, manifest);
        if res.is_err() {
            self.discard(tmps.iter().map(PathBuf::as_path));
        }
        res
    }

    /// Removes temporary files of a save that failed. Errors are ignored:
    /// recovery removes any leftover on the next open, and a removal never
    /// touches a committed name.
    fn discard<'p>(&self, tmps: impl IntoIterator<Item = &'p Path>) {
        for t in tmps {
            let _ = self.vfs.remove(t);
        }
    }

    fn commit_inner(
        &self,
        blocks: Vec<Staged<V::File>>,
        manifest: Option<Staged<V::File>>,
    ) -> Result<()> {
        let mut paths = Vec::with_capacity(blocks.len() + 1);
        let mut files = Vec::with_capacity(blocks.len() + 1);
        for st in blocks.into_iter().chain(manifest) {
            paths.push((st.tmp, st.dst));
            files.push(st.file);
        }
        if files.is_empty() {
            return Ok(());
        }
        self.vfs.sync_files(&mut files).map_err(|e| {
            FormatError::io(
                "fsync",
                paths.first().map(|p| p.0.clone()).unwrap_or_default(),
                e,
            )
        })?;
        drop(files);
        let mut block_renames = false;
        for (tmp, dst) in &paths {
            if dst.parent() == Some(self.blocks_dir.as_path()) {
                self.vfs
                    .rename(tmp, dst)
                    .map_err(|e| FormatError::io("rename", dst, e))?;
                block_renames = true;
            }
        }
        if block_renames {
            self.vfs
                .sync_dir(&self.blocks_dir)
                .map_err(|e| FormatError::io("fsync", &self.blocks_dir, e))?;
        }
        for (tmp, dst) in &paths {
            if dst.parent() != Some(self.blocks_dir.as_path()) {
                self.vfs
                    .rename(tmp, dst)
                    .map_err(|e| FormatError::io("rename", dst, e))?;
                let dir = dst.parent().unwrap_or(Path::new("."));
                self.vfs
                    .sync_dir(dir)
                    .map_err(|e| FormatError::io("fsync", dir, e))?;
            }
        }
        Ok(())
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
        let p = self.block_path(id);
        self.vfs
            .remove(&p)
            .map_err(|e| FormatError::io("remove", &p, e))?;
        self.vfs
            .sync_dir(&self.blocks_dir)
            .map_err(|e| FormatError::io("fsync", &self.blocks_dir, e))
    }

    /// Ids of all committed blocks.
    pub fn list_blocks(&self) -> Result<Vec<BlockId>> {
        let names = self
            .vfs
            .list(&self.blocks_dir)
            .map_err(|e| FormatError::io("list", &self.blocks_dir, e))?;
        Ok(names
            .iter()
            .filter_map(|n| n.strip_suffix(BLOCK_SUFFIX))
            .filter_map(|h| BlockId::from_hex(h).ok())
            .collect())
    }

    /// Writes a manifest atomically under `manifest.meta.name`, replacing
    /// any checkpoint of that name. Does not check that its blocks exist.
    pub fn write_manifest(&self, manifest: &Manifest) -> Result<u64> {
        check_name(&manifest.meta.name)?;
        manifest.check_owner(&self.fingerprint, &self.geometry)?;
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

    /// Reads and verifies the manifest of checkpoint `name`.
    pub fn read_manifest(&self, name: &str) -> Result<Manifest> {
        let p = self.manifest_path(name)?;
        let bytes = self.vfs.read(&p).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => FormatError::NotFound {
                what: "checkpoint",
                name: name.to_string(),
            },
            _ => FormatError::io("read", &p, e),
        })?;
        let m = Manifest::decode(&bytes)?;
        m.check_owner(&self.fingerprint, &self.geometry)?;
        Ok(m)
    }

    /// Deletes checkpoint `name` durably (its blocks stay; see [`Store::gc`]).
    pub fn delete_manifest(&self, name: &str) -> Result<()> {
        let p = self.manifest_path(name)?;
        self.vfs
            .remove(&p)
            .map_err(|e| FormatError::io("remove", &p, e))?;
        self.vfs
            .sync_dir(&self.manifests_dir)
            .map_err(|e| FormatError::io("fsync", &self.manifests_dir, e))
    }

    /// Names of all committed checkpoints.
    pub fn list_manifests(&self) -> Result<Vec<String>> {
        let names = self
            .vfs
            .list(&self.manifests_dir)
            .map_err(|e| FormatError::io("list", &self.manifests_dir, e))?;
        Ok(names
            .iter()
            .filter_map(|n| n.strip_suffix(MANIFEST_SUFFIX))
            .map(String::from)
            .collect())
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
                prev: if *i == 0 {
                    None
                } else {
                    manifest.block_ids.get(i - 1)
                },
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

    /// Deletes blocks referenced by no checkpoint. Returns how many. Must not
    /// run while a save is in progress (FORMAT.md §9.2).
    pub fn gc(&self) -> Result<usize> {
        let mut live = std::collections::HashSet::new();
        for name in self.list_manifests()? {
            live.extend(self.read_manifest(&name)?.block_ids);
        }
        let mut n = 0;
        for id in self.list_blocks()? {
            if !live.contains(&id) {
                let p = self.block_path(&id);
                self.vfs
                    .remove(&p)
                    .map_err(|e| FormatError::io("remove", &p, e))?;
                n += 1;
            }
        }
        if n > 0 {
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
