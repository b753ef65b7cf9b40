//! Garbage collection: deleting block files no checkpoint of any process
//! references and this process has not pinned, least recently used first. It
//! works from each model's index of its files, brought up to date from what
//! changed since the last collection; a damaged manifest is set aside, not a
//! reason to stop.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, MutexGuard};

use ckptfmt::{BlockId, FileLock};

use crate::config::GcReport;
use crate::disk_index::DiskIndex;
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

impl Victim {
    /// A victim not claimed yet.
    fn new(id: BlockId, pos: usize, record_len: u64) -> Self {
        Victim {
            id,
            pos,
            record_len,
            claimed: false,
        }
    }
}

/// Deletes manifest `name` durably; one already gone is as good.
fn delete_manifest<V: BlockIo>(store: &ckptfmt::Store<V>, name: &str) -> Result<()> {
    match store.delete_manifest(name) {
        Ok(()) => Ok(()),
        Err(e) if e.is_io_not_found() => Ok(()),
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

/// A model of a collection, with its place among the store's models.
type Model<V> = (usize, Arc<ModelInfo<V>>);

/// What a collection holds once its models are locked (step b): each model's exclusive store
/// lock and index guard, in the one lock order (`None` once released), and the budget's
/// arithmetic. Signed: the manifests alone may exceed the budget.
struct Pass<'a> {
    // Fields drop in order: each index before the store lock it was refreshed under.
    indexes: Vec<Option<MutexGuard<'a, DiskIndex>>>,
    locks: Vec<Option<FileLock>>,
    /// Bytes the block files take.
    used: i128,
    /// Bytes they may take: the budget, less the manifests of the model to drop from.
    target: i128,
    /// The place of the model to drop manifests from.
    drop_pos: Option<usize>,
}

impl<'a> Pass<'a> {
    /// The index of the model at `pos`, held until [`Pass::release_idle`] lets it go.
    fn index(&mut self, pos: usize) -> &mut DiskIndex {
        self.indexes[pos]
            .as_deref_mut()
            .expect("a model's index is held while the collection may use it")
    }

    /// Lets go of the locks and indexes of the models that hold no victim: the decision is
    /// made and their manifests deleted, so nothing is read or written in their directories
    /// any more (the victims' models stay locked until their files are gone).
    fn release_idle(&mut self, victims: &[Victim]) {
        let busy: HashSet<usize> = victims.iter().map(|v| v.pos).collect();
        for pos in (0..self.locks.len()).filter(|p| !busy.contains(p)) {
            self.indexes[pos] = None;
            self.locks[pos] = None;
        }
    }
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
    /// the budget is met. Works from each model's [`DiskIndex`]: its cost follows what changed
    /// since the last collection, however many go. Returns, in the report, the manifests
    /// deleted.
    ///
    /// The steps, and what each holds: (a) [`Shared::due`]: each index's mutex in turn, no
    /// store lock; (b) [`lock_models`]: every model's exclusive store lock, taken in the one
    /// order of every process (by fingerprint), then its index, both kept through (d);
    /// (c) [`delete_expired`], then [`Shared::candidates`] and [`Shared::choose`], each under
    /// the state mutex for its own span only; (d) the dropped manifests deleted, the locks of
    /// the models without victims given back ([`Pass::release_idle`]), the block files deleted
    /// under their models' locks ([`Shared::remove_victims`]); (e) with no store lock left,
    /// [`Shared::settle`] under the state mutex: the RAM tier, the metrics and the report.
    pub(crate) fn gc_dropping(
        &self,
        budget: u64,
        dropping: Option<(usize, DropOrder<'_>)>,
    ) -> Result<GcReport> {
        self.writable("gc")?;
        let mut models: Vec<Model<V>> = self.models_read().iter().cloned().enumerate().collect();
        // One lock order for every process: by fingerprint.
        models.sort_by_key(|(_, m)| m.fp.to_hex());
        let mut report = GcReport::default();
        let now = crate::unix_now();
        if !self.due(&models, budget, dropping.map(|(d, _)| d), now)? {
            return Ok(report);
        }
        let mut pass = lock_models(&models, budget, dropping.map(|(d, _)| d), &mut report)?;
        let forced = delete_expired(&models, &mut pass, now, &mut report)?;
        if pass.used <= pass.target && forced.is_empty() {
            return Ok(report);
        }
        let cands = self.candidates(&models, &mut pass, &forced);
        let drops = drop_order(dropping.map(|(_, o)| o), &mut pass);
        let (victims, dropped) = self.choose(&models, &mut pass, forced, cands, &drops);
        // The dropped manifests go first, durably: a block goes only once nothing refers to it.
        if let Some(pos) = pass.drop_pos {
            let m = &models[pos].1;
            for name in &dropped {
                if let Err(e) = delete_manifest(&m.store, name) {
                    // Their blocks may still be needed: none goes this time.
                    self.release(&victims);
                    return Err(e);
                }
                report.manifests_dropped.push(name.clone());
                pass.index(pos).remove_manifest(name);
            }
        }
        if victims.is_empty() {
            return Ok(report);
        }
        pass.release_idle(&victims);
        let (removed, first_err) = self.remove_victims(&models, &mut pass, &victims)?;
        drop(pass);
        self.settle(&victims, &removed, &mut report);
        match first_err {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Step (a): whether a collection is due, from the indexes followed without the store lock:
    /// not when the files are within the budget, nothing expired and no new manifest (which may
    /// carry an expiry) waits to be read. `dropping` is the model whose manifests count.
    fn due(
        &self,
        models: &[Model<V>],
        budget: u64,
        dropping: Option<usize>,
        now: u64,
    ) -> Result<bool> {
        let mut known = Some(0i128);
        let mut due = false;
        for (idx, m) in models {
            let mut index = lock_mutex(&m.index);
            let used = index
                .follow(&m.store, m.record_len)
                .map_err(|e| StoreError::format(m.store.root(), e))?;
            // A new manifest may carry an expiry: it is read (under the lock) first.
            due |= index.any_expired(now) || index.has_pending();
            // The block files alone count for a collection without a model to drop from.
            let used = match dropping {
                Some(d) if d == *idx => used,
                _ => used.map(|u| u - index.manifest_bytes()),
            };
            known = known.zip(used).map(|(k, u)| k + i128::from(u));
        }
        Ok(due || known.is_none_or(|k| k > i128::from(budget)))
    }

    /// Step (c), the candidates: the unreferenced blocks no one uses (not forced, in flight or
    /// pinned), in the order they go, under the state mutex. A prefix is worth nothing without
    /// its first blocks: a block goes no earlier than the blocks that continue it (leaves
    /// first), so each candidate counts as recent as its most recent continuation, and among
    /// equals the later block goes first.
    fn candidates(
        &self,
        models: &[Model<V>],
        pass: &mut Pass<'_>,
        forced: &[Victim],
    ) -> Vec<Victim> {
        let forced_ids: HashSet<BlockId> = forced.iter().map(|v| v.id).collect();
        let mut cands: Vec<(u64, Victim)> = Vec::new();
        let st = lock_mutex(&self.state);
        for (pos, (_, m)) in models.iter().enumerate() {
            for &id in pass.index(pos).unreferenced() {
                if forced_ids.contains(&id) {
                    continue;
                }
                let last = match st.entries.get(&id) {
                    Some(e) if e.in_flight || e.pins > 0 => continue,
                    Some(e) => e.last_access,
                    None => 0,
                };
                cands.push((last, Victim::new(id, pos, m.record_len)));
            }
        }
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
        drop(st);
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
        cands.into_iter().map(|(_, v)| v).collect()
    }

    /// Step (c), the choice, under the state mutex: the forced victims, then candidates in
    /// order while over the target, and when they run out the next manifest of `drops`, whose
    /// blocks left without a reference join the candidates, the last first. Claims each victim
    /// it keeps; returns the victims and the manifests to drop.
    fn choose(
        &self,
        models: &[Model<V>],
        pass: &mut Pass<'_>,
        forced: Vec<Victim>,
        cands: Vec<Victim>,
        drops: &[(String, u64)],
    ) -> (Vec<Victim>, Vec<String>) {
        let mut dropped: Vec<String> = Vec::new();
        let mut st = lock_mutex(&self.state);
        let mut out = Vec::new();
        for mut v in forced {
            if claim(&mut st, &mut v) {
                pass.used -= i128::from(v.record_len);
                out.push(v);
            }
        }
        let mut queue: VecDeque<Victim> = cands.into();
        let mut drops = drops.iter();
        // References left to the blocks of the manifests dropped so far.
        let mut left: HashMap<BlockId, u32> = HashMap::new();
        loop {
            while pass.used > pass.target {
                let Some(mut v) = queue.pop_front() else {
                    break;
                };
                if claim(&mut st, &mut v) {
                    pass.used -= i128::from(v.record_len);
                    out.push(v);
                }
            }
            if pass.used <= pass.target {
                break;
            }
            let (Some((name, bytes)), Some(pos)) = (drops.next(), pass.drop_pos) else {
                break;
            };
            pass.target += i128::from(*bytes);
            dropped.push(name.clone());
            let record_len = models[pos].1.record_len;
            let index = pass.index(pos);
            // Its blocks lose a reference; those left with none go, the last first.
            for id in index.blocks_of(name).into_iter().flatten().rev() {
                let n = left.entry(*id).or_insert_with(|| index.refs(id));
                if *n == 0 {
                    continue;
                }
                *n -= 1;
                if *n == 0 && index.holds_block(id) {
                    queue.push_back(Victim::new(*id, pos, record_len));
                }
            }
        }
        (out, dropped)
    }

    /// Step (d): deletes the victims' block files, each model's manifest directory synced
    /// first and its block directory after. Runs under the victims' models' exclusive locks:
    /// a save (under the shared lock) that found a block present relies on it until its
    /// manifest commits (FORMAT.md §9.2). Returns the blocks removed and the first failure to
    /// remove or sync one; a failed manifest sync gives the victims back and fails.
    fn remove_victims(
        &self,
        models: &[Model<V>],
        pass: &mut Pass<'_>,
        victims: &[Victim],
    ) -> Result<(HashSet<BlockId>, Option<StoreError>)> {
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
                self.release(victims);
                return Err(StoreError::io("fsync", &dir, e));
            }
        }
        let mut removed = HashSet::new();
        let mut first_err = None;
        let mut dirs: HashSet<usize> = HashSet::new();
        for v in victims {
            let p = models[v.pos].1.store.block_path(&v.id);
            match self.io.remove(&p) {
                Ok(()) => {
                    removed.insert(v.id);
                    dirs.insert(v.pos);
                    pass.index(v.pos).remove_block(&v.id);
                    // The block's recurrent-state snapshot, if any, goes with it: it can
                    // never serve a resume without the block.
                    let _ = self.io.remove(&models[v.pos].1.store.state_path(&v.id));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    pass.index(v.pos).remove_block(&v.id);
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
        Ok((removed, first_err))
    }

    /// Step (e), after every store lock is given back: counts the blocks `removed` in the
    /// report and the metrics, and settles the victims' entries under the state mutex (in
    /// flight no more; a removed block's RAM copy goes, a kept one may finish its eviction).
    fn settle(&self, victims: &[Victim], removed: &HashSet<BlockId>, report: &mut GcReport) {
        let mut st = lock_mutex(&self.state);
        for v in victims {
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
    }
}

/// Step (b): takes every model's exclusive store lock in the order of `models` (by
/// fingerprint, the same in every process), then brings each index up to date under it (no
/// manifest of any process is being committed) and sums what the block files take against
/// the budget. `dropping` is the model whose manifests count.
fn lock_models<'a, V: BlockIo>(
    models: &'a [Model<V>],
    budget: u64,
    dropping: Option<usize>,
    report: &mut GcReport,
) -> Result<Pass<'a>> {
    let mut locks = Vec::with_capacity(models.len());
    for (_, m) in models {
        locks.push(Some(
            m.store
                .lock_exclusive()
                .map_err(|e| StoreError::format(m.store.root(), e))?,
        ));
    }
    let mut pass = Pass {
        indexes: Vec::with_capacity(models.len()),
        locks,
        used: 0,
        target: i128::from(budget),
        drop_pos: None,
    };
    for ((idx, m), lock) in models.iter().zip(&pass.locks) {
        let lock = lock.as_ref().expect("every lock was just taken");
        let mut index = lock_mutex(&m.index);
        let found = index
            .refresh(&m.store, lock)
            .map_err(|e| StoreError::format(m.store.root(), e))?;
        report.manifests_read += found.read;
        report.set_aside.extend(found.set_aside);
        pass.used += i128::from(index.block_count() * m.record_len);
        if dropping == Some(*idx) {
            pass.target -= i128::from(index.manifest_bytes());
            pass.drop_pos = Some(pass.indexes.len());
        }
        pass.indexes.push(Some(index));
    }
    Ok(pass)
}

/// Step (c), under the exclusive locks: expired checkpoints go whatever the budget, durably,
/// and the blocks only they held become forced victims, the last first (a dropped manifest
/// owes the budget nothing any more).
fn delete_expired<V: BlockIo>(
    models: &[Model<V>],
    pass: &mut Pass<'_>,
    now: u64,
    report: &mut GcReport,
) -> Result<Vec<Victim>> {
    let mut forced: Vec<Victim> = Vec::new();
    for (pos, (_, m)) in models.iter().enumerate() {
        let drop_pos = pass.drop_pos;
        let index = pass.index(pos);
        let mut freed = 0;
        for name in index.expired(now) {
            let blocks = index
                .blocks_of(&name)
                .map(<[_]>::to_vec)
                .unwrap_or_default();
            let before = index.manifest_bytes();
            delete_manifest(&m.store, &name)?;
            index.remove_manifest(&name);
            if Some(pos) == drop_pos {
                freed += i128::from(before - index.manifest_bytes());
            }
            report.manifests_expired.push(name);
            for id in blocks.into_iter().rev() {
                if index.refs(&id) == 0
                    && index.holds_block(&id)
                    && !forced.iter().any(|v| v.id == id)
                {
                    forced.push(Victim::new(id, pos, m.record_len));
                }
            }
        }
        pass.target += freed;
    }
    Ok(forced)
}

/// The manifests of the model to drop from that `order` lets go, oldest first (among equal
/// times, the lower key first), with their lengths; none without a model to drop from.
fn drop_order(order: Option<DropOrder<'_>>, pass: &mut Pass<'_>) -> Vec<(String, u64)> {
    let (Some(order), Some(pos)) = (order, pass.drop_pos) else {
        return Vec::new();
    };
    let mut v: Vec<_> = pass
        .index(pos)
        .manifests()
        .filter_map(|(name, len, modified)| order(name).map(|key| (modified, key, name, len)))
        .collect();
    v.sort_unstable();
    v.into_iter()
        .map(|(_, _, n, len)| (n.to_owned(), len))
        .collect()
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
                        let _ = self.io.remove(&info.store.state_path(id));
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
