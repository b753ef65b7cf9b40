//! granitehybrid (llama.cpp's `llama_model_granite_hybrid` graph): each block RMS-normed
//! (`attn_norm`) into a Mamba-2 layer (nemotron_h's, `nemotron_h::mamba2`) or an attention
//! layer (llama's RoPE unless the file turns it off; scores scaled by `attention.scale`),
//! whose output, times `residual_scale`, is added to the residual stream; then RMS-normed
//! (`ffn_norm`) into a SwiGLU network whose output, times `residual_scale` again, is added too.
//! The embeddings are multiplied by `embedding_scale` (`Forward::embed`) and the logits
//! divided by `logit_scale` (`Forward::head`).

use super::nemotron_h::mamba2;
use super::{Forward, Gate};
use crate::error::Result;
use crate::ggml::{Graph, Tensor};
use crate::model::{MixerKind, Qkv};

/// The blocks: the residual stream after the last one (only the rows that give outputs).
pub(super) fn blocks<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    f: &mut Forward<'_, 'g, 'w>,
) -> Result<Tensor<'g>> {
    let hp = f.hp;
    let (Some(s), Some(scales)) = (hp.mamba2.as_ref(), hp.granite.as_ref()) else {
        unreachable!("granitehybrid's hyperparameters give its layers and multipliers")
    };
    let residual_scale = |g: &mut Graph<'g, 'w>, t: Tensor<'g>| match scales.residual_scale {
        Some(r) => g.scale(t, r),
        None => t,
    };
    let mut x = f.embed(g);
    for il in 0..hp.n_layer {
        let lw = f.model.layer(il);
        let cur = f.norm(g, x, lw.attn_norm);
        let mixed = match (s.kinds[il], lw.mamba2, lw.qkv) {
            (MixerKind::Mamba2, Some(mw), Qkv::Fused(in_proj)) => {
                mamba2(g, f, il, s, &lw, mw, in_proj, cur)?
            }
            (MixerKind::Attention, _, _) => {
                let (mut q, mut k, v) = f.qkv(g, il, cur);
                if scales.rope {
                    q = f.rope(g, q, il);
                    k = f.rope(g, k, il);
                }
                let attn = f.attention(g, il, q, k, v, hp.attn_scale);
                f.project(g, attn, lw.wo, lw.bo)
            }
            _ => unreachable!("granitehybrid's layers load the tensors of their kind"),
        };
        // As llama.cpp: the rows that give outputs kept after the mixer of the last layer.
        let mixed = f.last_rows(g, il, mixed);
        let residual = f.last_rows(g, il, x);
        let mixed = residual_scale(g, mixed);
        let ffn_inp = g.add(mixed, residual);
        let h = f.norm(g, ffn_inp, lw.ffn_norm);
        let down = f.ffn(g, il, h, Gate::Silu);
        let down = residual_scale(g, down);
        x = g.add(down, ffn_inp);
    }
    Ok(x)
}
