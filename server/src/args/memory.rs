//! `--kv-ram` without a value: the KV pool's RAM budget taken from the memory available at
//! start. Available is the smaller of the memory cgroup's limit (v2 `memory.max`, v1
//! `memory.limit_in_bytes`, the process's own group and those above it; `max` or a huge value
//! is no limit) and `/proc/meminfo`'s `MemAvailable`. The pool gets half of what remains after
//! the model file and the prompt cache's RAM tier (the other half is for the compute buffers,
//! the tokenizer and the system's page cache, which reads the spilled pages), and at least
//! [`MIN_KV_RAM`].

use std::path::{Path, PathBuf};

/// The smallest budget the default gives, however little memory is left.
pub const MIN_KV_RAM: u64 = 64 << 20;

/// A cgroup limit at or above this is no limit (v1 writes `LONG_MAX` rounded to a page).
const NO_LIMIT: u64 = 1 << 60;

/// The default budget: half of `available` less the model file and the cache's RAM tier
/// (`cache_ram`, when it has a limit), at least [`MIN_KV_RAM`].
pub fn kv_ram_rule(available: u64, model_bytes: u64, cache_ram: u64) -> u64 {
    let tier = if cache_ram == u64::MAX { 0 } else { cache_ram };
    (available.saturating_sub(model_bytes).saturating_sub(tier) / 2).max(MIN_KV_RAM)
}

/// Bytes of memory available to this process now (see the module docs); `None` where neither
/// the cgroup nor `/proc/meminfo` can be read.
pub fn memory_available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| mem_available(&t));
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let cgroup = cgroup_files(&own)
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .filter_map(|t| cgroup_limit(&t))
        .min();
    match (meminfo, cgroup) {
        (Some(m), Some(c)) => Some(m.min(c)),
        (m, c) => m.or(c),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib = line.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    kib.checked_mul(1024)
}

/// A cgroup memory limit file's value in bytes; `None` for no limit (`max`, or huge).
pub fn cgroup_limit(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|&n| n < NO_LIMIT)
}

/// The limit files that bound this process, from `/proc/self/cgroup`'s text: for cgroup v2
/// (`0::/path`) `memory.max` of its group and each one above it, for v1 (`N:memory:/path`)
/// `memory.limit_in_bytes` likewise; each hierarchy's root file besides (inside a container
/// the group's path is often the host's, and the container's own group is the mount's root).
pub fn cgroup_files(own: &str) -> Vec<PathBuf> {
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
