//! llama, qwen2 and qwen3 (llama.cpp's `llm_build_llama`, `llm_build_qwen2`, `llm_build_qwen3`):
//! pre-norm blocks of RMSNorm, grouped-query attention with RoPE (adjacent pairs for llama,
//! halves (NeoX) for qwen2 and qwen3), Q/K/V biases where the file has them (qwen2), each head
//! of Q and K RMS-normalised before RoPE (qwen3), and a SwiGLU feed-forward network. The output
//! head is tied to the embedding table when the file has no `output.weight`.

use super::{Forward, Gate};
use crate::ggml::{Graph, Tensor};

/// The transformer blocks: the residual stream after the last one.
pub(super) fn blocks<'g, 'w>(g: &mut Graph<'g, 'w>, f: &mut Forward<'_, 'g, 'w>) -> Tensor<'g> {
    let hp = f.hp;
    let (head_dim, n) = (hp.head_dim, f.n);
    let mut x = f.embed(g);
    for il in 0..hp.n_layer {
        let lw = f.model.layer(il);
        let cur = f.norm(g, x, lw.attn_norm);
        let q = f.project(g, cur, lw.wq, lw.bq);
        let k = f.project(g, cur, lw.wk, lw.bk);
        let v = f.project(g, cur, lw.wv, lw.bv);
        let q = g.reshape_3d(q, head_dim, hp.n_head, n);
        let k = g.reshape_3d(k, head_dim, hp.n_head_kv, n);
        let q = f.opt_norm(g, q, lw.q_norm);
        let k = f.opt_norm(g, k, lw.k_norm);
        let q = f.rope(g, q, il);
        let k = f.rope(g, k, il);
        let attn = f.attention(g, il, q, k, v, hp.attn_scale);

        let attn = f.last_rows(g, il, attn);
        let residual = f.last_rows(g, il, x);
        let out = f.project(g, attn, lw.wo, None);
        let x_attn = g.add(out, residual);

        let cur = f.norm(g, x_attn, lw.ffn_norm);
        let down = f.ffn(g, il, cur, Gate::Silu);
        x = g.add(down, x_attn);
    }
    x
}
