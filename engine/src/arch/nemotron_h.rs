//! nemotron_h (llama.cpp's `llama_model_nemotron_h` graph): each block RMS-normed
//! (`attn_norm`) into one mixer whose output is added to the residual stream; the final norm is
//! `output_norm`. The mixers:
//!
//! - Mamba-2: one projection gives z, the convolution's channels (x, B, C) and dt. The
//!   channels pass through a causal depthwise convolution of width `d_conv` after the
//!   sequence's previous `d_conv - 1` inputs (its convolution state), plus its bias, then
//!   SiLU; ggml's selective scan runs from the sequence's SSM state with `dt + dt_bias`, A, B
//!   and C, `D * x` is added, the result gated by `silu(z)`, RMS-normed per group and
//!   projected. Both states after the sequence's last token go to the slot written for it
//!   (`recurrent.rs`).
//! - Attention: grouped-query attention without RoPE, scores scaled by `1 / sqrt(head_dim)`.
//! - Feed-forward: `down · relu(up · x)²`.
//!
//! Each sequence of a batch runs its own segment of the convolution and the scan (its tokens
//! in order); everything else runs over the whole batch.

use super::{concat_tokens, Forward};
use crate::error::{Error, Result};
use crate::ggml::{Graph, RawTensor, Tensor};
use crate::model::{LayerWeights, Mamba2, Mamba2Weights, MixerKind, Qkv};

/// The blocks: the residual stream after the last one (only the rows that give outputs).
pub(super) fn blocks<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    f: &mut Forward<'_, 'g, 'w>,
) -> Result<Tensor<'g>> {
    let hp = f.hp;
    let Some(s) = hp.mamba2.as_ref() else {
        unreachable!("nemotron_h's hyperparameters give its layers")
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
                let (q, k, v) = f.qkv(g, il, cur);
                let attn = f.attention(g, il, q, k, v, hp.attn_scale);
                f.project(g, attn, lw.wo, lw.bo)
            }
            (MixerKind::Mlp, _, Qkv::Fused(up)) => {
                let h = f.project(g, cur, up, None);
                let h = g.relu_sqr(h);
                f.project(g, h, lw.wo, None)
            }
            _ => unreachable!("nemotron_h's layers load the tensors of their kind"),
        };
        // As llama.cpp: the rows that give outputs kept after the mixer of the last layer.
        let mixed = f.last_rows(g, il, mixed);
        let residual = f.last_rows(g, il, x);
        x = g.add(residual, mixed);
    }
    Ok(x)
}

/// Layer `il`'s Mamba-2 mixer on the normed input `cur`, each sequence from its slot.
#[allow(clippy::too_many_arguments)]
pub(super) fn mamba2<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    f: &Forward<'_, 'g, 'w>,
    il: usize,
    s: &Mamba2,
    lw: &LayerWeights<RawTensor<'w>>,
    mw: Mamba2Weights<RawTensor<'w>>,
    in_proj: RawTensor<'w>,
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
    let (n, ch) = (f.n, s.conv_channels());
    let (d_inner, n_head, hdim) = (s.d_inner, s.n_head, s.head_dim());
    let (d_state, n_group) = (s.d_state, s.n_group);
    let zxbcdt = f.project(g, cur, in_proj, None);
    let row = zxbcdt.nb(1);
    let dt = g.view_2d(zxbcdt, n_head, n, row, (d_inner + ch) * 4);
    let dt = g.cont(dt);
    let dt_bias = g.lift(mw.dt_bias);
    let dt = g.add(dt, dt_bias);
    let (kernel, conv_bias) = (g.lift(mw.conv), g.lift(mw.conv_bias));
    let (a, d) = (g.lift(mw.a), g.lift(mw.d));

    let conv_states = g.lift_mut(state.tensors.conv(r));
    let ssm_states = g.lift_mut(state.tensors.ssm(r));
    let ssm_row = s.ssm_state_len() * 4;
    let mut outs = Vec::with_capacity(state.slots.len());
    for i in super::items_in_row_order(f.plan) {
        let (rows, slot) = (&f.plan.token_rows[i], state.slots[i]);
        let (first, m) = (rows.start, rows.len());
        // This sequence's channels.
        let xbc = g.view_2d(zxbcdt, ch, m, row, first * row + d_inner * 4);
        let conv = super::causal_conv(g, conv_states, kernel, xbc, slot);
        let conv = g.add(conv, conv_bias);
        let conv = g.silu(conv);
        let crow = conv.nb(1);
        let x = g.view_4d(conv, [hdim, n_head, m, 1], [hdim * 4, crow, crow * m], 0);
        let group = [d_state * 4, crow, crow * m];
        let b = g.view_4d(conv, [d_state, n_group, m, 1], group, d_inner * 4);
        let c_off = (d_inner + n_group * d_state) * 4;
        let c = g.view_4d(conv, [d_state, n_group, m, 1], group, c_off);
        let dt_seg = g.view_3d(
            dt,
            [n_head, m, 1],
            [n_head * 4, n_head * 4 * m],
            first * n_head * 4,
        );
        let dt_seg = g.cont(dt_seg);
        let s0 = g.view_4d(
            ssm_states.as_tensor(),
            [d_state, hdim, n_head, 1],
            [d_state * 4, d_state * hdim * 4, ssm_row],
            slot.src * ssm_row,
        );
        let out = g.ssm_scan(s0, x, dt_seg, a, b, c);
        let y_bytes = d_inner * m * 4;
        let y = g.view_3d(out, [hdim, n_head, m], [hdim * 4, d_inner * 4], 0);
        let s1 = g.view_2d(out, s.ssm_state_len(), 1, ssm_row, y_bytes);
        let stored = g.store(ssm_states, slot.dst * ssm_row, s1);
        g.expand(stored);
        let x3 = g.view_3d(conv, [hdim, n_head, m], [hdim * 4, crow], 0);
        let skip = g.mul(x3, d);
        outs.push(g.add(y, skip));
    }
    let y = concat_tokens(g, outs);
    let z = g.view_2d(zxbcdt, d_inner, n, row, 0);
    let z = g.cont(z);
    let z = g.reshape_3d(z, hdim, n_head, n);
    let y = g.swiglu(z, y);
    // The gated output RMS-normed per group.
    let y = g.reshape_3d(y, d_inner / n_group, n_group, n);
    let y = f.norm(g, y, mw.norm);
    let y = g.reshape_2d(y, d_inner, n);
    Ok(f.project(g, y, lw.wo, None))
}
