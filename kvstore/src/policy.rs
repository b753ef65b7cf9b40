//! Eviction policies of the RAM tier: which unpinned block leaves RAM first.
//!
//! A policy only sees blocks that may be evicted: the store inserts a block
//! when it enters RAM (or is unpinned) and removes it when it is pinned,
//! leaves RAM, or is chosen as a victim. Two policies are provided:
//!
//! - [`Lru`]: least recently used. `insert`, `touch`, `remove` and `victim`
//!   are O(log n) (an ordered map from access tick to block).
//! - [`S3Fifo`]: the S3-FIFO policy of Yang et al. (SOSP 2023): a small FIFO
//!   admitting new blocks (10 % of the resident bytes), a main FIFO with
//!   2-bit access counters given a second chance, and a ghost FIFO of
//!   recently evicted ids that sends a returning block straight to main.
//!   It resists scans: a block read once (a cold session brought in and
//!   left) leaves from the small queue without displacing the hot set.
//!   Operations are amortised O(1) (queues with lazy deletion).
//!
//! The default is chosen by measurement (see the kvstore section of `docs/BENCHMARKS.md`): see
//! [`PolicyKind::default`].

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use ckptfmt::BlockId;

/// An eviction policy over the evictable blocks of the RAM tier.
pub trait EvictionPolicy: Send {
    /// The policy's short name.
    fn name(&self) -> &'static str;
    /// A block of `bytes` bytes entered RAM (or became evictable).
    fn insert(&mut self, id: BlockId, bytes: u64);
    /// A block was read.
    fn touch(&mut self, id: &BlockId);
    /// A block stopped being evictable (pinned or gone). Unknown ids are ignored.
    fn remove(&mut self, id: &BlockId);
    /// Chooses the next victim and forgets it; `None` when nothing is evictable.
    fn victim(&mut self) -> Option<BlockId>;
    /// Number of evictable blocks tracked.
    fn len(&self) -> usize;
    /// Whether no block is tracked.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which policy a store uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// [`Lru`].
    Lru,
    /// [`S3Fifo`].
    S3Fifo,
}

impl Default for PolicyKind {
    /// S3-FIFO: on the synthetic service trace (Zipf sessions plus cold
    /// session scans) it had the higher RAM hit rate (see the kvstore section of `docs/BENCHMARKS.md`).
    fn default() -> Self {
        PolicyKind::S3Fifo
    }
}

impl PolicyKind {
    /// A fresh policy of this kind.
    pub fn build(self) -> Box<dyn EvictionPolicy> {
        match self {
            PolicyKind::Lru => Box::new(Lru::default()),
            PolicyKind::S3Fifo => Box::new(S3Fifo::default()),
        }
    }
}

/// Least recently used.
#[derive(Debug, Default)]
pub struct Lru {
    tick: u64,
    by_id: HashMap<BlockId, u64>,
    by_tick: BTreeMap<u64, BlockId>,
}

impl EvictionPolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn insert(&mut self, id: BlockId, _bytes: u64) {
        self.tick += 1;
        if let Some(old) = self.by_id.insert(id, self.tick) {
            self.by_tick.remove(&old);
        }
        self.by_tick.insert(self.tick, id);
    }

    fn touch(&mut self, id: &BlockId) {
        if let Some(t) = self.by_id.get_mut(id) {
            self.by_tick.remove(t);
            self.tick += 1;
            *t = self.tick;
            self.by_tick.insert(self.tick, *id);
        }
    }

    fn remove(&mut self, id: &BlockId) {
        if let Some(t) = self.by_id.remove(id) {
            self.by_tick.remove(&t);
        }
    }

    fn victim(&mut self) -> Option<BlockId> {
        let (_, id) = self.by_tick.pop_first()?;
        self.by_id.remove(&id);
        Some(id)
    }

    fn len(&self) -> usize {
        self.by_id.len()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

#[derive(Debug, Clone, Copy)]
struct S3Meta {
    freq: u8,
    queue: Queue,
    bytes: u64,
    generation: u64,
}

/// S3-FIFO (small, main and ghost FIFO queues).
#[derive(Debug, Default)]
pub struct S3Fifo {
    meta: HashMap<BlockId, S3Meta>,
    small: VecDeque<(BlockId, u64)>,
    main: VecDeque<(BlockId, u64)>,
    ghost: VecDeque<BlockId>,
    ghost_set: HashSet<BlockId>,
    small_bytes: u64,
    main_bytes: u64,
    generation: u64,
}

impl S3Fifo {
    /// Percentage of the tracked bytes given to the small queue.
    pub const SMALL_PERCENT: u64 = 10;
    /// Highest value of the per-block access counter.
    pub const MAX_FREQ: u8 = 3;

    fn push(&mut self, id: BlockId, queue: Queue, freq: u8, bytes: u64) {
        self.generation += 1;
        let generation = self.generation;
        self.meta.insert(
            id,
            S3Meta {
                freq,
                queue,
                bytes,
                generation,
            },
        );
        match queue {
            Queue::Small => {
                self.small.push_back((id, generation));
                self.small_bytes += bytes;
            }
            Queue::Main => {
                self.main.push_back((id, generation));
                self.main_bytes += bytes;
            }
        }
    }

    /// Pops the live head of a queue (skipping entries removed lazily).
    fn pop_live(&mut self, queue: Queue) -> Option<(BlockId, S3Meta)> {
        loop {
            let q = match queue {
                Queue::Small => &mut self.small,
                Queue::Main => &mut self.main,
            };
            let (id, generation) = q.pop_front()?;
            match self.meta.get(&id) {
                Some(m) if m.generation == generation => {
                    let m = *m;
                    self.meta.remove(&id);
                    match queue {
                        Queue::Small => self.small_bytes -= m.bytes,
                        Queue::Main => self.main_bytes -= m.bytes,
                    }
                    return Some((id, m));
                }
                _ => continue,
            }
        }
    }

    fn remember_ghost(&mut self, id: BlockId) {
        if self.ghost_set.insert(id) {
            self.ghost.push_back(id);
        }
        // The ghost queue remembers about as many ids as main holds.
        let cap = self.meta.len().max(16);
        while self.ghost.len() > cap {
            if let Some(old) = self.ghost.pop_front() {
                self.ghost_set.remove(&old);
            }
        }
    }

    fn compact(&mut self) {
        let live = self.meta.len();
        if self.small.len() + self.main.len() > 2 * live + 64 {
            let meta = &self.meta;
            self.small
                .retain(|(id, g)| meta.get(id).is_some_and(|m| m.generation == *g));
            self.main
                .retain(|(id, g)| meta.get(id).is_some_and(|m| m.generation == *g));
        }
    }
}

impl EvictionPolicy for S3Fifo {
    fn name(&self) -> &'static str {
        "s3-fifo"
    }

    fn insert(&mut self, id: BlockId, bytes: u64) {
        self.remove(&id);
        let queue = if self.ghost_set.remove(&id) {
            Queue::Main
        } else {
            Queue::Small
        };
        self.push(id, queue, 0, bytes);
    }

    fn touch(&mut self, id: &BlockId) {
        if let Some(m) = self.meta.get_mut(id) {
            m.freq = (m.freq + 1).min(Self::MAX_FREQ);
        }
    }

    fn remove(&mut self, id: &BlockId) {
        if let Some(m) = self.meta.remove(id) {
            match m.queue {
                Queue::Small => self.small_bytes -= m.bytes,
                Queue::Main => self.main_bytes -= m.bytes,
            }
            self.compact();
        }
    }

    fn victim(&mut self) -> Option<BlockId> {
        loop {
            let total = self.small_bytes + self.main_bytes;
            if total == 0 && self.meta.is_empty() {
                return None;
            }
            let from_small = self.small_bytes > 0
                && (self.small_bytes * 100 >= total * Self::SMALL_PERCENT || self.main_bytes == 0);
            if from_small {
                let (id, m) = self.pop_live(Queue::Small)?;
                if m.freq > 0 {
                    self.push(id, Queue::Main, 0, m.bytes);
                } else {
                    self.remember_ghost(id);
                    return Some(id);
                }
            } else {
                let (id, m) = self.pop_live(Queue::Main)?;
                if m.freq > 0 {
                    self.push(id, Queue::Main, m.freq - 1, m.bytes);
                } else {
                    return Some(id);
                }
            }
        }
    }

    fn len(&self) -> usize {
        self.meta.len()
    }
}

/// Replays `trace` (block indices, each block of `bytes` bytes) through a
/// policy with room for `capacity` blocks and returns the hit count. Used by
/// the policy measurement (tests and the bench binary).
pub fn simulate(kind: PolicyKind, capacity: usize, trace: &[u64]) -> u64 {
    let mut p = kind.build();
    let mut resident: HashSet<u64> = HashSet::new();
    let mut hits = 0;
    let id_of = |i: u64| {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&i.to_le_bytes());
        BlockId(b)
    };
    let mut back: HashMap<BlockId, u64> = HashMap::new();
    for &i in trace {
        let id = id_of(i);
        if resident.contains(&i) {
            hits += 1;
            p.touch(&id);
            continue;
        }
        while resident.len() >= capacity {
            match p.victim() {
                Some(v) => {
                    if let Some(j) = back.remove(&v) {
                        resident.remove(&j);
                    }
                }
                None => break,
            }
        }
        resident.insert(i);
        back.insert(id, i);
        p.insert(id, 1);
    }
    hits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(i: u64) -> BlockId {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&i.to_le_bytes());
        BlockId(b)
    }

    #[test]
    fn lru_evicts_least_recent() {
        let mut p = Lru::default();
        for i in 0..3 {
            p.insert(id(i), 1);
        }
        p.touch(&id(0));
        assert_eq!(p.victim(), Some(id(1)));
        p.remove(&id(2));
        assert_eq!(p.victim(), Some(id(0)));
        assert_eq!(p.victim(), None);
    }

    #[test]
    fn s3fifo_returns_every_block_once() {
        let mut p = S3Fifo::default();
        for i in 0..50 {
            p.insert(id(i), 1);
            if i % 3 == 0 {
                p.touch(&id(i));
            }
        }
        p.remove(&id(7));
        let mut seen = HashSet::new();
        while let Some(v) = p.victim() {
            assert!(seen.insert(v), "victim returned twice");
        }
        assert_eq!(seen.len(), 49);
        assert!(!seen.contains(&id(7)));
        assert!(p.is_empty());
    }

    #[test]
    fn s3fifo_keeps_hot_blocks_through_a_scan() {
        // Ten hot blocks read over and over, then a scan of 1,000 blocks read once.
        let mut trace = Vec::new();
        for _ in 0..20 {
            trace.extend(0..10u64);
        }
        for round in 0..10u64 {
            trace.extend((0..100u64).map(|i| 1000 + round * 100 + i));
            trace.extend(0..10u64);
        }
        let lru = simulate(PolicyKind::Lru, 40, &trace);
        let s3 = simulate(PolicyKind::S3Fifo, 40, &trace);
        assert!(s3 > lru, "s3-fifo {s3} hits, lru {lru}");
    }
}
