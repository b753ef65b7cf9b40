//! granitehybrid's (IBM's Granite 4.0 hybrids) hyperparameters and block tensors, as
//! llama.cpp's loader reads them: a layer whose `attention.head_count_kv` is 0 is a Mamba-2
//! layer (nemotron_h's tensors), the others attention (RoPE unless
//! `rope.scaling.finetuned` is false); every block then has `ffn_norm` and a SwiGLU network,
//! or with `expert_count` a mixture of experts (softmax routing, weights normalised) plus,
//! with `expert_shared_feed_forward_length`, an ungated shared expert.
//! Granite's multipliers: `embedding_scale` on the embeddings, `residual_scale` on each
//! branch before it joins the residual stream, `attention.scale` for the scores and
//! `logit_scale` dividing the logits (0 or absent: none).

use super::hparams::{invalid, Keys};
use super::nemotron_h::{mixer, sizes, Mixer};
use super::{Ffn, GateUp, HParams, LayerWeights, Mamba2, MixerKind, Role, SharedExpert, Specs};
use crate::error::Result;

/// Granite's multipliers and RoPE switch.
#[derive(Clone, Debug, PartialEq)]
pub struct GraniteScales {
    /// Factor on each block's mixer and network outputs (`residual_scale`).
    pub residual_scale: Option<f32>,
    /// The logits are divided by it (`logit_scale`).
    pub logit_scale: Option<f32>,
    /// Whether the attention layers rotate Q and K (`rope.scaling.finetuned`, true unless
    /// given).
    pub rope: bool,
}

/// An optional multiplier `name`: absent or 0 is none; otherwise finite and above 0.
fn scale(k: &Keys<'_>, name: &str) -> Result<Option<f32>> {
    let key = k.key(name);
    if k.gguf.get(&key).is_none() {
        return Ok(None);
    }
    match k.gguf.get_f32(&key)? {
        0.0 => Ok(None),
        v if v.is_finite() && v > 0.0 => Ok(Some(v)),
        v => Err(invalid(&key, v, "must be 0 (none), or finite and > 0")),
    }
}

/// Sets the granitehybrid fields of `hp`: its Mamba-2 layers (those whose
/// `attention.head_count_kv` is 0) and sizes, and its multipliers.
pub(super) fn granite(k: &Keys<'_>, hp: &mut HParams) -> Result<()> {
    let heads = k.per_layer("attention.head_count_kv", 0, hp.n_head, hp.n_layer)?;
    let kinds = heads
        .iter()
        .map(|&h| match h {
            0 => MixerKind::Mamba2,
            _ => MixerKind::Attention,
        })
        .collect();
    let m = sizes(k, kinds)?;
    // As llama.cpp: only an expansion factor of 2.
    if m.d_inner != 2 * hp.n_embd {
        return Err(invalid(
            &k.key("ssm.inner_size"),
            m.d_inner,
            format!("must be twice embedding_length ({})", 2 * hp.n_embd),
        ));
    }
    hp.mamba2 = Some(m);
    hp.embd_scale = scale(k, "embedding_scale")?;
    if let Some(s) = scale(k, "attention.scale")? {
        hp.attn_scale = s;
    }
    let rope = match k.gguf.get(&k.key("rope.scaling.finetuned")) {
        None => true,
        Some(v) => v.as_bool().ok_or_else(|| {
            invalid(
                &k.key("rope.scaling.finetuned"),
                "not a bool",
                "must be a bool",
            )
        })?,
    };
    hp.granite = Some(GraniteScales {
        residual_scale: scale(k, "residual_scale")?,
        logit_scale: scale(k, "logit_scale")?,
        rope,
    });
    Ok(())
}

/// Layer `l`'s weights, registered in `specs` with the shapes `hp` and `s` imply.
pub(super) fn layer_weights(
    specs: &mut Specs<'_>,
    hp: &HParams,
    s: &Mamba2,
    l: usize,
) -> Result<LayerWeights> {
    let e = hp.n_embd;
    let n = |s: &str| format!("blk.{l}.{s}");
    let (m, v) = (Role::Matrix, Role::Vector);
    let attn_norm = specs.require(&n("attn_norm.weight"), &[e], v)?;
    let Mixer {
        qkv,
        wo,
        bias,
        mamba2,
    } = mixer(specs, hp, s, l)?;
    let [bq, bk, bv, bo] = bias;
    let ffn_norm = specs.require(&n("ffn_norm.weight"), &[e], v)?;
    let (ff, exps) = (hp.n_ff, hp.experts.as_ref());
    let ffn = match exps {
        // Softmax routing, the chosen weights normalised; an ungated shared expert if any.
        Some(x) => Ffn::Experts {
            gate_inp: specs.require(&n("ffn_gate_inp.weight"), &[e, x.n_expert], m)?,
            gate_up: GateUp::Split {
                gate: specs.require(&n("ffn_gate_exps.weight"), &[e, ff, x.n_expert], m)?,
                up: specs.require(&n("ffn_up_exps.weight"), &[e, ff, x.n_expert], m)?,
            },
            down: specs.require(&n("ffn_down_exps.weight"), &[ff, e, x.n_expert], m)?,
            shared: match x.n_ff_shared {
                Some(sf) => Some(SharedExpert {
                    gate_inp: None,
                    gate: specs.require(&n("ffn_gate_shexp.weight"), &[e, sf], m)?,
                    up: specs.require(&n("ffn_up_shexp.weight"), &[e, sf], m)?,
                    down: specs.require(&n("ffn_down_shexp.weight"), &[sf, e], m)?,
                }),
                None => None,
            },
            biases: None,
            probs_bias: None,
        },
        None => Ffn::Dense {
            gate: Some(specs.require(&n("ffn_gate.weight"), &[e, ff], m)?),
            up: specs.require(&n("ffn_up.weight"), &[e, ff], m)?,
            down: specs.require(&n("ffn_down.weight"), &[ff, e], m)?,
        },
    };
    Ok(LayerWeights {
        attn_norm,
        qkv,
        wo,
        bo,
        bq,
        bk,
        bv,
        q_norm: None,
        k_norm: None,
        attn_sinks: None,
        post_attn_norm: None,
        post_ffn_norm: None,
        ffn_norm,
        ffn,
        gemma4: None,
        delta: None,
        short_conv: None,
        mamba2,
    })
}
