//! A tiny Gemma 4 text model with random weights, written to exercise every part of the
//! graph: five layers (windowed, windowed, global, windowed, global) whose windowed layers have
//! smaller heads (16) than the global ones (32) and their own RoPE base, the global ones
//! rotating through `rope_freqs`; the last two layers reusing the KV of layers 1 and 2; Q, K
//! and V fused in layer 0, no V projection in layer 2 (K serves), the unused K and V of a
//! sharing layer present in layer 4; per-layer inputs of width 8; per-layer feed-forward
//! widths; experts beside the dense network in layers 1 (gate and up split) and 4 (fused, with
//! a per-expert output scale); output scales in layers 0 and 2; soft-capped logits; the output
//! tied to the embeddings.

use std::path::Path;

use engine::gguf::{GgmlType, GgufWriter};
use engine::testing::SplitMix64;

use super::{f16_bytes, f32_bytes};

/// Vocabulary, width, heads, KV heads.
pub const N_VOCAB: usize = 97;
pub const N_EMBD: usize = 32;
pub const N_HEAD: usize = 4;
pub const N_HEAD_KV: usize = 2;
/// Head size of the global layers and of the windowed ones.
pub const HEAD_DIM: usize = 32;
pub const HEAD_DIM_SWA: usize = 16;
/// Which layers are windowed.
pub const SWA: [bool; 5] = [true, true, false, true, false];
/// Layers at the end reusing earlier layers' KV.
pub const SHARED_KV: usize = 2;
/// Dense feed-forward width per layer.
pub const N_FF: [usize; 5] = [48, 48, 40, 64, 64];
/// Per-layer input width.
pub const N_PL: usize = 8;
/// Experts: count, used per token, width.
pub const EXPERTS: (usize, usize, usize) = (4, 2, 16);

/// What a variant of the file changes (the tests' malformed files).
#[derive(Clone, Copy, Default)]
pub struct Variant {
    /// `attention.shared_kv_layers` instead of [`SHARED_KV`].
    pub shared_kv: Option<u32>,
    /// Leave the per-layer token table out.
    pub no_per_layer_table: bool,
    /// Add a vision tower's tensor (as a file with the towers would carry).
    pub vision_tensor: bool,
}

/// Writes the tiny model (the same bytes for the same seed) to `path`.
pub fn write(path: &Path, seed: u64, variant: Variant) {
    let mut r = SplitMix64(seed);
    let n_layer = SWA.len();
    let mut g = GgufWriter::new();
    metadata(&mut g, variant, n_layer);
    globals(&mut g, &mut r, variant, n_layer);
    for (l, &swa) in SWA.iter().enumerate() {
        attention(&mut g, &mut r, l, swa);
        feed_forward(&mut g, &mut r, l);
    }
    g.write(path).unwrap();
}

/// The file's keys and vocabulary.
fn metadata(g: &mut GgufWriter, variant: Variant, n_layer: usize) {
    let k = |s: &str| format!("gemma4.{s}");
    g.add_str("general.architecture", "gemma4");
    g.add_u32(&k("context_length"), 256);
    g.add_u32(&k("embedding_length"), N_EMBD as u32);
    g.add_u32(&k("block_count"), n_layer as u32);
    let ff: Vec<i32> = N_FF.iter().map(|&v| v as i32).collect();
    g.add_i32_array(&k("feed_forward_length"), &ff);
    g.add_u32(&k("attention.head_count"), N_HEAD as u32);
    g.add_u32(&k("attention.head_count_kv"), N_HEAD_KV as u32);
    g.add_u32(&k("attention.key_length"), HEAD_DIM as u32);
    g.add_u32(&k("attention.value_length"), HEAD_DIM as u32);
    g.add_u32(&k("attention.key_length_swa"), HEAD_DIM_SWA as u32);
    g.add_u32(&k("attention.value_length_swa"), HEAD_DIM_SWA as u32);
    g.add_u32(&k("rope.dimension_count_swa"), HEAD_DIM_SWA as u32);
    g.add_f32(&k("attention.layer_norm_rms_epsilon"), 1e-6);
    g.add_f32(&k("rope.freq_base"), 10_000.0);
    g.add_f32(&k("rope.freq_base_swa"), 100.0);
    g.add_u32(&k("attention.sliding_window"), 4);
    let pattern: Vec<i32> = SWA.iter().map(|&w| i32::from(w)).collect();
    g.add_i32_array(&k("attention.sliding_window_pattern"), &pattern);
    g.add_u32(
        &k("attention.shared_kv_layers"),
        variant.shared_kv.unwrap_or(SHARED_KV as u32),
    );
    g.add_u32(&k("embedding_length_per_layer_input"), N_PL as u32);
    g.add_f32(&k("final_logit_softcapping"), 10.0);
    let (n_x, n_used, ff_x) = EXPERTS;
    g.add_u32(&k("expert_count"), n_x as u32);
    g.add_u32(&k("expert_used_count"), n_used as u32);
    g.add_u32(&k("expert_feed_forward_length"), ff_x as u32);
    super::add_tiny_vocab(g, N_VOCAB);
}

fn f32t(g: &mut GgufWriter, name: &str, shape: &[u64], w: Vec<f32>) {
    g.add_tensor(name, shape, GgmlType::F32, f32_bytes(&w));
}

fn f16t(g: &mut GgufWriter, name: &str, shape: &[u64], w: Vec<f32>) {
    g.add_tensor(name, shape, GgmlType::F16, f16_bytes(&w));
}

/// Norm weights around 1.
fn norm(r: &mut SplitMix64, n: usize) -> Vec<f32> {
    r.f32_vec(n, 0.5).iter().map(|x| 1.0 + x).collect()
}

/// The tensors outside the blocks.
fn globals(g: &mut GgufWriter, r: &mut SplitMix64, variant: Variant, n_layer: usize) {
    let (e, v) = (N_EMBD as u64, N_VOCAB as u64);
    f32t(
        g,
        "token_embd.weight",
        &[e, v],
        r.f32_vec(N_EMBD * N_VOCAB, 1.0),
    );
    f32t(g, "output_norm.weight", &[e], norm(r, N_EMBD));
    // Proportional RoPE: factors from 1 to 4 over the global heads' pairs.
    let factors: Vec<f32> = r
        .f32_vec(HEAD_DIM / 2, 1.5)
        .iter()
        .map(|x| 2.5 + x)
        .collect();
    f32t(g, "rope_freqs.weight", &[HEAD_DIM as u64 / 2], factors);
    let all = (N_PL * n_layer) as u64;
    if !variant.no_per_layer_table {
        f16t(
            g,
            "per_layer_token_embd.weight",
            &[all, v],
            r.f32_vec(N_PL * n_layer * N_VOCAB, 1.0),
        );
    }
    f32t(
        g,
        "per_layer_model_proj.weight",
        &[e, all],
        r.f32_vec(N_EMBD * N_PL * n_layer, 0.5),
    );
    f32t(
        g,
        "per_layer_proj_norm.weight",
        &[N_PL as u64],
        norm(r, N_PL),
    );
    if variant.vision_tensor {
        f32t(g, "v.patch_embd.weight", &[e], norm(r, N_EMBD));
    }
}

/// Layer `l`'s attention tensors (and norms, output scale).
fn attention(g: &mut GgufWriter, r: &mut SplitMix64, l: usize, swa: bool) {
    let e = N_EMBD as u64;
    let n = |s: &str| format!("blk.{l}.{s}");
    let hd = if swa { HEAD_DIM_SWA } else { HEAD_DIM };
    let (q, kv) = ((hd * N_HEAD) as u64, (hd * N_HEAD_KV) as u64);
    f32t(g, &n("attn_norm.weight"), &[e], norm(r, N_EMBD));
    let wq = r.f32_vec(N_EMBD * q as usize, 0.3);
    let wk = r.f32_vec(N_EMBD * kv as usize, 0.3);
    let wv = r.f32_vec(N_EMBD * kv as usize, 0.3);
    match l {
        0 => {
            let fused: Vec<f32> = wq.iter().chain(&wk).chain(&wv).copied().collect();
            f32t(g, &n("attn_qkv.weight"), &[e, q + 2 * kv], fused);
        }
        // No V: K's projection serves.
        2 => {
            f32t(g, &n("attn_q.weight"), &[e, q], wq);
            f32t(g, &n("attn_k.weight"), &[e, kv], wk);
        }
        // Reuses layer 1's KV: Q alone.
        3 => f32t(g, &n("attn_q.weight"), &[e, q], wq),
        _ => {
            f32t(g, &n("attn_q.weight"), &[e, q], wq);
            f32t(g, &n("attn_k.weight"), &[e, kv], wk);
            f32t(g, &n("attn_v.weight"), &[e, kv], wv);
        }
    }
    f32t(
        g,
        &n("attn_output.weight"),
        &[q, e],
        r.f32_vec(N_EMBD * q as usize, 0.3),
    );
    f32t(g, &n("attn_q_norm.weight"), &[hd as u64], norm(r, hd));
    let k_norm = norm(r, hd);
    if l != 3 {
        f32t(g, &n("attn_k_norm.weight"), &[hd as u64], k_norm);
    }
    f32t(g, &n("post_attention_norm.weight"), &[e], norm(r, N_EMBD));
    let scale = r.f32_vec(1, 0.3)[0] + 0.9;
    if l == 0 || l == 2 {
        f32t(g, &n("layer_output_scale.weight"), &[1], vec![scale]);
    }
}

/// Layer `l`'s feed-forward network, experts and per-layer input.
fn feed_forward(g: &mut GgufWriter, r: &mut SplitMix64, l: usize) {
    let e = N_EMBD as u64;
    let n = |s: &str| format!("blk.{l}.{s}");
    let (n_x, _, ff_x) = EXPERTS;
    let ff = N_FF[l];
    f32t(g, &n("ffn_norm.weight"), &[e], norm(r, N_EMBD));
    f16t(
        g,
        &n("ffn_gate.weight"),
        &[e, ff as u64],
        r.f32_vec(N_EMBD * ff, 0.3),
    );
    f16t(
        g,
        &n("ffn_up.weight"),
        &[e, ff as u64],
        r.f32_vec(N_EMBD * ff, 0.3),
    );
    f16t(
        g,
        &n("ffn_down.weight"),
        &[ff as u64, e],
        r.f32_vec(N_EMBD * ff, 0.3),
    );
    f32t(g, &n("post_ffw_norm.weight"), &[e], norm(r, N_EMBD));
    if l == 1 || l == 4 {
        let (nx, fx) = (n_x as u64, ff_x as u64);
        f32t(
            g,
            &n("ffn_gate_inp.weight"),
            &[e, nx],
            r.f32_vec(N_EMBD * n_x, 2.0),
        );
        f32t(g, &n("ffn_gate_inp.scale"), &[e], norm(r, N_EMBD));
        f32t(g, &n("pre_ffw_norm_2.weight"), &[e], norm(r, N_EMBD));
        f32t(g, &n("post_ffw_norm_1.weight"), &[e], norm(r, N_EMBD));
        f32t(g, &n("post_ffw_norm_2.weight"), &[e], norm(r, N_EMBD));
        let gate = r.f32_vec(N_EMBD * ff_x * n_x, 0.3);
        let up = r.f32_vec(N_EMBD * ff_x * n_x, 0.3);
        if l == 1 {
            f16t(g, &n("ffn_gate_exps.weight"), &[e, fx, nx], gate);
            f16t(g, &n("ffn_up_exps.weight"), &[e, fx, nx], up);
        } else {
            // Per expert: the gate's rows, then up's.
            let per = N_EMBD * ff_x;
            let fused: Vec<f32> = (0..n_x)
                .flat_map(|x| {
                    gate[x * per..(x + 1) * per]
                        .iter()
                        .chain(&up[x * per..(x + 1) * per])
                        .copied()
                        .collect::<Vec<_>>()
                })
                .collect();
            f16t(g, &n("ffn_gate_up_exps.weight"), &[e, 2 * fx, nx], fused);
        }
        let down = r.f32_vec(N_EMBD * ff_x * n_x, 0.3);
        f16t(g, &n("ffn_down_exps.weight"), &[fx, e, nx], down);
        if l == 4 {
            let s: Vec<f32> = r.f32_vec(n_x, 0.5).iter().map(|x| 1.0 + x).collect();
            f32t(g, &n("ffn_down_exps.scale"), &[nx], s);
        }
    }
    let pl = N_PL as u64;
    f32t(
        g,
        &n("inp_gate.weight"),
        &[e, pl],
        r.f32_vec(N_EMBD * N_PL, 0.5),
    );
    f32t(
        g,
        &n("proj.weight"),
        &[pl, e],
        r.f32_vec(N_EMBD * N_PL, 0.5),
    );
    f32t(g, &n("post_norm.weight"), &[e], norm(r, N_EMBD));
}
