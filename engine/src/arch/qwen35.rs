//! qwen35 (llama.cpp's `llama_model_qwen35` graph): a hybrid of gated delta-net blocks and,
//! every few blocks, gated attention; each block is pre-normed, its mixer's output added to the
//! residual stream, then RMS-normed (`post_attention_norm`) into a SwiGLU network whose output
//! is added too.
//!
//! - Gated attention: Q's projection gives, per head, the query then a gate; Q and K are
//!   RMS-normed per head and rotated by interleaved M-RoPE over their first `rope_dims`
//!   dimensions (text positions in the first three sections); the attention's output is
//!   multiplied by `sigmoid(gate)` before the output projection.
//! - Gated delta-net: one projection gives the convolution's channels (queries, keys, values),
//!   another the output gate `z`; per value head `beta = sigmoid(ssm_beta · x)` and the decay
//!   `g = softplus(ssm_alpha · x + dt_bias) * a`. Each sequence's channels pass through the
//!   causal convolution after its previous inputs (its convolution state), then SiLU; queries
//!   and keys are L2-normalised (as llama.cpp: an RMSNorm with `eps / head_dim`, scaled by
//!   `1 / sqrt(head_dim)`), and ggml's gated delta rule runs from the sequence's state. Both
//!   states after the sequence's last token go to the slot written for it (`recurrent.rs`).
//!   The output is RMS-normed per head, multiplied by `silu(z)` and projected.
//!
//! Each sequence of a batch runs its own segment of the recurrent layers (its tokens in
//! order); everything else runs over the whole batch.
//!
//! qwen35moe (`llama_model_qwen35moe`) is the same with a mixture of experts and a shared
//! expert in place of the SwiGLU network; qwen3next (`llama_model_qwen3next`) too, with the
//! differences `qwen3next.rs` gives.

use super::{concat_tokens, qwen3next, rope_params, Forward, Gate};
use crate::error::{Error, Result};
use crate::ggml::RawTensor;
use crate::ggml::{DType, Graph, Tensor};
use crate::model::{Arch, BetaAlpha, DeltaNet, DeltaNetWeights, LayerWeights, Qkv};

/// The transformer blocks: the residual stream after the last one (only the rows that give
/// outputs).
pub(super) fn blocks<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    f: &mut Forward<'_, 'g, 'w>,
) -> Result<Tensor<'g>> {
    let hp = f.hp;
    let d = hp.delta_net.as_ref().ok_or_else(|| Error::Recurrent {
        what: "a qwen35 graph without delta-net hyperparameters".into(),
    })?;
    // M-RoPE positions, section by section: a text token is at `[p, p, p, 0]`.
    let n = f.n;
    let mut positions = Vec::with_capacity(16 * n);
    for _ in 0..3 {
        positions.extend_from_slice(&f.plan.positions);
    }
    positions.resize(16 * n, 0);
    let pos = g.input(DType::I32, &[4 * n], positions);
    let mut x = f.embed(g);
    for il in 0..hp.n_layer {
        let lw = f.model.layer(il);
        let cur = f.norm(g, x, lw.attn_norm);
        let mixed = match lw.delta {
            Some(dw) => delta_net(g, f, il, d, &lw, dw, cur)?,
            None => attention(g, f, il, d, &lw, cur, pos),
        };
        let x_mixed = g.add(mixed, x);
        let h = f.norm(g, x_mixed, lw.ffn_norm);
        let down = f.ffn(g, il, h, Gate::Silu);
        x = g.add(down, x_mixed);
    }
    // Row selection commutes with the final (per-row) norm.
    Ok(f.last_rows(g, hp.n_layer - 1, x))
}

/// Layer `il`'s gated attention on the normed input `cur`; `pos` the M-RoPE positions.
fn attention<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    f: &Forward<'_, 'g, 'w>,
    il: usize,
    d: &DeltaNet,
    lw: &LayerWeights<RawTensor<'w>>,
    cur: Tensor<'g>,
    pos: Tensor<'g>,
) -> Tensor<'g> {
    let hp = f.hp;
    let (hd, n_head, n_kv, n) = (hp.head_dim, hp.n_head, hp.n_head_kv, f.n);
    // Per token: per head its query's `hd` values then its gate's, then K, then V (three
    // products, or one whose rows are viewed apart).
    let (qg, k, v) = match lw.qkv {
        Qkv::Split { wq, wk, wv } => {
            let qg = f.project(g, cur, wq, None);
            let k = f.project(g, cur, wk, None);
            let v = f.project(g, cur, wv, None);
            (
                qg,
                g.reshape_3d(k, hd, n_kv, n),
                g.reshape_3d(v, hd, n_kv, n),
            )
        }
        Qkv::Fused(w) => {
            let all = f.project(g, cur, w, None);
            let (row, q_len) = (all.nb(1), 2 * hd * n_head);
            let k = g.view_3d(all, [hd, n_kv, n], [hd * 4, row], q_len * 4);
            let v = g.view_3d(all, [hd, n_kv, n], [hd * 4, row], (q_len + hd * n_kv) * 4);
            (all, k, g.cont(v))
        }
    };
    let strides = [2 * hd * 4, qg.nb(1)];
    let q = g.view_3d(qg, [hd, n_head, n], strides, 0);
    let gate = g.view_3d(qg, [hd, n_head, n], strides, hd * 4);
    let gate = g.cont(gate);
    let gate = g.reshape_2d(gate, hd * n_head, n);
    let q = f.opt_norm(g, q, lw.q_norm);
    let k = f.opt_norm(g, k, lw.k_norm);
    let (q, k) = match hp.arch {
        // qwen3next: NeoX RoPE at the tokens' positions.
        Arch::Qwen3Next => (f.rope(g, q, il), f.rope(g, k, il)),
        _ => {
            let p = rope_params(f.model, il);
            let q = g.rope_multi(q, pos, d.rope_sections, &p);
            (q, g.rope_multi(k, pos, d.rope_sections, &p))
        }
    };
    let attn = f.attention(g, il, q, k, v, hp.attn_scale);
    let gate = g.sigmoid(gate);
    let attn = g.mul(attn, gate);
    f.project(g, attn, lw.wo, None)
}

/// llama.cpp's L2 norm of each row of `x` (`len` values): an RMSNorm with `eps / len`,
/// scaled by `1 / sqrt(len)`.
fn l2_norm<'g>(g: &mut Graph<'g, '_>, x: Tensor<'g>, eps: f32, len: usize) -> Tensor<'g> {
    let n = len as f32;
    let x = g.rms_norm(x, eps / n);
    g.scale(x, 1.0 / n.sqrt())
}

/// Layer `il`'s gated delta-net on the normed input `cur`, each sequence from its slot.
fn delta_net<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    f: &Forward<'_, 'g, 'w>,
    il: usize,
    d: &DeltaNet,
    lw: &LayerWeights<RawTensor<'w>>,
    dw: DeltaNetWeights<RawTensor<'w>>,
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
    let (hdim, n_k, n_v, n) = (d.head_dim, d.n_k_heads, d.n_v_heads, f.n);
    let channels = d.conv_channels();
    let Qkv::Fused(wqkv) = lw.qkv else {
        unreachable!("qwen35's delta-net layers load a fused projection")
    };
    let (qkv, z) = match dw.gate {
        Some(gate) => (f.project(g, cur, wqkv, None), f.project(g, cur, gate, None)),
        None => qwen3next::split_qkvz(g, f, d, wqkv, cur),
    };
    let (beta, alpha) = match dw.beta_alpha {
        BetaAlpha::Split { beta, alpha } => (
            f.project(g, cur, beta, None),
            f.project(g, cur, alpha, None),
        ),
        BetaAlpha::Fused(ba) => qwen3next::beta_alpha(g, f, d, ba, cur),
    };
    let beta = g.sigmoid(beta);
    let dt_bias = g.lift(dw.dt_bias);
    let alpha = g.add(alpha, dt_bias);
    let alpha = g.softplus(alpha);
    let a = g.lift(dw.a);
    let decay = g.mul(alpha, a);

    let conv_states = g.lift_mut(state.tensors.conv(r));
    let ssm_states = g.lift_mut(state.tensors.ssm(r));
    let ssm_row = d.ssm_state_len() * 4;
    let kernel = g.lift(dw.conv);
    let eps = f.hp.rms_eps;
    let mut outs = Vec::with_capacity(state.slots.len());
    for i in super::items_in_row_order(f.plan) {
        let (rows, slot) = (&f.plan.token_rows[i], state.slots[i]);
        let (first, m) = (rows.start, rows.len());
        // This sequence's channels.
        let x = g.view_2d(qkv, channels, m, qkv.nb(1), first * qkv.nb(1));
        let conv = super::causal_conv(g, conv_states, kernel, x, slot);
        let conv = g.silu(conv);
        let row = conv.nb(1);
        let q = g.view_4d(conv, [hdim, n_k, m, 1], [hdim * 4, row, row * m], 0);
        let k = g.view_4d(
            conv,
            [hdim, n_k, m, 1],
            [hdim * 4, row, row * m],
            hdim * n_k * 4,
        );
        let v = g.view_4d(
            conv,
            [hdim, n_v, m, 1],
            [hdim * 4, row, row * m],
            2 * hdim * n_k * 4,
        );
        let mut q = l2_norm(g, q, eps, hdim);
        let mut k = l2_norm(g, k, eps, hdim);
        if d.grouped_heads {
            q = qwen3next::repeat_key_heads(g, d, q, m);
            k = qwen3next::repeat_key_heads(g, d, k, m);
        }
        let per_token = [4, n_v * 4, n_v * 4 * m];
        let gd = g.view_4d(decay, [1, n_v, m, 1], per_token, first * n_v * 4);
        let b = g.view_4d(beta, [1, n_v, m, 1], per_token, first * n_v * 4);
        let s0 = g.view_4d(
            ssm_states.as_tensor(),
            [hdim, hdim, n_v, 1],
            [hdim * 4, hdim * hdim * 4, ssm_row],
            slot.src * ssm_row,
        );
        let out = g.gated_delta_net(q, k, v, gd, b, s0);
        let o_bytes = hdim * n_v * m * 4;
        let o = g.view_3d(out, [hdim, n_v, m], [hdim * 4, hdim * n_v * 4], 0);
        let s1 = g.view_2d(out, d.ssm_state_len(), 1, ssm_row, o_bytes);
        let stored = g.store(ssm_states, slot.dst * ssm_row, s1);
        g.expand(stored);
        outs.push(o);
    }
    let o = concat_tokens(g, outs);
    let normed = f.norm(g, o, dw.norm);
    let z = g.reshape_3d(z, hdim, n_v, n);
    let z = g.silu(z);
    let gated = g.mul(normed, z);
    let flat = g.reshape_2d(gated, hdim * n_v, n);
    Ok(f.project(g, flat, lw.wo, None))
}
