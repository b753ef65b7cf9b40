//! Small text records that a program keeps in a store's directory beside the models, one file
//! each in a directory of their kind (the engine's `fingerprints/`: which model file hashed to
//! which fingerprint). Best effort: a record caches what its writer can compute again, so a
//! failure to read or write one is an absent record, never an error.

use std::path::{Path, PathBuf};

/// The file of record `name` of `kind` under `root`.
fn path(root: &Path, kind: &str, name: &str) -> PathBuf {
    root.join(kind).join(name)
}

/// The text of record `name` of `kind` in the directory `root`; `None` when there is none (or
/// it cannot be read as UTF-8).
pub fn read(root: &Path, kind: &str, name: &str) -> Option<String> {
    std::fs::read_to_string(path(root, kind, name)).ok()
}

/// Writes record `name` of `kind` in the directory `root` atomically (a new file renamed into
/// place, so a reader sees the old text or the new, whole); whether it was written.
pub fn write(root: &Path, kind: &str, name: &str, text: &str) -> bool {
    let path = path(root, kind, name);
    let Some(parent) = path.parent() else {
        return false;
    };
    if std::fs::create_dir_all(parent).is_err() {
        return false;
    }
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, &path).is_ok() {
        return true;
    }
    let _ = std::fs::remove_file(&tmp);
    false
}

/// Bytes the records of `kind` take in the directory `root` (a disk budget for the directory
/// counts them).
pub fn bytes(root: &Path, kind: &str) -> u64 {
    std::fs::read_dir(root.join(kind))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_record_reads_back_as_written_and_counts_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(super::read(dir.path(), "notes", "a.txt"), None);
        assert_eq!(super::bytes(dir.path(), "notes"), 0);
        assert!(super::write(dir.path(), "notes", "a.txt", "one\n"));
        assert!(super::write(dir.path(), "notes", "a.txt", "two!\n"));
        assert_eq!(
            super::read(dir.path(), "notes", "a.txt").as_deref(),
            Some("two!\n")
        );
        assert_eq!(super::bytes(dir.path(), "notes"), 5);
        let left: Vec<_> = std::fs::read_dir(dir.path().join("notes"))
            .unwrap()
            .collect();
        assert_eq!(left.len(), 1, "no temporary file is left");
    }
}
