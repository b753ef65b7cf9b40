//! gemma3 (llama.cpp's `llm_build_gemma3`): token embeddings scaled by `sqrt(n_embd)`; in each
//! block an RMSNorm before and after attention and before and after a GELU-gated feed-forward
//! network; each head of Q and K RMS-normalised before NeoX RoPE; Q scaled before attention
//! (by `attn_scale`, the scores then unscaled); five of every six layers attend through a
//! sliding window with their own RoPE base. The output head is tied to the embeddings.

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
        let q = f.rope(g, q, il);
        let k = f.opt_norm(g, k, lw.k_norm);
        let k = f.rope(g, k, il);
        let q = g.scale(q, hp.attn_scale);
        let attn = f.attention(g, il, q, k, v, 1.0);
        let out = f.project(g, attn, lw.wo, None);

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
