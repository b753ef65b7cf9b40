//! lfm2's hyperparameters and block tensors, as llama.cpp's loader reads them: a layer whose
//! `attention.head_count_kv` is 0 is a gated short convolution (`attn_norm`,
//! `shortconv.in_proj` giving B, C and x, the depthwise kernel `shortconv.conv`
//! (`[l_cache, n_embd]`, f32), `shortconv.out_proj`), the others qwen3-shaped attention
//! (`attn_q`, `attn_k`, `attn_v`, per-head `attn_q_norm` / `attn_k_norm`, `attn_output`); every
//! block then has `ffn_norm` and a SwiGLU network, or in lfm2moe past its leading dense blocks
//! a mixture of experts with `exp_probs_b`, the bias on the router's choice. The final norm is
//! `token_embd_norm`.

use super::hparams::{invalid, Keys};
use super::{Ffn, GateUp, HParams, LayerWeights, Qkv, Role, Specs};
use crate::error::Result;

/// The gated short-convolution layers of a hybrid model (lfm2) and their kernel width.
#[derive(Clone, Debug, PartialEq)]
pub struct ShortConv {
    /// Per layer: whether it is a short convolution (the others are attention layers).
    pub layers: Vec<bool>,
    /// Width of the causal depthwise convolution (`shortconv.l_cache`); its state keeps
    /// `l_cache - 1` inputs per channel.
    pub l_cache: usize,
}

impl ShortConv {
    /// f32 values of one sequence's convolution state in one layer of a model `n_embd` wide.
    pub fn conv_state_len(&self, n_embd: usize) -> usize {
        (self.l_cache - 1) * n_embd
    }
}

/// The per-layer `attention.head_count_kv` of an lfm2 file: 0 marks a short convolution.
fn head_counts(k: &Keys<'_>, n_head: usize, n_layer: usize) -> Result<Vec<usize>> {
    k.per_layer("attention.head_count_kv", 0, n_head, n_layer)
}

/// The key/value heads of an lfm2 file's attention layers: the one non-zero count of
/// `attention.head_count_kv`, which at least one layer must have.
pub(super) fn n_head_kv(k: &Keys<'_>, n_head: usize, n_layer: usize) -> Result<usize> {
    let counts = head_counts(k, n_head, n_layer)?;
    let mut attn = counts.iter().copied().filter(|&c| c > 0);
    let first = attn.next().ok_or_else(|| {
        invalid(
            &k.key("attention.head_count_kv"),
            "0 in every layer",
            "must give at least one attention layer its heads",
        )
    })?;
    if let Some(other) = attn.find(|&c| c != first) {
        return Err(invalid(
            &k.key("attention.head_count_kv"),
            other,
            format!("must be the same in every attention layer ({first})"),
        ));
    }
    Ok(first)
}

/// The short-convolution layers of an lfm2 file: those whose `attention.head_count_kv` is 0,
/// with `shortconv.l_cache`. Sliding-window attention (`attention.sliding_window` above 0) is
/// refused: it is not run here.
pub(super) fn short_conv(k: &Keys<'_>, n_layer: usize) -> Result<ShortConv> {
    let n_head = k.int("attention.head_count", 1, usize::MAX)?;
    let layers = head_counts(k, n_head, n_layer)?
        .iter()
        .map(|&c| c == 0)
        .collect();
    let l_cache = k.int("shortconv.l_cache", 2, 64)?;
    if let Some(w) = k.opt_int("attention.sliding_window", 0, usize::MAX)? {
        if w > 0 {
            return Err(invalid(
                &k.key("attention.sliding_window"),
                w,
                "must be 0 or absent (sliding-window lfm2 layers are not supported)",
            ));
        }
    }
    Ok(ShortConv { layers, l_cache })
}

/// Layer `l`'s weights, registered in `specs` with the shapes `hp` implies.
pub(super) fn layer_weights(specs: &mut Specs<'_>, hp: &HParams, l: usize) -> Result<LayerWeights> {
    let conv = hp.short_conv.as_ref().filter(|s| s.layers[l]);
    let e = hp.n_embd;
    let n = |s: &str| format!("blk.{l}.{s}");
    let (m, v) = (Role::Matrix, Role::Vector);
    let attn_norm = specs.require(&n("attn_norm.weight"), &[e], v)?;
    let (qkv, wo, q_norm, k_norm, short_conv) = match conv {
        Some(sc) => (
            Qkv::Fused(specs.require(&n("shortconv.in_proj.weight"), &[e, 3 * e], m)?),
            specs.require(&n("shortconv.out_proj.weight"), &[e, e], m)?,
            None,
            None,
            Some(specs.require(&n("shortconv.conv.weight"), &[sc.l_cache, e], v)?),
        ),
        None => {
            let (q, kv, hd) = (hp.head_dim * hp.n_head, hp.n_embd_kv(), hp.head_dim);
            let qkv = Qkv::Split {
                wq: specs.require(&n("attn_q.weight"), &[e, q], m)?,
                wk: specs.require(&n("attn_k.weight"), &[e, kv], m)?,
                wv: specs.require(&n("attn_v.weight"), &[e, kv], m)?,
            };
            let q_norm = specs.require(&n("attn_q_norm.weight"), &[hd], v)?;
            let k_norm = specs.require(&n("attn_k_norm.weight"), &[hd], v)?;
            let wo = specs.require(&n("attn_output.weight"), &[q, e], m)?;
            (qkv, wo, Some(q_norm), Some(k_norm), None)
        }
    };
    let ffn_norm = specs.require(&n("ffn_norm.weight"), &[e], v)?;
    let ffn = match hp.experts.as_ref().filter(|x| l >= x.n_dense_lead) {
        // lfm2moe past its dense leading blocks.
        Some(x) => Ffn::Experts {
            gate_inp: specs.require(&n("ffn_gate_inp.weight"), &[e, x.n_expert], m)?,
            gate_up: GateUp::Split {
                gate: specs.require(&n("ffn_gate_exps.weight"), &[e, x.n_ff_exp, x.n_expert], m)?,
                up: specs.require(&n("ffn_up_exps.weight"), &[e, x.n_ff_exp, x.n_expert], m)?,
            },
            down: specs.require(&n("ffn_down_exps.weight"), &[x.n_ff_exp, e, x.n_expert], m)?,
            shared: None,
            biases: None,
            probs_bias: Some(specs.require(&n("exp_probs_b.bias"), &[x.n_expert], v)?),
        },
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
        attn_sinks: None,
        post_attn_norm: None,
        post_ffn_norm: None,
        ffn_norm,
        ffn,
        gemma4: None,
        delta: None,
        short_conv,
        mamba2: None,
    })
}
