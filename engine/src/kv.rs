//! The KV page pool, and the byte layout of its pages (a contract other crates rely on).
//!
//! # Pages
//!
//! One [`Context`](crate::Context) holds the KV cache of all its sequences in one pool of
//! *pages*. A page holds the K and V rows of [`PAGE_TOKENS`] consecutive positions of one
//! sequence, in every layer: exactly one checkpoint block. A sequence's page table maps position
//! `p` to page `table[p / PAGE_TOKENS]`, row `p % PAGE_TOKENS`. Pages are reference-counted: a
//! sequence started from another's prefix shares its pages, and a shared page that is partly
//! filled is copied before either holder writes into it (copy on write). Full pages carry the
//! chained block id of the tokens they hold, so a sequence can start from any resident prefix.
//!
//! # Layout
//!
//! For every layer `l` there is one K tensor and one V tensor of `n_pages * PAGE_TOKENS` rows
//! (*cells*); page `g` owns cells `g * PAGE_TOKENS .. (g + 1) * PAGE_TOKENS`. A row is
//! `n_embd_kv = head_dim * n_head_kv` little-endian IEEE-754 binary16 (f16) values:
//!
//! - K row: the keys after RoPE, head after head (`head h` is elements `h * head_dim ..
//!   (h + 1) * head_dim`).
//! - V row: the values, head after head, not transposed.
//!
//! So one layer holds `k_bytes_per_token = v_bytes_per_token = 2 * n_embd_kv` bytes per token
//! for each of K and V (384 + 384 for SmolLM2-135M), and the bytes of rows `a..b` of one page of
//! one layer's K are contiguous. As a checkpoint block (ckptfmt's span layout) a page is, layer
//! after layer, the K bytes of its tokens followed by their V bytes. [`KvLayout`] describes this
//! for a model.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use ckptfmt::BlockId;

use crate::model::HParams;

/// Element type of cached K and V: always f16 in this version.
pub const KV_DTYPE: &str = "f16";

/// Positions per page (= tokens per checkpoint block).
pub const PAGE_TOKENS: usize = ckptfmt::DEFAULT_TOKENS_PER_BLOCK as usize;

/// The shape of a model's KV cache, per token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Number of layers.
    pub n_layers: usize,
    /// Bytes of K per token, for each layer.
    pub k_bytes_per_token: Vec<usize>,
    /// Bytes of V per token, for each layer.
    pub v_bytes_per_token: Vec<usize>,
}

impl KvLayout {
    /// The layout of `hparams`' model with f16 K and V.
    pub fn for_model(hparams: &HParams) -> KvLayout {
        let per_token = hparams.n_embd_kv() * 2;
        KvLayout {
            n_layers: hparams.n_layer,
            k_bytes_per_token: vec![per_token; hparams.n_layer],
            v_bytes_per_token: vec![per_token; hparams.n_layer],
        }
    }

    /// K and V bytes of one token over all layers (23,040 for SmolLM2-135M).
    pub fn bytes_per_token(&self) -> usize {
        self.k_bytes_per_token.iter().sum::<usize>() + self.v_bytes_per_token.iter().sum::<usize>()
    }

    /// K and V bytes of one page over all layers.
    pub fn bytes_per_page(&self) -> usize {
        self.bytes_per_token() * PAGE_TOKENS
    }
}

/// Occupancy of a context's page pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvStats {
    /// Pages in the pool.
    pub pages_total: usize,
    /// Pages held by at least one sequence.
    pub pages_used: usize,
    /// Pages held by more than one sequence.
    pub pages_shared: usize,
    /// Sum over sequences of the pages each holds (what the pool would need without sharing).
    pub pages_referenced: usize,
    /// Live sequences.
    pub sequences: usize,
}

/// The bookkeeping of the page pool: reference counts, the free list and the index of full
/// pages by block id. Pure data: the K and V bytes live in `ggml::KvTensors`.
#[derive(Debug)]
pub(crate) struct PagePool {
    refs: Vec<u32>,
    ids: Vec<Option<BlockId>>,
    /// Free pages, lowest index first: keeping the used cells low keeps attention short.
    free: BinaryHeap<Reverse<u32>>,
    index: HashMap<BlockId, u32>,
}

impl PagePool {
    pub(crate) fn new(n_pages: usize) -> PagePool {
        PagePool {
            refs: vec![0; n_pages],
            ids: vec![None; n_pages],
            free: (0..n_pages as u32).map(Reverse).collect(),
            index: HashMap::new(),
        }
    }

    pub(crate) fn n_pages(&self) -> usize {
        self.refs.len()
    }

    pub(crate) fn n_free(&self) -> usize {
        self.free.len()
    }

    /// Takes a free page (reference count 1), or `None` when the pool is exhausted.
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        let Reverse(page) = self.free.pop()?;
        debug_assert_eq!(self.refs[page as usize], 0);
        self.refs[page as usize] = 1;
        Some(page)
    }

    /// One more holder of `page`.
    pub(crate) fn retain(&mut self, page: u32) {
        debug_assert!(self.refs[page as usize] > 0);
        self.refs[page as usize] += 1;
    }

    /// One holder fewer; the last one returns the page to the free list and unindexes it.
    pub(crate) fn release(&mut self, page: u32) {
        let r = &mut self.refs[page as usize];
        debug_assert!(*r > 0);
        *r -= 1;
        if *r == 0 {
            self.unindex(page);
            self.free.push(Reverse(page));
        }
    }

    pub(crate) fn refs(&self, page: u32) -> u32 {
        self.refs[page as usize]
    }

    /// Records that `page` holds the full block `id` (it must not be written again).
    pub(crate) fn index(&mut self, page: u32, id: BlockId) {
        self.unindex(page);
        // A second page with the same contents stays unindexed: one copy is enough to share.
        if let std::collections::hash_map::Entry::Vacant(e) = self.index.entry(id) {
            e.insert(page);
            self.ids[page as usize] = Some(id);
        }
    }

    /// Forgets `page`'s block id, before it is written.
    pub(crate) fn unindex(&mut self, page: u32) {
        if let Some(id) = self.ids[page as usize].take() {
            self.index.remove(&id);
        }
    }

    #[cfg(test)]
    pub(crate) fn is_indexed(&self, page: u32) -> bool {
        self.ids[page as usize].is_some()
    }

    /// The resident page holding block `id`, if any.
    pub(crate) fn find(&self, id: &BlockId) -> Option<u32> {
        self.index.get(id).copied()
    }

    /// Used pages and pages held more than once.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let used = self.refs.iter().filter(|&&r| r > 0).count();
        let shared = self.refs.iter().filter(|&&r| r > 1).count();
        (used, shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> BlockId {
        BlockId::chain(&ckptfmt::Fingerprint([n; 32]), None, &[u32::from(n)])
    }

    #[test]
    fn pages_are_reused_lowest_first_and_freed_by_the_last_holder() {
        let mut pool = PagePool::new(3);
        assert_eq!(
            (pool.alloc(), pool.alloc(), pool.alloc()),
            (Some(0), Some(1), Some(2))
        );
        assert_eq!(pool.alloc(), None);
        pool.retain(1);
        pool.release(1);
        assert_eq!(pool.n_free(), 0, "page 1 still has a holder");
        pool.release(2);
        pool.release(1);
        assert_eq!(pool.n_free(), 2);
        assert_eq!(pool.alloc(), Some(1), "lowest free page first");
    }

    #[test]
    fn index_follows_the_page_lifetime() {
        let mut pool = PagePool::new(2);
        let p = pool.alloc().unwrap();
        pool.index(p, id(1));
        assert_eq!(pool.find(&id(1)), Some(p));
        let q = pool.alloc().unwrap();
        pool.index(q, id(1));
        assert_eq!(
            pool.find(&id(1)),
            Some(p),
            "the first copy stays the shared one"
        );
        assert!(!pool.is_indexed(q));
        pool.release(p);
        assert_eq!(pool.find(&id(1)), None, "a freed page is no longer found");
        pool.index(q, id(2));
        pool.unindex(q);
        assert_eq!(pool.find(&id(2)), None);
    }
}
