//! The tensors of a qwen3next (Qwen3-Next) delta-net block, as llama.cpp's loader names and
//! shapes them: qwen35's, except that beta and alpha come from one projection, `ssm_ba`
//! (`[n_embd, 2 * n_v_heads]`: per key head, the betas of its value heads, then their
//! alphas), and that older files give queries, keys, values and the output gate `z` from one
//! projection, `ssm_in`, in place of `attn_qkv` and `attn_gate`.

use super::layer::BetaAlpha;
use super::{DeltaNet, DeltaNetWeights, HParams, Qkv, Role, Specs};
use crate::error::Result;

/// Layer `l`'s delta-net: its input projection, output projection and further tensors,
/// registered in `specs` with the shapes `hp` and `d` imply.
pub(super) fn delta_weights(
    specs: &mut Specs<'_>,
    hp: &HParams,
    d: &DeltaNet,
    l: usize,
) -> Result<(Qkv<usize>, usize, DeltaNetWeights<usize>)> {
    let e = hp.n_embd;
    let n = |s: &str| format!("blk.{l}.{s}");
    let (m, v) = (Role::Matrix, Role::Vector);
    let inner = d.head_dim * d.n_v_heads;
    // The older layout: queries, keys, values and `z` from one projection, laid out per key
    // head (see `arch/qwen3next.rs`).
    let legacy = specs.gguf.tensor(&n("attn_qkv.weight")).is_none()
        && specs.gguf.tensor(&n("ssm_in.weight")).is_some();
    let (qkv, gate) = match legacy {
        true => {
            let w = specs.require(&n("ssm_in.weight"), &[e, d.conv_channels() + inner], m)?;
            (Qkv::Fused(w), None)
        }
        false => {
            let w = specs.require(&n("attn_qkv.weight"), &[e, d.conv_channels()], m)?;
            let gate = specs.require(&n("attn_gate.weight"), &[e, inner], m)?;
            (Qkv::Fused(w), Some(gate))
        }
    };
    let delta = DeltaNetWeights {
        gate,
        conv: specs.require(
            &n("ssm_conv1d.weight"),
            &[d.conv_kernel, d.conv_channels()],
            v,
        )?,
        dt_bias: specs.require(&n("ssm_dt.bias"), &[d.n_v_heads], v)?,
        a: specs.require(&n("ssm_a"), &[d.n_v_heads], v)?,
        beta_alpha: BetaAlpha::Fused(specs.require(
            &n("ssm_ba.weight"),
            &[e, 2 * d.n_v_heads],
            m,
        )?),
        norm: specs.require(&n("ssm_norm.weight"), &[d.head_dim], v)?,
    };
    let wo = specs.require(&n("ssm_out.weight"), &[inner, e], m)?;
    Ok((qkv, wo, delta))
}
