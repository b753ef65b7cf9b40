//! A tiny qwen35 (Qwen3.5) model written by the tests: four blocks, gated delta-nets in the
//! first and third and gated attention in the second and fourth (`full_attention_interval`
//! 2), with twice as many value heads as key heads in the delta-nets (so the kernel's
//! broadcast of key heads is exercised), partial M-RoPE and f32 weights throughout.

use std::path::Path;
use std::sync::Arc;

use engine::gguf::{GgmlType, GgufWriter};
use engine::testing::SplitMix64;
use engine::Model;

use super::f32_bytes;

/// The tiny model's sizes.
pub struct Qwen35Cfg {
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    /// Attention heads, key/value heads and head dimension.
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Rotated dimensions per head, and their M-RoPE sections (pairs).
    pub rope_dims: usize,
    pub sections: [i32; 4],
    /// Every `interval`-th block attends; the others are delta-nets.
    pub interval: usize,
    /// Delta-net key heads, value heads, head dimension and convolution width.
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub ssm_head: usize,
    pub conv_kernel: usize,
    pub eps: f32,
}

/// The model the tests use.
pub fn qwen35_cfg() -> Qwen35Cfg {
    Qwen35Cfg {
        n_vocab: 97,
        n_embd: 32,
        n_layer: 4,
        n_ff: 48,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 16,
        rope_dims: 8,
        sections: [2, 1, 1, 0],
        interval: 2,
        n_k_heads: 2,
        n_v_heads: 4,
        ssm_head: 8,
        conv_kernel: 4,
        eps: 1e-6,
    }
}

impl Qwen35Cfg {
    /// Whether block `l` is a delta-net.
    pub fn recurrent(&self, l: usize) -> bool {
        !(l + 1).is_multiple_of(self.interval)
    }
    fn channels(&self) -> usize {
        self.ssm_head * (2 * self.n_k_heads + self.n_v_heads)
    }
}

/// Writes the model with weights drawn from `seed` to `path`.
pub fn write_qwen35(c: &Qwen35Cfg, seed: u64, path: &Path) {
    let mut r = SplitMix64(seed);
    let arch = "qwen35";
    let mut g = GgufWriter::new();
    g.add_str("general.architecture", arch);
    let k = |s: &str| format!("{arch}.{s}");
    g.add_u32(&k("context_length"), 256);
    g.add_u32(&k("embedding_length"), c.n_embd as u32);
    g.add_u32(&k("block_count"), c.n_layer as u32);
    g.add_u32(&k("feed_forward_length"), c.n_ff as u32);
    g.add_u32(&k("attention.head_count"), c.n_head as u32);
    g.add_u32(&k("attention.head_count_kv"), c.n_head_kv as u32);
    g.add_u32(&k("attention.key_length"), c.head_dim as u32);
    g.add_u32(&k("attention.value_length"), c.head_dim as u32);
    g.add_f32(&k("attention.layer_norm_rms_epsilon"), c.eps);
    g.add_f32(&k("rope.freq_base"), 10000.0);
    g.add_u32(&k("rope.dimension_count"), c.rope_dims as u32);
    g.add_i32_array(&k("rope.dimension_sections"), &c.sections);
    g.add_u32(&k("full_attention_interval"), c.interval as u32);
    g.add_u32(&k("ssm.conv_kernel"), c.conv_kernel as u32);
    g.add_u32(&k("ssm.state_size"), c.ssm_head as u32);
    g.add_u32(&k("ssm.group_count"), c.n_k_heads as u32);
    g.add_u32(&k("ssm.time_step_rank"), c.n_v_heads as u32);
    g.add_u32(&k("ssm.inner_size"), (c.ssm_head * c.n_v_heads) as u32);
    // The byte-level vocabulary of the other tiny models: single characters, no merges.
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
    for l in 0..c.n_layer {
        let n = |s: &str| format!("blk.{l}.{s}");
        let w = near_one(&mut r, e);
        t(&mut g, &n("attn_norm.weight"), &[e], w);
        if c.recurrent(l) {
            let (ch, inner, hv) = (c.channels(), c.ssm_head * c.n_v_heads, c.n_v_heads);
            let w = r.f32_vec(e * ch, 0.3);
            t(&mut g, &n("attn_qkv.weight"), &[e, ch], w);
            let w = r.f32_vec(e * inner, 0.3);
            t(&mut g, &n("attn_gate.weight"), &[e, inner], w);
            let w = r.f32_vec(c.conv_kernel * ch, 0.5);
            t(&mut g, &n("ssm_conv1d.weight"), &[c.conv_kernel, ch], w);
            let w = r.f32_vec(hv, 0.5);
            t(&mut g, &n("ssm_dt.bias"), &[hv], w);
            // -exp(A_log): negative, so the state decays.
            let w = r.f32_vec(hv, 0.5).iter().map(|x| -(1.0 + x)).collect();
            t(&mut g, &n("ssm_a"), &[hv], w);
            let w = r.f32_vec(e * hv, 0.3);
            t(&mut g, &n("ssm_beta.weight"), &[e, hv], w);
            let w = r.f32_vec(e * hv, 0.3);
            t(&mut g, &n("ssm_alpha.weight"), &[e, hv], w);
            let w = near_one(&mut r, c.ssm_head);
            t(&mut g, &n("ssm_norm.weight"), &[c.ssm_head], w);
            let w = r.f32_vec(inner * e, 0.3);
            t(&mut g, &n("ssm_out.weight"), &[inner, e], w);
        } else {
            let (q, kv) = (c.head_dim * c.n_head, c.head_dim * c.n_head_kv);
            let w = r.f32_vec(e * 2 * q, 0.3);
            t(&mut g, &n("attn_q.weight"), &[e, 2 * q], w);
            let w = r.f32_vec(e * kv, 0.3);
            t(&mut g, &n("attn_k.weight"), &[e, kv], w);
            let w = r.f32_vec(e * kv, 0.3);
            t(&mut g, &n("attn_v.weight"), &[e, kv], w);
            let w = near_one(&mut r, c.head_dim);
            t(&mut g, &n("attn_q_norm.weight"), &[c.head_dim], w);
            let w = near_one(&mut r, c.head_dim);
            t(&mut g, &n("attn_k_norm.weight"), &[c.head_dim], w);
            let w = r.f32_vec(q * e, 0.3);
            t(&mut g, &n("attn_output.weight"), &[q, e], w);
        }
        let w = near_one(&mut r, e);
        t(&mut g, &n("post_attention_norm.weight"), &[e], w);
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
pub fn build_qwen35(seed: u64) -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen35.gguf");
    write_qwen35(&qwen35_cfg(), seed, &path);
    let model = Model::load(&path).unwrap();
    (dir, model)
}
