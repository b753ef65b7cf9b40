//! Staging files under temporary names and committing them (FORMAT.md,
//! "Commit protocol").

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Store, TMP_SUFFIX};
use crate::error::{FormatError, Result};
use crate::vfs::{Vfs, VfsFile};

/// Counter that makes temporary file names unique within the process.
static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// A file written to its temporary name, not yet synced or renamed.
#[derive(Debug)]
pub(super) struct Staged<F> {
    pub(super) tmp: PathBuf,
    pub(super) dst: PathBuf,
    pub(super) file: F,
    pub(super) len: u64,
}

impl<V: Vfs> Store<V> {
    /// Writes `parts` to `dir/name` durably: temporary file, write, sync,
    /// rename, sync of the directory. Any failure fails the call; nothing is retried.
    pub(super) fn write_file_durable(
        &self,
        dir: &Path,
        name: &str,
        parts: &[&[u8]],
    ) -> Result<u64> {
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
    pub(super) fn stage(&self, dir: &Path, name: &str, parts: &[&[u8]]) -> Result<Staged<V::File>> {
        // A unique temporary name carrying the owner's token: concurrent
        // writers never write the same temporary file, and cleanup knows
        // whose it is.
        let owner = self.owner("write")?;
        let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!("{name}.{}-{seq}{TMP_SUFFIX}", owner.token));
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
    pub(super) fn commit(
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
    pub(super) fn discard<'p>(&self, tmps: impl IntoIterator<Item = &'p Path>) {
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
}
