//! This process's index of one model's manifests: for each name, the blocks it references and
//! the stamp of the file it was read from. A collection brings it up to date by listing the
//! directory and looking at each file's stamp, and reads only the manifests that are new or
//! changed since, so its cost follows what changed rather than the size of the store (a tail
//! manifest carries up to a page of KV, and reading them all at every collection does not).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use ckptfmt::{BlockId, FileLock, FileStamp, FormatError, Store, Vfs};

/// A file modified this close to the moment it was read is read again next time: another
/// write within the same tick of the file system's clock keeps its modification time.
const RACY: Duration = Duration::from_secs(2);

/// The manifests of one model as last read.
#[derive(Debug, Default)]
pub(crate) struct ManifestIndex {
    entries: HashMap<String, Indexed>,
}

#[derive(Debug)]
struct Indexed {
    stamp: FileStamp,
    read_at: SystemTime,
    blocks: Vec<BlockId>,
}

/// What [`ManifestIndex::refresh`] found.
#[derive(Debug, Default)]
pub(crate) struct Refreshed {
    /// Every block some manifest references, with how many manifests reference it.
    pub live: HashMap<BlockId, u32>,
    /// The blocks of each manifest the index holds.
    pub lists: HashMap<String, Vec<BlockId>>,
    /// Damaged manifests moved into the quarantine directory.
    pub set_aside: Vec<PathBuf>,
    /// Manifests read (new or changed since the last refresh).
    pub read: usize,
}

impl ManifestIndex {
    /// Brings the index up to date with `store`'s manifests under the exclusive store lock
    /// (so none is being committed): unchanged files are not read again, a damaged one is set
    /// aside ([`Store::quarantine_manifest`]) and reported rather than stopping the caller.
    pub(crate) fn refresh<V: Vfs>(
        &mut self,
        store: &Store<V>,
        exclusive: &FileLock,
    ) -> Result<Refreshed, FormatError> {
        let names: HashSet<String> = store.list_manifests()?.into_iter().collect();
        self.entries.retain(|n, _| names.contains(n));
        let mut out = Refreshed::default();
        for name in names {
            let stamp = match store.manifest_stamp(&name) {
                Ok(s) => s,
                Err(FormatError::NotFound { .. }) => {
                    self.entries.remove(&name);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let fresh = match (stamp, self.entries.get(&name)) {
                (Some(s), Some(e)) => {
                    e.stamp == s
                        && e.read_at
                            .duration_since(s.modified)
                            .is_ok_and(|age| age >= RACY)
                }
                _ => false,
            };
            if fresh {
                continue;
            }
            let read_at = SystemTime::now();
            // Decoded only: a manifest of another model or under another name still keeps
            // the blocks it lists.
            match store.decode_manifest(&name) {
                Ok(m) => {
                    out.read += 1;
                    match stamp {
                        Some(stamp) => {
                            self.entries.insert(
                                name,
                                Indexed {
                                    stamp,
                                    read_at,
                                    blocks: m.block_ids,
                                },
                            );
                        }
                        // No stamps: nothing to remember it by; its blocks are live now.
                        None => {
                            self.entries.remove(&name);
                            for id in m.block_ids {
                                *out.live.entry(id).or_default() += 1;
                            }
                        }
                    }
                }
                Err(FormatError::NotFound { .. }) => {
                    self.entries.remove(&name);
                }
                Err(e) if e.is_corruption() => {
                    self.entries.remove(&name);
                    if let Some(p) = store.quarantine_manifest(&name, exclusive)? {
                        out.set_aside.push(p);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        for (name, e) in &self.entries {
            for id in &e.blocks {
                *out.live.entry(*id).or_default() += 1;
            }
            out.lists.insert(name.clone(), e.blocks.clone());
        }
        Ok(out)
    }
}
