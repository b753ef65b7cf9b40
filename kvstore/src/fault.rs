//! `FaultIo`: an in-memory [`BlockIo`](crate::BlockIo) for tests that
//! injects ENOSPC, EIO, fsync failures and crashes at a chosen operation,
//! and on [`FaultIo::crash`] keeps only what was made durable (the way a
//! power loss does; new directories whose parent was not synced vanish).
//! Its crash model is `ckptfmt`'s `FaultFs`; the typed faults are added
//! here. Compiled with the `test-util` feature.

use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use ckptfmt::vfs::FaultFile;
use ckptfmt::{CrashMode, FaultFs, FileLock, LockMode, Vfs, VfsFile};

/// A fault [`FaultIo`] can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The disk is full: a write or create fails with
    /// [`io::ErrorKind::StorageFull`] (a write may leave a prefix).
    NoSpace,
    /// Any mutating operation fails with an I/O error.
    Eio,
    /// The filesystem went read-only: a create or write fails with
    /// [`io::ErrorKind::ReadOnlyFilesystem`].
    ReadOnly,
    /// A file or directory sync fails; the data it should have made durable
    /// is not durable.
    FsyncFail,
    /// The process dies: the operation and every later one fail until
    /// [`FaultIo::crash`] is called.
    Crash,
}

#[derive(Debug, Default)]
struct Ctl {
    ops: u64,
    armed: Option<(u64, Fault)>,
    fired: Option<Fault>,
    dead: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Create,
    Write,
    Sync,
    Other,
}

/// An in-memory, fault-injecting [`BlockIo`]. Clones share one file system.
///
/// Mutating operations (create, write, sync, rename, remove, directory sync)
/// are numbered from 0 ([`FaultIo::ops`]). [`FaultIo::arm`] makes the first
/// operation numbered at least `at` that the fault applies to fail.
#[derive(Debug, Clone, Default)]
pub struct FaultIo {
    fs: FaultFs,
    ctl: Arc<Mutex<Ctl>>,
}

fn ctl_lock(m: &Mutex<Ctl>) -> MutexGuard<'_, Ctl> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn fault_error(f: Fault) -> io::Error {
    match f {
        Fault::NoSpace => io::Error::new(io::ErrorKind::StorageFull, "injected ENOSPC"),
        Fault::Eio => io::Error::other("injected EIO"),
        Fault::ReadOnly => io::Error::new(io::ErrorKind::ReadOnlyFilesystem, "injected EROFS"),
        Fault::FsyncFail => io::Error::other("injected fsync failure"),
        Fault::Crash => io::Error::other("injected crash: the process is dead"),
    }
}

impl FaultIo {
    /// An empty file system with no fault armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Mutating operations performed so far.
    pub fn ops(&self) -> u64 {
        ctl_lock(&self.ctl).ops
    }

    /// Arms `fault` at the first applicable operation numbered `at` or later.
    pub fn arm(&self, at: u64, fault: Fault) {
        let mut c = ctl_lock(&self.ctl);
        c.armed = Some((at, fault));
    }

    /// Disarms without firing.
    pub fn disarm(&self) {
        ctl_lock(&self.ctl).armed = None;
    }

    /// The fault that fired since the last call (and clears it).
    pub fn take_fired(&self) -> Option<Fault> {
        ctl_lock(&self.ctl).fired.take()
    }

    /// Whether a [`Fault::Crash`] fired and [`FaultIo::crash`] was not called yet.
    pub fn is_dead(&self) -> bool {
        ctl_lock(&self.ctl).dead
    }

    /// Simulates the power loss after a death (or at any moment): only what
    /// was durable survives (with [`CrashMode::Random`], also a random part
    /// of what was not); locks are released and the file system works again.
    pub fn crash(&self, mode: CrashMode) {
        let mut c = ctl_lock(&self.ctl);
        self.fs.crash(mode);
        c.dead = false;
        c.armed = None;
    }

    /// Every mutating operation attempted so far while alive, as
    /// `(operation, path)` (see `FaultFs::history`).
    pub fn history(&self) -> Vec<(&'static str, std::path::PathBuf)> {
        self.fs.history()
    }

    /// Reads a file directly (test helper).
    pub fn file(&self, path: &Path) -> Option<Vec<u8>> {
        self.fs.file(path)
    }

    /// Replaces a file durably (test helper, to corrupt data).
    pub fn set_file(&self, path: &Path, data: Vec<u8>) {
        self.fs.set_file(path, data)
    }

    /// Counts a mutating operation and decides whether it fails.
    fn tick(&self, kind: OpKind) -> io::Result<()> {
        let mut c = ctl_lock(&self.ctl);
        if c.dead {
            return Err(fault_error(Fault::Crash));
        }
        let n = c.ops;
        c.ops += 1;
        if let Some((at, fault)) = c.armed {
            let applies = match fault {
                Fault::NoSpace | Fault::ReadOnly => {
                    matches!(kind, OpKind::Create | OpKind::Write)
                }
                Fault::FsyncFail => kind == OpKind::Sync,
                Fault::Eio | Fault::Crash => true,
            };
            if n >= at && applies {
                c.armed = None;
                c.fired = Some(fault);
                if fault == Fault::Crash {
                    c.dead = true;
                }
                return Err(fault_error(fault));
            }
        }
        Ok(())
    }

    fn check_alive(&self) -> io::Result<()> {
        if ctl_lock(&self.ctl).dead {
            Err(fault_error(Fault::Crash))
        } else {
            Ok(())
        }
    }
}

/// A file of [`FaultIo`].
#[derive(Debug)]
pub struct FaultIoFile {
    io: FaultIo,
    inner: FaultFile,
}

impl VfsFile for FaultIoFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if let Err(e) = self.io.tick(OpKind::Write) {
            if e.kind() == io::ErrorKind::StorageFull {
                // A full disk takes what fits: keep a prefix (unsynced).
                let _ = self.inner.write_all(&buf[..buf.len() / 2]);
            }
            return Err(e);
        }
        self.inner.write_all(buf)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.io.tick(OpKind::Sync)?;
        self.inner.sync()
    }
}

impl Vfs for FaultIo {
    type File = FaultIoFile;

    fn create(&self, path: &Path) -> io::Result<FaultIoFile> {
        self.tick(OpKind::Create)?;
        let inner = self.fs.create(path)?;
        Ok(FaultIoFile {
            io: self.clone(),
            inner,
        })
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.check_alive()?;
        self.fs.read(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.tick(OpKind::Other)?;
        self.fs.rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.tick(OpKind::Other)?;
        self.fs.remove(path)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        self.check_alive()?;
        self.fs.exists(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.check_alive()?;
        self.fs.list(dir)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.check_alive()?;
        self.fs.create_dir_all(dir)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.tick(OpKind::Sync)?;
        self.fs.sync_dir(dir)
    }

    fn try_lock(&self, path: &Path, mode: LockMode, create: bool) -> io::Result<Option<FileLock>> {
        self.check_alive()?;
        self.fs.try_lock(path, mode, create)
    }
}
