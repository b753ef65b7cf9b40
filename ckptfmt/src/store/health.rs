//! Damage: how much of a checkpoint verifies, and quarantine of block files and manifests
//! that do not verify.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Store, BLOCK_SUFFIX, MANIFEST_SUFFIX, QUARANTINE_DIR, STATE_SUFFIX};
use crate::error::{FormatError, Result};
use crate::ids::BlockId;
use crate::manifest::Manifest;
use crate::vfs::{create_dir_durable, FileLock, Vfs};

static QUARANTINE_SEQ: AtomicU64 = AtomicU64::new(0);

/// The first block of a checkpoint that does not verify.
#[derive(Debug)]
pub struct BadBlock {
    /// Its index in the checkpoint.
    pub index: usize,
    /// Its id.
    pub id: BlockId,
    /// Its file.
    pub path: PathBuf,
    /// Why it does not verify (missing, damaged, foreign).
    pub error: FormatError,
}

/// How much of a checkpoint verifies.
#[derive(Debug)]
pub struct CheckpointHealth {
    /// The checkpoint's manifest (it verified).
    pub manifest: Manifest,
    /// Leading blocks that verify: the checkpoint is restorable up to
    /// `good_blocks * tokens_per_block` tokens.
    pub good_blocks: usize,
    /// The first block that does not, `None` when the whole checkpoint verifies.
    pub first_bad: Option<BadBlock>,
}

impl CheckpointHealth {
    /// Whether every block verifies.
    pub fn is_intact(&self) -> bool {
        self.first_bad.is_none()
    }
}

impl<V: Vfs> Store<V> {
    /// Reads checkpoint `name`'s manifest and verifies its blocks in order,
    /// stopping at the first that is missing or damaged. Errors only when the
    /// manifest itself cannot be read or verified, or on an I/O failure.
    pub fn checkpoint_health(&self, name: &str) -> Result<CheckpointHealth> {
        let _shared = self.read_lock();
        let manifest = self.read_manifest(name)?;
        let mut first_bad = None;
        let mut good_blocks = manifest.block_ids.len();
        for (index, id) in manifest.block_ids.iter().enumerate() {
            match self.read_block(id) {
                Ok(_) => {}
                Err(e) if e.is_corruption() || matches!(e, FormatError::NotFound { .. }) => {
                    good_blocks = index;
                    first_bad = Some(BadBlock {
                        index,
                        id: *id,
                        path: self.block_path(id),
                        error: e,
                    });
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(CheckpointHealth {
            manifest,
            good_blocks,
            first_bad,
        })
    }

    /// Moves block `id`'s file into the quarantine directory when it does not
    /// verify, so that no later save reuses it (the next save of that block
    /// writes it again). Returns the quarantined file's new path, or `None`
    /// when the file is absent or verifies (someone wrote it again). Takes
    /// the exclusive store lock, so no save is relying on the file.
    pub fn quarantine_block(&self, id: &BlockId) -> Result<Option<PathBuf>> {
        let owner = self.owner("quarantine_block")?;
        let _excl = self.lock_exclusive()?;
        let p = self.block_path(id);
        match self.read_block(id) {
            Ok(_) | Err(FormatError::NotFound { .. }) => return Ok(None),
            Err(e) if e.is_corruption() => {}
            Err(e) => return Err(e),
        }
        let name = format!("{}.{}", id.to_hex(), owner.token);
        self.move_to_quarantine(&p, &self.blocks_dir, &name, BLOCK_SUFFIX)
            .map(Some)
    }

    /// Moves the state record at the end of block `id` into the quarantine directory when it
    /// does not verify, as [`Store::quarantine_block`] does for a block (the next snapshot of
    /// that block writes it again). Returns its new path, or `None` when the file is absent or
    /// verifies.
    pub fn quarantine_state(&self, id: &BlockId) -> Result<Option<PathBuf>> {
        let owner = self.owner("quarantine_state")?;
        let _excl = self.lock_exclusive()?;
        match self.read_state(id) {
            Ok(_) | Err(FormatError::NotFound { .. }) => return Ok(None),
            Err(e) if e.is_corruption() => {}
            Err(e) => return Err(e),
        }
        let name = format!("{}.{}", id.to_hex(), owner.token);
        self.move_to_quarantine(&self.state_path(id), &self.blocks_dir, &name, STATE_SUFFIX)
            .map(Some)
    }

    /// Renames the file `path` of directory `from` into the quarantine directory as
    /// `{stem}-{n}{suffix}` (`n` unique in this process), durably.
    fn move_to_quarantine(
        &self,
        path: &std::path::Path,
        from: &std::path::Path,
        stem: &str,
        suffix: &str,
    ) -> Result<PathBuf> {
        let dir = self.root.join(QUARANTINE_DIR);
        create_dir_durable(&self.vfs, &dir).map_err(|e| FormatError::io("mkdir", &dir, e))?;
        let seq = QUARANTINE_SEQ.fetch_add(1, Ordering::Relaxed);
        let dst = dir.join(format!("{stem}-{seq}{suffix}"));
        self.vfs
            .rename(path, &dst)
            .map_err(|e| FormatError::io("rename", path, e))?;
        for d in [&dir, from] {
            self.vfs
                .sync_dir(d)
                .map_err(|e| FormatError::io("fsync", d, e))?;
        }
        Ok(dst)
    }

    /// Moves checkpoint `name`'s manifest into the quarantine directory when its bytes do
    /// not verify ([`Store::decode_manifest`]): a damaged manifest names no blocks anyone can
    /// use, and set aside it no longer stops a collection. Returns its new path, or `None` when
    /// the file is absent or verifies.
    /// The caller holds the exclusive store lock (`exclusive`, from
    /// [`Store::lock_exclusive`]), so no save is committing that name meanwhile.
    pub fn quarantine_manifest(&self, name: &str, exclusive: &FileLock) -> Result<Option<PathBuf>> {
        let _ = exclusive;
        let owner = self.owner("quarantine_manifest")?;
        match self.decode_manifest(name) {
            Ok(_) | Err(FormatError::NotFound { .. }) => return Ok(None),
            Err(e) if e.is_corruption() => {}
            Err(e) => return Err(e),
        }
        let p = self.manifest_path(name)?;
        let stem = format!("{name}.{}", owner.token);
        self.move_to_quarantine(&p, &self.manifests_dir, &stem, MANIFEST_SUFFIX)
            .map(Some)
    }

    /// Files in the quarantine directory.
    pub fn quarantined(&self) -> Result<Vec<PathBuf>> {
        let dir = self.root.join(QUARANTINE_DIR);
        match self.vfs.list(&dir) {
            Ok(names) => Ok(names.into_iter().map(|n| dir.join(n)).collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(FormatError::io("list", &dir, e)),
        }
    }
}
