//! Garbage collection: deleting block files no checkpoint of any process
//! references and this process has not pinned, least recently used first. The
//! live blocks come from an index of the manifests that reads only those new or
//! changed since the last collection; a damaged manifest is set aside, not a
//! reason to stop.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use ckptfmt::{BlockId, FileLock, FormatError};

use crate::config::GcReport;
use crate::error::{Result, StoreError};
use crate::io::BlockIo;
use crate::store::{lock_mutex, ModelInfo, Shared};

/// The model whose manifests a collection may delete to make room: its block files, the
/// manifests referencing each block, and each manifest's blocks.
struct Droppable<V: BlockIo> {
    idx: usize,
    info: Arc<ModelInfo<V>>,
    files: HashSet<BlockId>,
    refs: HashMap<BlockId, u32>,
    lists: HashMap<String, Vec<BlockId>>,
}

/// A block file chosen for deletion.
struct Victim {
    id: BlockId,
    model: usize,
    record_len: u64,
    /// Whether this process's index knows it (and marked it in flight).
    claimed: bool,
}

impl<V: BlockIo> Shared<V> {
    /// The blocks every checkpoint of a model references, from this process's index of its
    /// manifests brought up to date (only new or changed manifests are read; a damaged one is
    /// set aside and reported in `report`). The caller holds the exclusive store lock.
    fn live_blocks(
        &self,
        info: &ModelInfo<V>,
        exclusive: &FileLock,
        report: &mut GcReport,
    ) -> Result<crate::manifest_index::Refreshed> {
        let store = &info.store;
        // A manifest removal (a delete whose directory sync failed, or one in
        // flight in another process) must be durable before its blocks go:
        // otherwise a crash brings back a checkpoint without its blocks.
        let manifests_dir = store.root().join(ckptfmt::store::MANIFESTS_DIR);
        self.io
            .sync_dir(&manifests_dir)
            .map_err(|e| StoreError::io("fsync", &manifests_dir, e))?;
        let mut found = lock_mutex(&info.manifests)
            .refresh(store, exclusive)
            .map_err(|e| StoreError::format(store.root(), e))?;
        report.manifests_read += found.read;
        report
            .set_aside
            .extend(std::mem::take(&mut found.set_aside));
        Ok(found)
    }

    pub(crate) fn gc_to(&self, target: u64) -> Result<GcReport> {
        self.gc_dropping(target, 0, None)
    }

    /// Like [`Shared::gc_to`] with a target of `budget` less `owed` (the bytes of manifests
    /// the caller's budget counts too); and when the unreferenced blocks are not enough,
    /// deletes the manifests `dropping.1` of model `dropping.0` in their order (each owing its
    /// bytes no more), whose blocks then lose a reference, until the target is met: one
    /// listing of the directory and one look at the manifests however many go. Returns, in the
    /// report, the manifests deleted.
    pub(crate) fn gc_dropping(
        &self,
        budget: u64,
        owed: u64,
        dropping: Option<(usize, &[(String, u64)])>,
    ) -> Result<GcReport> {
        self.writable("gc")?;
        let mut models: Vec<(usize, Arc<ModelInfo<V>>)> =
            self.models_read().iter().cloned().enumerate().collect();
        // One lock order for every process: by fingerprint.
        models.sort_by_key(|(_, m)| m.fp.to_hex());
        let mut report = GcReport::default();
        let mut locks = Vec::with_capacity(models.len());
        for (_, m) in &models {
            locks.push(
                m.store
                    .lock_exclusive()
                    .map_err(|e| StoreError::format(m.store.root(), e))?,
            );
        }
        let mut used = 0u64;
        let mut cands: Vec<(u64, Victim)> = Vec::new();
        // For the model whose manifests may be dropped: its files, the references to each
        // block and each manifest's blocks.
        let mut droppable: Option<Droppable<V>> = None;
        {
            let mut per_model = Vec::new();
            for ((idx, m), lock) in models.iter().zip(&locks) {
                let files = m
                    .store
                    .list_blocks()
                    .map_err(|e| StoreError::format(&m.blocks_dir, e))?;
                used += files.len() as u64 * m.record_len;
                let found = self.live_blocks(m, lock, &mut report)?;
                if dropping.is_some_and(|(d, _)| d == *idx) {
                    droppable = Some(Droppable {
                        idx: *idx,
                        info: Arc::clone(m),
                        files: files.iter().copied().collect(),
                        refs: found.live.clone(),
                        lists: found.lists,
                    });
                }
                per_model.push((*idx, m, files, found.live));
            }
            let st = lock_mutex(&self.state);
            for (idx, m, files, live) in per_model {
                for id in files {
                    if live.contains_key(&id) {
                        continue;
                    }
                    let last = match st.entries.get(&id) {
                        Some(e) if e.in_flight || e.pins > 0 => continue,
                        Some(e) => e.last_access,
                        None => 0,
                    };
                    cands.push((
                        last,
                        Victim {
                            id,
                            model: idx,
                            record_len: m.record_len,
                            claimed: false,
                        },
                    ));
                }
            }
        }
        // A prefix is worth nothing without its first blocks: a block goes no earlier than
        // the blocks that continue it (leaves first), so each candidate counts as recent as its
        // most recent continuation, and among equals the later block goes first.
        {
            let st = lock_mutex(&self.state);
            let own: HashMap<BlockId, u64> = cands.iter().map(|(l, v)| (v.id, *l)).collect();
            let mut effective = own.clone();
            for (&id, &last) in &own {
                let mut cur = id;
                while let Some(prev) = st
                    .entries
                    .get(&cur)
                    .and_then(|e| e.chain.as_ref())
                    .and_then(|(p, _)| *p)
                {
                    match effective.get_mut(&prev) {
                        Some(e) if *e < last => *e = last,
                        _ => break,
                    }
                    cur = prev;
                }
            }
            for (l, v) in &mut cands {
                *l = effective.get(&v.id).copied().unwrap_or(*l);
            }
            cands.sort_unstable_by_key(|(l, v)| {
                (
                    *l,
                    std::cmp::Reverse(own.get(&v.id).copied()),
                    v.id.to_hex(),
                )
            });
        }
        // Signed: the manifests alone may exceed the budget.
        let mut target = i128::from(budget) - i128::from(owed);
        let mut used = i128::from(used);
        let mut dropped: Vec<String> = Vec::new();
        let victims: Vec<Victim> = {
            let mut st = lock_mutex(&self.state);
            let mut out = Vec::new();
            let mut queue: std::collections::VecDeque<Victim> =
                cands.into_iter().map(|(_, v)| v).collect();
            let mut drops = dropping.map_or(&[][..], |d| d.1).iter();
            loop {
                while used > target {
                    let Some(mut v) = queue.pop_front() else {
                        break;
                    };
                    if let Some(e) = st.entries.get_mut(&v.id) {
                        if e.in_flight || e.pins > 0 {
                            continue;
                        }
                        e.in_flight = true;
                        v.claimed = true;
                    }
                    used -= i128::from(v.record_len);
                    out.push(v);
                }
                if used <= target {
                    break;
                }
                let (Some((name, bytes)), Some(d)) = (drops.next(), droppable.as_mut()) else {
                    break;
                };
                target += i128::from(*bytes);
                dropped.push(name.clone());
                // Its blocks lose a reference; those left with none go, the last first.
                for id in d.lists.get(name).into_iter().flatten().rev() {
                    let Some(n) = d.refs.get_mut(id) else {
                        continue;
                    };
                    *n = n.saturating_sub(1);
                    if *n == 0 && d.files.contains(id) {
                        queue.push_back(Victim {
                            id: *id,
                            model: d.idx,
                            record_len: d.info.record_len,
                            claimed: false,
                        });
                    }
                }
            }
            out
        };
        // The dropped manifests go first, durably: a block goes only once nothing refers to it.
        if let Some(Droppable { info: m, .. }) = &droppable {
            for name in &dropped {
                match m.store.delete_manifest(name) {
                    Ok(()) => report.manifests_dropped.push(name.clone()),
                    Err(FormatError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        report.manifests_dropped.push(name.clone());
                    }
                    Err(e) => {
                        // Their blocks may still be needed: none goes this time.
                        let mut st = lock_mutex(&self.state);
                        for v in victims.iter().filter(|v| v.claimed) {
                            if let Some(e) = st.entries.get_mut(&v.id) {
                                e.in_flight = false;
                            }
                        }
                        drop(st);
                        self.cond.notify_all();
                        return Err(StoreError::format(m.store.root(), e));
                    }
                }
            }
        }
        if victims.is_empty() {
            return Ok(report);
        }
        let mut removed = HashSet::new();
        let mut first_err = None;
        let mut dirs: HashSet<usize> = HashSet::new();
        for v in &victims {
            let info = self.model_info(v.model);
            let p = info.store.block_path(&v.id);
            match self.io.remove(&p) {
                Ok(()) => {
                    removed.insert(v.id);
                    dirs.insert(v.model);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    first_err.get_or_insert(StoreError::io("remove", &p, e));
                }
            }
        }
        for model in dirs {
            let info = self.model_info(model);
            if let Err(e) = self.io.sync_dir(&info.blocks_dir) {
                // The removals may come back after a crash: harmless, the
                // blocks are complete and unreferenced.
                first_err.get_or_insert(StoreError::io("fsync", &info.blocks_dir, e));
            }
        }
        drop(locks);
        let mut st = lock_mutex(&self.state);
        for v in &victims {
            if removed.contains(&v.id) {
                report.blocks += 1;
                report.bytes += v.record_len;
            }
            if !v.claimed {
                continue;
            }
            let Some(e) = st.entries.get_mut(&v.id) else {
                continue;
            };
            e.in_flight = false;
            let (len, pins, had_ram) = (e.len, e.pins, e.ram.is_some());
            let evict = std::mem::take(&mut e.evict_after_write);
            if !removed.contains(&v.id) {
                // Still on disk: a pending eviction of its RAM copy can complete.
                if evict {
                    st.evicting_bytes -= len;
                    if pins == 0 {
                        st.m.evictions += 1;
                        st.drop_ram(&v.id);
                    }
                }
                continue;
            }
            let was_on_disk = std::mem::replace(&mut e.on_disk, false);
            if was_on_disk {
                st.disk_bytes = st.disk_bytes.saturating_sub(v.record_len);
            }
            if evict {
                st.evicting_bytes -= len;
            }
            if !had_ram {
                st.entries.remove(&v.id);
            } else if pins == 0 {
                // Collected means gone from the store: its RAM copy goes too.
                // Kept, it would be dirty again, written back at the next
                // flush, and the disk budget would churn.
                st.drop_ram(&v.id);
            } else if evict {
                // Pinned while its file was going away: it stays in RAM,
                // dirty again.
                st.policy.insert(v.id, len);
            }
        }
        st.m.gc_blocks += report.blocks;
        st.m.gc_bytes += report.bytes;
        drop(st);
        self.cond.notify_all();
        match first_err {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }
}
