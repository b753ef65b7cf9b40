//! Making blocks durable (writes within the disk quota, flush) and
//! committing, deleting and checking checkpoints.

use std::collections::{HashMap, HashSet};
use std::sync::MutexGuard;

use ckptfmt::store::MANIFESTS_DIR;
use ckptfmt::{BadBlock, BlockId, BlockInput, CheckpointHealth, FormatError, Manifest};

use crate::error::{Result, StoreError};
use crate::handle::CheckpointInfo;
use crate::io::BlockIo;
use crate::state::{State, WriteItem, WriteKind};
use crate::store::{lock_mutex, ModelInfo, Shared};

/// Whether a write still has to reserve its bytes of the disk quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Quota {
    /// Reserve (collecting garbage when needed) before writing.
    Reserve,
    /// The caller reserved already (it may hold a store lock that a
    /// collection would wait for).
    Reserved,
}

impl<V: BlockIo> Shared<V> {
    /// Writes `items` with the state lock released (counted in
    /// `writes_in_progress`), then retakes it and records the outcome;
    /// returns the guard and the write's result.
    pub(crate) fn write_unlocked<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        items: &[WriteItem],
        kind: WriteKind,
    ) -> (MutexGuard<'a, State>, Result<()>) {
        self.write_unlocked_with(st, items, kind, Quota::Reserve)
    }

    fn write_unlocked_with<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        items: &[WriteItem],
        kind: WriteKind,
        quota: Quota,
    ) -> (MutexGuard<'a, State>, Result<()>) {
        st.writes_in_progress += 1;
        drop(st);
        let r = match quota {
            Quota::Reserve => self.write_batch(items, kind),
            Quota::Reserved => {
                let r = self.write_reserved(items);
                self.record_outcome(&mut lock_mutex(&self.state), items, &r, kind);
                r
            }
        };
        let mut st = lock_mutex(&self.state);
        st.writes_in_progress -= 1;
        (st, r)
    }

    /// Records a write's outcome in the bookkeeping.
    pub(crate) fn record_outcome(
        &self,
        st: &mut State,
        items: &[WriteItem],
        r: &Result<()>,
        kind: WriteKind,
    ) {
        match r {
            Ok(()) => st.record_written(&self.item_lens(items), kind),
            Err(_) => st.release_unwritten(&items.iter().map(|i| i.id).collect::<Vec<_>>()),
        }
    }

    pub(crate) fn item_lens(&self, items: &[WriteItem]) -> Vec<(BlockId, u64)> {
        let models = self.models_read();
        items
            .iter()
            .map(|i| (i.id, models[i.model].record_len))
            .collect()
    }

    /// Writes blocks durably (no lock held), within the disk quota and budget, and records
    /// the outcome (the claims of those not written are released). Under a disk budget the
    /// items go in pieces of at most a quarter of it (one at least), each recorded once
    /// written, so that the next piece's room may come from collecting it: a batch larger than
    /// the budget still keeps it.
    pub(crate) fn write_batch(&self, items: &[WriteItem], kind: WriteKind) -> Result<()> {
        let lens = self.item_lens(items);
        let piece_bytes = self.cfg.disk_budget.map_or(u64::MAX, |b| (b / 4).max(1));
        let mut start = 0;
        while start < items.len() {
            let mut end = start;
            let mut need = 0;
            while end < items.len() && (end == start || need + lens[end].1 <= piece_bytes) {
                need += lens[end].1;
                end += 1;
            }
            let piece = &items[start..end];
            let reserved = self.reserve_disk(need);
            let r = match &reserved {
                Ok(()) => self.write_reserved(piece),
                Err(_) => Ok(()),
            };
            let mut st = lock_mutex(&self.state);
            // The files are counted as the reservation ends: no one sees the bytes in neither.
            if reserved.is_ok() {
                st.disk_reserved -= need;
            }
            let r = reserved.and(r);
            self.record_outcome(&mut st, piece, &r, kind);
            if r.is_err() {
                let rest: Vec<BlockId> = items[end..].iter().map(|i| i.id).collect();
                st.release_unwritten(&rest);
                return r;
            }
            start = end;
        }
        Ok(())
    }

    fn write_reserved(&self, items: &[WriteItem]) -> Result<()> {
        let mut by_model: HashMap<usize, Vec<&WriteItem>> = HashMap::new();
        for i in items {
            by_model.entry(i.model).or_default().push(i);
        }
        for (model, group) in by_model {
            let info = self.model_info(model);
            let inputs: Vec<BlockInput<'_>> = group
                .iter()
                .map(|i| BlockInput {
                    prev: i.prev.as_ref(),
                    tokens: &i.tokens,
                    kv: &i.data,
                })
                .collect();
            let report = info
                .store
                .put_blocks(&inputs, self.cfg.encoding)
                .map_err(|e| StoreError::format(&info.blocks_dir, e))?;
            if report.blocks_reused > 0 {
                // A file left by an earlier, failed batch (or another
                // process's write in flight) may not have had its directory
                // entry synced: sync it before calling it durable.
                self.io
                    .sync_dir(&info.blocks_dir)
                    .map_err(|e| StoreError::io("fsync", &info.blocks_dir, e))?;
            }
        }
        Ok(())
    }

    /// Reserves `need` bytes of the disk quota and the disk budget ([`crate::Config`]),
    /// collecting garbage if needed. Every write of block files reserves here first, whatever
    /// the blocks' source; only the quota refuses: a budget that collecting cannot meet (every
    /// block referenced, pinned or being written) lets the write go on. No caller holds the
    /// store lock (a collection takes it exclusive).
    pub(crate) fn reserve_disk(&self, need: u64) -> Result<()> {
        let quota = self.cfg.disk_quota;
        for attempt in 0..2 {
            // The manifests count in the budget; their indexes are looked at before the state
            // is locked (a collection takes them in that order).
            let budget = self
                .cfg
                .disk_budget
                .map(|b| b.saturating_sub(self.manifest_bytes()));
            let (reserved, over_quota) = {
                let mut st = lock_mutex(&self.state);
                let used = st.disk_bytes + st.disk_reserved;
                let over_budget = budget.is_some_and(|b| used + need > b);
                if used + need <= quota && (!over_budget || attempt == 1) {
                    st.disk_reserved += need;
                    return Ok(());
                }
                if attempt == 1 {
                    return Err(StoreError::QuotaExceeded {
                        needed: need,
                        used,
                        quota,
                    });
                }
                (st.disk_reserved, used + need > quota)
            };
            let for_budget = budget.map_or(u64::MAX, |b| b.saturating_sub(need + reserved));
            let target = quota.saturating_sub(need).min(for_budget);
            // Over the budget, the registered order may drop checkpoints too (over the quota
            // alone, only garbage goes).
            let drops = budget
                .is_some()
                .then(|| {
                    self.budget_drops
                        .read()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone()
                })
                .flatten();
            let collected = match &drops {
                Some((idx, order)) => self.gc_dropping(target, Some((*idx, &**order))),
                None => self.gc_to(target),
            };
            if over_quota {
                collected?;
            }
        }
        unreachable!("the loop returns on its second pass")
    }

    /// Bytes of every model's manifests, as their indexes see them once they have followed
    /// the changes since (cheap: the names any process changed; without them, as last read).
    fn manifest_bytes(&self) -> u64 {
        self.models_read()
            .iter()
            .map(|m| {
                let mut index = lock_mutex(&m.index);
                // A failure to follow leaves the index as it was: its figure stands.
                let _ = index.follow(&m.store, m.record_len);
                index.manifest_bytes_noted()
            })
            .sum()
    }

    pub(crate) fn flush(&self) -> Result<()> {
        self.writable("flush")?;
        for _round in 0..3 {
            let mut st = lock_mutex(&self.state);
            while !st.spill_queue.is_empty() || st.writes_in_progress > 0 {
                st = self.wait(st);
            }
            let dirty: Vec<BlockId> = st
                .entries
                .iter()
                .filter(|(_, e)| e.ram.is_some() && !e.on_disk && !e.in_flight)
                .map(|(id, _)| *id)
                .collect();
            if dirty.is_empty() {
                drop(st);
                return self.sync_found();
            }
            let items: Vec<WriteItem> = dirty.iter().filter_map(|id| st.claim_dirty(id)).collect();
            st.writes_in_progress += 1;
            drop(st);
            let mut result = Ok(());
            let mut start = 0;
            while start < items.len() {
                let mut end = start;
                let mut bytes = 0u64;
                while end < items.len() && (end == start || bytes < self.cfg.spill_batch_bytes) {
                    bytes += items[end].data.len() as u64;
                    end += 1;
                }
                let chunk = &items[start..end];
                let r = self.write_batch(chunk, WriteKind::Persist);
                let mut st = lock_mutex(&self.state);
                if r.is_err() {
                    st.m.spill_errors += 1;
                    // Release the claims of the chunks not written.
                    let rest: Vec<BlockId> = items[end..].iter().map(|i| i.id).collect();
                    st.release_unwritten(&rest);
                    result = r;
                    break;
                }
                start = end;
            }
            lock_mutex(&self.state).writes_in_progress -= 1;
            self.cond.notify_all();
            result?;
        }
        self.sync_found()
    }

    /// Makes the blocks found on disk rather than written here durable, as a flush promises:
    /// a file whose directory entry was never synced (a batch whose directory sync failed
    /// after its renames, or a writer that died before it) is synced now, once per model.
    /// Only the entries seen before the sync lose their mark.
    fn sync_found(&self) -> Result<()> {
        let mut found: HashMap<usize, Vec<BlockId>> = HashMap::new();
        for (id, e) in lock_mutex(&self.state)
            .entries
            .iter()
            .filter(|(_, e)| e.found)
        {
            found.entry(e.model).or_default().push(*id);
        }
        for (model, ids) in found {
            let info = self.model_info(model);
            self.io
                .sync_dir(&info.blocks_dir)
                .map_err(|e| StoreError::io("fsync", &info.blocks_dir, e))?;
            let mut st = lock_mutex(&self.state);
            for id in &ids {
                if let Some(e) = st.entries.get_mut(id) {
                    e.found = false;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn save(
        &self,
        model: usize,
        info: &ModelInfo<V>,
        manifest: &Manifest,
    ) -> Result<()> {
        self.writable("save")?;
        let name = &manifest.meta.name;
        let path = info
            .store
            .manifest_path(name)
            .map_err(|e| StoreError::format(&self.root, e))?;
        manifest
            .check_owner(&info.fp, &info.geometry)
            .map_err(|e| StoreError::format(&path, e))?;
        manifest
            .validate()
            .map_err(|e| StoreError::format(&path, e))?;
        let _serial = lock_mutex(&self.save_lock);
        let mut seen = HashSet::new();
        let ids: Vec<BlockId> = manifest
            .block_ids
            .iter()
            .filter(|id| seen.insert(**id))
            .copied()
            .collect();
        // Under a budget the new manifest's file counts too (beside the one it replaces, until
        // the rename).
        let manifest_file = match self.cfg.disk_budget {
            Some(_) => manifest
                .encode()
                .map_err(|e| StoreError::format(&path, e))?
                .len() as u64,
            None => 0,
        };
        // Reserve quota before taking the shared lock: a collection to make
        // room takes the lock exclusive.
        let need = {
            let st = lock_mutex(&self.state);
            let dirty = ids
                .iter()
                .filter(|id| !st.entries.get(*id).is_some_and(|e| e.on_disk))
                .count() as u64;
            dirty * info.record_len + manifest_file
        };
        self.reserve_disk(need)?;
        let r = self.save_reserved(model, info, manifest, &ids, &path);
        lock_mutex(&self.state).disk_reserved -= need;
        r
    }

    /// Looks again for the files of `ids` this process knows as written (another process may
    /// have collected them) and for those it does not know (another may have written them).
    fn check_present(&self, model: usize, info: &ModelInfo<V>, ids: &[BlockId]) -> Result<()> {
        for id in ids {
            let known_on_disk = lock_mutex(&self.state)
                .entries
                .get(id)
                .map(|e| e.on_disk && !e.in_flight);
            match known_on_disk {
                Some(true) => {
                    let present = info
                        .store
                        .has_block(id)
                        .map_err(|e| StoreError::format(&info.blocks_dir, e))?;
                    if !present {
                        // Collected or quarantined by another process.
                        lock_mutex(&self.state).lost_file(id, info.record_len);
                    }
                }
                Some(false) => {}
                None => {
                    self.contains(model, info, id);
                }
            }
        }
        Ok(())
    }

    fn save_reserved(
        &self,
        model: usize,
        info: &ModelInfo<V>,
        manifest: &Manifest,
        ids: &[BlockId],
        path: &std::path::Path,
    ) -> Result<()> {
        let name = &manifest.meta.name;
        let (mut st, _shared) = loop {
            // Blocks being written are waited for without the store lock: a write makes room
            // first, and a collection takes the store lock exclusive.
            let mut st = lock_mutex(&self.state);
            while ids
                .iter()
                .any(|id| st.entries.get(id).is_some_and(|e| e.in_flight))
            {
                st = self.wait(st);
            }
            drop(st);
            // No collection (in any process) between these checks and the commit.
            let shared = info
                .store
                .lock_shared()
                .map_err(|e| StoreError::format(info.store.root(), e))?;
            self.check_present(model, info, ids)?;
            let st = lock_mutex(&self.state);
            if let Some(id) = ids.iter().find(|id| !st.entries.contains_key(*id)) {
                return Err(StoreError::MissingBlock {
                    checkpoint: name.clone(),
                    id: id.to_hex(),
                });
            }
            // Claimed for writing meanwhile: wait again, without the lock.
            if !ids
                .iter()
                .any(|id| st.entries.get(id).is_some_and(|e| e.in_flight))
            {
                break (st, shared);
            }
        };
        let items: Vec<WriteItem> = ids.iter().filter_map(|id| st.claim_dirty(id)).collect();
        let r;
        (st, r) = self.write_unlocked_with(st, &items, WriteKind::Persist, Quota::Reserved);
        self.cond.notify_all();
        if let Err(e) = r {
            st.m.spill_errors += 1;
            return Err(e);
        }
        let found: Vec<BlockId> = ids
            .iter()
            .filter(|id| st.entries.get(*id).is_some_and(|e| e.found))
            .copied()
            .collect();
        drop(st);
        if !found.is_empty() {
            // Files found on disk may have entries a dead writer never
            // synced: make them durable before the manifest names them.
            self.io
                .sync_dir(&info.blocks_dir)
                .map_err(|e| StoreError::io("fsync", &info.blocks_dir, e))?;
            let mut st = lock_mutex(&self.state);
            for id in &found {
                if let Some(e) = st.entries.get_mut(id) {
                    e.found = false;
                }
            }
        }
        let n = info
            .store
            .write_manifest(manifest)
            .map_err(|e| StoreError::format(path, e))?;
        let mut st = lock_mutex(&self.state);
        st.m.bytes_written += n;
        st.m.saves += 1;
        Ok(())
    }

    pub(crate) fn delete(&self, info: &ModelInfo<V>, name: &str) -> Result<()> {
        self.writable("delete")?;
        let _serial = lock_mutex(&self.save_lock);
        let path = info
            .store
            .manifest_path(name)
            .map_err(|e| StoreError::format(&self.root, e))?;
        let exists = self
            .io
            .exists(&path)
            .map_err(|e| StoreError::io("stat", &path, e))?;
        if !exists {
            return Err(StoreError::CheckpointNotFound {
                name: name.to_string(),
            });
        }
        match info.store.delete_manifest(name) {
            Ok(()) => Ok(()),
            Err(FormatError::Io {
                op: "remove",
                source,
                ..
            }) if source.kind() == std::io::ErrorKind::NotFound => {
                // Deleted meanwhile (another process): make that durable.
                let dir = info.store.root().join(MANIFESTS_DIR);
                self.io
                    .sync_dir(&dir)
                    .map_err(|e| StoreError::io("fsync", &dir, e))
            }
            Err(e) => Err(StoreError::format(&path, e)),
        }
    }

    pub(crate) fn checkpoint_health(
        &self,
        info: &ModelInfo<V>,
        name: &str,
    ) -> Result<CheckpointHealth> {
        let manifest = info.store.read_manifest(name).map_err(|e| match e {
            FormatError::NotFound { .. } => StoreError::CheckpointNotFound {
                name: name.to_string(),
            },
            e => StoreError::format(info.store.root(), e),
        })?;
        let mut good_blocks = manifest.block_ids.len();
        let mut first_bad = None;
        for (index, id) in manifest.block_ids.iter().enumerate() {
            let resident = lock_mutex(&self.state)
                .entries
                .get(id)
                .is_some_and(|e| e.ram.is_some());
            if resident {
                continue;
            }
            let error = match info.store.read_block(id) {
                Ok(_) => continue,
                Err(e) if e.is_corruption() => {
                    if self.writable("quarantine").is_ok() {
                        info.store
                            .quarantine_block(id)
                            .map_err(|e| StoreError::format(info.store.root(), e))?;
                        lock_mutex(&self.state).lost_file(id, info.record_len);
                    }
                    e
                }
                Err(e @ FormatError::NotFound { .. }) => e,
                Err(e) => return Err(StoreError::format(info.store.block_path(id), e)),
            };
            good_blocks = index;
            first_bad = Some(BadBlock {
                index,
                id: *id,
                path: info.store.block_path(id),
                error,
            });
            break;
        }
        Ok(CheckpointHealth {
            manifest,
            good_blocks,
            first_bad,
        })
    }

    pub(crate) fn checkpoint_infos(&self, info: &ModelInfo<V>) -> Result<Vec<CheckpointInfo>> {
        let store = &info.store;
        let mut names = store
            .list_manifests()
            .map_err(|e| StoreError::format(store.root(), e))?;
        names.sort();
        let manifests: Vec<(String, Option<Manifest>, u64)> = names
            .into_iter()
            .map(|n| {
                let len = store
                    .manifest_path(&n)
                    .ok()
                    .and_then(|p| self.io.read(&p).ok())
                    .map_or(0, |b| b.len() as u64);
                let m = store.read_manifest(&n).ok();
                (n, m, len)
            })
            .collect();
        let mut holders: HashMap<BlockId, usize> = HashMap::new();
        for (_, m, _) in &manifests {
            if let Some(m) = m {
                let unique: HashSet<&BlockId> = m.block_ids.iter().collect();
                for id in unique {
                    *holders.entry(*id).or_insert(0) += 1;
                }
            }
        }
        Ok(manifests
            .into_iter()
            .map(|(name, m, len)| {
                let (n_tokens, own_blocks, last_used_unix) = match &m {
                    Some(m) => {
                        let unique: HashSet<&BlockId> = m.block_ids.iter().collect();
                        let own = unique.iter().filter(|id| holders[**id] == 1).count() as u64;
                        (m.tokens.len(), own, m.meta.created_unix)
                    }
                    None => (0, 0, 0),
                };
                CheckpointInfo {
                    name,
                    n_tokens,
                    own_bytes: own_blocks * info.record_len + len,
                    last_used_unix,
                }
            })
            .collect())
    }
}
