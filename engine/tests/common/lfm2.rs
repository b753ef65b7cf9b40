//! A tiny lfm2 (Liquid's LFM2) model written by the tests: four blocks, gated short
//! convolutions in the first, second and fourth and grouped-query attention in the third
//! (`attention.head_count_kv` 0 marks a convolution), f32 weights throughout; and its lfm2moe
//! variant, whose blocks after the first have mixtures of experts.

use std::path::Path;
use std::sync::Arc;

use engine::gguf::{GgmlType, GgufWriter};
use engine::testing::SplitMix64;
use engine::Model;

use super::{add_tiny_vocab, f32_bytes};

/// The tiny model's sizes.
pub struct Lfm2Cfg {
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    /// Attention heads, key/value heads of the attention layers and head dimension
    /// (`n_head * head_dim == n_embd`, as llama.cpp requires of lfm2).
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Per block: whether it is a short convolution (the others attend).
    pub conv: Vec<bool>,
    /// The convolution's width.
    pub l_cache: usize,
    pub eps: f32,
    /// lfm2moe's experts, if any.
    pub moe: Option<Lfm2Moe>,
}

/// The mixture of experts of the lfm2moe variant.
pub struct Lfm2Moe {
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff_exp: usize,
    /// Blocks with dense networks first.
    pub dense_lead: usize,
    /// The router's gating function: 1 softmax, 2 sigmoid.
    pub gating: u32,
}

/// The lfm2moe model the tests use: the lfm2 one with 4 experts of which 2 run, sigmoid
/// routing, the first block dense.
pub fn lfm2moe_cfg() -> Lfm2Cfg {
    Lfm2Cfg {
        moe: Some(Lfm2Moe {
            n_expert: 4,
            n_used: 2,
            n_ff_exp: 24,
            dense_lead: 1,
            gating: 2,
        }),
        ..lfm2_cfg()
    }
}

/// The model the tests use.
pub fn lfm2_cfg() -> Lfm2Cfg {
    Lfm2Cfg {
        n_vocab: 97,
        n_embd: 32,
        n_ff: 48,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 8,
        conv: vec![true, true, false, true],
        l_cache: 3,
        eps: 1e-5,
        moe: None,
    }
}

/// Writes the model with weights drawn from `seed` to `path`.
pub fn write_lfm2(c: &Lfm2Cfg, seed: u64, path: &Path) {
    let kv: Vec<i32> = c
        .conv
        .iter()
        .map(|&conv| if conv { 0 } else { c.n_head_kv as i32 })
        .collect();
    write_lfm2_with_kv(c, seed, path, &kv);
}

/// [`write_lfm2`] with `attention.head_count_kv` set to `kv` (the tensors still those of
/// `c.conv`'s layers): for files whose metadata is wrong.
pub fn write_lfm2_with_kv(c: &Lfm2Cfg, seed: u64, path: &Path, kv: &[i32]) {
    let mut r = SplitMix64(seed);
    let arch = if c.moe.is_some() { "lfm2moe" } else { "lfm2" };
    let mut g = GgufWriter::new();
    g.add_str("general.architecture", arch);
    let k = |s: &str| format!("{arch}.{s}");
    let n_layer = c.conv.len();
    g.add_u32(&k("context_length"), 256);
    g.add_u32(&k("embedding_length"), c.n_embd as u32);
    g.add_u32(&k("block_count"), n_layer as u32);
    g.add_u32(&k("feed_forward_length"), c.n_ff as u32);
    g.add_u32(&k("attention.head_count"), c.n_head as u32);
    g.add_i32_array(&k("attention.head_count_kv"), kv);
    g.add_f32(&k("attention.layer_norm_rms_epsilon"), c.eps);
    g.add_f32(&k("rope.freq_base"), 10000.0);
    g.add_u32(&k("shortconv.l_cache"), c.l_cache as u32);
    if let Some(x) = &c.moe {
        g.add_u32(&k("expert_count"), x.n_expert as u32);
        g.add_u32(&k("expert_used_count"), x.n_used as u32);
        g.add_u32(&k("expert_feed_forward_length"), x.n_ff_exp as u32);
        g.add_u32(&k("leading_dense_block_count"), x.dense_lead as u32);
        g.add_u32(&k("expert_gating_func"), x.gating);
    }
    add_tiny_vocab(&mut g, c.n_vocab);

    let t = |g: &mut GgufWriter, name: &str, shape: &[usize], values: Vec<f32>| {
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        g.add_tensor(name, &shape, GgmlType::F32, f32_bytes(&values));
    };
    let near_one = |r: &mut SplitMix64, n: usize| -> Vec<f32> {
        r.f32_vec(n, 0.5).iter().map(|v| 1.0 + v).collect()
    };
    let (e, v) = (c.n_embd, c.n_vocab);
    let embd = r.f32_vec(e * v, 1.0);
    t(&mut g, "token_embd.weight", &[e, v], embd);
    let out_norm = near_one(&mut r, e);
    t(&mut g, "token_embd_norm.weight", &[e], out_norm);
    let output = r.f32_vec(e * v, 0.3);
    t(&mut g, "output.weight", &[e, v], output);
    for (l, &conv) in c.conv.iter().enumerate() {
        let n = |s: &str| format!("blk.{l}.{s}");
        let w = near_one(&mut r, e);
        t(&mut g, &n("attn_norm.weight"), &[e], w);
        if conv {
            let w = r.f32_vec(e * 3 * e, 0.3);
            t(&mut g, &n("shortconv.in_proj.weight"), &[e, 3 * e], w);
            let w = r.f32_vec(c.l_cache * e, 0.5);
            t(&mut g, &n("shortconv.conv.weight"), &[c.l_cache, e], w);
            let w = r.f32_vec(e * e, 0.3);
            t(&mut g, &n("shortconv.out_proj.weight"), &[e, e], w);
        } else {
            let kv = c.head_dim * c.n_head_kv;
            let w = r.f32_vec(e * e, 0.3);
            t(&mut g, &n("attn_q.weight"), &[e, e], w);
            let w = r.f32_vec(e * kv, 0.3);
            t(&mut g, &n("attn_k.weight"), &[e, kv], w);
            let w = r.f32_vec(e * kv, 0.3);
            t(&mut g, &n("attn_v.weight"), &[e, kv], w);
            let w = near_one(&mut r, c.head_dim);
            t(&mut g, &n("attn_q_norm.weight"), &[c.head_dim], w);
            let w = near_one(&mut r, c.head_dim);
            t(&mut g, &n("attn_k_norm.weight"), &[c.head_dim], w);
            let w = r.f32_vec(e * e, 0.3);
            t(&mut g, &n("attn_output.weight"), &[e, e], w);
        }
        let w = near_one(&mut r, e);
        t(&mut g, &n("ffn_norm.weight"), &[e], w);
        if let Some(x) = c.moe.as_ref().filter(|x| l >= x.dense_lead) {
            let (ne, f) = (x.n_expert, x.n_ff_exp);
            let w = r.f32_vec(e * ne, 1.0);
            t(&mut g, &n("ffn_gate_inp.weight"), &[e, ne], w);
            let w = r.f32_vec(e * f * ne, 0.3);
            t(&mut g, &n("ffn_gate_exps.weight"), &[e, f, ne], w);
            let w = r.f32_vec(e * f * ne, 0.3);
            t(&mut g, &n("ffn_up_exps.weight"), &[e, f, ne], w);
            let w = r.f32_vec(f * e * ne, 0.3);
            t(&mut g, &n("ffn_down_exps.weight"), &[f, e, ne], w);
            let w = r.f32_vec(ne, 0.2);
            t(&mut g, &n("exp_probs_b.bias"), &[ne], w);
            continue;
        }
        let w = r.f32_vec(e * c.n_ff, 0.3);
        t(&mut g, &n("ffn_gate.weight"), &[e, c.n_ff], w);
        let w = r.f32_vec(e * c.n_ff, 0.3);
        t(&mut g, &n("ffn_up.weight"), &[e, c.n_ff], w);
        let w = r.f32_vec(c.n_ff * e, 0.3);
        t(&mut g, &n("ffn_down.weight"), &[c.n_ff, e], w);
    }
    g.write(path).unwrap();
}

/// The tiny model of `seed`, written into a temporary directory and loaded.
pub fn build_lfm2(seed: u64) -> (tempfile::TempDir, Arc<Model>) {
    build_lfm2_of(&lfm2_cfg(), seed)
}

/// The tiny model `c` of `seed`, written into a temporary directory and loaded.
pub fn build_lfm2_of(c: &Lfm2Cfg, seed: u64) -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lfm2.gguf");
    write_lfm2(c, seed, &path);
    let model = Model::load(&path).unwrap();
    (dir, model)
}
