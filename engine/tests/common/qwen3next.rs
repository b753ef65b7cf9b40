//! Tiny qwen35moe (Qwen3.5 MoE) and qwen3next (Qwen3-Next) models written by the tests: four
//! blocks, gated delta-nets in the first and third and gated attention in the second and
//! fourth (`full_attention_interval` 2), twice as many value heads as key heads in the
//! delta-nets (so how key heads are shared out is exercised: every other value head in
//! qwen35moe, consecutive ones in qwen3next), partial RoPE (interleaved M-RoPE in qwen35moe,
//! NeoX in qwen3next), each feed-forward network four experts of which two run plus a shared
//! expert behind its sigmoid gate, and f32 weights throughout. qwen3next's beta and alpha
//! come from one projection (`ssm_ba`).

use std::path::Path;
use std::sync::Arc;

use engine::gguf::{GgmlType, GgufWriter};
use engine::testing::SplitMix64;
use engine::Model;

use super::f32_bytes;

/// Which of the two families.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Family {
    Qwen35Moe,
    Qwen3Next,
}

impl Family {
    /// The GGUF architecture name.
    pub fn arch(self) -> &'static str {
        match self {
            Family::Qwen35Moe => "qwen35moe",
            Family::Qwen3Next => "qwen3next",
        }
    }
}

/// The tiny model's sizes.
pub struct MoeHybridCfg {
    pub family: Family,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    /// Attention heads, key/value heads, head dimension and rotated dimensions per head.
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope_dims: usize,
    /// Every `interval`-th block attends; the others are delta-nets.
    pub interval: usize,
    /// Delta-net key heads, value heads, head dimension and convolution width.
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub ssm_head: usize,
    pub conv_kernel: usize,
    /// Experts, experts used per token, an expert's width and the shared expert's.
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff_exp: usize,
    pub n_ff_shared: usize,
    pub eps: f32,
    /// qwen3next's older layout: queries, keys, values and gate in one projection (`ssm_in`).
    pub legacy_ssm_in: bool,
    /// The attention blocks' Q (with its gate), K and V as one projection (`attn_qkv`, the
    /// same weights).
    pub fused_qkv: bool,
    /// The experts' gate and up projections as one stack (`ffn_gate_up_exps`, the same
    /// weights: each expert's gate rows, then its up rows).
    pub fused_gate_up: bool,
    /// `nextn_predict_layers`, written when given: that many multi-token prediction blocks
    /// (gated attention, experts, and their `nextn.*` tensors) follow the `n_layer` others,
    /// whose weights stay those of the model without them.
    pub nextn_predict_layers: Option<u32>,
}

/// The model the tests use, of `family`.
pub fn moe_hybrid_cfg(family: Family) -> MoeHybridCfg {
    MoeHybridCfg {
        family,
        n_vocab: 97,
        n_embd: 32,
        n_layer: 4,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 16,
        rope_dims: 8,
        interval: 2,
        n_k_heads: 2,
        n_v_heads: 4,
        ssm_head: 8,
        conv_kernel: 4,
        n_expert: 4,
        n_used: 2,
        n_ff_exp: 16,
        n_ff_shared: 24,
        eps: 1e-6,
        legacy_ssm_in: false,
        fused_qkv: false,
        fused_gate_up: false,
        nextn_predict_layers: None,
    }
}

impl MoeHybridCfg {
    /// Whether block `l` is a delta-net.
    pub fn recurrent(&self, l: usize) -> bool {
        !(l + 1).is_multiple_of(self.interval)
    }
    fn channels(&self) -> usize {
        self.ssm_head * (2 * self.n_k_heads + self.n_v_heads)
    }
}

/// Adds an f32 tensor.
fn t(g: &mut GgufWriter, name: &str, shape: &[usize], values: Vec<f32>) {
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    g.add_tensor(name, &shape, GgmlType::F32, f32_bytes(&values));
}

/// `n` values near 1 (norm weights).
fn near_one(r: &mut SplitMix64, n: usize) -> Vec<f32> {
    r.f32_vec(n, 0.5).iter().map(|v| 1.0 + v).collect()
}

/// The metadata: sizes and the byte-level vocabulary of the other tiny models.
fn header(c: &MoeHybridCfg, g: &mut GgufWriter) {
    let arch = c.family.arch();
    g.add_str("general.architecture", arch);
    let k = |s: &str| format!("{arch}.{s}");
    g.add_u32(&k("context_length"), 256);
    g.add_u32(&k("embedding_length"), c.n_embd as u32);
    let nextn = c.nextn_predict_layers.unwrap_or(0);
    g.add_u32(&k("block_count"), c.n_layer as u32 + nextn);
    g.add_u32(&k("feed_forward_length"), c.n_ff_shared as u32);
    g.add_u32(&k("attention.head_count"), c.n_head as u32);
    g.add_u32(&k("attention.head_count_kv"), c.n_head_kv as u32);
    g.add_u32(&k("attention.key_length"), c.head_dim as u32);
    g.add_u32(&k("attention.value_length"), c.head_dim as u32);
    g.add_f32(&k("attention.layer_norm_rms_epsilon"), c.eps);
    g.add_f32(&k("rope.freq_base"), 10000.0);
    g.add_u32(&k("rope.dimension_count"), c.rope_dims as u32);
    if c.family == Family::Qwen35Moe {
        g.add_i32_array(&k("rope.dimension_sections"), &[2, 1, 1, 0]);
    }
    g.add_u32(&k("full_attention_interval"), c.interval as u32);
    g.add_u32(&k("ssm.conv_kernel"), c.conv_kernel as u32);
    g.add_u32(&k("ssm.state_size"), c.ssm_head as u32);
    g.add_u32(&k("ssm.group_count"), c.n_k_heads as u32);
    g.add_u32(&k("ssm.time_step_rank"), c.n_v_heads as u32);
    g.add_u32(&k("ssm.inner_size"), (c.ssm_head * c.n_v_heads) as u32);
    if let Some(n) = c.nextn_predict_layers {
        g.add_u32(&k("nextn_predict_layers"), n);
    }
    g.add_u32(&k("expert_count"), c.n_expert as u32);
    g.add_u32(&k("expert_used_count"), c.n_used as u32);
    g.add_u32(&k("expert_feed_forward_length"), c.n_ff_exp as u32);
    g.add_u32(
        &k("expert_shared_feed_forward_length"),
        c.n_ff_shared as u32,
    );
    let tokens: Vec<String> = (0..c.n_vocab)
        .map(|i| {
            char::from(b'!' + (i % 90) as u8)
                .to_string()
                .repeat(1 + i / 90)
        })
        .collect();
    g.add_str("tokenizer.ggml.model", "gpt2");
    g.add_str("tokenizer.ggml.pre", "default");
    g.add_str_array("tokenizer.ggml.tokens", &tokens);
    g.add_i32_array("tokenizer.ggml.token_type", &vec![1; c.n_vocab]);
    g.add_str_array::<&str>("tokenizer.ggml.merges", &[]);
    g.add_u32("tokenizer.ggml.eos_token_id", 0);
}

/// Block `l`'s delta-net tensors.
fn delta_net(c: &MoeHybridCfg, g: &mut GgufWriter, r: &mut SplitMix64, l: usize) {
    let n = |s: &str| format!("blk.{l}.{s}");
    let (e, ch, inner, hv) = (
        c.n_embd,
        c.channels(),
        c.ssm_head * c.n_v_heads,
        c.n_v_heads,
    );
    if c.legacy_ssm_in {
        let w = r.f32_vec(e * (ch + inner), 0.3);
        t(g, &n("ssm_in.weight"), &[e, ch + inner], w);
    } else {
        t(g, &n("attn_qkv.weight"), &[e, ch], r.f32_vec(e * ch, 0.3));
        t(
            g,
            &n("attn_gate.weight"),
            &[e, inner],
            r.f32_vec(e * inner, 0.3),
        );
    }
    let w = r.f32_vec(c.conv_kernel * ch, 0.5);
    t(g, &n("ssm_conv1d.weight"), &[c.conv_kernel, ch], w);
    t(g, &n("ssm_dt.bias"), &[hv], r.f32_vec(hv, 0.5));
    // -exp(A_log): negative, so the state decays.
    let w = r.f32_vec(hv, 0.5).iter().map(|x| -(1.0 + x)).collect();
    t(g, &n("ssm_a"), &[hv], w);
    match c.family {
        Family::Qwen35Moe => {
            t(g, &n("ssm_beta.weight"), &[e, hv], r.f32_vec(e * hv, 0.3));
            t(g, &n("ssm_alpha.weight"), &[e, hv], r.f32_vec(e * hv, 0.3));
        }
        Family::Qwen3Next => {
            let w = r.f32_vec(e * 2 * hv, 0.3);
            t(g, &n("ssm_ba.weight"), &[e, 2 * hv], w);
        }
    }
    t(
        g,
        &n("ssm_norm.weight"),
        &[c.ssm_head],
        near_one(r, c.ssm_head),
    );
    t(
        g,
        &n("ssm_out.weight"),
        &[inner, e],
        r.f32_vec(inner * e, 0.3),
    );
}

/// Block `l`'s gated attention tensors.
fn attention(c: &MoeHybridCfg, g: &mut GgufWriter, r: &mut SplitMix64, l: usize) {
    let n = |s: &str| format!("blk.{l}.{s}");
    let e = c.n_embd;
    let (q, kv) = (c.head_dim * c.n_head, c.head_dim * c.n_head_kv);
    let wq = r.f32_vec(e * 2 * q, 0.3);
    let wk = r.f32_vec(e * kv, 0.3);
    let wv = r.f32_vec(e * kv, 0.3);
    if c.fused_qkv {
        let all = [wq, wk, wv].concat();
        t(g, &n("attn_qkv.weight"), &[e, 2 * q + 2 * kv], all);
    } else {
        t(g, &n("attn_q.weight"), &[e, 2 * q], wq);
        t(g, &n("attn_k.weight"), &[e, kv], wk);
        t(g, &n("attn_v.weight"), &[e, kv], wv);
    }
    let w = near_one(r, c.head_dim);
    t(g, &n("attn_q_norm.weight"), &[c.head_dim], w);
    let w = near_one(r, c.head_dim);
    t(g, &n("attn_k_norm.weight"), &[c.head_dim], w);
    t(g, &n("attn_output.weight"), &[q, e], r.f32_vec(q * e, 0.3));
}

/// Block `l`'s experts and shared expert.
fn experts(c: &MoeHybridCfg, g: &mut GgufWriter, r: &mut SplitMix64, l: usize) {
    let n = |s: &str| format!("blk.{l}.{s}");
    let (e, x, ff, sh) = (c.n_embd, c.n_expert, c.n_ff_exp, c.n_ff_shared);
    t(g, &n("ffn_gate_inp.weight"), &[e, x], r.f32_vec(e * x, 0.5));
    let gate = r.f32_vec(e * ff * x, 0.3);
    let up = r.f32_vec(e * ff * x, 0.3);
    if c.fused_gate_up {
        let block = e * ff;
        let both: Vec<f32> = (0..x)
            .flat_map(|j| [&gate, &up].map(|w| &w[j * block..(j + 1) * block]))
            .flatten()
            .copied()
            .collect();
        t(g, &n("ffn_gate_up_exps.weight"), &[e, 2 * ff, x], both);
    } else {
        t(g, &n("ffn_gate_exps.weight"), &[e, ff, x], gate);
        t(g, &n("ffn_up_exps.weight"), &[e, ff, x], up);
    }
    let w = r.f32_vec(ff * e * x, 0.3);
    t(g, &n("ffn_down_exps.weight"), &[ff, e, x], w);
    t(g, &n("ffn_gate_inp_shexp.weight"), &[e], r.f32_vec(e, 0.5));
    t(
        g,
        &n("ffn_gate_shexp.weight"),
        &[e, sh],
        r.f32_vec(e * sh, 0.3),
    );
    t(
        g,
        &n("ffn_up_shexp.weight"),
        &[e, sh],
        r.f32_vec(e * sh, 0.3),
    );
    t(
        g,
        &n("ffn_down_shexp.weight"),
        &[sh, e],
        r.f32_vec(sh * e, 0.3),
    );
}

/// Writes the model with weights drawn from `seed` to `path`.
pub fn write_moe_hybrid(c: &MoeHybridCfg, seed: u64, path: &Path) {
    let mut r = SplitMix64(seed);
    let mut g = GgufWriter::new();
    header(c, &mut g);
    let (e, v) = (c.n_embd, c.n_vocab);
    t(&mut g, "token_embd.weight", &[e, v], r.f32_vec(e * v, 1.0));
    let w = near_one(&mut r, e);
    t(&mut g, "output_norm.weight", &[e], w);
    t(&mut g, "output.weight", &[e, v], r.f32_vec(e * v, 0.3));
    for l in 0..c.n_layer {
        let w = near_one(&mut r, e);
        t(&mut g, &format!("blk.{l}.attn_norm.weight"), &[e], w);
        match c.recurrent(l) {
            true => delta_net(c, &mut g, &mut r, l),
            false => attention(c, &mut g, &mut r, l),
        }
        let w = near_one(&mut r, e);
        t(
            &mut g,
            &format!("blk.{l}.post_attention_norm.weight"),
            &[e],
            w,
        );
        experts(c, &mut g, &mut r, l);
    }
    let nextn = c.nextn_predict_layers.unwrap_or(0) as usize;
    for l in c.n_layer..c.n_layer + nextn {
        let n = |s: &str| format!("blk.{l}.{s}");
        for name in [
            "attn_norm",
            "post_attention_norm",
            "nextn.enorm",
            "nextn.hnorm",
        ] {
            let w = near_one(&mut r, e);
            t(&mut g, &n(&format!("{name}.weight")), &[e], w);
        }
        attention(c, &mut g, &mut r, l);
        experts(c, &mut g, &mut r, l);
        let w = r.f32_vec(2 * e * e, 0.3);
        t(&mut g, &n("nextn.eh_proj.weight"), &[2 * e, e], w);
    }
    g.write(path).unwrap();
}

/// The tiny model of `family` and `seed`, written into a temporary directory and loaded.
pub fn build_moe_hybrid(family: Family, seed: u64) -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{}.gguf", family.arch()));
    write_moe_hybrid(&moe_hybrid_cfg(family), seed, &path);
    let model = Model::load(&path).unwrap();
    (dir, model)
}
