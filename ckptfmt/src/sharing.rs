//! Sharing one store directory between processes.
//!
//! ```text
//! ROOT/LOCK                      the store lock
//! ROOT/owners/<pid>-<nonce>.lock one per open for writing, locked by its owner while open
//! */<name>.<pid>-<nonce>-<n>.tmp a file being written by that owner
//! ```
//!
//! Blocks are immutable and named by their content, and manifests are
//! replaced by an atomic rename, so writers of blocks and manifests and
//! readers of any file share a store freely. Two things need exclusion:
//!
//! - **Collection** deletes blocks no manifest references. A save that found
//!   a block present must not see it deleted before its manifest commits, so
//!   a save holds the store lock *shared* from its presence checks to the
//!   manifest's rename, and the collector's deletion holds it *exclusive*.
//! - **Removal of temporary files.** A temporary file's name carries its
//!   writer's owner token; it is removed only under the exclusive lock and
//!   only when its owner is provably gone: the owner file is absent or can be
//!   locked (the operating system releases a dead process's locks). A writer
//!   registers its owner file under the shared lock, so registration and
//!   cleanup never interleave.
//!
//! Locks are advisory (`flock` through [`Vfs::try_lock`]). A reader takes
//! no lock it would have to create, so it works on a read-only copy.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{FormatError, Result};
use crate::store::TMP_SUFFIX;
use crate::vfs::{create_dir_durable, FileLock, LockMode, Vfs};

/// File name of the store lock.
pub const LOCK_FILE: &str = "LOCK";
/// Directory of owner files.
pub const OWNERS_DIR: &str = "owners";
/// Suffix of owner files.
pub const OWNER_SUFFIX: &str = ".lock";
/// How long a call waits for the store lock before failing with
/// [`FormatError::Busy`].
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

static NONCE: AtomicU64 = AtomicU64::new(0);

/// A registered writer: its token names its temporary files.
#[derive(Debug)]
pub(crate) struct Owner {
    pub(crate) token: String,
    _lock: FileLock,
}

fn new_token() -> String {
    let nanos = crate::since_epoch().as_nanos() as u64;
    let n = NONCE.fetch_add(1, Ordering::Relaxed);
    // splitmix64 of the time and a counter: unique within the process,
    // unlikely to repeat across a reused pid.
    let mut z = nanos ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    format!("{}-{:016x}", std::process::id(), z ^ (z >> 31))
}

fn owner_path(root: &Path, token: &str) -> PathBuf {
    root.join(OWNERS_DIR).join(format!("{token}{OWNER_SUFFIX}"))
}

/// Registers a new owner in `root`. Call with the store lock held shared.
pub(crate) fn register<V: Vfs>(vfs: &V, root: &Path) -> Result<Owner> {
    let dir = root.join(OWNERS_DIR);
    create_dir_durable(vfs, &dir).map_err(|e| FormatError::io("mkdir", &dir, e))?;
    let token = new_token();
    let p = owner_path(root, &token);
    match vfs.try_lock(&p, LockMode::Exclusive, true) {
        Ok(Some(lock)) => Ok(Owner { token, _lock: lock }),
        Ok(None) => Err(FormatError::invalid(
            "owner file",
            format!("{p:?} is locked by someone else"),
        )),
        Err(e) => Err(FormatError::io("lock", &p, e)),
    }
}

/// The owner token in a temporary file's name
/// (`<name>.<pid>-<nonce>-<n>.tmp`); `None` for other names.
pub(crate) fn tmp_owner(file_name: &str) -> Option<&str> {
    let stem = file_name.strip_suffix(TMP_SUFFIX)?;
    let tag = &stem[stem.rfind('.')? + 1..];
    let (owner, seq) = tag.rsplit_once('-')?;
    let (pid, nonce) = owner.split_once('-')?;
    let digits = |s: &str, hex: bool| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (hex && b.is_ascii_hexdigit()))
    };
    (digits(pid, false) && digits(nonce, true) && digits(seq, false)).then_some(owner)
}

/// Whether the owner `token` of `root` is alive: its owner file exists and
/// is locked.
pub(crate) fn is_alive<V: Vfs>(vfs: &V, root: &Path, token: &str) -> Result<bool> {
    let p = owner_path(root, token);
    match vfs.try_lock(&p, LockMode::Exclusive, false) {
        Ok(Some(_)) => Ok(false),
        Ok(None) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(FormatError::io("lock", &p, e)),
    }
}

/// Owner tokens registered in `root` (alive or not).
pub(crate) fn owners<V: Vfs>(vfs: &V, root: &Path) -> Vec<String> {
    let dir = root.join(OWNERS_DIR);
    vfs.list(&dir)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|n| n.strip_suffix(OWNER_SUFFIX).map(String::from))
        .collect()
}

/// Pids of the live owners of `root` (best effort: for error messages).
pub fn live_pids<V: Vfs>(vfs: &V, root: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = owners(vfs, root)
        .iter()
        .filter(|t| is_alive(vfs, root, t).unwrap_or(false))
        .filter_map(|t| t.split_once('-').and_then(|(p, _)| p.parse().ok()))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Takes the store lock of `root` in `mode`, waiting up to `timeout`.
/// `create` makes the lock file when absent; without it, a missing lock file
/// gives `Ok(None)` (a store no writer ever opened, or a read-only copy).
pub(crate) fn acquire<V: Vfs>(
    vfs: &V,
    root: &Path,
    mode: LockMode,
    timeout: Duration,
    create: bool,
) -> Result<Option<FileLock>> {
    let p = root.join(LOCK_FILE);
    let start = Instant::now();
    let mut pause = Duration::from_micros(200);
    loop {
        match vfs.try_lock(&p, mode, create) {
            Ok(Some(l)) => return Ok(Some(l)),
            Ok(None) => {}
            Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(FormatError::io("lock", &p, e)),
        }
        if start.elapsed() >= timeout {
            return Err(FormatError::Busy {
                path: p,
                wanted: match mode {
                    LockMode::Shared => "shared",
                    LockMode::Exclusive => "exclusive",
                },
                pids: live_pids(vfs, root),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmp_owner_parses_only_owned_temporary_names() {
        assert_eq!(tmp_owner("ab.blk.12-00ff-3.tmp"), Some("12-00ff"));
        assert_eq!(tmp_owner("my.chat-1.ckpt.7-a1-0.tmp"), Some("7-a1"));
        assert_eq!(tmp_owner("ab.blk.12-3.tmp"), None, "legacy name");
        assert_eq!(tmp_owner("ab.blk"), None);
        assert_eq!(tmp_owner("x.1-zz-3.tmp"), None);
    }

    #[test]
    fn token_has_pid_and_parses_back() {
        let t = new_token();
        let name = format!("b.blk.{t}-5{TMP_SUFFIX}");
        assert_eq!(tmp_owner(&name), Some(t.as_str()));
        assert!(t.starts_with(&format!("{}-", std::process::id())));
    }
}
