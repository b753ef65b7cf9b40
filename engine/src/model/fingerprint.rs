//! The model fingerprint: an explicit, versioned encoding of everything that decides the KV
//! cache's contents, every byte of the weights included, hashed with BLAKE3 on all cores; and
//! the record that lets a second start skip the hashing for an unchanged file.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::gguf::{FileIdentity, Gguf, TensorInfo};
use crate::tokenizer::Tokenizer;

use super::{Arch, HParams, RopeScaling};

/// Version of the fingerprint's encoding.
///
/// Bump it whenever the encoding below changes, and together with any change of the KV cache
/// layout (`kv.rs`: element type, row order) or of the forward pass that changes what is
/// cached: checkpoints made under another version then no longer match any model.
pub const FINGERPRINT_VERSION: u32 = 3;

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
    // Written only when they differ from what the first three architectures have, so that
    // their fingerprints stay as they were.
    pub const ATTN_SCALE: u8 = 16;
    pub const EMBD_SCALE: u8 = 17;
    pub const SWA_SIZE: u8 = 18;
    pub const SWA_LAYERS: u8 = 19;
    pub const SWA_ROPE_FREQ_BASE: u8 = 20;
    pub const FINAL_SOFTCAP: u8 = 21;
    pub const ATTN_SOFTCAP: u8 = 22;
    pub const EXPERTS: u8 = 23;
    pub const SHARED_EXPERT: u8 = 24;
    pub const GEMMA4: u8 = 25;
    pub const MISTRAL3: u8 = 26;
    pub const DELTA_NET: u8 = 27;
    pub const SHORT_CONV: u8 = 28;
    pub const MAMBA2: u8 = 29;
    pub const GRANITE: u8 = 30;
    pub const TENSORS: u8 = 0x20;
    pub const VOCAB: u8 = 0x30;
}

/// Bytes of tensor data hashed as one piece (pieces are hashed in parallel).
const PIECE: usize = 1 << 20;

/// Version 2 of the encoding hashed only this many bytes from each end of every tensor: two
/// fine-tunes that differ only inside a tensor shared a fingerprint. Known only to recognise
/// the stores it named ([`legacy_sampled`]).
const LEGACY_SAMPLE: usize = 4096;

/// The fingerprint of a model. The input, in order:
///
/// 1. `DOMAIN` and [`FINGERPRINT_VERSION`] (`u32` LE);
/// 2. each hyperparameter as `tag: u8, value: u64 LE`, tags 1..=15 in order: architecture
///    (0 llama, 1 qwen2, 2 qwen3, 3 gemma3, 4 gemma2, 5 phi3, 6 qwen3moe, 7 qwen2moe, 8
///    gpt-oss),
///    vocabulary size, training context, embedding width, blocks, heads, KV heads, head
///    dimension, feed-forward width, RMS epsilon (f32 bits), RoPE base (f32 bits), RoPE
///    dimensions, RoPE scaling kind (0 none, 1 linear, 2 yarn), its factor (f32 bits, 0 when
///    none) and its original context (0 unless yarn); then tags 16..=24, each only where the
///    model has it (see `tag`): attention and embedding scales, the sliding window, soft-caps,
///    experts and the shared expert's width;
/// 3. tag `0x20`, the tensor count (`u64`), then per tensor in file order: name length (`u64`)
///    and bytes, type code (`u32`), dimension count (`u32`), each dimension (`u64`), its data's
///    length (`u64`), and the BLAKE3 hash of each 1 MiB piece of its data in order (the last
///    piece shorter): every byte of every tensor counts;
/// 4. tag `0x30`, the vocabulary size (`u64`), then per token its piece length (`u32`) and bytes.
///
/// The data is read from the file (a copy, not the map ggml computes with). A file that can no
/// longer be read where its header said (truncated or replaced since it was opened) gets a
/// fingerprint of its own that no other model, and no later load, has: nothing cached matches
/// it, and nothing cached for it is found again.
pub(super) fn fingerprint(gguf: &Gguf, hp: &HParams, tokenizer: &Tokenizer) -> [u8; 32] {
    let Some(pieces) = piece_hashes(gguf) else {
        return unmatched();
    };
    let mut next = pieces.iter();
    encode(gguf, hp, tokenizer, FINGERPRINT_VERSION, |h, t| {
        h.update(&t.n_bytes.to_le_bytes());
        for _ in 0..t.n_bytes.div_ceil(PIECE as u64) {
            h.update(next.next().map_or(&[0; 32], |d| d));
        }
        Some(())
    })
    .unwrap_or_else(unmatched)
}

/// The version 2 fingerprint (tensors sampled at both ends), to recognise the stores written
/// under it; an unreadable file gets one of its own, as in [`fingerprint`].
pub(super) fn legacy_sampled(gguf: &Gguf, hp: &HParams, tokenizer: &Tokenizer) -> [u8; 32] {
    let mut buf = vec![0; LEGACY_SAMPLE];
    encode(gguf, hp, tokenizer, 2, |h, t| {
        let sample = (LEGACY_SAMPLE as u64).min(t.n_bytes);
        let buf = &mut buf[..sample as usize];
        for at in [t.offset, t.offset + t.n_bytes - sample] {
            gguf.read_at(at, buf).ok()?;
            h.update(buf);
        }
        Some(())
    })
    .unwrap_or_else(unmatched)
}

/// A fingerprint no model has: BLAKE3 of a marker, the process, the time and a counter.
fn unmatched() -> [u8; 32] {
    static COUNT: AtomicUsize = AtomicUsize::new(0);
    let mut h = blake3::Hasher::new();
    h.update(DOMAIN);
    h.update(b"unreadable model file\0");
    h.update(&std::process::id().to_le_bytes());
    h.update(&ckptfmt::since_epoch().as_nanos().to_le_bytes());
    h.update(&COUNT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    *h.finalize().as_bytes()
}

/// The BLAKE3 hash of every [`PIECE`] of every tensor's data, in file order, each piece read
/// from the file and hashed on all cores; `None` if a piece cannot be read.
fn piece_hashes(gguf: &Gguf) -> Option<Vec<[u8; 32]>> {
    let pieces: Vec<(u64, usize)> = gguf
        .tensors()
        .iter()
        .flat_map(|t| {
            let n = t.n_bytes.div_ceil(PIECE as u64);
            (0..n).map(move |k| {
                let at = k * PIECE as u64;
                (t.offset + at, (t.n_bytes - at).min(PIECE as u64) as usize)
            })
        })
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(pieces.len().max(1));
    let next = AtomicUsize::new(0);
    let work = || {
        let mut mine = Vec::new();
        let mut buf = vec![0; PIECE];
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(at, len)) = pieces.get(i) else {
                return Some(mine);
            };
            let piece = &mut buf[..len];
            if gguf.read_at(at, piece).is_err() {
                // The others stop at their next piece.
                next.store(pieces.len(), Ordering::Relaxed);
                return None;
            }
            mine.push((i, *blake3::hash(piece).as_bytes()));
        }
    };
    let mut out = vec![[0u8; 32]; pieces.len()];
    let mut ok = true;
    std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mut all = work();
        for h in helpers {
            match h.join() {
                Ok(found) => match (&mut all, found) {
                    (Some(all), Some(found)) => all.extend(found),
                    _ => all = None,
                },
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        match all {
            Some(all) => {
                for (i, d) in all {
                    out[i] = d;
                }
            }
            None => ok = false,
        }
    });
    ok.then_some(out)
}

/// The encoding above, each tensor's data hashed by `data` (`None`: it could not be read).
fn encode(
    gguf: &Gguf,
    hp: &HParams,
    tokenizer: &Tokenizer,
    version: u32,
    mut data: impl FnMut(&mut blake3::Hasher, &TensorInfo) -> Option<()>,
) -> Option<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    h.update(DOMAIN);
    h.update(&version.to_le_bytes());
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
        attn_scale,
        embd_scale,
        ref sliding_window,
        final_softcap,
        attn_softcap,
        ref experts,
        ref gemma4,
        ref mistral3,
        ref delta_net,
        ref short_conv,
        ref mamba2,
        ref granite,
    } = *hp;
    let mut field = |tag: u8, value: u64| {
        h.update(&[tag]);
        h.update(&value.to_le_bytes());
    };
    let arch = match arch {
        Arch::Llama => 0,
        Arch::Qwen2 => 1,
        Arch::Qwen3 => 2,
        Arch::Gemma3 => 3,
        Arch::Gemma2 => 4,
        Arch::Phi3 => 5,
        Arch::Qwen3Moe => 6,
        Arch::Qwen2Moe => 7,
        Arch::Gemma4 => 8,
        Arch::Mistral3 => 9,
        Arch::Qwen35 => 10,
        Arch::GptOss => 11,
        Arch::Lfm2 => 12,
        Arch::Lfm2Moe => 13,
        Arch::Qwen35Moe => 14,
        Arch::Qwen3Next => 15,
        Arch::NemotronH => 16,
        Arch::GraniteHybrid => 17,
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
    if attn_scale.to_bits() != (1.0 / (head_dim as f32).sqrt()).to_bits() {
        field(tag::ATTN_SCALE, attn_scale.to_bits().into());
    }
    if let Some(s) = embd_scale {
        field(tag::EMBD_SCALE, s.to_bits().into());
    }
    if let Some(w) = sliding_window {
        field(tag::SWA_SIZE, w.size as u64);
        field(tag::SWA_LAYERS, w.layers.len() as u64);
        for (il, _) in w
            .layers
            .iter()
            .enumerate()
            .filter(|(_, &windowed)| windowed)
        {
            field(tag::SWA_LAYERS, il as u64);
        }
        field(tag::SWA_ROPE_FREQ_BASE, w.rope_freq_base.to_bits().into());
        // `w.rope_scaled` follows from the architecture (gpt-oss alone), encoded above.
    }
    if let Some(c) = final_softcap {
        field(tag::FINAL_SOFTCAP, c.to_bits().into());
    }
    if let Some(c) = attn_softcap {
        field(tag::ATTN_SOFTCAP, c.to_bits().into());
    }
    if let Some(x) = experts {
        for v in [
            x.n_expert as u64,
            x.n_used as u64,
            x.n_ff_exp as u64,
            u64::from(x.norm_weights),
            x.weights_scale.to_bits().into(),
        ] {
            field(tag::EXPERTS, v);
        }
        if let Some(ff) = x.n_ff_shared {
            field(tag::SHARED_EXPERT, ff as u64);
        }
        if x.sigmoid || x.n_dense_lead > 0 {
            field(tag::EXPERTS, u64::from(x.sigmoid));
            field(tag::EXPERTS, x.n_dense_lead as u64);
        }
    }
    families(
        &mut field,
        gemma4.as_ref(),
        mistral3.as_ref(),
        delta_net.as_ref(),
    );
    if let Some(s) = short_conv {
        field(tag::SHORT_CONV, s.l_cache as u64);
        for (il, _) in s.layers.iter().enumerate().filter(|(_, &c)| c) {
            field(tag::SHORT_CONV, il as u64);
        }
    }
    hybrids(&mut field, mamba2.as_ref(), granite.as_ref());
    contents(&mut h, gguf, tokenizer, &mut data)?;
    Some(*h.finalize().as_bytes())
}

/// The fields of the families with hyper-parameters of their own (gemma4, mistral3, and the
/// delta-net layers of qwen35, qwen35moe and qwen3next), each under its tag. The delta-net's
/// `grouped_heads` follows from the architecture, encoded with it.
fn families(
    field: &mut impl FnMut(u8, u64),
    gemma4: Option<&super::Gemma4Params>,
    mistral3: Option<&super::Mistral3Params>,
    delta_net: Option<&super::DeltaNet>,
) {
    if let Some(d) = delta_net {
        let sizes = [d.conv_kernel, d.n_k_heads, d.n_v_heads, d.head_dim];
        for v in sizes.into_iter().chain(d.rope_sections.map(|s| s as usize)) {
            field(tag::DELTA_NET, v as u64);
        }
        for (il, _) in d.layers.iter().enumerate().filter(|(_, &r)| r) {
            field(tag::DELTA_NET, il as u64);
        }
    }

    if let Some(g) = gemma4 {
        let mut values = vec![
            g.head_dim_swa as u64,
            g.rope_dims_swa as u64,
            g.n_layer_kv as u64,
            g.n_embd_per_layer as u64,
        ];
        values.extend(g.n_head_kv.iter().chain(&g.n_ff).map(|&v| v as u64));
        for v in values {
            field(tag::GEMMA4, v);
        }
    }

    if let Some(m) = mistral3 {
        for v in [
            m.yarn_beta_fast.to_bits().into(),
            m.yarn_beta_slow.to_bits().into(),
            m.rope_attn_factor.to_bits().into(),
            m.attn_temp_scale.map_or(0, |s| u64::from(s.to_bits()) + 1),
            m.attn_temp_floor as u64,
        ] {
            field(tag::MISTRAL3, v);
        }
    }
}

/// The tensors' names, types and shapes (and what `data` adds of each), then the vocabulary.
fn contents(
    h: &mut blake3::Hasher,
    gguf: &Gguf,
    tokenizer: &Tokenizer,
    data: &mut impl FnMut(&mut blake3::Hasher, &TensorInfo) -> Option<()>,
) -> Option<()> {
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
        data(h, t)?;
    }

    h.update(&[tag::VOCAB]);
    h.update(&(tokenizer.n_vocab() as u64).to_le_bytes());
    for id in 0..tokenizer.n_vocab() as u32 {
        let piece = tokenizer.token_bytes(id);
        h.update(&(piece.len() as u32).to_le_bytes());
        h.update(piece);
    }
    Some(())
}

/// Directory, inside a cache directory, of the fingerprints remembered per model file.
const RECORDS_DIR: &str = "fingerprints";

/// First line of a record.
const RECORD_MAGIC: &str = "llama-hdd model fingerprint";

/// The name of the record of the model file `id` (in [`RECORDS_DIR`]): one per model path.
fn record_name(id: &FileIdentity) -> String {
    let key = blake3::hash(id.path.as_os_str().as_encoded_bytes());
    format!("{}.txt", &key.to_hex()[..32])
}

/// What a record says of a file, line by line (the path last: it is only for people).
fn record_text(id: &FileIdentity, fp: &[u8; 32]) -> String {
    format!(
        "{RECORD_MAGIC}\nversion {FINGERPRINT_VERSION}\nlen {}\nmodified_ns {}\nchanged_ns {}\n\
         inode {}\ndevice {}\nfingerprint {}\npath {}\n",
        id.len,
        id.modified_ns,
        id.changed_ns,
        id.inode,
        id.device,
        blake3::Hash::from_bytes(*fp).to_hex(),
        id.path.display()
    )
}

/// The fingerprint remembered in `dir` for the model file `id`, when the record is of this
/// version and the file is the same (path, length, modification and change times, inode and
/// device: the change time cannot be set back, so an edited file is hashed again).
pub(super) fn remembered(dir: &Path, id: &FileIdentity) -> Option<[u8; 32]> {
    let text = kvstore::records::read(dir, RECORDS_DIR, &record_name(id))?;
    let fp_hex = text.lines().find_map(|l| l.strip_prefix("fingerprint "))?;
    let fp = *blake3::Hash::from_hex(fp_hex).ok()?.as_bytes();
    (text == record_text(id, &fp)).then_some(fp)
}

/// Bytes the records in cache directory `dir` take (a disk budget for the directory counts
/// them).
pub(crate) fn records_bytes(dir: &Path) -> u64 {
    kvstore::records::bytes(dir, RECORDS_DIR)
}

/// Remembers `fp` for the model file `id` in `dir`, atomically, through kvstore's records
/// (the engine writes nothing in a store's directory itself). Best effort: without the
/// record, the next start hashes the file again.
pub(super) fn remember(dir: &Path, id: &FileIdentity, fp: &[u8; 32]) {
    kvstore::records::write(dir, RECORDS_DIR, &record_name(id), &record_text(id, fp));
}

/// The fields of the Mamba-2 hybrids (nemotron_h, granitehybrid), each under its tag.
fn hybrids(
    field: &mut impl FnMut(u8, u64),
    mamba2: Option<&super::Mamba2>,
    granite: Option<&super::GraniteScales>,
) {
    if let Some(m) = mamba2 {
        for v in [m.d_conv, m.d_inner, m.d_state, m.n_head, m.n_group] {
            field(tag::MAMBA2, v as u64);
        }
        for kind in &m.kinds {
            field(tag::MAMBA2, *kind as u64);
        }
    }
    if let Some(s) = granite {
        let f = |v: Option<f32>| v.map_or(0, |v| u64::from(v.to_bits()) + 1);
        for v in [f(s.residual_scale), f(s.logit_scale), u64::from(s.rope)] {
            field(tag::GRANITE, v);
        }
    }
}
