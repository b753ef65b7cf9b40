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
//! So with f16 K and V one layer holds `k_bytes_per_token = v_bytes_per_token = 2 * n_embd_kv`
//! bytes per token for each of K and V (384 + 384 for SmolLM2-135M), and the bytes of rows `a..b`
//! of one page of one layer's K are contiguous.
//!
//! K and V may each be stored as q8_0 instead ([`KvType`]): a row is then `n_embd_kv / 32` ggml
//! q8_0 blocks (an f16 scale and 32 signed bytes, 34 bytes per 32 elements), head after head as
//! above; a head's elements start on a block boundary because head sizes must be multiples of 32. As a checkpoint block (ckptfmt's span layout) a page is, layer
//! after layer, the K bytes of its tokens followed by their V bytes. [`KvLayout`] describes this
//! for a model.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use ckptfmt::BlockId;

use crate::model::HParams;

/// Element type of cached K and V in the default configuration.
pub const KV_DTYPE: &str = "f16";

/// Element type of a KV cache tensor (llama.cpp's `--cache-type-k/-v` names: `f16`, `q8_0`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    /// IEEE-754 binary16, 2 bytes per element (the default).
    #[default]
    F16,
    /// ggml q8_0: blocks of 32 elements, an f16 scale and 32 signed bytes (34 bytes).
    Q8_0,
}

impl KvType {
    /// llama.cpp's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Elements per block of the type (1 for f16).
    pub fn block_elems(self) -> usize {
        match self {
            KvType::F16 => 1,
            KvType::Q8_0 => 32,
        }
    }

    /// Bytes of one block of the type.
    pub fn block_bytes(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::Q8_0 => 34,
        }
    }

    /// Bytes of `n` elements, when `n` is a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_elems())
            .then(|| n / self.block_elems() * self.block_bytes())
    }

    /// The checkpoint element type of the type.
    pub fn elem(self) -> ckptfmt::ElemType {
        match self {
            KvType::F16 => ckptfmt::ElemType::F16,
            KvType::Q8_0 => ckptfmt::ElemType::Q8_0,
        }
    }

    /// The checkpoint element type of a cache with `k` keys and `v` values: the type itself when
    /// both agree, else an application code (`128 + 16 * k + v`, over ckptfmt's codes).
    pub fn pair_elem(k: KvType, v: KvType) -> ckptfmt::ElemType {
        if k == v {
            k.elem()
        } else {
            ckptfmt::ElemType::Other(128 + 16 * k.elem().code() + v.elem().code())
        }
    }

    /// The K and V types that [`KvType::pair_elem`] maps to `elem`, if any.
    pub fn from_pair_elem(elem: ckptfmt::ElemType) -> Option<(KvType, KvType)> {
        let from_code = |c: u8| {
            [KvType::F16, KvType::Q8_0]
                .into_iter()
                .find(|t| t.elem().code() == c)
        };
        match elem {
            ckptfmt::ElemType::Other(c) => {
                let c = c.checked_sub(128)?;
                Some((from_code(c / 16)?, from_code(c % 16)?))
            }
            e => from_code(e.code()).map(|t| (t, t)),
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<KvType> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            _ => Err(crate::Error::UnknownKvType { name: s.to_owned() }),
        }
    }
}

/// Positions per page (= tokens per checkpoint block).
pub const PAGE_TOKENS: usize = ckptfmt::DEFAULT_TOKENS_PER_BLOCK as usize;

/// The shape of a model's KV cache, per token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Element type of K.
    pub type_k: KvType,
    /// Element type of V.
    pub type_v: KvType,
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
        KvLayout::with_types(hparams, KvType::F16, KvType::F16)
            .expect("every head size holds whole f16 elements")
    }

    /// The layout of `hparams`' model with `type_k` keys and `type_v` values; a quantized type
    /// needs a head size that is a whole number of its blocks ([`Error::KvTypeHeadDim`]).
    ///
    /// [`Error::KvTypeHeadDim`]: crate::Error::KvTypeHeadDim
    pub fn with_types(
        hparams: &HParams,
        type_k: KvType,
        type_v: KvType,
    ) -> crate::Result<KvLayout> {
        // A recurrent layer has no rows: its pages' spans hold nothing of it.
        let per_token = |t: KvType, il: usize| {
            let head_dim = hparams.head_dim_at(il);
            let heads = if hparams.holds_kv(il) {
                hparams.n_head_kv_at(il)
            } else {
                0
            };
            t.row_bytes(head_dim)
                .map(|head| head * heads)
                .ok_or(crate::Error::KvTypeHeadDim {
                    kv_type: t,
                    block: t.block_elems(),
                    head_dim,
                })
        };
        let layers = 0..hparams.n_layer;
        Ok(KvLayout {
            type_k,
            type_v,
            n_layers: hparams.n_layer,
            k_bytes_per_token: layers
                .clone()
                .map(|il| per_token(type_k, il))
                .collect::<crate::Result<_>>()?,
            v_bytes_per_token: layers
                .map(|il| per_token(type_v, il))
                .collect::<crate::Result<_>>()?,
        })
    }

    /// K and V bytes of one token over all layers (23,040 for SmolLM2-135M).
    pub fn bytes_per_token(&self) -> usize {
        self.k_bytes_per_token.iter().sum::<usize>() + self.v_bytes_per_token.iter().sum::<usize>()
    }

    /// K and V bytes of one page over all layers.
    pub fn bytes_per_page(&self) -> usize {
        self.bytes_per_token() * PAGE_TOKENS
    }

    /// Converts a checkpoint span of whole tokens (layer after layer, K then V) from this
    /// layout to `to`, a layout of the same model with other element types: f16 rows are
    /// quantized to q8_0 (ckptfmt's q8_0, which is ggml's block layout), q8_0 rows widened to
    /// f16, rows of one type copied as they are. The result is deterministic: converting the
    /// same bytes twice gives the same bytes.
    pub fn convert_span(&self, span: &[u8], to: &KvLayout) -> crate::Result<Vec<u8>> {
        let bad =
            |why: String| crate::Error::checkpoint(ckptfmt::FormatError::invalid("KV span", why));
        let per_token = self.bytes_per_token();
        if self.n_layers != to.n_layers || per_token == 0 || !span.len().is_multiple_of(per_token) {
            return Err(bad(format!(
                "{} bytes are not whole tokens of {per_token} bytes in {} layers (target {})",
                span.len(),
                self.n_layers,
                to.n_layers
            )));
        }
        let n = span.len() / per_token;
        let mut out = Vec::with_capacity(n * to.bytes_per_token());
        let mut rest = span;
        for l in 0..self.n_layers {
            for (from_type, to_type, bytes) in [
                (self.type_k, to.type_k, self.k_bytes_per_token[l]),
                (self.type_v, to.type_v, self.v_bytes_per_token[l]),
            ] {
                let (part, tail) = rest.split_at(n * bytes);
                rest = tail;
                match (from_type, to_type) {
                    (a, b) if a == b => out.extend_from_slice(part),
                    (KvType::F16, KvType::Q8_0) => {
                        out.extend_from_slice(&ckptfmt::quant::quantize_f16(part));
                    }
                    (KvType::Q8_0, KvType::F16) => {
                        let elems = part.len() / KvType::Q8_0.block_bytes() * 32;
                        let wide = ckptfmt::quant::dequantize_f16(part, 2 * elems as u64)
                            .ok_or_else(|| {
                                bad(format!("{} bytes are not q8_0 blocks", part.len()))
                            })?;
                        out.extend_from_slice(&wide);
                    }
                    (a, b) => return Err(bad(format!("no conversion from {a} to {b}"))),
                }
            }
        }
        Ok(out)
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
    /// Used pages whose sliding-window layers' rows were released
    /// ([`Context::release_windows`](crate::Context::release_windows)).
    pub pages_window_released: usize,
    /// Held pages spilled to their block files (beyond [`ContextParams::kv_ram`]): held, but not
    /// in RAM.
    ///
    /// [`ContextParams::kv_ram`]: crate::ContextParams::kv_ram
    pub pages_spilled: usize,
    /// Bytes attention has read from block files, since the context was made.
    pub spill_bytes_read: u64,
    /// Pages written to block files to leave RAM, since the context was made.
    pub spill_pages_written: u64,
}

/// The bookkeeping of the page pool: reference counts, the free list and the index of full
/// pages by block id. Pure data: the K and V bytes live in `ggml::KvTensors`.
#[derive(Debug)]
pub(crate) struct PagePool {
    refs: Vec<u32>,
    ids: Vec<Option<BlockId>>,
    /// Pages whose rows in sliding-window layers were released (they read as zeros).
    released: Vec<bool>,
    /// Full pages spilled to their block file: their rows in the pool were released (they read
    /// as zeros) and attention reads them from the file (see `spill.rs`).
    spilled: Vec<bool>,
    /// Free pages, lowest index first: keeping the used cells low keeps attention short.
    free: BinaryHeap<Reverse<u32>>,
    index: HashMap<BlockId, u32>,
}

impl PagePool {
    pub(crate) fn new(n_pages: usize) -> PagePool {
        PagePool {
            refs: vec![0; n_pages],
            ids: vec![None; n_pages],
            released: vec![false; n_pages],
            spilled: vec![false; n_pages],
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
        self.released[page as usize] = false;
        self.spilled[page as usize] = false;
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
            self.spilled[page as usize] = false;
            self.free.push(Reverse(page));
        }
    }

    pub(crate) fn refs(&self, page: u32) -> u32 {
        self.refs[page as usize]
    }

    /// Records that `page` holds the full block `id` (it must not be written again).
    pub(crate) fn index(&mut self, page: u32, id: BlockId) {
        self.unindex(page);
        // A second page with the same contents stays unindexed: one copy is enough to share,
        // unless the first one's sliding-window rows were released and this one's were not.
        if let Some(&other) = self.index.get(&id) {
            if !self.released[other as usize] || self.released[page as usize] {
                return;
            }
            self.ids[other as usize] = None;
        }
        self.index.insert(id, page);
        self.ids[page as usize] = Some(id);
    }

    /// Records that `page`'s rows in sliding-window layers were released.
    pub(crate) fn mark_released(&mut self, page: u32) {
        self.released[page as usize] = true;
    }

    /// Whether `page`'s rows in sliding-window layers were released.
    pub(crate) fn is_released(&self, page: u32) -> bool {
        self.released[page as usize]
    }

    /// Records that `page` (full, held) was spilled to its block file.
    pub(crate) fn mark_spilled(&mut self, page: u32) {
        self.spilled[page as usize] = true;
    }

    /// Records that spilled `page`'s rows are back in the pool.
    pub(crate) fn clear_spilled(&mut self, page: u32) {
        self.spilled[page as usize] = false;
    }

    /// Whether `page` was spilled to its block file (its pool rows read as zeros).
    pub(crate) fn is_spilled(&self, page: u32) -> bool {
        self.spilled.get(page as usize).copied().unwrap_or(false)
    }

    /// Held pages that are spilled.
    pub(crate) fn n_spilled(&self) -> usize {
        (self.refs.iter().zip(&self.spilled))
            .filter(|&(&r, &x)| r > 0 && x)
            .count()
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

    /// Used pages, pages held more than once, and used pages whose sliding-window rows were
    /// released.
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        let used = self.refs.iter().filter(|&&r| r > 0).count();
        let shared = self.refs.iter().filter(|&&r| r > 1).count();
        let released = (self.refs.iter().zip(&self.released))
            .filter(|&(&r, &x)| r > 0 && x)
            .count();
        (used, shared, released)
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
