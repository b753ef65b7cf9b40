//! This process's index of one model's files: the block files, the manifests with the blocks
//! each references and its file's stamp, the references to each block, and the blocks nothing
//! references. A collection brings it up to date and works from it, so its cost follows what
//! changed rather than the size of the store.
//!
//! Where the platform tells of changes (Linux's inotify on the two directories), the index
//! follows the events of every process: a collection drains them and looks only at the files
//! they name. Elsewhere, and whenever the events may be incomplete (the kernel's queue
//! overflowed), it lists the directories and looks at each manifest's stamp, reading only the
//! new or changed ones. Either way it is brought up to date under the exclusive store lock, when
//! no save of any process is between its checks and its commit.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use ckptfmt::store::{BLOCK_SUFFIX, MANIFEST_SUFFIX};
use ckptfmt::{BlockId, FileLock, FileStamp, FormatError, Store, Vfs};

use crate::watch::{Changes, Watch};

/// Without events, a file modified this close to the moment it was read is read again next
/// time: another write within the same tick of the file system's clock keeps its stamp.
const RACY: Duration = Duration::from_secs(2);

/// One model's files as last seen.
#[derive(Debug, Default)]
pub(crate) struct DiskIndex {
    watch: WatchState,
    /// Whether the sets below are complete (a listing was taken and, with a watch, every
    /// change since is in its events).
    listed: bool,
    blocks: HashSet<BlockId>,
    manifests: HashMap<String, Indexed>,
    /// References to each block from the manifests above.
    refs: HashMap<BlockId, u32>,
    /// Block files no manifest references.
    unreferenced: HashSet<BlockId>,
    manifest_bytes: u64,
    /// Manifests an event named that were not looked at yet, with their files' lengths then
    /// (0: gone).
    pending: HashMap<String, u64>,
    /// The manifests that expire ([`crate::EXPIRES_KEY`]), by expiry.
    expiries: std::collections::BTreeSet<(u64, String)>,
}

#[derive(Debug, Default)]
enum WatchState {
    /// Not tried yet (a process that never collects never watches).
    #[default]
    Untried,
    Active(Watch),
    /// The platform or the file system gives no events: listings it is.
    Unavailable,
}

#[derive(Debug)]
struct Indexed {
    stamp: Option<FileStamp>,
    read_at: SystemTime,
    blocks: Vec<BlockId>,
    /// What its first block chains from, when not from nothing (a namespace's root).
    root: Option<BlockId>,
    /// When it expires (seconds since the epoch).
    expires: Option<u64>,
}

/// What [`DiskIndex::refresh`] did.
#[derive(Debug, Default)]
pub(crate) struct Refreshed {
    /// Damaged manifests moved into the quarantine directory.
    pub set_aside: Vec<PathBuf>,
    /// Manifests read (new or changed since the last refresh).
    pub read: usize,
}

impl DiskIndex {
    /// Follows the changes since the last look without the store lock: block files come and
    /// go, and the manifests named are noted (with their lengths) for the next
    /// [`DiskIndex::refresh`] to read. Returns the bytes the block files (of `record_len`
    /// bytes) and the manifests take, when the index is complete; `None` when only a refresh
    /// can tell (no events to go by).
    pub(crate) fn follow<V: Vfs>(
        &mut self,
        store: &Store<V>,
        record_len: u64,
    ) -> Result<Option<u64>, FormatError> {
        if matches!(self.watch, WatchState::Untried) {
            self.watch = match Watch::new(store.root()) {
                Some(w) => WatchState::Active(w),
                None => WatchState::Unavailable,
            };
        }
        let changes = match &mut self.watch {
            WatchState::Active(w) => w.drain(),
            _ => Changes::Unknown,
        };
        let Changes::Named { blocks, manifests } = changes else {
            self.listed = false;
            return Ok(None);
        };
        if !self.listed {
            return Ok(None);
        }
        for name in blocks {
            let Some(id) = name
                .strip_suffix(BLOCK_SUFFIX)
                .and_then(|h| BlockId::from_hex(h).ok())
            else {
                continue;
            };
            match store.has_block(&id)? {
                true => self.add_block(id),
                false => self.remove_block(&id),
            }
        }
        for name in manifests {
            let Some(stem) = name.strip_suffix(MANIFEST_SUFFIX) else {
                continue;
            };
            if ckptfmt::store::check_name(stem).is_err() {
                continue;
            }
            let len = match store.manifest_stamp(stem) {
                Ok(s) => s.map_or(0, |s| s.len),
                Err(FormatError::NotFound { .. }) => 0,
                Err(e) => return Err(e),
            };
            self.pending.insert(stem.to_owned(), len);
        }
        let pending: u64 = self.pending.values().sum();
        Ok(Some(
            self.block_count() * record_len + self.manifest_bytes + pending,
        ))
    }

    /// Brings the index up to date with `store`'s files under the exclusive store lock (so no
    /// manifest is being committed): from the watch's events where there is one, else from
    /// listings; unchanged manifests are not read again, a damaged one is set aside
    /// ([`Store::quarantine_manifest`]) and reported rather than stopping the caller.
    pub(crate) fn refresh<V: Vfs>(
        &mut self,
        store: &Store<V>,
        exclusive: &FileLock,
    ) -> Result<Refreshed, FormatError> {
        // Events first: the names they give join those noted earlier.
        let complete = self.follow(store, 0)?.is_some();
        let mut out = Refreshed::default();
        let pending = std::mem::take(&mut self.pending);
        if complete {
            for name in pending.keys() {
                self.look_at(store, exclusive, name, true, &mut out)?;
            }
            return Ok(out);
        }
        let files: HashSet<BlockId> = store.list_blocks()?.into_iter().collect();
        let gone: Vec<BlockId> = self.blocks.difference(&files).copied().collect();
        for id in gone {
            self.remove_block(&id);
        }
        for id in files {
            self.add_block(id);
        }
        let names: HashSet<String> = store.list_manifests()?.into_iter().collect();
        let gone: Vec<String> = self
            .manifests
            .keys()
            .filter(|n| !names.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            self.remove_manifest(&name);
        }
        for name in names {
            self.look_at(store, exclusive, &name, false, &mut out)?;
        }
        // With a watch, every change from here on is in its events.
        self.listed = matches!(self.watch, WatchState::Active(_));
        Ok(out)
    }

    /// Brings manifest `name` up to date: `named` when an event named it (then a file with
    /// the same inode and length is the same file, whatever its time says).
    fn look_at<V: Vfs>(
        &mut self,
        store: &Store<V>,
        exclusive: &FileLock,
        name: &str,
        named: bool,
        out: &mut Refreshed,
    ) -> Result<(), FormatError> {
        if ckptfmt::store::check_name(name).is_err() {
            return Ok(());
        }
        let stamp = match store.manifest_stamp(name) {
            Ok(s) => s,
            Err(FormatError::NotFound { .. }) => {
                self.remove_manifest(name);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if let (Some(s), Some(e)) = (stamp, self.manifests.get_mut(name)) {
            let same = match e.stamp {
                Some(old) if named => old.ino != 0 && old.ino == s.ino && old.len == s.len,
                Some(old) => {
                    old == s
                        && e.read_at
                            .duration_since(s.modified)
                            .is_ok_and(|age| age >= RACY)
                }
                None => false,
            };
            if same {
                // A touch (a tail used again) moves its age only.
                e.stamp = Some(s);
                return Ok(());
            }
        }
        let read_at = SystemTime::now();
        // Decoded only: a manifest of another model or under another name still keeps the
        // blocks it lists.
        match store.decode_manifest(name) {
            Ok(m) => {
                out.read += 1;
                let root = m.chain_roots.first().filter(|r| r.block == 0).map(|r| r.id);
                let expires = m
                    .meta
                    .kv
                    .iter()
                    .find(|(k, _)| k == crate::EXPIRES_KEY)
                    .and_then(|(_, v)| v.parse().ok());
                self.set_manifest(
                    name,
                    Indexed {
                        stamp,
                        read_at,
                        blocks: m.block_ids,
                        root,
                        expires,
                    },
                );
            }
            Err(FormatError::NotFound { .. }) => self.remove_manifest(name),
            Err(e) if e.is_corruption() => {
                self.remove_manifest(name);
                if let Some(p) = store.quarantine_manifest(name, exclusive)? {
                    out.set_aside.push(p);
                }
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    fn set_manifest(&mut self, name: &str, entry: Indexed) {
        self.remove_manifest(name);
        self.manifest_bytes += entry.stamp.map_or(0, |s| s.len);
        if let Some(e) = entry.expires {
            self.expiries.insert((e, name.to_owned()));
        }
        for id in &entry.blocks {
            let n = self.refs.entry(*id).or_default();
            *n += 1;
            if *n == 1 {
                self.unreferenced.remove(id);
            }
        }
        self.manifests.insert(name.to_owned(), entry);
    }

    /// Forgets manifest `name` (deleted): its blocks lose a reference.
    pub(crate) fn remove_manifest(&mut self, name: &str) {
        let Some(old) = self.manifests.remove(name) else {
            return;
        };
        self.manifest_bytes -= old.stamp.map_or(0, |s| s.len);
        if let Some(e) = old.expires {
            self.expiries.remove(&(e, name.to_owned()));
        }
        for id in &old.blocks {
            if let Some(n) = self.refs.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    self.refs.remove(id);
                    if self.blocks.contains(id) {
                        self.unreferenced.insert(*id);
                    }
                }
            }
        }
    }

    fn add_block(&mut self, id: BlockId) {
        if self.blocks.insert(id) && !self.refs.contains_key(&id) {
            self.unreferenced.insert(id);
        }
    }

    /// Forgets block file `id` (deleted).
    pub(crate) fn remove_block(&mut self, id: &BlockId) {
        self.blocks.remove(id);
        self.unreferenced.remove(id);
    }

    /// Block files.
    pub(crate) fn block_count(&self) -> u64 {
        self.blocks.len() as u64
    }

    /// Whether block file `id` is there.
    pub(crate) fn holds_block(&self, id: &BlockId) -> bool {
        self.blocks.contains(id)
    }

    /// Bytes of the manifests whose stamps are known.
    pub(crate) fn manifest_bytes(&self) -> u64 {
        self.manifest_bytes
    }

    /// Bytes of the manifests as last read, and of those changed since as their lengths were
    /// noted by [`DiskIndex::follow`] (a changed one counts twice until the next refresh: a
    /// budget errs on the safe side).
    pub(crate) fn manifest_bytes_noted(&self) -> u64 {
        self.manifest_bytes + self.pending.values().sum::<u64>()
    }

    /// Block files no manifest references.
    pub(crate) fn unreferenced(&self) -> impl Iterator<Item = &BlockId> {
        self.unreferenced.iter()
    }

    /// Manifests that reference block `id`.
    pub(crate) fn refs(&self, id: &BlockId) -> u32 {
        self.refs.get(id).copied().unwrap_or(0)
    }

    /// The blocks manifest `name` references, if the index holds it.
    pub(crate) fn blocks_of(&self, name: &str) -> Option<&[BlockId]> {
        self.manifests.get(name).map(|e| e.blocks.as_slice())
    }

    /// The manifests whose expiry is at or before `now_unix`.
    pub(crate) fn expired(&self, now_unix: u64) -> Vec<String> {
        self.expiries
            .iter()
            .take_while(|(e, _)| *e <= now_unix)
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// Whether manifests changed that were not read yet (their expiries are not known).
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whether some manifest's expiry is at or before `now_unix`.
    pub(crate) fn any_expired(&self, now_unix: u64) -> bool {
        self.expiries.first().is_some_and(|(e, _)| *e <= now_unix)
    }

    /// The manifests whose first block chains from `root`.
    pub(crate) fn rooted_at(&self, root: &BlockId) -> Vec<String> {
        self.manifests
            .iter()
            .filter(|(_, e)| e.root.as_ref() == Some(root))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Each manifest with its file's length and modification time, where known.
    pub(crate) fn manifests(&self) -> impl Iterator<Item = (&str, u64, Option<SystemTime>)> {
        self.manifests.iter().map(|(n, e)| {
            (
                n.as_str(),
                e.stamp.map_or(0, |s| s.len),
                e.stamp.map(|s| s.modified),
            )
        })
    }
}
