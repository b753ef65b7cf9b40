//! KV geometry: how many layers, how many bytes each token takes per layer,
//! the element type and the block size. Geometry is plain data: this crate
//! knows nothing about models.

use crate::error::{FormatError, Result};

/// Most layers a geometry may have (a guard against absurd allocations).
pub const MAX_LAYERS: usize = 4096;
/// Most tokens a block may hold.
pub const MAX_TOKENS_PER_BLOCK: u32 = 65536;
/// Most bytes one token may take in one layer's K or V.
pub const MAX_BYTES_PER_TOKEN_PER_LAYER: u32 = 1 << 24;
/// Largest block payload accepted (16 GiB).
pub const MAX_BLOCK_BYTES: u64 = 1 << 34;
/// Most bytes of recurrent state one layer may have.
pub const MAX_STATE_BYTES_PER_LAYER: u32 = 1 << 30;
/// Largest recurrent state of all layers together (16 GiB).
pub const MAX_STATE_BYTES: u64 = 1 << 34;

/// Element type of the KV cache tensors.
///
/// The type is recorded so that a reader can refuse data it cannot interpret
/// and so that compression knows what it compresses (only `F16` blocks can be
/// stored as q8_0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ElemType {
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16.
    BF16,
    /// ggml q8_0 (blocks of 32 values: f16 scale + 32 × i8).
    Q8_0,
    /// ggml q4_0 (blocks of 32 values: f16 scale + 16 bytes of nibbles).
    Q4_0,
    /// Any other element type, as an opaque code ≥ 128 chosen by the application.
    Other(u8),
}

impl ElemType {
    /// The one-byte code stored on disk.
    pub fn code(self) -> u8 {
        match self {
            ElemType::F32 => 0,
            ElemType::F16 => 1,
            ElemType::BF16 => 2,
            ElemType::Q8_0 => 3,
            ElemType::Q4_0 => 4,
            ElemType::Other(c) => c,
        }
    }

    /// Parses an on-disk code; codes 5..=127 are reserved and refused.
    pub fn from_code(code: u8) -> Result<Self> {
        Ok(match code {
            0 => ElemType::F32,
            1 => ElemType::F16,
            2 => ElemType::BF16,
            3 => ElemType::Q8_0,
            4 => ElemType::Q4_0,
            128..=255 => ElemType::Other(code),
            _ => {
                return Err(FormatError::invalid(
                    "element type",
                    format!("reserved code {code}"),
                ))
            }
        })
    }

    /// A short lower-case name (`"f16"`, `"q8_0"`, ...).
    pub fn name(self) -> String {
        match self {
            ElemType::F32 => "f32".into(),
            ElemType::F16 => "f16".into(),
            ElemType::BF16 => "bf16".into(),
            ElemType::Q8_0 => "q8_0".into(),
            ElemType::Q4_0 => "q4_0".into(),
            ElemType::Other(c) => format!("other{c}"),
        }
    }
}

/// Bytes per token of one layer's K and V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerGeometry {
    /// Bytes of K per token in this layer.
    pub k_bytes_per_token: u32,
    /// Bytes of V per token in this layer.
    pub v_bytes_per_token: u32,
}

/// Where one layer's K and V lie inside a span of `n` tokens.
///
/// A span (a block, or a checkpoint's tail) stores, layer after layer, the K
/// bytes of its `n` tokens followed by their V bytes; inside each region token
/// `i` occupies bytes `[i * b, (i + 1) * b)` where `b` is the per-token size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSpan {
    /// Offset of this layer's K bytes from the start of the span.
    pub k_offset: u64,
    /// Length of this layer's K bytes.
    pub k_len: u64,
    /// Offset of this layer's V bytes from the start of the span.
    pub v_offset: u64,
    /// Length of this layer's V bytes.
    pub v_len: u64,
}

/// The KV geometry of a store: fixed for every block and checkpoint in it.
///
/// A hybrid model's recurrent (or convolutional) layers also carry a state of
/// fixed size per sequence rather than per token: [`Geometry::with_state`]
/// records each layer's state bytes, which state records and a manifest's
/// tail state hold (FORMAT.md §4.1, §5.2).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Geometry {
    layers: Vec<LayerGeometry>,
    elem: ElemType,
    tokens_per_block: u32,
    /// Per layer, bytes of recurrent state; empty when no layer has any.
    state: Vec<u32>,
}

/// Default tokens per block (see FORMAT.md, "Choice of block size").
pub const DEFAULT_TOKENS_PER_BLOCK: u32 = 64;

impl Geometry {
    /// Builds and validates a geometry from per-layer sizes.
    pub fn new(layers: Vec<LayerGeometry>, elem: ElemType, tokens_per_block: u32) -> Result<Self> {
        if layers.is_empty() || layers.len() > MAX_LAYERS {
            return Err(FormatError::OutOfBounds {
                what: "geometry layer count",
                value: layers.len() as u64,
                limit: MAX_LAYERS as u64,
            });
        }
        if tokens_per_block == 0 || tokens_per_block > MAX_TOKENS_PER_BLOCK {
            return Err(FormatError::OutOfBounds {
                what: "geometry tokens per block",
                value: u64::from(tokens_per_block),
                limit: u64::from(MAX_TOKENS_PER_BLOCK),
            });
        }
        for (layer_idx, l) in layers.iter().enumerate() {
            for b in [l.k_bytes_per_token, l.v_bytes_per_token] {
                if b > MAX_BYTES_PER_TOKEN_PER_LAYER {
                    return Err(FormatError::OutOfBounds {
                        what: "geometry bytes per token of a layer",
                        value: u64::from(b),
                        limit: u64::from(MAX_BYTES_PER_TOKEN_PER_LAYER),
                    });
                }
                if elem == ElemType::F16 && b % 2 != 0 {
                    return Err(FormatError::invalid(
                        "geometry",
                        format!("layer {layer_idx}: odd byte count {b} for f16"),
                    ));
                }
            }
        }
        let g = Geometry {
            layers,
            elem,
            tokens_per_block,
            state: Vec::new(),
        };
        if g.bytes_per_token() == 0 {
            return Err(FormatError::invalid("geometry", "zero bytes per token"));
        }
        if g.block_bytes() > MAX_BLOCK_BYTES {
            return Err(FormatError::AbsurdLength {
                what: "geometry block bytes",
                len: g.block_bytes(),
                limit: MAX_BLOCK_BYTES,
            });
        }
        Ok(g)
    }

    /// A geometry whose layers carry K and V per token and recurrent state
    /// (`state[i]` bytes in layer `i`). Unlike [`Geometry::new`], the K and V of
    /// every layer may be zero (a purely recurrent model) as long as some
    /// layer has state.
    pub fn new_hybrid(
        layers: Vec<LayerGeometry>,
        elem: ElemType,
        tokens_per_block: u32,
        state: Vec<u32>,
    ) -> Result<Self> {
        let n = layers.len();
        let kv_free = layers
            .iter()
            .all(|l| l.k_bytes_per_token == 0 && l.v_bytes_per_token == 0);
        // Validated with a placeholder K byte where there is none, then restored.
        let mut probe = layers.clone();
        if kv_free && n > 0 {
            probe[0].k_bytes_per_token = 2;
        }
        let mut g = Geometry::new(probe, elem, tokens_per_block)?.with_state(state)?;
        debug_assert_eq!(g.layers.len(), n);
        g.layers = layers;
        Ok(g)
    }

    /// A geometry in which every layer has the same K and V sizes.
    pub fn uniform(
        n_layers: usize,
        k_bytes_per_token: u32,
        v_bytes_per_token: u32,
        elem: ElemType,
        tokens_per_block: u32,
    ) -> Result<Self> {
        let layer = LayerGeometry {
            k_bytes_per_token,
            v_bytes_per_token,
        };
        Self::new(
            vec![layer; n_layers.min(MAX_LAYERS + 1)],
            elem,
            tokens_per_block,
        )
    }

    /// Number of layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Per-layer sizes.
    pub fn layers(&self) -> &[LayerGeometry] {
        &self.layers
    }

    /// Element type.
    pub fn elem(&self) -> ElemType {
        self.elem
    }

    /// Tokens per block.
    pub fn tokens_per_block(&self) -> u32 {
        self.tokens_per_block
    }

    /// The same geometry whose layers carry `state[i]` bytes of recurrent state
    /// each (one entry per layer, zero for a layer without state, at least one
    /// not zero). A layer may have state and no K or V (a recurrent layer of a
    /// hybrid model).
    pub fn with_state(mut self, state: Vec<u32>) -> Result<Self> {
        if state.len() != self.layers.len() {
            return Err(FormatError::invalid(
                "geometry state",
                format!(
                    "{} state sizes for {} layers",
                    state.len(),
                    self.layers.len()
                ),
            ));
        }
        if let Some(&b) = state.iter().find(|&&b| b > MAX_STATE_BYTES_PER_LAYER) {
            return Err(FormatError::OutOfBounds {
                what: "geometry state bytes of a layer",
                value: u64::from(b),
                limit: u64::from(MAX_STATE_BYTES_PER_LAYER),
            });
        }
        let total: u64 = state.iter().map(|&b| u64::from(b)).sum();
        if total == 0 {
            return Err(FormatError::invalid(
                "geometry state",
                "every layer has zero bytes",
            ));
        }
        if total > MAX_STATE_BYTES {
            return Err(FormatError::AbsurdLength {
                what: "geometry state bytes",
                len: total,
                limit: MAX_STATE_BYTES,
            });
        }
        self.state = state;
        Ok(self)
    }

    /// Whether any layer carries recurrent state.
    pub fn has_state(&self) -> bool {
        !self.state.is_empty()
    }

    /// Per layer, bytes of recurrent state (empty when no layer has any).
    pub fn state_layers(&self) -> &[u32] {
        &self.state
    }

    /// Bytes of recurrent state over all layers (0 when none).
    pub fn state_bytes(&self) -> u64 {
        self.state.iter().map(|&b| u64::from(b)).sum()
    }

    /// Splits a state (every layer's state in layer order, [`Geometry::state_bytes`]
    /// long) into each layer's bytes, without copying.
    pub fn split_state<'a>(&self, state: &'a [u8]) -> Result<Vec<&'a [u8]>> {
        if state.len() as u64 != self.state_bytes() {
            return Err(FormatError::invalid(
                "state",
                format!("{} bytes, expected {}", state.len(), self.state_bytes()),
            ));
        }
        let mut off = 0usize;
        Ok(self
            .state
            .iter()
            .map(|&b| {
                let part = &state[off..off + b as usize];
                off += b as usize;
                part
            })
            .collect())
    }

    /// K plus V bytes of one token over all layers.
    pub fn bytes_per_token(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| u64::from(l.k_bytes_per_token) + u64::from(l.v_bytes_per_token))
            .sum()
    }

    /// Bytes of one full block (raw, uncompressed).
    pub fn block_bytes(&self) -> u64 {
        self.span_bytes(u64::from(self.tokens_per_block))
    }

    /// Bytes of a span of `n_tokens` tokens (a block or a tail).
    pub fn span_bytes(&self, n_tokens: u64) -> u64 {
        self.bytes_per_token().saturating_mul(n_tokens)
    }

    /// Offsets of every layer's K and V inside a span of `n_tokens` tokens.
    pub fn layer_spans(&self, n_tokens: u64) -> Vec<LayerSpan> {
        let mut off = 0u64;
        self.layers
            .iter()
            .map(|l| {
                let k_len = u64::from(l.k_bytes_per_token) * n_tokens;
                let v_len = u64::from(l.v_bytes_per_token) * n_tokens;
                let s = LayerSpan {
                    k_offset: off,
                    k_len,
                    v_offset: off + k_len,
                    v_len,
                };
                off += k_len + v_len;
                s
            })
            .collect()
    }

    /// Offsets of one layer's K and V inside a full block, or `None` when
    /// `layer_idx` is out of range.
    pub fn block_layer_span(&self, layer_idx: usize) -> Option<LayerSpan> {
        self.layer_spans(u64::from(self.tokens_per_block))
            .get(layer_idx)
            .copied()
    }

    /// Splits a span of `n_tokens` tokens (a block's KV, a tail) into each
    /// layer's K and V bytes, without copying. Fails when `span` has the
    /// wrong length.
    pub fn split_span<'a>(
        &self,
        span: &'a [u8],
        n_tokens: u64,
    ) -> Result<Vec<(&'a [u8], &'a [u8])>> {
        if span.len() as u64 != self.span_bytes(n_tokens) {
            return Err(FormatError::invalid(
                "KV span",
                format!(
                    "{} bytes for {n_tokens} tokens, expected {}",
                    span.len(),
                    self.span_bytes(n_tokens)
                ),
            ));
        }
        Ok(self
            .layer_spans(n_tokens)
            .iter()
            .map(|s| {
                let k = &span[s.k_offset as usize..(s.k_offset + s.k_len) as usize];
                let v = &span[s.v_offset as usize..(s.v_offset + s.v_len) as usize];
                (k, v)
            })
            .collect())
    }

    /// Builds a span of `n_tokens` tokens from each layer's K and V bytes:
    /// `part(layer_idx, is_v)` returns that region (exactly
    /// `n_tokens × bytes per token` of the layer).
    pub fn gather_span<'a>(
        &self,
        n_tokens: u64,
        mut part: impl FnMut(usize, bool) -> &'a [u8],
    ) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.span_bytes(n_tokens) as usize);
        for (layer_idx, l) in self.layers.iter().enumerate() {
            for (is_v, b) in [(false, l.k_bytes_per_token), (true, l.v_bytes_per_token)] {
                let src = part(layer_idx, is_v);
                let want = u64::from(b) * n_tokens;
                if src.len() as u64 != want {
                    return Err(FormatError::invalid(
                        "KV span",
                        format!(
                            "layer {layer_idx} {}: {} bytes, expected {want}",
                            if is_v { "V" } else { "K" },
                            src.len()
                        ),
                    ));
                }
                out.extend_from_slice(src);
            }
        }
        Ok(out)
    }

    /// Canonical byte encoding, as stored in manifests and exports
    /// (see FORMAT.md, "Geometry record").
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + 8 * self.layers.len());
        out.extend_from_slice(&(self.layers.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.tokens_per_block.to_le_bytes());
        out.push(self.elem.code());
        out.push(if self.has_state() {
            crate::layout::GEOMETRY_FLAG_HAS_STATE
        } else {
            0
        });
        out.extend_from_slice(&[0u8; 6]);
        for l in &self.layers {
            out.extend_from_slice(&l.k_bytes_per_token.to_le_bytes());
            out.extend_from_slice(&l.v_bytes_per_token.to_le_bytes());
        }
        for b in &self.state {
            out.extend_from_slice(&b.to_le_bytes());
        }
        out
    }

    /// Parses [`Geometry::encode`] output; the whole slice must be used.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let need = |n: usize| -> Result<()> {
            if bytes.len() < n {
                Err(FormatError::Truncated {
                    what: "geometry record",
                    offset: 0,
                    needed: n as u64,
                    available: bytes.len() as u64,
                })
            } else {
                Ok(())
            }
        };
        need(16)?;
        let n_layers = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        let tpb = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        let elem = ElemType::from_code(bytes[8])?;
        let has_state = bytes[9] == crate::layout::GEOMETRY_FLAG_HAS_STATE;
        if (bytes[9] != 0 && !has_state) || bytes[10..16].iter().any(|&b| b != 0) {
            return Err(FormatError::invalid(
                "geometry record",
                "reserved bytes not zero",
            ));
        }
        if n_layers == 0 || n_layers > MAX_LAYERS {
            return Err(FormatError::OutOfBounds {
                what: "geometry layer count",
                value: n_layers as u64,
                limit: MAX_LAYERS as u64,
            });
        }
        let table = 16 + 8 * n_layers;
        let total = table + if has_state { 4 * n_layers } else { 0 };
        need(total)?;
        if bytes.len() != total {
            return Err(FormatError::invalid(
                "geometry record",
                format!(
                    "length {} but {} layers need {}",
                    bytes.len(),
                    n_layers,
                    total
                ),
            ));
        }
        let layers: Vec<LayerGeometry> = bytes[16..table]
            .chunks_exact(8)
            .map(|c| LayerGeometry {
                k_bytes_per_token: u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                v_bytes_per_token: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        if !has_state {
            return Geometry::new(layers, elem, tpb);
        }
        let state = bytes[table..total]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Geometry::new_hybrid(layers, elem, tpb, state)
    }

    /// BLAKE3 digest of the canonical encoding: block records carry it so a
    /// block of another geometry is refused without storing the geometry.
    pub fn digest(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(b"ckptfmt/geometry/v1");
        h.update(&self.encode());
        *h.finalize().as_bytes()
    }

    /// Describes how `self` differs from `other`, or `None` if equal.
    pub fn diff(&self, other: &Geometry) -> Option<String> {
        if self == other {
            return None;
        }
        Some(if self.layers.len() != other.layers.len() {
            format!("{} layers vs {}", self.layers.len(), other.layers.len())
        } else if self.elem != other.elem {
            format!("element type {} vs {}", self.elem.name(), other.elem.name())
        } else if self.tokens_per_block != other.tokens_per_block {
            format!(
                "{} tokens per block vs {}",
                self.tokens_per_block, other.tokens_per_block
            )
        } else if self.state != other.state {
            format!(
                "recurrent state of {} bytes vs {}",
                self.state_bytes(),
                other.state_bytes()
            )
        } else {
            let i = self
                .layers
                .iter()
                .zip(&other.layers)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            format!(
                "layer {i} sizes {:?} vs {:?}",
                self.layers[i], other.layers[i]
            )
        })
    }
}
