//! The KV cache of one sequence, and its byte layout (a contract other crates rely on).
//!
//! # Layout
//!
//! For every layer `l` there is one K tensor and one V tensor of `n_ctx` rows. Row `p` holds the
//! token at position `p`; cells are filled from position 0 without gaps, so the cache holds the
//! positions `0..len`. A row is `n_embd_kv = head_dim * n_head_kv` little-endian IEEE-754 binary16
//! (f16) values:
//!
//! - K row: the keys after RoPE, head after head (`head h` is elements `h * head_dim ..
//!   (h + 1) * head_dim`).
//! - V row: the values, head after head, not transposed.
//!
//! So one layer holds `k_bytes_per_token = v_bytes_per_token = 2 * n_embd_kv` bytes per token
//! for each of K and V (384 + 384 for SmolLM2-135M), and the bytes of positions `a..b` of one
//! layer's K are the contiguous range `a * k_bytes_per_token .. b * k_bytes_per_token` of that
//! layer's K tensor. [`KvLayout`] describes this for a model; [`KvCache::read`] and
//! [`KvCache::write`] copy such ranges, which is how checkpoints save and restore blocks of
//! tokens without running the model.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::ggml::{Backend, KvTensors};
use crate::model::HParams;

/// Element type of cached K and V: always f16 in this version.
pub const KV_DTYPE: &str = "f16";

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
}

/// A single-sequence KV cache of fixed capacity, holding positions `0..len`.
pub struct KvCache {
    tensors: KvTensors,
    layout: KvLayout,
    n_ctx: usize,
    len: usize,
}

impl KvCache {
    pub(crate) fn new(backend: &Backend, hparams: &HParams, n_ctx: usize) -> Result<KvCache> {
        let layout = KvLayout::for_model(hparams);
        let dims = vec![hparams.n_embd_kv(); hparams.n_layer];
        let tensors = KvTensors::new(backend, &dims, &dims, n_ctx)?;
        Ok(KvCache {
            tensors,
            layout,
            n_ctx,
            len: 0,
        })
    }

    /// The byte layout.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Capacity in positions.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Positions held: `0..len`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every position at or after `len` (no-op when already shorter).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Forgets everything and zeroes the cells.
    pub fn clear(&mut self) {
        self.len = 0;
        self.tensors.clear();
    }

    /// Copies the K and V bytes of `positions` of `layer` into `k` and `v`, which must be
    /// exactly `positions.len() * {k,v}_bytes_per_token[layer]` long.
    pub fn read(
        &self,
        layer: usize,
        positions: Range<usize>,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<()> {
        let (kb, vb) = self.check(layer, &positions, self.len, k.len(), v.len())?;
        self.tensors.read(layer, false, positions.start * kb, k);
        self.tensors.read(layer, true, positions.start * vb, v);
        Ok(())
    }

    /// Writes K and V bytes for `positions` of `layer`. Positions may extend past `len` (up to
    /// the capacity); they become part of the sequence only through [`KvCache::set_len`].
    pub fn write(
        &mut self,
        layer: usize,
        positions: Range<usize>,
        k: &[u8],
        v: &[u8],
    ) -> Result<()> {
        let (kb, vb) = self.check(layer, &positions, self.n_ctx, k.len(), v.len())?;
        self.tensors.write(layer, false, positions.start * kb, k);
        self.tensors.write(layer, true, positions.start * vb, v);
        Ok(())
    }

    /// Declares that positions `0..len` hold valid K and V (after [`KvCache::write`]s).
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.n_ctx {
            return Err(Error::ContextFull {
                needed: len,
                n_ctx: self.n_ctx,
            });
        }
        self.len = len;
        Ok(())
    }

    fn check(
        &self,
        layer: usize,
        positions: &Range<usize>,
        limit: usize,
        k_len: usize,
        v_len: usize,
    ) -> Result<(usize, usize)> {
        if layer >= self.layout.n_layers || positions.start > positions.end || positions.end > limit
        {
            return Err(Error::KvRange {
                layer,
                start: positions.start,
                end: positions.end,
                len: limit,
            });
        }
        let (kb, vb) = (
            self.layout.k_bytes_per_token[layer],
            self.layout.v_bytes_per_token[layer],
        );
        let n = positions.end - positions.start;
        if k_len != n * kb {
            return Err(Error::KvBytes {
                layer,
                expected: n * kb,
                found: k_len,
            });
        }
        if v_len != n * vb {
            return Err(Error::KvBytes {
                layer,
                expected: n * vb,
                found: v_len,
            });
        }
        Ok((kb, vb))
    }

    pub(crate) fn tensors(&self) -> &KvTensors {
        &self.tensors
    }

    pub(crate) fn advance(&mut self, n: usize) {
        debug_assert!(self.len + n <= self.n_ctx);
        self.len += n;
    }
}
