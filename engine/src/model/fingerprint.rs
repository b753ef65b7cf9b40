//! The model fingerprint: an explicit, versioned encoding of everything that decides the KV
//! cache's contents, hashed with BLAKE3.

use crate::gguf::Gguf;
use crate::tokenizer::Tokenizer;

use super::{Arch, HParams, RopeScaling};

/// Version of the fingerprint's encoding.
///
/// Bump it whenever the encoding below changes, and together with any change of the KV cache
/// layout (`kv.rs`: element type, row order) or of the forward pass that changes what is
/// cached: checkpoints made under another version then no longer match any model.
pub const FINGERPRINT_VERSION: u32 = 2;

/// Domain separation: no other BLAKE3 input of this project starts like this.
const DOMAIN: &[u8] = b"llama-hdd model fingerprint\0";

/// Field tags of the encoding. Each hyperparameter is written as its one-byte tag followed by
/// a `u64` little-endian value (floats as their IEEE-754 bits, widened).
mod tag {
    pub const ARCH: u8 = 1;
    pub const N_VOCAB: u8 = 2;
    pub const N_CTX_TRAIN: u8 = 3;
    pub const N_EMBD: u8 = 4;
    pub const N_LAYER: u8 = 5;
    pub const N_HEAD: u8 = 6;
    pub const N_HEAD_KV: u8 = 7;
    pub const HEAD_DIM: u8 = 8;
    pub const N_FF: u8 = 9;
    pub const RMS_EPS: u8 = 10;
    pub const ROPE_FREQ_BASE: u8 = 11;
    pub const ROPE_DIMS: u8 = 12;
    pub const ROPE_SCALING_KIND: u8 = 13;
    pub const ROPE_SCALING_FACTOR: u8 = 14;
    pub const ROPE_SCALING_CTX_ORIG: u8 = 15;
    pub const TENSORS: u8 = 0x20;
    pub const VOCAB: u8 = 0x30;
}

/// Bytes sampled from each end of every tensor.
const SAMPLE: usize = 4096;

/// The fingerprint of a model. The input, in order:
///
/// 1. `DOMAIN` and [`FINGERPRINT_VERSION`] (`u32` LE);
/// 2. each hyperparameter as `tag: u8, value: u64 LE`, tags 1..=15 in order: architecture
///    (0 llama, 1 qwen2), vocabulary size, training context, embedding width, blocks, heads, KV
///    heads, head dimension, feed-forward width, RMS epsilon (f32 bits), RoPE base (f32 bits),
///    RoPE dimensions, RoPE scaling kind (0 none, 1 linear, 2 yarn), its factor (f32 bits, 0 when
///    none) and its original context (0 unless yarn);
/// 3. tag `0x20`, the tensor count (`u64`), then per tensor in file order: name length (`u64`)
///    and bytes, type code (`u32`), dimension count (`u32`), each dimension (`u64`), and the
///    first and last 4 KiB of its data (the whole tensor when smaller), so fine-tunes differ;
/// 4. tag `0x30`, the vocabulary size (`u64`), then per token its piece length (`u32`) and bytes.
pub(super) fn fingerprint(gguf: &Gguf, hp: &HParams, tokenizer: &Tokenizer) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(DOMAIN);
    h.update(&FINGERPRINT_VERSION.to_le_bytes());
    // Destructured so that a new field does not compile until it is encoded (or skipped here
    // on purpose).
    let HParams {
        arch,
        n_vocab,
        n_ctx_train,
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim,
        n_ff,
        rms_eps,
        rope_freq_base,
        rope_dims,
        rope_scaling,
    } = *hp;
    let mut field = |tag: u8, value: u64| {
        h.update(&[tag]);
        h.update(&value.to_le_bytes());
    };
    let arch = match arch {
        Arch::Llama => 0,
        Arch::Qwen2 => 1,
    };
    let (kind, factor, n_ctx_orig) = match rope_scaling {
        RopeScaling::None => (0, 0.0f32, 0),
        RopeScaling::Linear { factor } => (1, factor, 0),
        RopeScaling::Yarn { factor, n_ctx_orig } => (2, factor, n_ctx_orig),
    };
    field(tag::ARCH, arch);
    field(tag::N_VOCAB, n_vocab as u64);
    field(tag::N_CTX_TRAIN, n_ctx_train as u64);
    field(tag::N_EMBD, n_embd as u64);
    field(tag::N_LAYER, n_layer as u64);
    field(tag::N_HEAD, n_head as u64);
    field(tag::N_HEAD_KV, n_head_kv as u64);
    field(tag::HEAD_DIM, head_dim as u64);
    field(tag::N_FF, n_ff as u64);
    field(tag::RMS_EPS, rms_eps.to_bits().into());
    field(tag::ROPE_FREQ_BASE, rope_freq_base.to_bits().into());
    field(tag::ROPE_DIMS, rope_dims as u64);
    field(tag::ROPE_SCALING_KIND, kind);
    field(tag::ROPE_SCALING_FACTOR, factor.to_bits().into());
    field(tag::ROPE_SCALING_CTX_ORIG, n_ctx_orig as u64);

    h.update(&[tag::TENSORS]);
    h.update(&(gguf.tensors().len() as u64).to_le_bytes());
    for t in gguf.tensors() {
        h.update(&(t.name.len() as u64).to_le_bytes());
        h.update(t.name.as_bytes());
        h.update(&(t.dtype as u32).to_le_bytes());
        h.update(&(t.shape.len() as u32).to_le_bytes());
        for d in &t.shape {
            h.update(&d.to_le_bytes());
        }
        let data = gguf.tensor_bytes(t);
        let sample = SAMPLE.min(data.len());
        h.update(&data[..sample]);
        h.update(&data[data.len() - sample..]);
    }

    h.update(&[tag::VOCAB]);
    h.update(&(tokenizer.n_vocab() as u64).to_le_bytes());
    for id in 0..tokenizer.n_vocab() as u32 {
        let piece = tokenizer.token_bytes(id);
        h.update(&(piece.len() as u32).to_le_bytes());
        h.update(piece);
    }
    *h.finalize().as_bytes()
}
