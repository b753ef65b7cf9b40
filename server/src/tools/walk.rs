//! Listing a directory tree for the search tools on this host: depth first, symbolic links
//! listed but never entered (a link can lead back up, or out of the tools root), the usual
//! junk directories (`.git`, `node_modules`, `target`, …) listed but never entered, and the walk
//! cut short, and said to be, past a time budget or an entry count.

use std::path::{Path, PathBuf};
use std::time::Instant;

/// Which entries a listing returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Regular files.
    Files,
    /// Directories.
    Dirs,
    /// Both.
    All,
}

impl Kind {
    /// The `type` parameter's value.
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "file" => Some(Kind::Files),
            "dir" => Some(Kind::Dirs),
            "all" => Some(Kind::All),
            _ => None,
        }
    }

    fn files(self) -> bool {
        self != Kind::Dirs
    }

    fn dirs(self) -> bool {
        self != Kind::Files
    }
}

/// One entry, relative to the listing's base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `/`-separated path from the base.
    pub rel: String,
    /// A directory (else a regular file).
    pub is_dir: bool,
}

/// A listing.
#[derive(Debug, Default)]
pub struct Listing {
    /// The entries, sorted by path.
    pub entries: Vec<Entry>,
    /// Part of the tree was not seen (time, count or an unreadable directory).
    pub truncated: bool,
}

/// Directories listed but never entered: they can hold millions of files.
pub const JUNK: &[&str] = &[
    ".git",
    ".svn",
    ".hg",
    "node_modules",
    "__pycache__",
    ".venv",
    "venv",
    "dist",
    "build",
    "target",
    ".cache",
    ".idea",
    ".vscode",
];

/// Most entries one listing collects.
pub const MAX_ENTRIES: usize = 200_000;

/// Lists `base` (a directory) down to `max_depth` levels (0: all), until `deadline`.
pub fn walk(base: &Path, max_depth: usize, kind: Kind, deadline: Instant) -> Listing {
    let mut out = Listing::default();
    let mut stack: Vec<(PathBuf, String, usize)> = vec![(base.to_path_buf(), String::new(), 0)];
    while let Some((dir, rel_dir, depth)) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&dir) else {
            out.truncated = true;
            continue;
        };
        for entry in read {
            if Instant::now() >= deadline || out.entries.len() >= MAX_ENTRIES {
                out.truncated = true;
                out.entries.sort_by(|a, b| a.rel.cmp(&b.rel));
                return out;
            }
            let Ok(entry) = entry else {
                out.truncated = true;
                continue;
            };
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = if rel_dir.is_empty() {
                name.clone()
            } else {
                format!("{rel_dir}/{name}")
            };
            let Ok(own) = entry.file_type() else { continue };
            // A link is listed as what it points to, and never entered.
            let (is_dir, is_file) = if own.is_symlink() {
                match std::fs::metadata(entry.path()) {
                    Ok(m) => (m.is_dir(), m.is_file()),
                    Err(_) => continue,
                }
            } else {
                (own.is_dir(), own.is_file())
            };
            if is_dir {
                if kind.dirs() {
                    out.entries.push(Entry {
                        rel: rel.clone(),
                        is_dir: true,
                    });
                }
                let deeper = max_depth == 0 || depth + 1 < max_depth;
                if !own.is_symlink() && deeper && !JUNK.contains(&name.as_str()) {
                    stack.push((entry.path(), rel, depth + 1));
                }
            } else if is_file && kind.files() {
                out.entries.push(Entry { rel, is_dir: false });
            }
        }
    }
    out.entries.sort_by(|a, b| a.rel.cmp(&b.rel));
    out
}

/// The depth of a relative path: `a/b/c` is 3.
pub fn depth(rel: &str) -> usize {
    1 + rel.matches('/').count()
}

#[cfg(test)]
mod tests {
    use super::{walk, Kind};
    use std::time::{Duration, Instant};

    #[test]
    fn links_and_junk_are_listed_but_not_entered() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::create_dir_all(d.join("node_modules/x")).unwrap();
        std::fs::write(d.join("a/b/f.txt"), "").unwrap();
        std::fs::write(d.join("node_modules/x/g.txt"), "").unwrap();
        std::os::unix::fs::symlink(d, d.join("a/loop")).unwrap();
        let later = Instant::now() + Duration::from_secs(30);
        let all = walk(d, 0, Kind::All, later);
        let rels: Vec<&str> = all.entries.iter().map(|e| e.rel.as_str()).collect();
        assert_eq!(rels, ["a", "a/b", "a/b/f.txt", "a/loop", "node_modules"]);
        assert!(!all.truncated);
        let top = walk(d, 1, Kind::Dirs, later);
        assert_eq!(top.entries.len(), 2);
        let late = walk(d, 0, Kind::All, Instant::now());
        assert!(late.truncated);
    }
}
