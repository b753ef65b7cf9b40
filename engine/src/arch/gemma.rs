//! gemma2 and gemma3 (llama.cpp's `llama_model_gemma2` and `llama_model_gemma3` graphs): token
//! embeddings scaled by `sqrt(n_embd)`; in each block an RMSNorm before and after attention and
//! before and after a GELU-gated feed-forward network; NeoX RoPE; Q scaled before attention (by
//! `attn_scale`, the scores then unscaled). gemma3 RMS-normalises each head of Q and K before
//! RoPE, and windows five of every six layers, which rotate with their own RoPE base; gemma2
//! windows every other layer and soft-caps attention scores and the logits (the attention's
//! cap is applied by [`Forward::attention`], the logits' by the head). The output head is tied
//! to the embeddings.

use super::{Forward, Gate};
use crate::ggml::{Graph, Tensor};

/// The transformer blocks: the residual stream after the last one.
pub(super) fn blocks<'g, 'w>(g: &mut Graph<'g, 'w>, f: &mut Forward<'_, 'g, 'w>) -> Tensor<'g> {
    let hp = f.hp;
    let mut x = f.embed(g);
    for il in 0..hp.n_layer {
        let lw = f.model.layer(il);
        let (q, k, v) = f.attention_inputs(g, il, x);
        let q = g.scale(q, hp.attn_scale);
        let attn = f.attention(g, il, q, k, v, 1.0);
        let out = f.project(g, attn, lw.wo, lw.bo);

        let out = f.last_rows(g, il, out);
        let residual = f.last_rows(g, il, x);
        let out = f.opt_norm(g, out, lw.post_attn_norm);
        let x_attn = g.add(out, residual);

        let cur = f.norm(g, x_attn, lw.ffn_norm);
        let down = f.ffn(g, il, cur, Gate::Gelu);
        let down = f.opt_norm(g, down, lw.post_ffn_norm);
        x = g.add(down, x_attn);
    }
    x
}
