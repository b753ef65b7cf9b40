//! Bare `ckptfmt` store directories (the layout sessions were saved in
//! before they went through `kvstore`): recognising one and migrating its
//! checkpoints into a [`KvStore`].

use std::path::Path;

use ckptfmt::store::DESCRIPTOR_FILE;
use ckptfmt::Store;

use crate::error::{Result, StoreError};
use crate::io::BlockIo;
use crate::store::{KvStore, MODELS_DIR};

/// What a directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A `kvstore` directory (`models/`).
    KvStore,
    /// A bare `ckptfmt` store (`store.ckpt`, `blocks/`, `manifests/`).
    LegacyCkptfmt,
    /// Neither (absent, empty or something else).
    Unknown,
}

/// Recognises the layout of `dir`.
pub fn detect<V: BlockIo>(io: &V, dir: &Path) -> Layout {
    if io.exists(&dir.join(MODELS_DIR)).unwrap_or(false) {
        Layout::KvStore
    } else if io.exists(&dir.join(DESCRIPTOR_FILE)).unwrap_or(false) {
        Layout::LegacyCkptfmt
    } else {
        Layout::Unknown
    }
}

/// [`detect`] on the local filesystem.
pub fn detect_local(dir: &Path) -> Layout {
    detect(&ckptfmt::StdFs, dir)
}

/// Whether `dir` (on the local filesystem) holds a bare `ckptfmt` store's descriptor, whether
/// or not a `kvstore` layout was added beside it: a directory [`migrate`] can read.
pub fn holds_legacy(dir: &Path) -> bool {
    dir.join(DESCRIPTOR_FILE).is_file()
}

/// What [`migrate`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrationReport {
    /// Checkpoints copied (or already present with the same content).
    pub migrated: Vec<String>,
    /// Checkpoints left behind, with the reason (a damaged manifest or block).
    pub skipped: Vec<(String, String)>,
    /// Blocks written into the destination.
    pub blocks_written: usize,
}

/// Copies every checkpoint of the bare `ckptfmt` store at `legacy` into
/// `dest`, verifying each block on the way. The legacy directory is only
/// read (it may be read-only); delete it once satisfied.
pub fn migrate<V: BlockIo>(legacy: &Path, dest: &KvStore<V>) -> Result<MigrationReport> {
    let src = Store::open_read_only(legacy).map_err(|e| StoreError::format(legacy, e))?;
    let model = dest.model(*src.fingerprint(), src.geometry().clone())?;
    let mut report = MigrationReport::default();
    let mut names = src
        .list_manifests()
        .map_err(|e| StoreError::format(legacy, e))?;
    names.sort();
    for name in names {
        let m = match src.read_manifest(&name) {
            Ok(m) => m,
            Err(e) => {
                report.skipped.push((name, e.to_string()));
                continue;
            }
        };
        let mut ok = true;
        for (i, id) in m.block_ids.iter().enumerate() {
            if model.contains(id) {
                continue;
            }
            let block = match src.read_block(id) {
                Ok(b) => b,
                Err(e) => {
                    report
                        .skipped
                        .push((name.clone(), format!("block {i} ({id}): {e}")));
                    ok = false;
                    break;
                }
            };
            let v = block.view().map_err(|e| StoreError::format(legacy, e))?;
            let kv = v.kv().map_err(|e| StoreError::format(legacy, e))?;
            model.put(m.prev_id(i), &v.tokens(), kv.to_vec())?;
            report.blocks_written += 1;
        }
        if ok {
            model.save(&m)?;
            report.migrated.push(name);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::{detect_local, holds_legacy, Layout, DESCRIPTOR_FILE, MODELS_DIR};

    #[test]
    fn a_bare_store_is_recognised_with_or_without_a_kvstore_layout_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(detect_local(dir.path()), Layout::Unknown);
        assert!(!holds_legacy(dir.path()));
        std::fs::write(dir.path().join(DESCRIPTOR_FILE), b"descriptor").unwrap();
        assert_eq!(detect_local(dir.path()), Layout::LegacyCkptfmt);
        assert!(holds_legacy(dir.path()));
        std::fs::create_dir(dir.path().join(MODELS_DIR)).unwrap();
        assert_eq!(detect_local(dir.path()), Layout::KvStore);
        assert!(
            holds_legacy(dir.path()),
            "the old files stay beside the new layout"
        );
    }
}
