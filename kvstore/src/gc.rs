//! Garbage collection: deleting block files no checkpoint of any process
//! references and this process has not pinned, least recently used first. It
//! works from each model's index of its files, brought up to date from what
//! changed since the last collection; a damaged manifest is set aside, not a
//! reason to stop.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use ckptfmt::{BlockId, FormatError};

use crate::config::GcReport;
use crate::error::{Result, StoreError};
use crate::io::BlockIo;
use crate::store::{lock_mutex, ModelInfo, Shared};

/// The order in which a collection may delete a model's manifests to make room: a key for
/// each that may go (among those of equal modification time, the lower key goes first), `None`
/// for those that stay.
pub(crate) type DropOrder<'a> = &'a dyn Fn(&str) -> Option<u64>;

/// A block file chosen for deletion.
struct Victim {
    id: BlockId,
    /// Its model's place in the collection's lists.
    pos: usize,
    record_len: u64,
    /// Whether this process's index knows it (and marked it in flight).
    claimed: bool,
}

/// Deletes manifest `name` durably; one already gone is as good.
fn delete_manifest<V: BlockIo>(store: &ckptfmt::Store<V>, name: &str) -> Result<()> {
    match store.delete_manifest(name) {
        Ok(()) => Ok(()),
        Err(FormatError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(())
        }
        Err(e) => Err(StoreError::format(store.root(), e)),
    }
}

/// Marks victim `v` in flight when this process knows its block (so no one uses or writes it
/// meanwhile); false when it must stay: in flight already, or pinned.
fn claim(st: &mut crate::state::State, v: &mut Victim) -> bool {
    if let Some(e) = st.entries.get_mut(&v.id) {
        if e.in_flight || e.pins > 0 {
            return false;
        }
        e.in_flight = true;
        v.claimed = true;
    }
    true
}

impl<V: BlockIo> Shared<V> {
    /// Gives back the victims a collection claimed and will not delete.
    fn release(&self, victims: &[Victim]) {
        let mut st = lock_mutex(&self.state);
        for v in victims.iter().filter(|v| v.claimed) {
            if let Some(e) = st.entries.get_mut(&v.id) {
                e.in_flight = false;
            }
        }
        drop(st);
        self.cond.notify_all();
    }

    pub(crate) fn gc_to(&self, target: u64) -> Result<GcReport> {
        self.gc_dropping(target, None)
    }

    /// Deletes unreferenced block files, least recently used first, until the block files take
    /// at most `budget` bytes. With `dropping` (a model and a [`DropOrder`]), that model's
    /// manifests count in the budget too, and when the unreferenced blocks are not enough its
    /// manifests go in that order (oldest first), whose blocks then lose a reference, until
    /// the budget is met. Works from each model's [`DiskIndex`](crate::disk_index::DiskIndex):
    /// its cost follows what changed since the last collection, however many go. Returns, in
    /// the report, the manifests deleted.
    pub(crate) fn gc_dropping(
        &self,
        budget: u64,
        dropping: Option<(usize, DropOrder<'_>)>,
    ) -> Result<GcReport> {
        self.writable("gc")?;
        let mut models: Vec<(usize, Arc<ModelInfo<V>>)> =
            self.models_read().iter().cloned().enumerate().collect();
        // One lock order for every process: by fingerprint.
        models.sort_by_key(|(_, m)| m.fp.to_hex());
        let mut report = GcReport::default();
        let now = crate::unix_now();
        // Within the budget by the indexes, followed without the store lock, nothing expired
        // and no new manifest: nothing to do.
        let mut known = Some(0i128);
        let mut due = false;
        for (idx, m) in &models {
            let mut index = lock_mutex(&m.index);
            let used = index
                .follow(&m.store, m.record_len)
                .map_err(|e| StoreError::format(m.store.root(), e))?;
            // A new manifest may carry an expiry: it is read (under the lock) first.
            due |= index.any_expired(now) || index.has_pending();
            // The block files alone count for a collection without a model to drop from.
            let used = match dropping {
                Some((d, _)) if d == *idx => used,
                _ => used.map(|u| u - index.manifest_bytes()),
            };
            known = known.zip(used).map(|(k, u)| k + i128::from(u));
        }
        if !due && known.is_some_and(|k| k <= i128::from(budget)) {
            return Ok(report);
        }
        let mut locks = Vec::with_capacity(models.len());
        for (_, m) in &models {
            locks.push(
                m.store
                    .lock_exclusive()
                    .map_err(|e| StoreError::format(m.store.root(), e))?,
            );
        }
        // Each model's index brought up to date (under the exclusive lock: no manifest of any
        // process is being committed), and what the files take. Signed: the manifests alone
        // may exceed the budget.
        let mut used = 0i128;
        let mut target = i128::from(budget);
        let mut indexes = Vec::with_capacity(models.len());
        let mut drop_pos = None;
        for ((idx, m), lock) in models.iter().zip(&locks) {
            let mut index = lock_mutex(&m.index);
            let found = index
                .refresh(&m.store, lock)
                .map_err(|e| StoreError::format(m.store.root(), e))?;
            report.manifests_read += found.read;
            report.set_aside.extend(found.set_aside);
            used += i128::from(index.block_count() * m.record_len);
            if dropping.is_some_and(|(d, _)| d == *idx) {
                target -= i128::from(index.manifest_bytes());
                drop_pos = Some(indexes.len());
            }
            indexes.push(index);
        }
        // Expired checkpoints go whatever the budget, and the blocks only they held with them
        // (a dropped manifest owes the budget nothing any more).
        let mut forced: Vec<Victim> = Vec::new();
        for (pos, ((_, m), index)) in models.iter().zip(indexes.iter_mut()).enumerate() {
            for name in index.expired(now) {
                let blocks = index
                    .blocks_of(&name)
                    .map(<[_]>::to_vec)
                    .unwrap_or_default();
                let before = index.manifest_bytes();
                delete_manifest(&m.store, &name)?;
                index.remove_manifest(&name);
                if Some(pos) == drop_pos {
                    target += i128::from(before - index.manifest_bytes());
                }
                report.manifests_expired.push(name);
                for id in blocks.into_iter().rev() {
                    if index.refs(&id) == 0
                        && index.holds_block(&id)
                        && !forced.iter().any(|v| v.id == id)
                    {
                        forced.push(Victim {
                            id,
                            pos,
                            record_len: m.record_len,
                            claimed: false,
                        });
                    }
                }
            }
        }
        if used <= target && forced.is_empty() {
            return Ok(report);
        }
        let forced_ids: HashSet<BlockId> = forced.iter().map(|v| v.id).collect();
        let mut cands: Vec<(u64, Victim)> = Vec::new();
        {
            let st = lock_mutex(&self.state);
            for (pos, ((_, m), index)) in models.iter().zip(&indexes).enumerate() {
                for &id in index.unreferenced() {
                    if forced_ids.contains(&id) {
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
                            pos,
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
        // The manifests that may go, oldest first (looked at only when over budget).
        let drops: Vec<(&str, u64)> = match (dropping, drop_pos) {
            (Some((_, order)), Some(pos)) => {
                let mut v: Vec<_> = indexes[pos]
                    .manifests()
                    .filter_map(|(name, len, modified)| {
                        order(name).map(|key| (modified, key, name, len))
                    })
                    .collect();
                v.sort_unstable();
                v.into_iter().map(|(_, _, n, len)| (n, len)).collect()
            }
            _ => Vec::new(),
        };
        let mut dropped: Vec<String> = Vec::new();
        let victims: Vec<Victim> = {
            let mut st = lock_mutex(&self.state);
            let mut out = Vec::new();
            for mut v in forced {
                if claim(&mut st, &mut v) {
                    used -= i128::from(v.record_len);
                    out.push(v);
                }
            }
            let mut queue: VecDeque<Victim> = cands.into_iter().map(|(_, v)| v).collect();
            let mut drops = drops.iter();
            // References left to the blocks of the manifests dropped so far.
            let mut left: HashMap<BlockId, u32> = HashMap::new();
            loop {
                while used > target {
                    let Some(mut v) = queue.pop_front() else {
                        break;
                    };
                    if claim(&mut st, &mut v) {
                        used -= i128::from(v.record_len);
                        out.push(v);
                    }
                }
                if used <= target {
                    break;
                }
                let (Some(&(name, bytes)), Some(pos)) = (drops.next(), drop_pos) else {
                    break;
                };
                target += i128::from(bytes);
                dropped.push(name.to_owned());
                let index = &indexes[pos];
                let m = &models[pos].1;
                // Its blocks lose a reference; those left with none go, the last first.
                for id in index.blocks_of(name).into_iter().flatten().rev() {
                    let n = left.entry(*id).or_insert_with(|| index.refs(id));
                    if *n == 0 {
                        continue;
                    }
                    *n -= 1;
                    if *n == 0 && index.holds_block(id) {
                        queue.push_back(Victim {
                            id: *id,
                            pos,
                            record_len: m.record_len,
                            claimed: false,
                        });
                    }
                }
            }
            out
        };
        // The dropped manifests go first, durably: a block goes only once nothing refers to it.
        if let Some(pos) = drop_pos {
            let m = &models[pos].1;
            for name in &dropped {
                if let Err(e) = delete_manifest(&m.store, name) {
                    // Their blocks may still be needed: none goes this time.
                    self.release(&victims);
                    return Err(e);
                }
                report.manifests_dropped.push(name.clone());
                indexes[pos].remove_manifest(name);
            }
        }
        if victims.is_empty() {
            return Ok(report);
        }
        // A manifest removal (a delete whose directory sync failed, or one in flight in
        // another process) must be durable before its blocks go: otherwise a crash brings back
        // a checkpoint without its blocks.
        let positions: HashSet<usize> = victims.iter().map(|v| v.pos).collect();
        for &pos in &positions {
            let dir = models[pos]
                .1
                .store
                .root()
                .join(ckptfmt::store::MANIFESTS_DIR);
            if let Err(e) = self.io.sync_dir(&dir) {
                self.release(&victims);
                return Err(StoreError::io("fsync", &dir, e));
            }
        }
        let mut removed = HashSet::new();
        let mut first_err = None;
        let mut dirs: HashSet<usize> = HashSet::new();
        for v in &victims {
            let info = &models[v.pos].1;
            let p = info.store.block_path(&v.id);
            match self.io.remove(&p) {
                Ok(()) => {
                    removed.insert(v.id);
                    dirs.insert(v.pos);
                    indexes[v.pos].remove_block(&v.id);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    indexes[v.pos].remove_block(&v.id);
                }
                Err(e) => {
                    first_err.get_or_insert(StoreError::io("remove", &p, e));
                }
            }
        }
        for pos in dirs {
            let info = &models[pos].1;
            if let Err(e) = self.io.sync_dir(&info.blocks_dir) {
                // The removals may come back after a crash: harmless, the
                // blocks are complete and unreferenced.
                first_err.get_or_insert(StoreError::io("fsync", &info.blocks_dir, e));
            }
        }
        drop(indexes);
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

impl<V: BlockIo> Shared<V> {
    /// [`crate::ModelStore::delete_chain`], under the exclusive store lock.
    pub(crate) fn delete_chain(
        &self,
        idx: usize,
        root: &BlockId,
        which: &dyn Fn(&str) -> bool,
    ) -> Result<crate::ChainReport> {
        self.writable("delete_chain")?;
        let info = self.model_info(idx);
        let lock = info
            .store
            .lock_exclusive()
            .map_err(|e| StoreError::format(info.store.root(), e))?;
        let mut index = lock_mutex(&info.index);
        index
            .refresh(&info.store, &lock)
            .map_err(|e| StoreError::format(info.store.root(), e))?;
        let mut report = crate::ChainReport::default();
        // The checkpoints rooted there, and their blocks.
        let mut doomed: HashSet<BlockId> = HashSet::new();
        for name in index.rooted_at(root) {
            if !which(&name) {
                continue;
            }
            doomed.extend(index.blocks_of(&name).into_iter().flatten().copied());
            delete_manifest(&info.store, &name)?;
            index.remove_manifest(&name);
            report.manifests.push(name);
        }
        // Blocks no checkpoint holds, on disk and in RAM, by what each chains from: those
        // leading to the root go too (a chain is followed to its end).
        let mut prev_of: HashMap<BlockId, BlockId> = HashMap::new();
        let loose: Vec<BlockId> = index.unreferenced().copied().collect();
        for id in loose {
            if let Ok(b) = info.store.read_block(&id) {
                if let Some(p) = b.view().ok().and_then(|v| v.prev()) {
                    prev_of.insert(id, p);
                }
            }
        }
        {
            let st = lock_mutex(&self.state);
            for (id, e) in &st.entries {
                if e.model != idx {
                    continue;
                }
                if let Some((Some(p), _)) = &e.chain {
                    prev_of.insert(*id, *p);
                }
            }
        }
        loop {
            let more: Vec<BlockId> = prev_of
                .iter()
                .filter(|(id, p)| !doomed.contains(*id) && (*p == root || doomed.contains(*p)))
                .map(|(id, _)| *id)
                .collect();
            if more.is_empty() {
                break;
            }
            doomed.extend(more);
        }
        let mut st = lock_mutex(&self.state);
        let mut first_err = None;
        let mut removed_any = false;
        for id in &doomed {
            if index.refs(id) > 0 {
                continue;
            }
            if let Some(e) = st.entries.get(id) {
                if e.in_flight || e.pins > 0 {
                    report.busy += 1;
                    continue;
                }
            }
            let mut gone = false;
            if index.holds_block(id) {
                let p = info.store.block_path(id);
                match self.io.remove(&p) {
                    Ok(()) => {
                        gone = true;
                        removed_any = true;
                        index.remove_block(id);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        index.remove_block(id);
                    }
                    Err(e) => {
                        first_err.get_or_insert(StoreError::io("remove", &p, e));
                        continue;
                    }
                }
            }
            if st.entries.contains_key(id) {
                gone = true;
                st.lost_file(id, info.record_len);
                st.drop_ram(id);
                st.entries.remove(id);
            }
            report.blocks += u64::from(gone);
        }
        drop(st);
        if removed_any {
            if let Err(e) = self.io.sync_dir(&info.blocks_dir) {
                first_err.get_or_insert(StoreError::io("fsync", &info.blocks_dir, e));
            }
        }
        drop(index);
        drop(lock);
        self.cond.notify_all();
        match first_err {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }
}
