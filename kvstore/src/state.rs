//! The bookkeeping of the RAM and disk tiers: pure data, no I/O, so it is
//! unit-tested without files.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use ckptfmt::BlockId;

use crate::bytes::KvBytes;
use crate::error::StoreError;
use crate::metrics::Metrics;
use crate::policy::EvictionPolicy;

/// One block known to this process.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) model: usize,
    pub(crate) len: u64,
    pub(crate) ram: Option<KvBytes>,
    pub(crate) on_disk: bool,
    pub(crate) in_flight: bool,
    pub(crate) evict_after_write: bool,
    pub(crate) pins: u32,
    pub(crate) last_access: u64,
    /// The file was found on disk rather than written and synced by this
    /// process: its directory entry may not be durable yet (a writer that
    /// died before its directory sync), so a save syncs the directory first.
    pub(crate) found: bool,
    /// Predecessor and tokens, needed to write the block; known once the
    /// block was put or read.
    pub(crate) chain: Option<(Option<BlockId>, Arc<[u32]>)>,
}

impl Entry {
    /// A block whose file exists and that is not in RAM.
    pub(crate) fn on_disk(model: usize, len: u64) -> Self {
        Entry {
            model,
            len,
            ram: None,
            on_disk: true,
            in_flight: false,
            evict_after_write: false,
            pins: 0,
            last_access: 0,
            found: true,
            chain: None,
        }
    }

    /// The write of this block's RAM copy; `None` without one.
    fn write_item(&self, id: BlockId) -> Option<WriteItem> {
        let (prev, tokens) = self.chain.as_ref()?;
        Some(WriteItem {
            id,
            model: self.model,
            prev: *prev,
            tokens: Arc::clone(tokens),
            data: self.ram.clone()?,
        })
    }
}

/// One block to write, captured under the lock.
pub(crate) struct WriteItem {
    pub(crate) id: BlockId,
    pub(crate) model: usize,
    pub(crate) prev: Option<BlockId>,
    pub(crate) tokens: Arc<[u32]>,
    pub(crate) data: KvBytes,
}

/// Why a block is written (for the counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteKind {
    /// Evicted from RAM (write-behind).
    Spill,
    /// Made durable by a flush or a save.
    Persist,
}

/// A queued prefetch.
pub(crate) struct PrefetchJob {
    pub(crate) ids: Vec<BlockId>,
    pub(crate) done: std::sync::mpsc::Sender<crate::Result<usize>>,
}

/// Everything behind the store's state mutex.
pub(crate) struct State {
    pub(crate) entries: HashMap<BlockId, Entry>,
    pub(crate) policy: Box<dyn EvictionPolicy>,
    pub(crate) ram_bytes: u64,
    pub(crate) evicting_bytes: u64,
    pub(crate) pinned_bytes: u64,
    pub(crate) disk_bytes: u64,
    pub(crate) disk_reserved: u64,
    pub(crate) writes_in_progress: usize,
    pub(crate) spill_queue: VecDeque<BlockId>,
    pub(crate) last_spill_error: Option<Arc<StoreError>>,
    pub(crate) prefetch_queue: VecDeque<PrefetchJob>,
    pub(crate) tick: u64,
    pub(crate) shutdown: bool,
    pub(crate) m: Metrics,
}

impl State {
    pub(crate) fn new(policy: Box<dyn EvictionPolicy>) -> Self {
        State {
            entries: HashMap::new(),
            policy,
            ram_bytes: 0,
            evicting_bytes: 0,
            pinned_bytes: 0,
            disk_bytes: 0,
            disk_reserved: 0,
            writes_in_progress: 0,
            spill_queue: VecDeque::new(),
            last_spill_error: None,
            prefetch_queue: VecDeque::new(),
            tick: 0,
            shutdown: false,
            m: Metrics::default(),
        }
    }

    pub(crate) fn metrics(&self) -> Metrics {
        let mut m = self.m;
        m.ram_bytes = self.ram_bytes;
        m.pinned_bytes = self.pinned_bytes;
        m.disk_bytes = self.disk_bytes;
        m.ram_blocks = self.entries.values().filter(|e| e.ram.is_some()).count() as u64;
        m.disk_blocks = self.entries.values().filter(|e| e.on_disk).count() as u64;
        m
    }

    pub(crate) fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Drops an entry's RAM copy (bookkeeping only).
    pub(crate) fn drop_ram(&mut self, id: &BlockId) {
        let Some(e) = self.entries.get_mut(id) else {
            return;
        };
        if e.ram.take().is_some() {
            self.ram_bytes -= e.len;
            self.policy.remove(id);
            if !e.on_disk {
                self.entries.remove(id);
            }
        }
    }

    /// Forgets that block `id` has a file (it was collected or quarantined
    /// by someone, or found missing): a RAM copy stays, dirty.
    pub(crate) fn lost_file(&mut self, id: &BlockId, record_len: u64) {
        let Some(e) = self.entries.get_mut(id) else {
            return;
        };
        if e.in_flight || !e.on_disk {
            return;
        }
        e.on_disk = false;
        self.disk_bytes = self.disk_bytes.saturating_sub(record_len);
        if e.ram.is_none() {
            self.entries.remove(id);
        }
    }

    /// Picks victims until RAM (not counting blocks already leaving) fits
    /// `budget`; drops clean ones, claims dirty ones for writing.
    pub(crate) fn pick_victims(&mut self, budget: u64) -> Vec<WriteItem> {
        let mut out = Vec::new();
        while self.ram_bytes - self.evicting_bytes > budget {
            let Some(v) = self.policy.victim() else {
                break;
            };
            let Some(e) = self.entries.get_mut(&v) else {
                continue;
            };
            debug_assert!(e.ram.is_some() && e.pins == 0);
            if e.on_disk && !e.in_flight {
                self.m.evictions += 1;
                self.drop_ram(&v);
                continue;
            }
            e.evict_after_write = true;
            self.evicting_bytes += e.len;
            if !e.in_flight {
                if let Some(item) = e.write_item(v) {
                    e.in_flight = true;
                    out.push(item);
                }
            }
        }
        out
    }

    /// Claims a dirty RAM block for writing; `None` when it is clean, gone or
    /// already claimed.
    pub(crate) fn claim_dirty(&mut self, id: &BlockId) -> Option<WriteItem> {
        let e = self.entries.get_mut(id)?;
        if e.on_disk || e.in_flight {
            return None;
        }
        let item = e.write_item(*id)?;
        e.in_flight = true;
        Some(item)
    }

    /// Claims the blocks queued for spilling (up to `max_bytes`).
    pub(crate) fn claim_spill_batch(&mut self, max_bytes: u64) -> (Vec<BlockId>, Vec<WriteItem>) {
        let mut ids = Vec::new();
        let mut bytes = 0u64;
        while bytes < max_bytes {
            let Some(id) = self.spill_queue.pop_front() else {
                break;
            };
            if let Some(e) = self.entries.get(&id) {
                bytes += e.len;
                ids.push(id);
            }
        }
        let items = ids
            .iter()
            .filter_map(|id| self.entries.get(id)?.write_item(*id))
            .collect();
        (ids, items)
    }

    /// Records that `ids` (with their record lengths) are durable now.
    pub(crate) fn record_written(&mut self, ids: &[(BlockId, u64)], kind: WriteKind) {
        for (id, record_len) in ids {
            let Some(e) = self.entries.get_mut(id) else {
                continue;
            };
            e.in_flight = false;
            let evict = std::mem::take(&mut e.evict_after_write);
            let (len, pins) = (e.len, e.pins);
            if evict {
                self.evicting_bytes -= len;
            }
            if !e.on_disk {
                e.on_disk = true;
                self.disk_bytes += record_len;
            }
            e.found = false;
            match kind {
                WriteKind::Spill => self.m.spills += 1,
                WriteKind::Persist => self.m.writes += 1,
            }
            self.m.bytes_written += record_len;
            if evict && pins == 0 {
                self.m.evictions += 1;
                self.drop_ram(id);
            }
        }
    }

    /// Releases the claims of `ids` whose write failed or never ran: they
    /// stay in RAM, dirty, and evictable again.
    pub(crate) fn release_unwritten(&mut self, ids: &[BlockId]) {
        for id in ids {
            let Some(e) = self.entries.get_mut(id) else {
                continue;
            };
            e.in_flight = false;
            let evict = std::mem::take(&mut e.evict_after_write);
            let (len, pins) = (e.len, e.pins);
            if evict {
                self.evicting_bytes -= len;
                if pins == 0 {
                    self.policy.insert(*id, len);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicyKind;

    fn id(n: u8) -> BlockId {
        BlockId([n; 32])
    }

    fn dirty(st: &mut State, n: u8, len: u64) {
        st.entries.insert(
            id(n),
            Entry {
                ram: Some(KvBytes::from_vec(vec![n; len as usize])),
                on_disk: false,
                chain: Some((None, Arc::from(vec![n as u32]))),
                ..Entry::on_disk(0, len)
            },
        );
        st.ram_bytes += len;
        st.policy.insert(id(n), len);
    }

    #[test]
    fn dirty_victims_are_claimed_and_leave_ram_once_written() {
        let mut st = State::new(PolicyKind::Lru.build());
        for n in 0..3 {
            dirty(&mut st, n, 10);
        }
        let items = st.pick_victims(10);
        assert_eq!(items.len(), 2);
        assert_eq!(st.evicting_bytes, 20);
        assert!(st.claim_dirty(&items[0].id).is_none(), "already claimed");
        st.record_written(&[(items[0].id, 12)], WriteKind::Spill);
        st.release_unwritten(&[items[1].id]);
        assert_eq!(
            (st.ram_bytes, st.evicting_bytes, st.disk_bytes),
            (20, 0, 12)
        );
        assert!(st.entries[&items[0].id].ram.is_none());
        assert!(st.entries[&items[1].id].ram.is_some() && !st.entries[&items[1].id].on_disk);
        assert_eq!(st.m.spills, 1);
    }

    #[test]
    fn a_lost_file_keeps_a_ram_copy_dirty_and_forgets_a_cold_block() {
        let mut st = State::new(PolicyKind::Lru.build());
        dirty(&mut st, 1, 10);
        st.record_written(&[(id(1), 12)], WriteKind::Persist);
        st.entries.insert(id(2), Entry::on_disk(0, 10));
        st.disk_bytes += 12;
        st.lost_file(&id(1), 12);
        st.lost_file(&id(2), 12);
        assert_eq!(st.disk_bytes, 0);
        assert!(st.claim_dirty(&id(1)).is_some());
        assert!(!st.entries.contains_key(&id(2)));
    }
}
