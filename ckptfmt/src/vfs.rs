//! The file-system seam: every write the crate makes goes through [`Vfs`].
//!
//! [`StdFs`] is the real implementation over `std::fs`. The in-memory,
//! fault-injecting `FaultFs` lives in `fault.rs`, behind the `test-util`
//! feature.

use std::fmt;
use std::fs::{self, TryLockError};
use std::io::{self, Write};
use std::path::Path;

/// A file open for writing through a [`Vfs`].
pub trait VfsFile: Send {
    /// Appends all of `buf`.
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Makes the written data durable (fdatasync). An error means the data
    /// may be lost; callers fail the operation and never retry.
    fn sync(&mut self) -> io::Result<()>;
}

/// How an advisory lock is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Any number of shared holders at once, and no exclusive one.
    Shared,
    /// One holder, and no shared one.
    Exclusive,
}

/// A held advisory lock; dropping it releases the lock. The operating system
/// releases it too when its process exits, even by a kill.
pub struct FileLock {
    _inner: Box<dyn Send + Sync>,
}

impl FileLock {
    /// Wraps anything whose drop releases the lock.
    pub fn new(inner: impl Send + Sync + 'static) -> Self {
        FileLock {
            _inner: Box::new(inner),
        }
    }
}

impl fmt::Debug for FileLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FileLock")
    }
}

/// The file-system operations the crate needs.
pub trait Vfs: Send + Sync {
    /// The writable file type.
    type File: VfsFile;
    /// Creates (or truncates) a file for writing.
    fn create(&self, path: &Path) -> io::Result<Self::File>;
    /// Reads a whole file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Atomically renames `from` to `to`, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Whether a file or directory exists.
    fn exists(&self, path: &Path) -> io::Result<bool>;
    /// Names of the entries of a directory.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Creates a directory and its parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Makes the directory's entries (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Tries to take an advisory lock on the file at `path` without waiting:
    /// `Ok(None)` when another holder has it in a conflicting mode. With
    /// `create` the file is created when absent; without, the file is only
    /// opened for reading (which works on a read-only store).
    ///
    /// Locks taken through separate calls conflict with each other even in
    /// one process (they behave like `flock` on separate open files).
    fn try_lock(&self, path: &Path, mode: LockMode, create: bool) -> io::Result<Option<FileLock>>;
    /// Syncs several files; the first error is returned and fails the caller.
    /// The default syncs one after the other; [`StdFs`] syncs in parallel,
    /// which lets the file system merge the flushes (see FORMAT.md, "Measurements").
    fn sync_files(&self, files: &mut [Self::File]) -> io::Result<()> {
        files.iter_mut().try_for_each(VfsFile::sync)
    }
    /// What identifies the file's present version (length, modification time, inode), so a
    /// caller can tell that a file it read has not changed without reading it again;
    /// `Ok(None)` when the file system cannot say (the default: read it again).
    fn stamp(&self, path: &Path) -> io::Result<Option<FileStamp>> {
        let _ = path;
        Ok(None)
    }
}

/// One version of a file, as [`Vfs::stamp`] sees it. A commit renames a new file into place,
/// so a rewritten file has a new inode even within one tick of the clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    /// Length in bytes.
    pub len: u64,
    /// Modification time.
    pub modified: std::time::SystemTime,
    /// Inode number (0 where the platform has none).
    pub ino: u64,
}

/// Creates `dir` and its missing parents, and makes each new directory's
/// entry (and `dir`'s in any case) durable by syncing its parent (a new directory whose parent was
/// never synced may vanish in a power loss, and everything in it with it).
pub fn create_dir_durable<V: Vfs + ?Sized>(vfs: &V, dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    for d in dir.ancestors() {
        if d.as_os_str().is_empty() || vfs.exists(d)? {
            break;
        }
        missing.push(d);
    }
    if missing.is_empty() {
        // It may have been created by an attempt whose parent sync failed:
        // sync its parent again (cheap, and only done when opening).
        missing.push(dir);
    } else {
        vfs.create_dir_all(dir)?;
    }
    for d in missing.iter().rev() {
        match d.parent() {
            Some(p) if !p.as_os_str().is_empty() => vfs.sync_dir(p)?,
            _ => vfs.sync_dir(Path::new("."))?,
        }
    }
    Ok(())
}

/// Most threads [`StdFs::sync_files`] uses.
pub const MAX_SYNC_THREADS: usize = 32;

/// Writes at least this large are followed by a hint to start writeback.
pub const WRITEBACK_HINT_BYTES: usize = 256 * 1024;

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdFs;

/// A file of [`StdFs`].
#[derive(Debug)]
pub struct StdFile(fs::File);

impl VfsFile for StdFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(buf)?;
        if buf.len() >= WRITEBACK_HINT_BYTES {
            crate::mmap::start_writeback(&self.0);
        }
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
}

impl Vfs for StdFs {
    type File = StdFile;

    fn create(&self, path: &Path) -> io::Result<StdFile> {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map(StdFile)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn stamp(&self, path: &Path) -> io::Result<Option<FileStamp>> {
        let m = fs::metadata(path)?;
        #[cfg(unix)]
        let ino = std::os::unix::fs::MetadataExt::ino(&m);
        #[cfg(not(unix))]
        let ino = 0;
        Ok(Some(FileStamp {
            len: m.len(),
            modified: m.modified()?,
            ino,
        }))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in fs::read_dir(dir)? {
            if let Ok(name) = e?.file_name().into_string() {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        fs::File::open(dir)?.sync_all()
    }

    /// `flock` on Unix, `LockFileEx` on Windows (std's file locks).
    fn try_lock(&self, path: &Path, mode: LockMode, create: bool) -> io::Result<Option<FileLock>> {
        let f = if create {
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)?
        } else {
            fs::File::open(path)?
        };
        let r = match mode {
            LockMode::Shared => f.try_lock_shared(),
            LockMode::Exclusive => f.try_lock(),
        };
        match r {
            Ok(()) => Ok(Some(FileLock::new(f))),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }

    fn sync_files(&self, files: &mut [StdFile]) -> io::Result<()> {
        if files.len() <= 1 {
            return files.iter_mut().try_for_each(VfsFile::sync);
        }
        let per_thread = files.len().div_ceil(MAX_SYNC_THREADS);
        std::thread::scope(|s| {
            let handles: Vec<_> = files
                .chunks_mut(per_thread)
                .map(|chunk| s.spawn(move || chunk.iter_mut().try_for_each(VfsFile::sync)))
                .collect();
            let mut first = Ok(());
            for h in handles {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("fsync thread panicked")));
                if first.is_ok() {
                    first = r;
                }
            }
            first
        })
    }
}

#[cfg(any(test, feature = "test-util"))]
pub use crate::fault::{CrashMode, FaultFile, FaultFs, FaultMode};
