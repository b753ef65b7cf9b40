//! How much memory this process may still use: the memory cgroup's limits (v2 `memory.max`, v1
//! `memory.limit_in_bytes`, of the process's own group and those above it; `max` or a huge
//! value is no limit) and `/proc/meminfo`'s `MemAvailable`. The server sizes its default
//! `--kv-ram` from [`available`]; the spill sizes its read-ahead from [`room_for_files`].

use std::path::{Path, PathBuf};

/// A cgroup limit at or above this is no limit (v1 writes `LONG_MAX` rounded to a page).
const NO_LIMIT: u64 = 1 << 60;

/// Bytes of memory available to this process now: the smaller of its cgroups' limits and
/// `MemAvailable`; `None` where neither can be read.
pub fn available() -> Option<u64> {
    let limits = limits().into_iter().map(|(limit, _)| limit).min();
    min_known(meminfo_available(), limits)
}

/// Bytes the page cache may hold for this process's files now: `MemAvailable`, and under each
/// cgroup limit what its anonymous memory leaves (a file page past it evicts another).
pub fn room_for_files() -> Option<u64> {
    let rooms = limits()
        .into_iter()
        .map(|(limit, dir)| limit.saturating_sub(cgroup_anon(&dir).unwrap_or(0)))
        .min();
    min_known(meminfo_available(), rooms)
}

fn min_known(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn meminfo_available() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| mem_available(&t))
}

/// The limits that bound this process, each with its group's directory.
fn limits() -> Vec<(u64, PathBuf)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    cgroup_files(&own)
        .into_iter()
        .filter_map(|f| {
            let limit = cgroup_limit(&std::fs::read_to_string(&f).ok()?)?;
            Some((limit, f.parent()?.to_path_buf()))
        })
        .collect()
}

/// Anonymous bytes charged to the cgroup at `dir` (v2 `anon`, v1 `total_rss`).
fn cgroup_anon(dir: &Path) -> Option<u64> {
    let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    stat_value(&stat, "anon").or_else(|| stat_value(&stat, "total_rss"))
}

/// The value of `key` in a cgroup's `memory.stat` text.
pub(crate) fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
pub(crate) fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib = line.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    kib.checked_mul(1024)
}

/// A cgroup memory limit file's value in bytes; `None` for no limit (`max`, or huge).
pub(crate) fn cgroup_limit(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|&n| n < NO_LIMIT)
}

/// The limit files that bound this process, from `/proc/self/cgroup`'s text: for cgroup v2
/// (`0::/path`) `memory.max` of its group and each one above it, for v1 (`N:memory:/path`)
/// `memory.limit_in_bytes` likewise; each hierarchy's root file besides (inside a container
/// the group's path is often the host's, and the container's own group is the mount's root).
pub(crate) fn cgroup_files(own: &str) -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let mut files = vec![
        root.join("memory.max"),
        root.join("memory").join("memory.limit_in_bytes"),
    ];
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (mount, file) = if id == "0" && controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        let rel = Path::new(path.trim_start_matches('/'));
        for dir in rel.ancestors().filter(|d| !d.as_os_str().is_empty()) {
            files.push(mount.join(dir).join(file));
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_parse() {
        let meminfo = "MemTotal:       24000000 kB\nMemAvailable:   23775940 kB\n";
        assert_eq!(mem_available(meminfo), Some(23775940 * 1024));
        assert_eq!(mem_available("MemFree: 1 kB\n"), None);
        assert_eq!(cgroup_limit("8589934592\n"), Some(8 << 30));
        assert_eq!(cgroup_limit("max\n"), None);
        assert_eq!(cgroup_limit("9223372036854771712\n"), None);
        let v1 = "cache 4096\nrss 8192\ntotal_cache 4096\ntotal_rss 12288\n";
        assert_eq!(stat_value(v1, "anon"), None);
        assert_eq!(stat_value(v1, "total_rss"), Some(12288));
        assert_eq!(stat_value("anon 77\nfile 5\n", "anon"), Some(77));
        let files = cgroup_files("0::/user.slice/app.scope\n");
        let v2: Vec<_> = files.iter().map(|f| f.display().to_string()).collect();
        assert!(v2.contains(&"/sys/fs/cgroup/user.slice/app.scope/memory.max".to_owned()));
        assert!(v2.contains(&"/sys/fs/cgroup/user.slice/memory.max".to_owned()));
        let files = cgroup_files("5:cpu:/x\n4:memory:/docker/abc\n");
        let v1: Vec<_> = files.iter().map(|f| f.display().to_string()).collect();
        assert!(v1.contains(&"/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes".to_owned()));
        assert!(!v1.iter().any(|f| f.contains("/cpu")));
    }
}
