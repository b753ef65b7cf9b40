//! A tiny granitehybrid (IBM's Granite 4.0 hybrid) model written by the tests: four blocks,
//! Mamba-2 in the first, third and fourth and attention with RoPE in the second
//! (`attention.head_count_kv` 0 marks a Mamba-2 layer), each followed by a SwiGLU network;
//! every Granite multiplier set; f32 weights throughout.

use std::path::Path;
use std::sync::Arc;

use engine::gguf::{GgmlType, GgufWriter};
use engine::testing::SplitMix64;
use engine::Model;

use super::nemotron_h::{write_mamba2, Kind, NemotronHCfg};
use super::{add_tiny_vocab, f32_bytes};

/// The model the tests use (nemotron_h's sizes, the inner width twice the embedding's as
/// llama.cpp requires of granitehybrid, `n_ff` the SwiGLU networks' width).
pub fn granite_hybrid_cfg() -> NemotronHCfg {
    use Kind::*;
    NemotronHCfg {
        kinds: vec![Mamba2, Attention, Mamba2, Mamba2],
        d_inner: 64,
        n_ssm_head: 8,
        ..super::nemotron_h::nemotron_h_cfg()
    }
}

/// Granite's multipliers in the tiny model: embeddings, residual branches, attention scores,
/// logits (divided).
pub const SCALES: [f32; 4] = [3.0, 0.5, 0.25, 2.0];

/// The mixture of experts of the MoE variant: experts, experts per token, the shared
/// expert's width.
pub struct GraniteMoe {
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff_shared: usize,
}

/// The MoE variant the tests use: 4 experts of `n_ff`, 2 per token, a shared expert.
pub const GRANITE_MOE: GraniteMoe = GraniteMoe {
    n_expert: 4,
    n_used: 2,
    n_ff_shared: 40,
};

/// Writes the model `c` (with mixtures of experts `moe`, if any) with weights drawn from
/// `seed` to `path`.
pub fn write_granite_hybrid(c: &NemotronHCfg, moe: Option<&GraniteMoe>, seed: u64, path: &Path) {
    let mut r = SplitMix64(seed);
    let arch = "granitehybrid";
    let mut g = GgufWriter::new();
    g.add_str("general.architecture", arch);
    let k = |s: &str| format!("{arch}.{s}");
    let kv: Vec<i32> = c
        .kinds
        .iter()
        .map(|&k| {
            if k == Kind::Mamba2 {
                0
            } else {
                c.n_head_kv as i32
            }
        })
        .collect();
    g.add_u32(&k("context_length"), 256);
    g.add_u32(&k("embedding_length"), c.n_embd as u32);
    g.add_u32(&k("block_count"), c.kinds.len() as u32);
    g.add_u32(&k("feed_forward_length"), c.n_ff as u32);
    g.add_u32(&k("attention.head_count"), c.n_head as u32);
    g.add_i32_array(&k("attention.head_count_kv"), &kv);
    g.add_f32(&k("attention.layer_norm_rms_epsilon"), c.eps);
    g.add_f32(&k("rope.freq_base"), 10000.0);
    g.add_u32(&k("ssm.conv_kernel"), c.d_conv as u32);
    g.add_u32(&k("ssm.inner_size"), c.d_inner as u32);
    g.add_u32(&k("ssm.state_size"), c.d_state as u32);
    g.add_u32(&k("ssm.time_step_rank"), c.n_ssm_head as u32);
    g.add_u32(&k("ssm.group_count"), c.n_group as u32);
    let [embd, residual, attn, logit] = SCALES;
    g.add_f32(&k("embedding_scale"), embd);
    g.add_f32(&k("residual_scale"), residual);
    g.add_f32(&k("attention.scale"), attn);
    g.add_f32(&k("logit_scale"), logit);
    if let Some(x) = moe {
        g.add_u32(&k("expert_count"), x.n_expert as u32);
        g.add_u32(&k("expert_used_count"), x.n_used as u32);
        g.add_u32(
            &k("expert_shared_feed_forward_length"),
            x.n_ff_shared as u32,
        );
    }
    add_tiny_vocab(&mut g, c.n_vocab);

    let t = |g: &mut GgufWriter, name: &str, shape: &[usize], values: Vec<f32>| {
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        g.add_tensor(name, &shape, GgmlType::F32, f32_bytes(&values));
    };
    let near_one = |r: &mut SplitMix64, n: usize| -> Vec<f32> {
        r.f32_vec(n, 0.5).iter().map(|v| 1.0 + v).collect()
    };
    let (e, v, ff) = (c.n_embd, c.n_vocab, c.n_ff);
    let embd = r.f32_vec(e * v, 0.4);
    t(&mut g, "token_embd.weight", &[e, v], embd);
    let out_norm = near_one(&mut r, e);
    t(&mut g, "output_norm.weight", &[e], out_norm);
    let output = r.f32_vec(e * v, 0.3);
    t(&mut g, "output.weight", &[e, v], output);
    for (l, &kind) in c.kinds.iter().enumerate() {
        let n = |s: &str| format!("blk.{l}.{s}");
        let w = near_one(&mut r, e);
        t(&mut g, &n("attn_norm.weight"), &[e], w);
        if kind == Kind::Mamba2 {
            write_mamba2(c, &mut r, &mut g, l);
        } else {
            let (q, kv) = (c.head_dim * c.n_head, c.head_dim * c.n_head_kv);
            for (name, rows) in [("attn_q", q), ("attn_k", kv), ("attn_v", kv)] {
                let w = r.f32_vec(e * rows, 0.3);
                t(&mut g, &n(&format!("{name}.weight")), &[e, rows], w);
            }
            let w = r.f32_vec(q * e, 0.3);
            t(&mut g, &n("attn_output.weight"), &[q, e], w);
        }
        let w = near_one(&mut r, e);
        t(&mut g, &n("ffn_norm.weight"), &[e], w);
        if let Some(x) = moe {
            let ne = x.n_expert;
            let w = r.f32_vec(e * ne, 1.0);
            t(&mut g, &n("ffn_gate_inp.weight"), &[e, ne], w);
            for name in ["ffn_gate_exps", "ffn_up_exps"] {
                let w = r.f32_vec(e * ff * ne, 0.3);
                t(&mut g, &n(&format!("{name}.weight")), &[e, ff, ne], w);
            }
            let w = r.f32_vec(ff * e * ne, 0.3);
            t(&mut g, &n("ffn_down_exps.weight"), &[ff, e, ne], w);
            let sf = x.n_ff_shared;
            for name in ["ffn_gate_shexp", "ffn_up_shexp"] {
                let w = r.f32_vec(e * sf, 0.3);
                t(&mut g, &n(&format!("{name}.weight")), &[e, sf], w);
            }
            let w = r.f32_vec(sf * e, 0.3);
            t(&mut g, &n("ffn_down_shexp.weight"), &[sf, e], w);
            continue;
        }
        for name in ["ffn_gate", "ffn_up"] {
            let w = r.f32_vec(e * ff, 0.3);
            t(&mut g, &n(&format!("{name}.weight")), &[e, ff], w);
        }
        let w = r.f32_vec(ff * e, 0.3);
        t(&mut g, &n("ffn_down.weight"), &[ff, e], w);
    }
    g.write(path).unwrap();
}

/// The tiny model of `seed` (with mixtures of experts `moe`, if any), written into a
/// temporary directory and loaded.
pub fn build_granite_hybrid(
    seed: u64,
    moe: Option<&GraniteMoe>,
) -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("granitehybrid.gguf");
    write_granite_hybrid(&granite_hybrid_cfg(), moe, seed, &path);
    let model = Model::load(&path).unwrap();
    (dir, model)
}
