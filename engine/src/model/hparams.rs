//! Hyperparameters read from GGUF metadata and validated against what the graph (`llama.rs`) and
//! ggml's kernels require, before any ggml object exists.
//!
//! Every value a model file controls is checked here or by the tensor checks of
//! [`Model::from_gguf`](super::Model::from_gguf): a malformed model is an
//! [`Error::InvalidHParam`] naming the key, never a hang, an abort inside ggml (`GGML_ASSERT`) or
//! a silently wrong answer. The requirements, with the kernel that needs each:
//!
//! | value | requirement | why |
//! |---|---|---|
//! | `embedding_length`, `feed_forward_length` | 1..=2^20 | tensor widths; overflow-free sizes |
//! | `block_count` | 1..=4096 | one set of tensors per block |
//! | `attention.head_count` | 1..=2^20 | heads of the Q reshape |
//! | `attention.head_count_kv` | divides `head_count` | grouped-query attention broadcast |
//! | `attention.key_length` (or `embedding_length / head_count`, exact) | even, heads × length ≤ 2^20 | Q/K reshape, flash attention |
//! | `attention.value_length` | equal to the key length | the KV cache stores K and V rows alike |
//! | `rope.dimension_count` | even, 1..=key length | `ggml_rope` asserts `n_dims % 2 == 0` and `n_dims <= ne0`; 0 spins forever |
//! | `rope.freq_base`, `attention.layer_norm_rms_epsilon` | finite, > 0 (ε < 1) | NaN logits otherwise |
//! | `rope.scaling.type` / `.factor` / `.original_context_length` | none, linear or yarn; factor finite > 0; length ≥ 1 | |
//! | `context_length`, vocabulary size | 1..=i32::MAX | positions and token ids are `i32` in the graph |
//! | `attention.sliding_window` (gemma3; gpt-oss, required) | 1..=i32::MAX, or 0 for none (gemma) | the mask of windowed layers |
//! | `attention.sliding_window_pattern` | 0..=4096 (0: every layer windowed) | which layers are windowed |
//! | `rope.freq_base_swa`, `final_logit_softcapping`, `attn_logit_softcapping` | finite, > 0 | NaN logits otherwise |
//! | `expert_count`, `expert_used_count` | 1..=512, 1..=count | the router's top-k |
//! | `expert_feed_forward_length`, `expert_shared_feed_forward_length` | 0..=2^20 (0: the default); gpt-oss: required, 1..=2^20 | expert widths |
//! | `ssm.conv_kernel` (qwen35, qwen35moe, qwen3next) | 2..=64 | the convolution keeps `kernel - 1` inputs |
//! | `ssm.group_count`, `ssm.time_step_rank` (the same) | 1..=4096, the second a multiple of the first | key heads broadcast (or repeated) over value heads |
//! | `ssm.state_size`, `ssm.inner_size` (the same) | inner = state × `time_step_rank`, width ≤ 2^20 | key and value heads of one size (the kernel's square state) |
//! | `full_attention_interval` or `attention.recurrent_layers` (the same) | ≥ 1, or one flag per layer | which layers are recurrent |
//! | `rope.dimension_sections` (qwen35, qwen35moe) | 4 non-negative values | M-RoPE |
//! | `nextn_predict_layers` (qwen35, qwen35moe, qwen3next) | below `block_count` | the last blocks, multi-token prediction heads, are not run |
//! | `attention.head_count_kv` (lfm2) | per layer: 0 (a short convolution) or one count for every attention layer, at least one | the KV cache's rows |
//! | `expert_gating_func`, `leading_dense_block_count` (lfm2moe) | 1 (softmax) or 2 (sigmoid); 0..=4096 | the router |
//! | `shortconv.l_cache` (lfm2) | 2..=64; no `attention.sliding_window` | the convolution keeps `l_cache - 1` inputs |
//! | `attention.head_count_kv`, `feed_forward_length` (nemotron_h) | per layer; both 0 a Mamba-2 layer, else KV heads an attention layer and a width a feed-forward one; one non-zero value each | the layers' kinds |
//! | `attention.head_count_kv` (granitehybrid) | per layer: 0 (Mamba-2) or one count for every attention layer; `ssm.inner_size` twice `embedding_length` | the layers' kinds |
//! | `embedding_scale`, `residual_scale`, `attention.scale`, `logit_scale` (granitehybrid) | 0 or absent (none), else finite and > 0; `rope.scaling.finetuned` a bool | Granite's multipliers |
//! | `ssm.conv_kernel`, `ssm.inner_size`, `ssm.state_size`, `ssm.time_step_rank`, `ssm.group_count` (nemotron_h, granitehybrid) | 2..=64; the heads and groups divide the inner size; no `nextn_predict_layers`, no experts | `ggml_ssm_conv`, `ggml_ssm_scan` and the grouped norm |

use crate::error::{Error, Result};
use crate::gguf::Gguf;

use super::{Arch, Gemma4Params, HParams, Mistral3Params, RopeScaling, SlidingWindow};

mod delta_net;
use delta_net::delta_net;

/// Largest width (embedding, feed-forward, heads × head dimension) accepted.
pub(crate) const MAX_WIDTH: usize = 1 << 20;
/// Most transformer blocks accepted.
pub(crate) const MAX_LAYERS: usize = 4096;
/// Largest context length and vocabulary size accepted (positions and ids are `i32` in ggml).
pub(crate) const MAX_POSITIONS: usize = i32::MAX as usize;

pub(super) fn invalid(
    key: &str,
    value: impl std::fmt::Display,
    requirement: impl Into<String>,
) -> Error {
    Error::InvalidHParam {
        key: key.to_owned(),
        value: value.to_string(),
        requirement: requirement.into(),
    }
}

/// Reads `{arch}.*` keys with typed errors.
pub(super) struct Keys<'g> {
    pub gguf: &'g Gguf,
    pub arch: &'static str,
}

impl Keys<'_> {
    pub(super) fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.arch)
    }

    pub(super) fn present(&self, name: &str) -> bool {
        self.gguf.get(&self.key(name)).is_some()
    }

    /// A required integer in `lo..=hi`.
    pub(super) fn int(&self, name: &str, lo: usize, hi: usize) -> Result<usize> {
        let key = self.key(name);
        let v = self.gguf.get_u32(&key)? as usize;
        if v < lo || v > hi {
            return Err(invalid(&key, v, format!("must be in {lo}..={hi}")));
        }
        Ok(v)
    }

    /// An optional integer in `lo..=hi`.
    pub(super) fn opt_int(&self, name: &str, lo: usize, hi: usize) -> Result<Option<usize>> {
        match self.present(name) {
            true => self.int(name, lo, hi).map(Some),
            false => Ok(None),
        }
    }

    /// A required float, finite and in `(0, hi)`.
    fn positive(&self, name: &str, hi: f32) -> Result<f32> {
        let key = self.key(name);
        let v = self.gguf.get_f32(&key)?;
        if !(v.is_finite() && v > 0.0 && v < hi) {
            return Err(invalid(&key, v, format!("must be finite, > 0 and < {hi}")));
        }
        Ok(v)
    }

    /// A required integer in `lo..=hi`, or an array of one such integer per layer.
    pub(super) fn per_layer(
        &self,
        name: &str,
        lo: usize,
        hi: usize,
        n_layer: usize,
    ) -> Result<Vec<usize>> {
        let key = self.key(name);
        let Some(values) = self.gguf.get(&key).and_then(|v| v.as_array()) else {
            return Ok(vec![self.int(name, lo, hi)?; n_layer]);
        };
        if values.len() != n_layer {
            return Err(invalid(
                &key,
                format!("{} values", values.len()),
                format!("must hold one value per layer ({n_layer})"),
            ));
        }
        (0..n_layer)
            .map(|il| {
                let v = values.get(il).and_then(|v| v.as_u64());
                match v {
                    Some(v) if (lo as u64..=hi as u64).contains(&v) => Ok(v as usize),
                    _ => Err(invalid(
                        &key,
                        format!("{v:?}"),
                        format!("must be in {lo}..={hi}"),
                    )),
                }
            })
            .collect()
    }

    fn opt_positive(&self, name: &str, hi: f32) -> Result<Option<f32>> {
        match self.present(name) {
            true => self.positive(name, hi).map(Some),
            false => Ok(None),
        }
    }
}

impl HParams {
    /// Reads and validates the hyperparameters of `gguf` (see the module docs for the rules).
    pub fn from_gguf(gguf: &Gguf) -> Result<HParams> {
        let arch = Arch::from_name(gguf.get_str("general.architecture")?)?;
        let k = Keys {
            gguf,
            arch: arch.name(),
        };
        let n_embd = k.int("embedding_length", 1, MAX_WIDTH)?;
        let n_layer = k.int("block_count", 1, MAX_LAYERS)?;
        // gemma4 may give the feed-forward width and the KV heads per layer.
        let per_layer_ok = arch == Arch::Gemma4;
        let n_ff = match (per_layer_ok, arch, k.present("feed_forward_length")) {
            (true, _, _) => *k
                .per_layer("feed_forward_length", 1, MAX_WIDTH, n_layer)?
                .iter()
                .max()
                .unwrap_or(&1),
            // gpt-oss files may leave the dense width out (llama.cpp does not need it): its
            // experts' width then stands in.
            (false, Arch::GptOss, false) => k.int("expert_feed_forward_length", 1, MAX_WIDTH)?,
            // So may qwen35moe and qwen3next files, when they give their experts' width.
            (false, Arch::Qwen35Moe | Arch::Qwen3Next, false)
                if k.present("expert_feed_forward_length") =>
            {
                k.int("expert_feed_forward_length", 1, MAX_WIDTH)?
            }
            // nemotron_h gives a width per layer: 0 but in its feed-forward layers.
            (false, Arch::NemotronH, _) => super::nemotron_h::n_ff(&k, n_layer)?,
            (false, _, _) => k.int("feed_forward_length", 1, MAX_WIDTH)?,
        };
        let n_head = k.int("attention.head_count", 1, MAX_WIDTH)?;
        let n_head_kv = match (per_layer_ok, k.present("attention.head_count_kv")) {
            (true, true) => *k
                .per_layer("attention.head_count_kv", 1, n_head, n_layer)?
                .iter()
                .max()
                .unwrap_or(&n_head),
            _ if matches!(arch, Arch::Lfm2 | Arch::Lfm2Moe) => {
                super::lfm2::n_head_kv(&k, n_head, n_layer)?
            }
            _ if matches!(arch, Arch::NemotronH | Arch::GraniteHybrid) => {
                super::nemotron_h::n_head_kv(&k, n_head, n_layer)?
            }
            _ => k
                .opt_int("attention.head_count_kv", 1, n_head)?
                .unwrap_or(n_head),
        };
        if n_head % n_head_kv != 0 {
            return Err(invalid(
                &k.key("attention.head_count_kv"),
                n_head_kv,
                format!("must divide attention.head_count ({n_head})"),
            ));
        }
        let head_dim = match k.opt_int("attention.key_length", 1, MAX_WIDTH)? {
            Some(d) => d,
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => {
                return Err(invalid(
                    &k.key("embedding_length"),
                    n_embd,
                    format!(
                        "must be a multiple of attention.head_count ({n_head}) when \
                         attention.key_length is absent"
                    ),
                ))
            }
        };
        let (head_key, head_value) = match k.present("attention.key_length") {
            true => (k.key("attention.key_length"), head_dim),
            false => (k.key("embedding_length"), n_embd),
        };
        if head_dim % 2 != 0 {
            return Err(invalid(
                &head_key,
                head_value,
                format!("gives an odd head dimension {head_dim}"),
            ));
        }
        if head_dim.checked_mul(n_head).is_none_or(|q| q > MAX_WIDTH) {
            return Err(invalid(
                &head_key,
                head_value,
                format!("gives {n_head} heads of {head_dim}, wider than {MAX_WIDTH}"),
            ));
        }
        if let Some(v) = k.opt_int("attention.value_length", 1, MAX_WIDTH)? {
            if v != head_dim {
                return Err(invalid(
                    &k.key("attention.value_length"),
                    v,
                    format!("must equal the key length {head_dim}"),
                ));
            }
        }
        let rope_dims = k
            .opt_int("rope.dimension_count", 1, head_dim)?
            .unwrap_or(head_dim);
        if rope_dims % 2 != 0 {
            return Err(invalid(
                &k.key("rope.dimension_count"),
                rope_dims,
                "must be even",
            ));
        }
        let n_ctx_train = k.int("context_length", 1, MAX_POSITIONS)?;
        let n_vocab = vocab_size(&k)?;
        // nemotron_h files may give only `attention.layer_norm_epsilon`, which then serves.
        let rms_eps =
            match arch == Arch::NemotronH && !k.present("attention.layer_norm_rms_epsilon") {
                true => k.positive("attention.layer_norm_epsilon", 1.0)?,
                false => k.positive("attention.layer_norm_rms_epsilon", 1.0)?,
            };
        let rope_freq_base = k
            .opt_positive("rope.freq_base", f32::INFINITY)?
            .unwrap_or(10_000.0);
        let rope_scaling = rope_scaling(&k, n_ctx_train)?;
        let experts = super::experts::experts(&k, arch, n_ff)?;
        let mut hp = HParams {
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
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            embd_scale: None,
            sliding_window: None,
            final_softcap: None,
            attn_softcap: None,
            experts,
            gemma4: None,
            mistral3: None,
            delta_net: None,
            short_conv: None,
            mamba2: None,
            granite: None,
        };
        family(&k, &mut hp)?;
        Ok(hp)
    }

    /// K (and V) elements per token per layer: `head_dim * n_head_kv`.
    pub fn n_embd_kv(&self) -> usize {
        self.head_dim * self.n_head_kv
    }

    /// Head dimension of layer `il` (gemma4's windowed layers have their own).
    pub fn head_dim_at(&self, il: usize) -> usize {
        match &self.gemma4 {
            Some(g) if self.is_swa(il) => g.head_dim_swa,
            _ => self.head_dim,
        }
    }

    /// Key/value heads of layer `il`.
    pub fn n_head_kv_at(&self, il: usize) -> usize {
        match &self.gemma4 {
            Some(g) => g.n_head_kv.get(il).copied().unwrap_or(self.n_head_kv),
            None => self.n_head_kv,
        }
    }

    /// Whether layer `il` keeps K and V rows in the page pool: every layer but a hybrid
    /// model's recurrent ones, whose state lives beside the pool (`recurrent.rs`), and
    /// nemotron_h's feed-forward-only ones.
    pub fn holds_kv(&self, il: usize) -> bool {
        match &self.mamba2 {
            // nemotron_h: only the attention layers.
            Some(m) => m.kinds.get(il) == Some(&super::MixerKind::Attention),
            None => !self.is_recurrent(il),
        }
    }

    /// K (and V) elements per token of layer `il`.
    pub fn n_embd_kv_at(&self, il: usize) -> usize {
        self.head_dim_at(il) * self.n_head_kv_at(il)
    }

    /// Rotated dimensions per head of layer `il`.
    pub fn rope_dims_at(&self, il: usize) -> usize {
        match &self.gemma4 {
            Some(g) if self.is_swa(il) => g.rope_dims_swa,
            _ => self.rope_dims,
        }
    }

    /// Hidden width of layer `il`'s dense feed-forward network.
    pub fn n_ff_at(&self, il: usize) -> usize {
        match &self.gemma4 {
            Some(g) => g.n_ff.get(il).copied().unwrap_or(self.n_ff),
            None => self.n_ff,
        }
    }

    /// The layer whose KV cache layer `il` attends to: itself, or for gemma4's layers past
    /// the last with its own KV, the last earlier layer of the same kind (windowed or not).
    pub fn kv_layer(&self, il: usize) -> usize {
        match &self.gemma4 {
            Some(g) if il >= g.n_layer_kv => g.n_layer_kv - if self.is_swa(il) { 2 } else { 1 },
            _ => il,
        }
    }
}

/// Gemma 4's per-layer shapes, KV sharing and per-layer inputs, as llama.cpp reads them:
/// `attention.key_length_swa` / `value_length_swa` (equal), `rope.dimension_count_swa`,
/// `attention.shared_kv_layers` (the last layers reuse the KV of the last earlier layer of
/// their kind; at least two layers keep their own, the last windowed then the last global),
/// `embedding_length_per_layer_input` (0: no per-layer inputs), and per-layer
/// `feed_forward_length` and `attention.head_count_kv` arrays.
fn gemma4_params(
    k: &Keys<'_>,
    n_layer: usize,
    n_head: usize,
    rope_dims: usize,
    window: Option<&SlidingWindow>,
) -> Result<Gemma4Params> {
    let head_dim_swa = k.int("attention.key_length_swa", 2, MAX_WIDTH)?;
    let v_swa = k.int("attention.value_length_swa", 1, MAX_WIDTH)?;
    if v_swa != head_dim_swa || head_dim_swa % 2 != 0 || head_dim_swa * n_head > MAX_WIDTH {
        return Err(invalid(
            &k.key("attention.value_length_swa"),
            v_swa,
            format!("must equal attention.key_length_swa ({head_dim_swa}), even, heads × length ≤ {MAX_WIDTH}"),
        ));
    }
    let rope_dims_swa = k
        .opt_int("rope.dimension_count_swa", 2, head_dim_swa)?
        .unwrap_or(rope_dims);
    if rope_dims_swa % 2 != 0 || rope_dims_swa > head_dim_swa {
        return Err(invalid(
            &k.key("rope.dimension_count_swa"),
            rope_dims_swa,
            format!("must be even and at most attention.key_length_swa ({head_dim_swa}) (absent: rope.dimension_count)"),
        ));
    }
    let shared = k
        .opt_int("attention.shared_kv_layers", 0, n_layer)?
        .unwrap_or(0);
    let n_layer_kv = n_layer - shared;
    let swa = |il: usize| window.is_some_and(|w| w.layers.get(il).copied().unwrap_or(false));
    if n_layer_kv < 2
        || (n_layer_kv..n_layer).any(|il| swa(il) != swa(n_layer_kv - if swa(il) { 2 } else { 1 }))
    {
        return Err(invalid(
            &k.key("attention.shared_kv_layers"),
            shared,
            "must leave at least two layers with their own KV, the last windowed then the last global",
        ));
    }
    let n_head_kv = match k.present("attention.head_count_kv") {
        true => k.per_layer("attention.head_count_kv", 1, n_head, n_layer)?,
        false => vec![n_head; n_layer],
    };
    let source = |il: usize| match il >= n_layer_kv {
        true => n_layer_kv - if swa(il) { 2 } else { 1 },
        false => il,
    };
    if let Some(il) = (0..n_layer).find(|&il| n_head_kv[il] != n_head_kv[source(il)]) {
        return Err(invalid(
            &k.key("attention.head_count_kv"),
            n_head_kv[il],
            format!(
                "must equal that of layer {}, whose KV layer {il} reuses",
                source(il)
            ),
        ));
    }
    if let Some(il) = (0..n_layer).find(|&il| !n_head.is_multiple_of(n_head_kv[il])) {
        return Err(invalid(
            &k.key("attention.head_count_kv"),
            n_head_kv[il],
            format!("must divide attention.head_count ({n_head}) in layer {il}"),
        ));
    }
    Ok(Gemma4Params {
        head_dim_swa,
        rope_dims_swa,
        n_head_kv,
        n_ff: k.per_layer("feed_forward_length", 1, MAX_WIDTH, n_layer)?,
        n_layer_kv,
        n_embd_per_layer: k.int("embedding_length_per_layer_input", 0, MAX_WIDTH)?,
    })
}

/// Mistral 3's YaRN parameters and attention temperature (see [`Mistral3Params`]); the
/// factor ggml's RoPE gets is llama.cpp's: under YaRN `mscale(1) / mscale(log_mul)` (or
/// `mscale(1)` without a log multiplier) divided by the `1 + 0.1 ln(factor)` ggml applies
/// itself, times `rope.scaling.attn_factor`.
fn mistral3_params(
    k: &Keys<'_>,
    n_ctx_train: usize,
    scaling: RopeScaling,
) -> Result<Mistral3Params> {
    // An optional float, finite and at least 0.
    let opt = |name: &str| -> Result<Option<f32>> {
        let key = k.key(name);
        match k.present(name) {
            false => Ok(None),
            true => {
                let v = k.gguf.get_f32(&key)?;
                match v.is_finite() && v >= 0.0 {
                    true => Ok(Some(v)),
                    false => Err(invalid(&key, v, "must be finite and >= 0")),
                }
            }
        }
    };
    let log_mul = opt("rope.scaling.yarn_log_multiplier")?.unwrap_or(0.0);
    let mut attn_factor = 1.0f32;
    if let RopeScaling::Yarn { factor, .. } = scaling {
        // As llama.cpp: the factor is the inverse of the frequency scale it keeps.
        let factor = 1.0 / (1.0 / factor);
        let mscale = |m: f32| match factor <= 1.0 {
            true => 1.0,
            false => 0.1 * m * factor.ln() + 1.0,
        };
        attn_factor = match log_mul != 0.0 {
            true => mscale(1.0) / mscale(log_mul),
            false => mscale(1.0),
        };
        attn_factor *= 1.0 / (1.0 + 0.1 * factor.ln());
    }
    attn_factor *= k
        .opt_positive("rope.scaling.attn_factor", f32::INFINITY)?
        .unwrap_or(1.0);
    Ok(Mistral3Params {
        yarn_beta_fast: opt("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
        yarn_beta_slow: opt("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
        rope_attn_factor: attn_factor,
        attn_temp_scale: opt("attention.temperature_scale")?.filter(|&s| s != 0.0),
        attn_temp_floor: k
            .opt_int("rope.scaling.original_context_length", 1, MAX_POSITIONS)?
            .unwrap_or(n_ctx_train),
    })
}

/// What each family sets beyond the common keys: scales, soft-caps and the sliding window.
fn family(k: &Keys<'_>, hp: &mut HParams) -> Result<()> {
    let (n_embd, n_head, n_layer) = (hp.n_embd, hp.n_head, hp.n_layer);
    match hp.arch {
        Arch::Gemma3 => {
            hp.embd_scale = Some((n_embd as f32).sqrt());
            // Gemma 3 27B scales by the model width per head rather than the head size.
            if n_layer == 62 {
                hp.attn_scale = 1.0 / ((n_embd / n_head) as f32).sqrt();
            }
            hp.final_softcap = k.opt_positive("final_logit_softcapping", f32::INFINITY)?;
            hp.sliding_window = sliding(k, n_layer, None, 6, 10_000.0)?;
        }
        Arch::Gemma2 => {
            hp.embd_scale = Some((n_embd as f32).sqrt());
            // Gemma 2 27B likewise.
            if n_layer == 46 {
                hp.attn_scale = 1.0 / ((n_embd / n_head) as f32).sqrt();
            }
            // Soft-capping is always on, with Gemma 2's values unless the file says.
            hp.final_softcap = Some(
                k.opt_positive("final_logit_softcapping", f32::INFINITY)?
                    .unwrap_or(30.0),
            );
            hp.attn_softcap = Some(
                k.opt_positive("attn_logit_softcapping", f32::INFINITY)?
                    .unwrap_or(50.0),
            );
            hp.sliding_window = sliding(k, n_layer, Some(4096), 2, hp.rope_freq_base)?;
        }
        Arch::GptOss => {
            // As llama.cpp's graph: scores scaled by the rotated dimensions.
            hp.attn_scale = 1.0 / (hp.rope_dims as f32).sqrt();
            // The window is required (as llama.cpp reads it); the first of every two layers
            // is windowed, rotating as the others do unless the file gives the windowed
            // layers their own base.
            let size = k.int("attention.sliding_window", 1, MAX_POSITIONS)?;
            hp.sliding_window =
                sliding(k, n_layer, Some(size), 2, hp.rope_freq_base)?.map(|w| SlidingWindow {
                    rope_scaled: true,
                    ..w
                });
        }
        Arch::Mistral3 => {
            hp.mistral3 = Some(mistral3_params(k, hp.n_ctx_train, hp.rope_scaling)?);
        }
        Arch::Gemma4 => {
            hp.embd_scale = Some((n_embd as f32).sqrt());
            // Q and K are RMS-normalised per head: no further scaling of the scores.
            hp.attn_scale = 1.0;
            hp.final_softcap = k.opt_positive("final_logit_softcapping", f32::INFINITY)?;
            let pattern = k.key("attention.sliding_window_pattern");
            if k.gguf.get(&pattern).and_then(|v| v.as_array()).is_none() {
                return Err(invalid(
                    &pattern,
                    "absent or not an array",
                    "must hold a flag per layer",
                ));
            }
            k.int("attention.sliding_window", 1, MAX_POSITIONS)?;
            hp.sliding_window = sliding(k, n_layer, None, 0, 10_000.0)?;
            hp.gemma4 = Some(gemma4_params(
                k,
                n_layer,
                n_head,
                hp.rope_dims,
                hp.sliding_window.as_ref(),
            )?);
        }
        Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next => {
            // The last blocks may be multi-token prediction heads, which are not run (as
            // llama.cpp's main graph): the model is the blocks before them.
            let nextn = k
                .opt_int("nextn_predict_layers", 0, n_layer - 1)?
                .unwrap_or(0);
            hp.n_layer = n_layer - nextn;
            hp.delta_net = Some(delta_net(k, hp.n_layer, n_layer, hp.rope_dims)?);
        }
        Arch::Lfm2 | Arch::Lfm2Moe => hp.short_conv = Some(super::lfm2::short_conv(k, n_layer)?),
        Arch::NemotronH => hp.mamba2 = Some(super::nemotron_h::mamba2(k, n_head, n_layer)?),
        Arch::GraniteHybrid => super::granite_hybrid::granite(k, hp)?,
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 | Arch::Qwen3Moe | Arch::Qwen2Moe => {}
    }
    Ok(())
}

/// The sliding window, if `attention.sliding_window` (else `default_size`) is present and not
/// 0: every layer but the last of each `pattern` consecutive ones is windowed
/// (`attention.sliding_window_pattern`, a period or a flag per layer, else `default_pattern`; 0
/// windows every layer), as llama.cpp lays them out. Windowed layers rotate with
/// `rope.freq_base_swa`, else `default_base`.
fn sliding(
    k: &Keys<'_>,
    n_layer: usize,
    default_size: Option<usize>,
    default_pattern: usize,
    default_base: f32,
) -> Result<Option<SlidingWindow>> {
    let size = match k
        .opt_int("attention.sliding_window", 0, MAX_POSITIONS)?
        .or(default_size)
    {
        None | Some(0) => return Ok(None),
        Some(size) => size,
    };
    let pattern_key = k.key("attention.sliding_window_pattern");
    // The pattern is either a flag per layer or a period.
    let layers = match k.gguf.get(&pattern_key).and_then(|v| v.as_array()) {
        Some(flags) => {
            if flags.len() != n_layer {
                return Err(invalid(
                    &pattern_key,
                    format!("{} flags", flags.len()),
                    format!("must hold one flag per layer ({n_layer})"),
                ));
            }
            (0..n_layer)
                .map(|il| match flags.get(il) {
                    Some(v) => v.as_bool().or(v.as_i64().map(|x| x != 0)).ok_or_else(|| {
                        invalid(&pattern_key, v.type_name(), "must be bools or integers")
                    }),
                    None => Ok(false),
                })
                .collect::<Result<Vec<bool>>>()?
        }
        None => {
            let pattern = k
                .opt_int("attention.sliding_window_pattern", 0, MAX_LAYERS)?
                .unwrap_or(default_pattern);
            (0..n_layer)
                .map(|il| pattern == 0 || il % pattern < pattern - 1)
                .collect()
        }
    };
    let rope_freq_base = k
        .opt_positive("rope.freq_base_swa", f32::INFINITY)?
        .unwrap_or(default_base);
    Ok(Some(SlidingWindow {
        size,
        layers,
        rope_freq_base,
        rope_scaled: false,
    }))
}

/// The vocabulary's size: `vocab_size`, else the count of `tokenizer.ggml.tokens`.
fn vocab_size(k: &Keys<'_>) -> Result<usize> {
    Ok(match k.present("vocab_size") {
        true => k.int("vocab_size", 1, MAX_POSITIONS)?,
        false => {
            let n = k.gguf.get_array("tokenizer.ggml.tokens")?.len();
            if n == 0 || n > MAX_POSITIONS {
                return Err(invalid(
                    "tokenizer.ggml.tokens",
                    format!("{n} tokens"),
                    format!("must hold 1..={MAX_POSITIONS} tokens"),
                ));
            }
            n
        }
    })
}

fn rope_scaling(k: &Keys<'_>, n_ctx_train: usize) -> Result<RopeScaling> {
    let type_key = k.key("rope.scaling.type");
    let kind = match k.gguf.get(&type_key) {
        None => "none",
        Some(_) => k.gguf.get_str(&type_key)?,
    };
    let factor = k.opt_positive("rope.scaling.factor", f32::INFINITY)?;
    let n_ctx_orig = k.opt_int("rope.scaling.original_context_length", 1, MAX_POSITIONS)?;
    // A factor of at most 1 means no scaling, as in llama.cpp.
    let factor = match factor {
        Some(f) if f > 1.0 => f,
        _ => return known_kind(&type_key, kind).map(|_| RopeScaling::None),
    };
    Ok(match known_kind(&type_key, kind)? {
        "linear" => RopeScaling::Linear { factor },
        "yarn" => RopeScaling::Yarn {
            factor,
            n_ctx_orig: n_ctx_orig.unwrap_or(n_ctx_train),
        },
        _ => RopeScaling::None,
    })
}

fn known_kind<'a>(key: &str, kind: &'a str) -> Result<&'a str> {
    match kind {
        "none" | "linear" | "yarn" => Ok(kind),
        other => Err(invalid(key, other, "must be none, linear or yarn")),
    }
}
