//! lfm2 (llama.cpp's `llama_model_lfm2` graph): a hybrid of gated short convolutions and
//! grouped-query attention. Each block is pre-normed (`attn_norm`), its mixer's output added
//! to the residual stream, then RMS-normed (`ffn_norm`) into a SwiGLU network whose output is
//! added too; the final norm is the file's `token_embd_norm`.
//!
//! - Attention: qwen3's: each head of Q and K RMS-normed, NeoX RoPE, scores scaled by
//!   `1 / sqrt(head_dim)`.
//! - Gated short convolution: one projection gives three `n_embd`-wide chunks `B`, `C` and
//!   `x`; `B * x` passes through a causal depthwise convolution of width `l_cache` after the
//!   sequence's previous `l_cache - 1` values (its convolution state), the result is multiplied
//!   by `C` and projected. The last `l_cache - 1` values go to the slot written for the
//!   sequence (`recurrent.rs`).
//!
//! Each sequence of a batch runs its own segment of the convolution (its tokens in order);
//! everything else runs over the whole batch.

use super::{causal_conv, concat_tokens, items_in_row_order, Forward, Gate};
use crate::error::{Error, Result};
use crate::ggml::{Graph, RawTensor, Tensor};
use crate::model::{LayerWeights, Qkv};

/// The transformer blocks: the residual stream after the last one (only the rows that give
/// outputs).
pub(super) fn blocks<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    f: &mut Forward<'_, 'g, 'w>,
) -> Result<Tensor<'g>> {
    let hp = f.hp;
    let mut x = f.embed(g);
    for il in 0..hp.n_layer {
        let lw = f.model.layer(il);
        let cur = f.norm(g, x, lw.attn_norm);
        let mixed = match lw.short_conv {
            Some(kernel) => short_conv(g, f, il, &lw, kernel, cur)?,
            None => {
                let (q, k, v) = f.qkv(g, il, cur);
                let q = f.opt_norm(g, q, lw.q_norm);
                let k = f.opt_norm(g, k, lw.k_norm);
                let q = f.rope(g, q, il);
                let k = f.rope(g, k, il);
                let attn = f.attention(g, il, q, k, v, hp.attn_scale);
                f.project(g, attn, lw.wo, None)
            }
        };
        // As llama.cpp: the rows that give outputs kept after the mixer of the last layer.
        let mixed = f.last_rows(g, il, mixed);
        let residual = f.last_rows(g, il, x);
        let x_mixed = g.add(residual, mixed);
        let h = f.norm(g, x_mixed, lw.ffn_norm);
        let down = f.ffn(g, il, h, Gate::Silu);
        x = g.add(x_mixed, down);
    }
    Ok(x)
}

/// Layer `il`'s gated short convolution (depthwise `kernel`, `[l_cache, n_embd]`) on the
/// normed input `cur`, each sequence from its slot.
fn short_conv<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    f: &Forward<'_, 'g, 'w>,
    il: usize,
    lw: &LayerWeights<RawTensor<'w>>,
    kernel: RawTensor<'w>,
    cur: Tensor<'g>,
) -> Result<Tensor<'g>> {
    let missing = || Error::Recurrent {
        what: format!("a graph without the state of recurrent layer {il}"),
    };
    let state = f.state.ok_or_else(missing)?;
    let r = state.index.get(il).copied().flatten().ok_or_else(missing)?;
    if state.slots.len() != f.plan.token_rows.len() {
        return Err(missing());
    }
    let Qkv::Fused(in_proj) = lw.qkv else {
        unreachable!("lfm2's convolution layers load one input projection")
    };
    let (e, n) = (f.hp.n_embd, f.n);
    let bcx = f.project(g, cur, in_proj, None);
    let row = bcx.nb(1);
    let b = g.view_2d(bcx, e, n, row, 0);
    let c = g.view_2d(bcx, e, n, row, e * 4);
    let x = g.view_2d(bcx, e, n, row, 2 * e * 4);
    let bx = g.mul(b, x);

    let kernel = g.lift(kernel);
    let conv_states = g.lift_mut(state.tensors.conv(r));
    let mut outs = Vec::with_capacity(state.slots.len());
    for i in items_in_row_order(f.plan) {
        let (rows, slot) = (&f.plan.token_rows[i], state.slots[i]);
        let (first, m) = (rows.start, rows.len());
        // This sequence's channels.
        let seg = g.view_2d(bx, e, m, bx.nb(1), first * bx.nb(1));
        // `[e, m, 1]`, its tokens made the third dimension to be joined.
        let conv = causal_conv(g, conv_states, kernel, seg, slot);
        outs.push(g.reshape_3d(conv, e, 1, m));
    }
    let conv = concat_tokens(g, outs);
    let conv = g.reshape_2d(conv, e, n);
    let y = g.mul(c, conv);
    Ok(f.project(g, y, lw.wo, None))
}
