//! Opening the model stores of a directory and rebuilding the index from
//! the files. Recovery deletes nothing: damaged checkpoints are reported and
//! kept; with [`VerifyLevel::Full`] damaged block files are quarantined.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use ckptfmt::store::DESCRIPTOR_FILE;
use ckptfmt::{encode_block, BlockId, Fingerprint, FormatError, Geometry, Store};

use crate::config::{DamagedCheckpoint, RecoveryReport, VerifyLevel};
use crate::error::{Result, StoreError};
use crate::io::BlockIo;
use crate::state::Entry;
use crate::store::{lock_mutex, Access, ModelInfo, Shared, MODELS_DIR};

impl<V: BlockIo> Shared<V> {
    fn model_info_of(&self, dir: &Path, store: Store<V>) -> Result<ModelInfo<V>> {
        let fp = *store.fingerprint();
        let geometry = store.geometry().clone();
        let tpb = geometry.tokens_per_block() as usize;
        let block_bytes = geometry.block_bytes();
        let record_len = encode_block(
            &fp,
            &geometry,
            None,
            &vec![0u32; tpb],
            &vec![0u8; block_bytes as usize],
            self.cfg.encoding,
        )
        .map_err(|e| StoreError::format(dir, e))?
        .len();
        Ok(ModelInfo {
            fp,
            geometry,
            blocks_dir: store.root().join(ckptfmt::store::BLOCKS_DIR),
            store,
            record_len,
            block_bytes,
            index: Default::default(),
            states_seen: std::sync::atomic::AtomicU64::new(u64::MAX),
        })
    }

    /// The index of model `fp`, opening (and on a writable store creating)
    /// its `ckptfmt` store.
    pub(crate) fn register_model(&self, fp: Fingerprint, geometry: Geometry) -> Result<usize> {
        let mut models = self.models_write();
        if let Some((idx, m)) = models.iter().enumerate().find(|(_, m)| m.fp == fp) {
            if let Some(detail) = m.geometry.diff(&geometry) {
                return Err(StoreError::GeometryMismatch {
                    fingerprint: fp.to_hex(),
                    detail,
                });
            }
            return Ok(idx);
        }
        self.writable("register a model")?;
        let dir = self.root.join(MODELS_DIR).join(fp.to_hex());
        // `ckptfmt` creates the directory durably (its parent synced).
        let store = Store::open_with(self.io.clone(), &dir, fp, geometry)
            .map_err(|e| StoreError::format(&dir, e))?;
        let info = self.model_info_of(&dir, store)?;
        models.push(Arc::new(info));
        Ok(models.len() - 1)
    }

    /// Opens every model directory and rebuilds the index from the files.
    pub(crate) fn recover(&self) -> Result<RecoveryReport> {
        let mut report = RecoveryReport::default();
        let models_dir = self.root.join(MODELS_DIR);
        let names = self
            .io
            .list(&models_dir)
            .map_err(|e| StoreError::io("list", &models_dir, e))?;
        for name in names {
            let Ok(fp) = Fingerprint::from_hex(&name) else {
                continue;
            };
            let dir = models_dir.join(&name);
            let desc = dir.join(DESCRIPTOR_FILE);
            // A model whose descriptor never committed holds nothing yet.
            if !self
                .io
                .exists(&desc)
                .map_err(|e| StoreError::io("stat", &desc, e))?
            {
                continue;
            }
            let store = match self.access {
                Access::ReadWrite => Store::open_existing_with(self.io.clone(), &dir),
                Access::ReadOnly => Store::open_read_only_with(self.io.clone(), &dir),
            }
            .map_err(|e| StoreError::format(&dir, e))?;
            if *store.fingerprint() != fp {
                return Err(StoreError::Invalid {
                    what: "model directory",
                    detail: format!("{dir:?} holds model {}", store.fingerprint()),
                });
            }
            let info = self.model_info_of(&dir, store)?;
            let idx = {
                let mut models = self.models_write();
                models.push(Arc::new(info));
                models.len() - 1
            };
            self.recover_model(idx, &mut report)?;
            report.models += 1;
        }
        Ok(report)
    }

    fn recover_model(&self, idx: usize, report: &mut RecoveryReport) -> Result<()> {
        let info = self.model_info(idx);
        let store = &info.store;
        let mut blocks: HashSet<BlockId> = store
            .list_blocks()
            .map_err(|e| StoreError::format(&info.blocks_dir, e))?
            .into_iter()
            .collect();
        if self.cfg.verify == VerifyLevel::Full {
            let mut bad = Vec::new();
            for id in &blocks {
                match store.read_block(id) {
                    Ok(_) => {}
                    Err(e) if e.is_corruption() => bad.push(*id),
                    // Collected by another process meanwhile.
                    Err(FormatError::NotFound { .. }) => bad.push(*id),
                    Err(e) => return Err(StoreError::format(store.block_path(id), e)),
                }
            }
            for id in bad {
                blocks.remove(&id);
                if self.access == Access::ReadWrite
                    && store
                        .quarantine_block(&id)
                        .map_err(|e| StoreError::format(store.root(), e))?
                        .is_some()
                {
                    report.quarantined_blocks += 1;
                }
            }
        }
        let names = store
            .list_manifests()
            .map_err(|e| StoreError::format(store.root(), e))?;
        for name in names {
            let damaged = |good_blocks: usize, reason: String| DamagedCheckpoint {
                fingerprint: info.fp.to_hex(),
                name: name.clone(),
                good_blocks,
                reason,
            };
            match store.read_manifest(&name) {
                Ok(m) => match m.block_ids.iter().position(|id| !blocks.contains(id)) {
                    None => report.checkpoints += 1,
                    Some(i) => report.damaged_checkpoints.push(damaged(
                        i,
                        format!("block {} is missing or damaged", m.block_ids[i]),
                    )),
                },
                Err(FormatError::NotFound { .. }) => {}
                Err(e) if e.is_corruption() => {
                    report.damaged_checkpoints.push(damaged(0, e.to_string()))
                }
                Err(e) => return Err(StoreError::format(store.root(), e)),
            }
        }
        let mut st = lock_mutex(&self.state);
        for id in &blocks {
            st.entries
                .insert(*id, Entry::on_disk(idx, info.block_bytes));
            st.disk_bytes += info.record_len;
        }
        report.blocks += blocks.len();
        Ok(())
    }
}
