//! gemma4 (llama.cpp's `llama_model_gemma4` graph), the text model. What differs from gemma3:
//!
//! - attention is not scaled: Q and K are RMS-normalised per head (with weights) and V too
//!   (without), then Q and K rotated (NeoX);
//! - windowed and global layers have their own head size and rotated dimensions; global layers
//!   rotate through `rope_freqs` (proportional RoPE), windowed ones with their own base;
//! - the last layers have no KV of their own: they attend over the cache of the last earlier
//!   layer of their kind ([`HParams::kv_layer`](crate::model::HParams::kv_layer));
//! - per-layer inputs: a per-layer token table plus a projection of the embeddings gives each
//!   layer a small vector, which gates a GELU of the block's output, projected back and added;
//! - an optional scalar on each block's output;
//! - optionally a mixture of GELU experts beside the dense network (router on the normalised
//!   residual times a scale vector, softmax, the chosen weights normalised, a per-expert scale
//!   on their outputs), each branch with its own norms, their sum post-normed.
//!
//! The logits are soft-capped when the file says so.

use super::{Forward, Gate};
use crate::ggml::{Graph, RawTensor, Tensor};
use crate::model::{GateUp, Gemma4Layer, Qkv};

/// The transformer blocks: the residual stream after the last one.
pub(super) fn blocks<'g, 'w>(g: &mut Graph<'g, 'w>, f: &mut Forward<'_, 'g, 'w>) -> Tensor<'g> {
    let hp = f.hp;
    let mut x = f.embed(g);
    let per_layer = per_layer_inputs(g, f, x);
    for il in 0..hp.n_layer {
        let lw = f.model.layer(il);
        let ex = lw
            .gemma4
            .unwrap_or_else(|| unreachable!("gemma4 layers are loaded with their extras"));
        let cur = f.norm(g, x, lw.attn_norm);
        let attn = if ex.has_kv {
            let (q, k, v) = f.qkv(g, il, cur);
            let q = f.opt_norm(g, q, lw.q_norm);
            let q = f.rope(g, q, il);
            let k = f.opt_norm(g, k, lw.k_norm);
            let v = g.rms_norm(v, hp.rms_eps);
            let k = f.rope(g, k, il);
            f.attention(g, il, q, k, v, hp.attn_scale)
        } else {
            let q = query(g, f, il, cur);
            let q = f.opt_norm(g, q, lw.q_norm);
            let q = f.rope(g, q, il);
            f.attention_shared(g, il, q, hp.attn_scale)
        };
        let out = f.project(g, attn, lw.wo, None);
        let out = f.last_rows(g, il, out);
        let residual = f.last_rows(g, il, x);
        let out = f.opt_norm(g, out, lw.post_attn_norm);
        let attn_out = g.add(out, residual);

        let cur = f.norm(g, attn_out, lw.ffn_norm);
        let dense = f.ffn(g, il, cur, Gate::Gelu);
        let cur = match ex.moe {
            None => dense,
            Some(m) => {
                let dense = f.norm(g, dense, m.post_norm_1);
                let moe_in = f.norm(g, attn_out, m.pre_norm_2);
                // The router reads the residual, normalised without weights and scaled.
                let r = g.rms_norm(attn_out, hp.rms_eps);
                let r = g.scale(r, 1.0 / (hp.n_embd as f32).sqrt());
                let s = g.lift(m.gate_inp_s);
                let r = g.mul(r, s);
                let logits = f.project(g, r, m.gate_inp, None);
                let moe = experts(g, f, moe_in, logits, &ex);
                let moe = f.norm(g, moe, m.post_norm_2);
                g.add(dense, moe)
            }
        };
        let cur = f.opt_norm(g, cur, lw.post_ffn_norm);
        let mut cur = g.add(cur, attn_out);

        if let (Some(inputs), Some([gate, proj, norm])) = (per_layer, ex.per_layer) {
            let n_pl = inputs.ne(0);
            let t = f.project(g, cur, gate, None);
            let t = g.gelu(t);
            let this = g.view_2d(inputs, n_pl, f.n, inputs.nb(1), il * inputs.nb(2));
            let this = f.last_rows(g, il, this);
            let t = g.mul(t, this);
            let t = f.project(g, t, proj, None);
            let t = f.norm(g, t, norm);
            cur = g.add(cur, t);
        }
        if let Some(s) = ex.out_scale {
            let s = g.lift(s);
            cur = g.mul(cur, s);
        }
        x = cur;
    }
    x
}

/// Layer `il`'s Q (`[head_dim, n_head, n]`) alone, for layers that reuse another's KV.
fn query<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    f: &Forward<'_, 'g, 'w>,
    il: usize,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let (hd, n_head, n) = (f.hp.head_dim_at(il), f.hp.n_head, f.n);
    match f.model.layer(il).qkv {
        Qkv::Split { wq, .. } => {
            let q = f.project(g, x, wq, None);
            g.reshape_3d(q, hd, n_head, n)
        }
        Qkv::Fused(w) => {
            let qkv = f.project(g, x, w, None);
            let q = g.view_2d(qkv, hd * n_head, n, qkv.nb(1), 0);
            let q = g.cont(q);
            g.reshape_3d(q, hd, n_head, n)
        }
    }
}

/// The per-layer inputs (`[n_pl, n, n_layer]`) from the scaled embeddings `x`, when the model
/// has them: each token's row of the per-layer table (scaled by `sqrt(n_pl)`) plus the
/// projection of `x` (scaled by `1/sqrt(n_embd)`, each layer's part RMS-normalised), the sum
/// scaled by `1/sqrt(2)`.
fn per_layer_inputs<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    f: &Forward<'_, 'g, 'w>,
    x: Tensor<'g>,
) -> Option<Tensor<'g>> {
    let [table, proj, norm] = f.model.per_layer_inputs()?;
    let hp = f.hp;
    let n_pl = hp.gemma4.as_ref()?.n_embd_per_layer;
    let (n_layer, n) = (hp.n_layer, f.n);
    let table = g.lift(table);
    let rows = g.get_rows(table, f.ids);
    let rows = g.reshape_3d(rows, n_pl, n_layer, n);
    let rows = g.scale(rows, (n_pl as f32).sqrt());
    let p = f.project(g, x, proj, None);
    let p = g.scale(p, 1.0 / (hp.n_embd as f32).sqrt());
    let p = g.reshape_3d(p, n_pl, n_layer, n);
    let p = f.norm(g, p, norm);
    let sum = g.add(p, rows);
    let sum = g.scale(sum, std::f32::consts::FRAC_1_SQRT_2);
    let sum = g.permute(sum, [0, 2, 1, 3]);
    Some(g.cont(sum))
}

/// The experts on `x` (`[n_embd, n]`) given the router's `logits` (`[n_expert, n]`): softmax,
/// the `n_used` best per token, their weights normalised to sum 1; each chosen expert's GELU
/// network (its down projection's output times the expert's scale, if any), weighted, and the
/// weighted outputs added in the order chosen.
fn experts<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    f: &Forward<'_, 'g, 'w>,
    x: Tensor<'g>,
    logits: Tensor<'g>,
    ex: &Gemma4Layer<RawTensor<'w>>,
) -> Tensor<'g> {
    let (Some(spec), Some(m)) = (f.hp.experts.as_ref(), ex.moe) else {
        unreachable!("expert tensors are loaded only with experts")
    };
    let (n_embd, n, k, n_expert) = (f.hp.n_embd, x.ne(1), spec.n_used, spec.n_expert);
    let probs = g.soft_max_plain(logits);
    let chosen = g.argsort_top_k(probs, k);
    let probs = g.reshape_3d(probs, 1, n_expert, n);
    let weights = g.get_rows(probs, chosen);
    let w = g.reshape_2d(weights, k, n);
    let sum = g.sum_rows(w);
    // As llama.cpp: no division by less than f16's smallest normal number.
    let sum = g.clamp(sum, 6.103_515_6e-5, f32::INFINITY);
    let w = g.div(w, sum);
    let weights = g.reshape_3d(w, 1, k, n);

    let x = g.reshape_3d(x, n_embd, 1, n);
    let (gate, up) = match m.gate_up {
        GateUp::Split { gate, up } => {
            let (gate, up) = (g.lift(gate), g.lift(up));
            let up = g.mul_mat_id(up, x, chosen);
            let gate = g.mul_mat_id(gate, x, chosen);
            (gate, up)
        }
        GateUp::Fused(w) => {
            let w = g.lift(w);
            let both = g.mul_mat_id(w, x, chosen);
            let ff = both.ne(0) / 2;
            let strides = [both.nb(1), both.nb(2)];
            let gate = g.view_3d(both, [ff, k, n], strides, 0);
            let up = g.view_3d(both, [ff, k, n], strides, ff * 4);
            (gate, up)
        }
    };
    let h = g.geglu(gate, up);
    let down = g.lift(m.down);
    let mut out = g.mul_mat_id(down, h, chosen);
    if let Some(s) = m.down_s {
        let s = g.lift(s);
        let s = g.reshape_3d(s, 1, n_expert, 1);
        let s = g.repeat_4d(s, [1, n_expert, n, 1]);
        let s = g.get_rows(s, chosen);
        out = g.mul(out, s);
    }
    let out = g.mul(out, weights);
    let (row, plane) = (out.nb(1), out.nb(2));
    let mut sum = g.view_2d(out, n_embd, n, plane, 0);
    for i in 1..k {
        let part = g.view_2d(out, n_embd, n, plane, i * row);
        sum = g.add(sum, part);
    }
    if k == 1 {
        sum = g.cont(sum);
    }
    sum
}
