//! Claims on checkpoint names: at most one live process works on a name at a time.
//!
//! Blocks and manifests may be shared by any number of processes, but two programs that both
//! keep saving a conversation under one name would overwrite each other's saves. A [`Claim`] is
//! an exclusive advisory lock (`flock`-style, [`std::fs::File::try_lock`]) on the file
//! `claims/NAME.lock` under the store's root; the file records the holder's pid so a refused
//! claim can say who holds the name. The lock is released when the claim is dropped or when
//! its process exits, however it exits, so a crashed holder never blocks a name.
//!
//! Claims are independent of [`KvStore`](crate::KvStore): they take no store lock and work on
//! a directory that holds no store yet.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ckptfmt::FormatError;

use crate::error::{Result, StoreError};

/// The directory under a store's root that holds the claim files.
pub const CLAIMS_DIR: &str = "claims";

/// How long a refused claim waits for the holder to have written its pid (the holder writes it
/// right after taking the lock).
const PID_WAIT: Duration = Duration::from_millis(200);

/// An exclusive claim on one checkpoint name, held until dropped.
#[derive(Debug)]
pub struct Claim {
    file: File,
    path: PathBuf,
    name: String,
}

impl Claim {
    /// The claimed name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // Clear the pid before the lock goes (closing the file releases it); a later reader of
        // an unlocked file ignores its content anyway.
        let _ = self.file.set_len(0);
        let _ = self.file.unlock();
    }
}

/// Claims `name` in the store at `root` for this process.
///
/// Fails with [`StoreError::Refused`] ([`FormatError::Busy`], naming the holder's pid, when it
/// could be read) if another claim on `name` is live, in this process or another; with
/// [`StoreError::Invalid`] if `name` is not a valid checkpoint name; with [`StoreError::Io`] if the claim file cannot be created
/// or locked.
pub fn claim(root: &Path, name: &str) -> Result<Claim> {
    ckptfmt::store::check_name(name).map_err(|e| StoreError::Invalid {
        what: "checkpoint name",
        detail: e.to_string(),
    })?;
    let dir = root.join(CLAIMS_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| StoreError::io("mkdir", &dir, e))?;
    let path = dir.join(format!("{name}.lock"));
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| StoreError::io("open", &path, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            return Err(StoreError::Refused(FormatError::Busy {
                pids: holder_pid(&mut file).into_iter().collect(),
                path,
                wanted: "exclusive",
            }))
        }
        Err(TryLockError::Error(e)) => return Err(StoreError::io("lock", &path, e)),
    }
    let write = |file: &mut File| -> std::io::Result<()> {
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        writeln!(file, "{}", std::process::id())
    };
    write(&mut file).map_err(|e| StoreError::io("write", &path, e))?;
    Ok(Claim {
        file,
        path,
        name: name.to_owned(),
    })
}

/// The pid recorded in a locked claim file, waiting briefly for a holder that has just taken
/// the lock to write it.
fn holder_pid(file: &mut File) -> Option<u32> {
    let start = std::time::Instant::now();
    loop {
        let mut text = String::new();
        let read = file
            .seek(SeekFrom::Start(0))
            .and_then(|_| file.read_to_string(&mut text));
        if read.is_ok() {
            if let Ok(pid) = text.trim().parse() {
                return Some(pid);
            }
        }
        if start.elapsed() >= PID_WAIT {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_claim_refuses_a_second_one_and_names_its_pid() {
        let dir = tempfile::tempdir().unwrap();
        let first = claim(dir.path(), "chat-1").unwrap();
        assert_eq!(first.name(), "chat-1");
        let recorded = std::fs::read_to_string(first.path()).unwrap();
        assert_eq!(recorded.trim(), std::process::id().to_string());
        match claim(dir.path(), "chat-1") {
            Err(StoreError::Refused(FormatError::Busy { pids, path, wanted })) => {
                assert_eq!(pids, vec![std::process::id()]);
                assert_eq!(path, first.path());
                assert_eq!(wanted, "exclusive");
            }
            other => panic!("expected Busy, got {other:?}"),
        }
        // Another name is free.
        let other = claim(dir.path(), "chat-2").unwrap();
        drop(other);
        drop(first);
        let again = claim(dir.path(), "chat-1").unwrap();
        assert_eq!(again.name(), "chat-1");
    }

    #[test]
    fn a_claim_held_by_another_thread_is_released_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let c = claim(&root, "shared").unwrap();
            tx.send(()).unwrap();
            done_rx.recv().unwrap();
            drop(c);
        });
        rx.recv().unwrap();
        assert!(matches!(
            claim(dir.path(), "shared"),
            Err(StoreError::Refused(FormatError::Busy { .. }))
        ));
        done_tx.send(()).unwrap();
        holder.join().unwrap();
        assert!(claim(dir.path(), "shared").is_ok());
    }

    #[test]
    fn names_that_are_not_checkpoint_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", "a/b", "../up", ".hidden", "x.tmp", "nul\0byte"] {
            assert!(
                matches!(
                    claim(dir.path(), bad),
                    Err(StoreError::Invalid {
                        what: "checkpoint name",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        // Nothing was created outside the claims directory.
        assert!(!dir.path().join("up.lock").exists());
    }
}
