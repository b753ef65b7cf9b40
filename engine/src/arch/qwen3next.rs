//! What qwen3next's (Qwen3-Next, llama.cpp's `llama_model_qwen3next` graph) blocks do
//! differently from qwen35's (`qwen35.rs` builds them): beta and alpha come from one
//! projection, laid out per key head (the betas of its value heads, then their alphas), and
//! each key head serves consecutive value heads, so queries and keys are repeated head by head
//! before ggml's gated delta rule (whose own broadcast takes every `n_k_heads`-th). Its
//! attention blocks rotate by NeoX RoPE rather than M-RoPE. Older files give the queries,
//! keys, values and output gate from one projection laid out per key head (`ssm_in`).

use super::Forward;
use crate::ggml::{Graph, RawTensor, Tensor};
use crate::model::DeltaNet;

/// `beta · x` and `alpha · x` (`[n_v_heads, n]` each, value heads in order) from the fused
/// projection `ba` on the normed input `cur`.
pub(super) fn beta_alpha<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    f: &Forward<'_, 'g, 'w>,
    d: &DeltaNet,
    ba: RawTensor<'w>,
    cur: Tensor<'g>,
) -> (Tensor<'g>, Tensor<'g>) {
    let (n_k, n_v, n) = (d.n_k_heads, d.n_v_heads, f.n);
    let per_key = n_v / n_k;
    let mixed = f.project(g, cur, ba, None);
    // Per token and key head: `per_key` betas, then `per_key` alphas.
    let strides = [2 * per_key * 4, 2 * n_v * 4];
    let mut part = |first: usize| {
        let t = g.view_3d(mixed, [per_key, n_k, n], strides, first * 4);
        let t = g.cont(t);
        g.reshape_2d(t, n_v, n)
    };
    let beta = part(0);
    let alpha = part(per_key);
    (beta, alpha)
}

/// Queries or keys `x` (`[head_dim, n_k_heads, m]`, contiguous) with each key head repeated
/// for the value heads it serves, consecutively: `[head_dim, n_v_heads, m]`.
pub(super) fn repeat_key_heads<'g>(
    g: &mut Graph<'g, '_>,
    d: &DeltaNet,
    x: Tensor<'g>,
    m: usize,
) -> Tensor<'g> {
    let (hd, n_k, n_v) = (d.head_dim, d.n_k_heads, d.n_v_heads);
    if n_k == n_v {
        return x;
    }
    let x = g.reshape_3d(x, hd, 1, n_k * m);
    let x = g.repeat_4d(x, [hd, n_v / n_k, n_k * m, 1]);
    g.reshape_3d(x, hd, n_v, m)
}

/// The convolution's input (`[channels, n]`: queries, keys, values) and the output gate `z`
/// (`[inner, n]`) from the older fused projection `w` (`ssm_in`) on the normed input `cur`,
/// whose rows hold, per key head, its query, its key, then the values and the `z` of the
/// value heads it serves.
pub(super) fn split_qkvz<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    f: &Forward<'_, 'g, 'w>,
    d: &DeltaNet,
    w: RawTensor<'w>,
    cur: Tensor<'g>,
) -> (Tensor<'g>, Tensor<'g>) {
    let (hd, n_k, n_v, n) = (d.head_dim, d.n_k_heads, d.n_v_heads, f.n);
    let per_key = hd * n_v / n_k;
    let group = 2 * hd + 2 * per_key;
    let mixed = f.project(g, cur, w, None);
    let strides = [group * 4, group * n_k * 4];
    let mut part = |width: usize, first: usize| {
        let t = g.view_3d(mixed, [width, n_k, n], strides, first * 4);
        let t = g.cont(t);
        g.reshape_2d(t, width * n_k, n)
    };
    let q = part(hd, 0);
    let k = part(hd, hd);
    let v = part(per_key, 2 * hd);
    let z = part(per_key, 2 * hd + per_key);
    let qk = g.concat(q, k, 0);
    (g.concat(qk, v, 0), z)
}
