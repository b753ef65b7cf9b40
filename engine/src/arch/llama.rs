//! llama, qwen2, qwen3, phi3, qwen3moe and qwen2moe (llama.cpp's graphs of the same names):
//! pre-norm blocks of RMSNorm, grouped-query attention with RoPE (adjacent pairs for llama,
//! halves (NeoX) for the others), Q/K/V biases where the file has them (qwen2, qwen2moe), each
//! head of Q and K RMS-normalised before RoPE (qwen3, qwen3moe), Q/K/V and gate/up fused in
//! single matrices (phi3), and a SwiGLU feed-forward network, or a mixture of experts (qwen3moe,
//! llama with experts; qwen2moe with its sigmoid-gated shared expert). The output head is tied
//! to the embedding table when the file has no `output.weight`.

use super::{Forward, Gate};
use crate::ggml::{Graph, Tensor};
use crate::model::Arch;

/// The transformer blocks: the residual stream after the last one.
pub(super) fn blocks<'g, 'w>(g: &mut Graph<'g, 'w>, f: &mut Forward<'_, 'g, 'w>) -> Tensor<'g> {
    let hp = f.hp;
    let mut x = f.embed(g);
    for il in 0..hp.n_layer {
        let lw = f.model.layer(il);
        let (q, k, v) = f.attention_inputs(g, il, x);
        let attn = if hp.arch == Arch::Phi3 {
            // phi3 scales Q before attention, the scores then unscaled (as llama.cpp).
            let q = g.scale(q, hp.attn_scale);
            f.attention(g, il, q, k, v, 1.0)
        } else {
            f.attention(g, il, q, k, v, hp.attn_scale)
        };
        // The output projection over every row, then only the rows that give logits (in the
        // last layer): the order llama.cpp takes, whose products over repacked weights depend
        // on the number of rows.
        let out = f.project(g, attn, lw.wo, lw.bo);
        let out = f.last_rows(g, il, out);
        let residual = f.last_rows(g, il, x);
        let x_attn = g.add(out, residual);

        let cur = f.norm(g, x_attn, lw.ffn_norm);
        let down = f.ffn(g, il, cur, Gate::Silu);
        x = g.add(down, x_attn);
    }
    x
}
