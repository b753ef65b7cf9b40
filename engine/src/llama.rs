//! The llama-family forward pass as a ggml graph (llama, qwen2 and qwen3 architectures).
//!
//! Follows llama.cpp's `llm_build_llama` / `llm_build_qwen2` / `llm_build_qwen3`: pre-norm
//! blocks of RMSNorm, grouped-query attention with RoPE (adjacent pairs for llama, halves (NeoX)
//! for qwen2 and qwen3, whose Q and K heads are RMS-normalised first), and a
//! SwiGLU feed-forward network; a final RMSNorm and the output head (tied to the embedding table
//! when the file has no `output.weight`). Attention uses ggml's fused flash-attention kernel over
//! the KV cache (f16 or q8_0), with a causal mask.

use crate::batch::Plan;
use crate::error::Result;
use crate::ggml::{DType, Graph, KvTensors, RopeParams, Tensor, TensorMut};
use crate::model::{Arch, Model, RopeScaling};

/// Builds the graph evaluating the batch `plan` describes: each token's K and V are written
/// into its cell of the page pool, each token attends to the cells its mask allows; returns the
/// logits tensor (`[n_vocab, plan.out_rows.len()]`), or with `embeddings` the final norm's
/// output (`[n_embd, plan.out_rows.len()]`, what llama.cpp calls the embeddings of a causal
/// model). The KV pool is borrowed mutably for the graph's life: the graph writes its cells.
pub(crate) fn build<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    model: &'w Model,
    kv: &'w mut KvTensors,
    plan: &Plan,
    flash_attn: bool,
    embeddings: bool,
) -> Result<Tensor<'g>> {
    let hp = model.hparams();
    let n = plan.tokens.len();
    let (head_dim, n_head, n_head_kv) = (hp.head_dim, hp.n_head, hp.n_head_kv);
    let n_embd_kv = hp.n_embd_kv();

    let ids = g.input(
        DType::I32,
        &[n],
        plan.tokens
            .iter()
            .flat_map(|&t| (t as i32).to_le_bytes())
            .collect(),
    );
    let pos = g.input(DType::I32, &[n], plan.positions.clone());
    let cells = g.input(DType::I64, &[n], plan.cells.clone());
    let masks: Vec<Tensor<'g>> = plan
        .attention
        .iter()
        .map(|a| {
            let rows = a.rows.len() + usize::from(a.dup);
            g.input(DType::F16, &[a.n_kv, rows], a.mask.clone())
        })
        .collect();
    // Cells of the gathered windows (see `SeqAttention::gather`).
    let gathers: Vec<Option<Tensor<'g>>> = plan
        .attention
        .iter()
        .map(|a| {
            a.gather
                .as_ref()
                .map(|cells| g.input(DType::I32, &[a.n_kv], cells.clone()))
        })
        .collect();
    let n_out = plan.out_rows.len();
    let out_ids = (n_out < n).then(|| {
        g.input(
            DType::I32,
            &[n_out],
            plan.out_rows.iter().flat_map(|r| r.to_le_bytes()).collect(),
        )
    });

    let rope = rope_params(model);
    let kv = kv.tensors_mut();
    let freq_factors = model.rope_freqs().map(|t| g.lift(t));
    let scale = 1.0 / (head_dim as f32).sqrt();

    let tok_embd = g.lift(model.tok_embd());
    let mut x = g.get_rows(tok_embd, ids);
    let n_layers = hp.n_layer;
    for il in 0..n_layers {
        let lw = model.layer(il);
        let residual = x;
        let norm = g.rms_norm(x, hp.rms_eps);
        let w = g.lift(lw.attn_norm);
        let cur = g.mul(norm, w);

        let project = |g: &mut Graph<'g, 'w>, w, b: Option<_>| {
            let w = g.lift(w);
            let y = g.mul_mat(w, cur);
            match b {
                Some(b) => {
                    let b = g.lift(b);
                    g.add(y, b)
                }
                None => y,
            }
        };
        let q = project(g, lw.wq, lw.bq);
        let k = project(g, lw.wk, lw.bk);
        let v = project(g, lw.wv, lw.bv);
        let q = g.reshape_3d(q, head_dim, n_head, n);
        let k = g.reshape_3d(k, head_dim, n_head_kv, n);
        // qwen3: each head of Q and K normalised (over its `head_dim` values) before RoPE.
        let head_norm = |g: &mut Graph<'g, 'w>, t, w: Option<_>| match w {
            Some(w) => {
                let norm = g.rms_norm(t, hp.rms_eps);
                let w = g.lift(w);
                g.mul(norm, w)
            }
            None => t,
        };
        let q = head_norm(g, q, lw.q_norm);
        let k = head_norm(g, k, lw.k_norm);
        let q = g.rope(q, pos, freq_factors, &rope);
        let k = g.rope(k, pos, freq_factors, &rope);

        // Store this batch's K and V in their cells (converted to the cache's type). The stores
        // join the graph before the attention that reads the cache, so they run first.
        let k_cache = g.lift_mut(kv.k(il));
        let v_cache = g.lift_mut(kv.v(il));
        let k_rows = g.reshape_2d(k, n_embd_kv, n);
        let k_store = g.set_rows(k_cache, k_rows, cells);
        let v_store = g.set_rows(v_cache, v, cells);
        g.expand(k_store);
        g.expand(v_store);

        // Each sequence attends on its own, over the window of cells holding its pages.
        // Per sequence, q: [head_dim, m, n_head]; cached k, v: [head_dim, n_kv, n_head_kv].
        let mut parts = Vec::with_capacity(plan.attention.len());
        for ((a, &mask), &gather) in plan.attention.iter().zip(&masks).zip(&gathers) {
            let m = a.rows.len();
            let q_bytes = head_dim * n_head * 4;
            let q = g.view_3d(
                q,
                [head_dim, n_head, m],
                [head_dim * 4, q_bytes],
                a.rows.start * q_bytes,
            );
            // A lone query given twice, in batch-invariant plans (see `SeqAttention::dup`).
            let q = if a.dup { g.concat(q, q, 2) } else { q };
            let q = g.permute(q, [0, 2, 1, 3]);
            let window = |g: &mut Graph<'g, 'w>, cache: TensorMut<'g>| {
                // One cell's row and one head of it, in the cache's type (heads are whole
                // blocks of a quantized type).
                let cache = cache.as_tensor();
                let (cache, first_cell) = match gather {
                    Some(cells) => (g.gather_f16(cache, cells), 0),
                    None => (cache, a.first_cell),
                };
                let row_bytes = cache.nb(1);
                g.view_3d(
                    cache,
                    [head_dim, a.n_kv, n_head_kv],
                    [row_bytes, row_bytes / n_head_kv],
                    first_cell * row_bytes,
                )
            };
            let k = window(g, k_cache);
            let v = window(g, v_cache);
            let out = if flash_attn {
                // Result: [head_dim, n_head, m].
                g.flash_attn(q, k, v, mask, scale)
            } else {
                // Unfused: scores [n_kv, m, n_head], softmax, then V transposed to
                // [n_kv, head_dim, n_head_kv] (a copy, since the cache stores V token-major).
                let kq = g.mul_mat(k, q);
                let kq = g.soft_max(kq, mask, scale);
                let v_t = g.permute(v, [1, 0, 2, 3]);
                let v_t = g.cont(v_t);
                let kqv = g.mul_mat(v_t, kq);
                let kqv = g.permute(kqv, [0, 2, 1, 3]);
                g.cont(kqv)
            };
            // Result: [head_dim, n_head, m]; the duplicated query's output is dropped.
            parts.push(if a.dup {
                g.view_3d(out, [head_dim, n_head, 1], [head_dim * 4, q_bytes], 0)
            } else {
                out
            });
        }
        let attn = concat_tokens(g, parts);
        let mut attn = g.reshape_2d(attn, head_dim * n_head, n);
        let mut residual = residual;

        // In the last layer only the rows that produce logits matter: drop the others before
        // the output projection and the feed-forward network.
        if let (true, Some(out_ids)) = (il + 1 == n_layers, out_ids) {
            attn = g.get_rows(attn, out_ids);
            residual = g.get_rows(residual, out_ids);
        }
        let wo = g.lift(lw.wo);
        let out = g.mul_mat(wo, attn);
        let x_attn = g.add(out, residual);

        let norm = g.rms_norm(x_attn, hp.rms_eps);
        let w = g.lift(lw.ffn_norm);
        let cur = g.mul(norm, w);
        let (wg, wu, wd) = (g.lift(lw.ffn_gate), g.lift(lw.ffn_up), g.lift(lw.ffn_down));
        let gate = g.mul_mat(wg, cur);
        let up = g.mul_mat(wu, cur);
        let h = g.swiglu(gate, up);
        let down = g.mul_mat(wd, h);
        x = g.add(down, x_attn);
    }
    let norm = g.rms_norm(x, hp.rms_eps);
    let w = g.lift(model.output_norm());
    let x = g.mul(norm, w);
    debug_assert_eq!(x.ne(0), hp.n_embd);
    if embeddings {
        return Ok(x);
    }
    let out = g.lift(model.output());
    Ok(g.mul_mat(out, x))
}

/// Joins `[head_dim, n_head, m_i]` tensors along the token dimension, pairwise so that each
/// row is copied about log2(parts) times.
fn concat_tokens<'g>(g: &mut Graph<'g, '_>, mut parts: Vec<Tensor<'g>>) -> Tensor<'g> {
    while parts.len() > 1 {
        parts = parts
            .chunks(2)
            .map(|pair| match *pair {
                [a, b] => g.concat(a, b, 2),
                [a] => a,
                _ => unreachable!("chunks of two"),
            })
            .collect();
    }
    parts[0]
}

pub(crate) fn rope_params(model: &Model) -> RopeParams {
    let hp = model.hparams();
    let (freq_scale, ext_factor, n_ctx_orig) = match hp.rope_scaling {
        RopeScaling::None => (1.0, 0.0, hp.n_ctx_train),
        RopeScaling::Linear { factor } => (1.0 / factor, 0.0, hp.n_ctx_train),
        RopeScaling::Yarn { factor, n_ctx_orig } => (1.0 / factor, 1.0, n_ctx_orig),
    };
    RopeParams {
        n_dims: hp.rope_dims,
        mode: match hp.arch {
            Arch::Llama => 0,
            Arch::Qwen2 | Arch::Qwen3 => 2,
        },
        n_ctx_orig,
        freq_base: hp.rope_freq_base,
        freq_scale,
        ext_factor,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
    }
}
