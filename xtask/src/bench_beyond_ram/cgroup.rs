//! The memory cgroups `bench-beyond-ram` runs in: made fresh under this process's own memory
//! cgroup or the hierarchy's root (v1 or v2), read for peaks and OOM kills, removed when done.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Which cgroup hierarchy holds the memory controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Version {
    /// cgroup v1: `memory.limit_in_bytes`, `memory.max_usage_in_bytes`, `memory.oom_control`.
    V1,
    /// cgroup v2: `memory.max`, `memory.peak`, `memory.events`.
    V2,
}

/// A memory cgroup this command made; removed (rmdir) when dropped.
pub(super) struct Cgroup {
    /// Its directory in the hierarchy.
    dir: PathBuf,
    /// The hierarchy's version.
    version: Version,
}

impl Cgroup {
    /// Makes `name` under the first usable parent and sets its limit to `limit` bytes.
    pub(super) fn create(name: &str, limit: u64) -> Result<Cgroup, String> {
        let parents = parents()?;
        let mut why = Vec::new();
        for (parent, version) in parents {
            match Cgroup::create_under(&parent, version, name, limit) {
                Ok(c) => return Ok(c),
                Err(e) => why.push(e),
            }
        }
        Err(format!(
            "no memory cgroup could be made (needs root): {}",
            why.join("; ")
        ))
    }

    /// Makes `name` under `parent`.
    fn create_under(
        parent: &Path,
        version: Version,
        name: &str,
        limit: u64,
    ) -> Result<Cgroup, String> {
        if version == Version::V2 {
            // The child gets `memory.*` only when its parent hands the controller down.
            let ctl = parent.join("cgroup.subtree_control");
            let on = std::fs::read_to_string(&ctl).unwrap_or_default();
            if !on.split_whitespace().any(|c| c == "memory") {
                std::fs::write(&ctl, "+memory").map_err(|e| format!("{}: {e}", ctl.display()))?;
            }
        }
        let dir = parent.join(name);
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let cgroup = Cgroup { dir, version };
        let file = match version {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        };
        cgroup.write(file, &limit.to_string())?;
        if version == Version::V2 {
            // No swap to spill to either, where the kernel has it.
            let _ = cgroup.write("memory.swap.max", "0");
        }
        Ok(cgroup)
    }

    /// Writes `value` to one of its files.
    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        let path = self.dir.join(file);
        std::fs::write(&path, value).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// One of its files, whole; `None` when unreadable.
    fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join(file)).ok()
    }

    /// A `key value` line's value in `file` (`memory.stat`, `memory.events`, ...).
    pub(super) fn field(&self, file: &str, key: &str) -> Option<u64> {
        self.read(file)?.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
    }

    /// The most the cgroup was charged at once, page cache included.
    pub(super) fn peak(&self) -> Option<u64> {
        let file = match self.version {
            Version::V1 => "memory.max_usage_in_bytes",
            Version::V2 => "memory.peak",
        };
        self.read(file)?.trim().parse().ok()
    }

    /// Anonymous memory charged now (what reclaim cannot drop without swap).
    pub(super) fn anon(&self) -> Option<u64> {
        match self.version {
            Version::V1 => self.field("memory.stat", "rss"),
            Version::V2 => self.field("memory.stat", "anon"),
        }
    }

    /// Processes the cgroup's OOM killer has killed.
    pub(super) fn oom_kills(&self) -> Option<u64> {
        match self.version {
            Version::V1 => self.field("memory.oom_control", "oom_kill"),
            Version::V2 => self.field("memory.events", "oom_kill"),
        }
    }

    /// The file a process writes its pid to, to join.
    pub(super) fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The last process may still be leaving; a few tries.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("bench-beyond-ram: could not remove {}", self.dir.display());
    }
}

/// Where a memory cgroup may be made, best first: this process's own memory cgroup, then the
/// hierarchy's root; v1 before v2.
fn parents() -> Result<Vec<(PathBuf, Version)>, String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        // `id parent major:minor root mount-point options ... - fstype source super-options`
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split(' ').collect();
        let theirs: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(point), Some(fstype)) =
            (fields.get(3), fields.get(4), theirs.first())
        else {
            continue;
        };
        let version = match *fstype {
            "cgroup"
                if theirs
                    .get(2)
                    .is_some_and(|o| o.split(',').any(|o| o == "memory")) =>
            {
                Version::V1
            }
            "cgroup2" => Version::V2,
            _ => continue,
        };
        let point = PathBuf::from(point);
        if version == Version::V2 {
            let controllers =
                std::fs::read_to_string(point.join("cgroup.controllers")).unwrap_or_default();
            if !controllers.split_whitespace().any(|c| c == "memory") {
                continue;
            }
        }
        // This process's place in that hierarchy (`N:memory:/path` or `0::/path`).
        let mine = own.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let wanted = match version {
                Version::V1 => controllers.split(',').any(|c| c == "memory"),
                Version::V2 => controllers.is_empty(),
            };
            wanted.then(|| path.to_string())
        });
        if let Some(path) = mine
            .as_deref()
            .and_then(|p| p.strip_prefix(*root).or(Some(p)))
        {
            let dir = point.join(path.trim_start_matches('/'));
            if dir != point && dir.is_dir() {
                out.push((dir, version));
            }
        }
        out.push((point, version));
    }
    out.sort_by_key(|(_, v)| *v == Version::V2);
    if out.is_empty() {
        return Err("no cgroup hierarchy with the memory controller is mounted".into());
    }
    Ok(out)
}
