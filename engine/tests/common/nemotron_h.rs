//! A tiny nemotron_h (NVIDIA's Nemotron-H) model written by the tests: five blocks, Mamba-2
//! in the first and last, ReLU² feed-forward networks in the second and fourth and attention
//! in the third (per layer, `attention.head_count_kv` and `feed_forward_length` both 0 mark a
//! Mamba-2 layer), f32 weights throughout.

use std::path::Path;
use std::sync::Arc;

use engine::gguf::{GgmlType, GgufWriter};
use engine::testing::SplitMix64;
use engine::Model;

use super::{add_tiny_vocab, f32_bytes};

/// What a block of the tiny model runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Mamba2,
    Attention,
    Mlp,
}

/// The tiny model's sizes.
pub struct NemotronHCfg {
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    /// Attention heads, key/value heads of the attention layers and head dimension.
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Per block: what it runs.
    pub kinds: Vec<Kind>,
    /// Mamba-2's convolution width, inner width, state size, heads and groups.
    pub d_conv: usize,
    pub d_inner: usize,
    pub d_state: usize,
    pub n_ssm_head: usize,
    pub n_group: usize,
    pub eps: f32,
}

/// The model the tests use.
pub fn nemotron_h_cfg() -> NemotronHCfg {
    use Kind::*;
    NemotronHCfg {
        n_vocab: 97,
        n_embd: 32,
        n_ff: 48,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 8,
        kinds: vec![Mamba2, Mlp, Attention, Mlp, Mamba2],
        d_conv: 4,
        d_inner: 48,
        d_state: 16,
        n_ssm_head: 6,
        n_group: 2,
        eps: 1e-5,
    }
}

/// The per-layer `attention.head_count_kv` and `feed_forward_length` of `c`.
pub fn per_layer(c: &NemotronHCfg) -> (Vec<i32>, Vec<i32>) {
    let kv = c.kinds.iter().map(|&k| match k {
        Kind::Attention => c.n_head_kv as i32,
        _ => 0,
    });
    let ff = c.kinds.iter().map(|&k| match k {
        Kind::Mlp => c.n_ff as i32,
        _ => 0,
    });
    (kv.collect(), ff.collect())
}

/// Writes the model with weights drawn from `seed` to `path`.
pub fn write_nemotron_h(c: &NemotronHCfg, seed: u64, path: &Path) {
    let (kv, ff) = per_layer(c);
    write_nemotron_h_with(c, seed, path, &kv, &ff);
}

/// [`write_nemotron_h`] with `attention.head_count_kv` set to `kv` and `feed_forward_length`
/// to `ff` (the tensors still those of `c.kinds`): for files whose metadata is wrong.
pub fn write_nemotron_h_with(c: &NemotronHCfg, seed: u64, path: &Path, kv: &[i32], ff: &[i32]) {
    let mut r = SplitMix64(seed);
    let arch = "nemotron_h";
    let mut g = GgufWriter::new();
    g.add_str("general.architecture", arch);
    let k = |s: &str| format!("{arch}.{s}");
    g.add_u32(&k("context_length"), 256);
    g.add_u32(&k("embedding_length"), c.n_embd as u32);
    g.add_u32(&k("block_count"), c.kinds.len() as u32);
    g.add_i32_array(&k("feed_forward_length"), ff);
    g.add_u32(&k("attention.head_count"), c.n_head as u32);
    g.add_i32_array(&k("attention.head_count_kv"), kv);
    g.add_u32(&k("attention.key_length"), c.head_dim as u32);
    g.add_u32(&k("attention.value_length"), c.head_dim as u32);
    g.add_f32(&k("attention.layer_norm_epsilon"), c.eps);
    g.add_f32(&k("attention.layer_norm_rms_epsilon"), c.eps);
    g.add_u32(&k("ssm.conv_kernel"), c.d_conv as u32);
    g.add_u32(&k("ssm.inner_size"), c.d_inner as u32);
    g.add_u32(&k("ssm.state_size"), c.d_state as u32);
    g.add_u32(&k("ssm.time_step_rank"), c.n_ssm_head as u32);
    g.add_u32(&k("ssm.group_count"), c.n_group as u32);
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
    t(&mut g, "output_norm.weight", &[e], out_norm);
    let output = r.f32_vec(e * v, 0.3);
    t(&mut g, "output.weight", &[e, v], output);
    for (l, &kind) in c.kinds.iter().enumerate() {
        let n = |s: &str| format!("blk.{l}.{s}");
        let w = near_one(&mut r, e);
        t(&mut g, &n("attn_norm.weight"), &[e], w);
        match kind {
            Kind::Mamba2 => write_mamba2(c, &mut r, &mut g, l),
            Kind::Attention => {
                let (q, kv) = (c.head_dim * c.n_head, c.head_dim * c.n_head_kv);
                let w = r.f32_vec(e * q, 0.3);
                t(&mut g, &n("attn_q.weight"), &[e, q], w);
                let w = r.f32_vec(e * kv, 0.3);
                t(&mut g, &n("attn_k.weight"), &[e, kv], w);
                let w = r.f32_vec(e * kv, 0.3);
                t(&mut g, &n("attn_v.weight"), &[e, kv], w);
                let w = r.f32_vec(q * e, 0.3);
                t(&mut g, &n("attn_output.weight"), &[q, e], w);
            }
            Kind::Mlp => {
                let w = r.f32_vec(e * c.n_ff, 0.3);
                t(&mut g, &n("ffn_up.weight"), &[e, c.n_ff], w);
                let w = r.f32_vec(c.n_ff * e, 0.3);
                t(&mut g, &n("ffn_down.weight"), &[c.n_ff, e], w);
            }
        }
    }
    g.write(path).unwrap();
}

/// Layer `l`'s Mamba-2 tensors.
pub fn write_mamba2(c: &NemotronHCfg, r: &mut SplitMix64, g: &mut GgufWriter, l: usize) {
    let t = |g: &mut GgufWriter, name: &str, shape: &[usize], values: Vec<f32>| {
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        g.add_tensor(name, &shape, GgmlType::F32, f32_bytes(&values));
    };
    let n = |s: &str| format!("blk.{l}.{s}");
    let e = c.n_embd;
    let ch = c.d_inner + 2 * c.n_group * c.d_state;
    let in_proj = c.d_inner + ch + c.n_ssm_head;
    let h = c.n_ssm_head;
    let w = r.f32_vec(e * in_proj, 0.3);
    t(g, &n("ssm_in.weight"), &[e, in_proj], w);
    let w = r.f32_vec(c.d_conv * ch, 0.5);
    t(g, &n("ssm_conv1d.weight"), &[c.d_conv, ch], w);
    let w = r.f32_vec(ch, 0.2);
    t(g, &n("ssm_conv1d.bias"), &[ch], w);
    let w = r.f32_vec(h, 0.5);
    t(g, &n("ssm_dt.bias"), &[h], w);
    // A = -exp(A_log): negative, so that the state decays.
    let w = r.f32_vec(h, 1.0).iter().map(|a| -a.exp()).collect();
    t(g, &n("ssm_a"), &[1, h], w);
    let w = r.f32_vec(h, 1.0);
    t(g, &n("ssm_d"), &[1, h], w);
    let gw = c.d_inner / c.n_group;
    let w = r
        .f32_vec(gw * c.n_group, 0.5)
        .iter()
        .map(|v| 1.0 + v)
        .collect();
    t(g, &n("ssm_norm.weight"), &[gw, c.n_group], w);
    let w = r.f32_vec(c.d_inner * e, 0.3);
    t(g, &n("ssm_out.weight"), &[c.d_inner, e], w);
}

/// The tiny model of `seed`, written into a temporary directory and loaded.
pub fn build_nemotron_h(seed: u64) -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nemotron_h.gguf");
    write_nemotron_h(&nemotron_h_cfg(), seed, &path);
    let model = Model::load(&path).unwrap();
    (dir, model)
}
