//! The tensors of a qwen35 (or qwen35moe, qwen3next) block, as llama.cpp's loader names and
//! shapes them: a gated delta-net (input projection `attn_qkv`, output gate `attn_gate`,
//! convolution `ssm_conv1d`, `ssm_dt.bias`, `ssm_a`, `ssm_beta`, `ssm_alpha` (qwen3next: see
//! `qwen3next.rs`), `ssm_norm`, output `ssm_out`) or a gated attention (`attn_q` twice as wide
//! as the heads: each head's query, then its gate; `attn_k`, `attn_v`, or the three as one
//! `attn_qkv`; per-head norms, `attn_output`), then `post_attention_norm` and a SwiGLU network, or for the mixture
//! families the experts and their shared expert.

use super::layer::BetaAlpha;
use super::{Arch, DeltaNetWeights, Ffn, HParams, LayerWeights, Qkv, Role, Specs};
use crate::error::Result;

/// The recurrent (gated delta-net) layers of a hybrid model and their sizes, as llama.cpp
/// reads them from `ssm.*` keys.
#[derive(Clone, Debug, PartialEq)]
pub struct DeltaNet {
    /// Per layer: whether it is a delta-net (the others are attention layers).
    pub layers: Vec<bool>,
    /// Width of the causal convolution (`ssm.conv_kernel`); its state keeps `conv_kernel - 1`
    /// inputs.
    pub conv_kernel: usize,
    /// Key (and query) heads (`ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`ssm.time_step_rank`), a multiple of the key heads: value head `h` reads
    /// key head `h % n_k_heads`, or `h / (n_v_heads / n_k_heads)` when `grouped_heads`.
    pub n_v_heads: usize,
    /// Each key head serves consecutive value heads (qwen3next) rather than every
    /// `n_k_heads`-th one (qwen35).
    pub grouped_heads: bool,
    /// Dimension of a key and of a value head (`ssm.state_size`).
    pub head_dim: usize,
    /// The attention layers' M-RoPE sections (`rope.dimension_sections`; all 0 for qwen3next,
    /// whose attention rotates by NeoX RoPE).
    pub rope_sections: [i32; 4],
}

impl DeltaNet {
    /// Channels of the convolution: queries, keys, then values.
    pub fn conv_channels(&self) -> usize {
        self.head_dim * (2 * self.n_k_heads + self.n_v_heads)
    }

    /// f32 values of one sequence's convolution state in one layer.
    pub fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_channels()
    }

    /// f32 values of one sequence's delta-net state in one layer (a square matrix per value
    /// head).
    pub fn ssm_state_len(&self) -> usize {
        self.head_dim * self.head_dim * self.n_v_heads
    }
}

/// Layer `l`'s weights, registered in `specs` with the shapes `hp` and `d` imply.
pub(super) fn layer_weights(
    specs: &mut Specs<'_>,
    hp: &HParams,
    d: &DeltaNet,
    l: usize,
) -> Result<LayerWeights> {
    let (e, kv, q) = (hp.n_embd, hp.n_embd_kv(), hp.head_dim * hp.n_head);
    let n = |s: &str| format!("blk.{l}.{s}");
    let (m, v) = (Role::Matrix, Role::Vector);
    let attn_norm = specs.require(&n("attn_norm.weight"), &[e], v)?;
    let (qkv, wo, q_norm, k_norm, delta) = if d.layers[l] && hp.arch == Arch::Qwen3Next {
        let (qkv, wo, delta) = super::qwen3next::delta_weights(specs, hp, d, l)?;
        (qkv, wo, None, None, Some(delta))
    } else if d.layers[l] {
        let inner = d.head_dim * d.n_v_heads;
        let qkv = Qkv::Fused(specs.require(&n("attn_qkv.weight"), &[e, d.conv_channels()], m)?);
        let delta = DeltaNetWeights {
            gate: Some(specs.require(&n("attn_gate.weight"), &[e, inner], m)?),
            conv: specs.require(
                &n("ssm_conv1d.weight"),
                &[d.conv_kernel, d.conv_channels()],
                v,
            )?,
            dt_bias: specs.require(&n("ssm_dt.bias"), &[d.n_v_heads], v)?,
            a: specs.require(&n("ssm_a"), &[d.n_v_heads], v)?,
            beta_alpha: BetaAlpha::Split {
                beta: specs.require(&n("ssm_beta.weight"), &[e, d.n_v_heads], m)?,
                alpha: specs.require(&n("ssm_alpha.weight"), &[e, d.n_v_heads], m)?,
            },
            norm: specs.require(&n("ssm_norm.weight"), &[d.head_dim], v)?,
        };
        let wo = specs.require(&n("ssm_out.weight"), &[inner, e], m)?;
        (qkv, wo, None, None, Some(delta))
    } else {
        // One projection where the file has it (as llama.cpp reads either).
        let qkv = match specs.find(&n("attn_qkv.weight"), &[e, 2 * q + 2 * kv], m)? {
            Some(w) => Qkv::Fused(w),
            None => Qkv::Split {
                wq: specs.require(&n("attn_q.weight"), &[e, 2 * q], m)?,
                wk: specs.require(&n("attn_k.weight"), &[e, kv], m)?,
                wv: specs.require(&n("attn_v.weight"), &[e, kv], m)?,
            },
        };
        let wo = specs.require(&n("attn_output.weight"), &[q, e], m)?;
        let q_norm = specs.require(&n("attn_q_norm.weight"), &[hp.head_dim], v)?;
        let k_norm = specs.require(&n("attn_k_norm.weight"), &[hp.head_dim], v)?;
        (qkv, wo, Some(q_norm), Some(k_norm), None)
    };
    let ffn_norm = specs.require(&n("post_attention_norm.weight"), &[e], v)?;
    let ffn = match &hp.experts {
        Some(x) => super::layer::experts(specs, hp, x, l)?,
        None => Ffn::Dense {
            gate: Some(specs.require(&n("ffn_gate.weight"), &[e, hp.n_ff], m)?),
            up: specs.require(&n("ffn_up.weight"), &[e, hp.n_ff], m)?,
            down: specs.require(&n("ffn_down.weight"), &[hp.n_ff, e], m)?,
        },
    };
    Ok(LayerWeights {
        attn_norm,
        qkv,
        wo,
        bo: None,
        bq: None,
        bk: None,
        bv: None,
        q_norm,
        k_norm,
        post_attn_norm: None,
        post_ffn_norm: None,
        ffn_norm,
        ffn,
        attn_sinks: None,
        gemma4: None,
        delta,
        short_conv: None,
        mamba2: None,
    })
}
