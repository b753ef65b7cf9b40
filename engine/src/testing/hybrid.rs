//! A tiny hybrid chat model: qwen35 (gated delta-nets and gated attention) with the byte-level
//! vocabulary and ChatML tokens of [`TinyChatModel`], for the tests and benchmarks of the prompt
//! cache of models whose recurrent state cannot be cut back.

use std::path::Path;

use super::{SplitMix64, TinyChatModel};
use crate::gguf::{GgmlType, GgufWriter};
use crate::Result;

/// A qwen35 of four blocks (delta-nets first and third, attention second and fourth), width 32,
/// with twice as many value heads as key heads in its delta-nets, f32 weights.
#[derive(Debug, Clone)]
pub struct TinyHybridModel {
    /// `qwen35.context_length`.
    pub context_length: u32,
    /// Seed of the weights.
    pub seed: u64,
}

impl Default for TinyHybridModel {
    fn default() -> Self {
        TinyHybridModel {
            context_length: 8192,
            seed: 35,
        }
    }
}

/// Sizes: width, feed-forward, attention heads / KV heads / head size, rotated dims,
/// delta-net key heads / value heads / head size, convolution width, blocks.
const E: usize = 32;
const FF: usize = 48;
const HEADS: (usize, usize, usize) = (4, 2, 16);
const ROPE_DIMS: usize = 8;
const SSM: (usize, usize, usize) = (2, 4, 8);
const CONV: usize = 4;
const LAYERS: usize = 4;

impl TinyHybridModel {
    /// Writes the model to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let (tokens, types, merges) = TinyChatModel::default().vocabulary();
        let n_vocab = tokens.len();
        let arch = "qwen35";
        let k = |s: &str| format!("{arch}.{s}");
        let (n_head, n_kv, hd) = HEADS;
        let (n_kh, n_vh, sh) = SSM;
        let mut g = GgufWriter::new();
        g.add_str("general.architecture", arch)
            .add_u32(&k("context_length"), self.context_length)
            .add_u32(&k("embedding_length"), E as u32)
            .add_u32(&k("block_count"), LAYERS as u32)
            .add_u32(&k("feed_forward_length"), FF as u32)
            .add_u32(&k("attention.head_count"), n_head as u32)
            .add_u32(&k("attention.head_count_kv"), n_kv as u32)
            .add_u32(&k("attention.key_length"), hd as u32)
            .add_u32(&k("attention.value_length"), hd as u32)
            .add_f32(&k("attention.layer_norm_rms_epsilon"), 1e-6)
            .add_f32(&k("rope.freq_base"), 10000.0)
            .add_u32(&k("rope.dimension_count"), ROPE_DIMS as u32)
            .add_i32_array(&k("rope.dimension_sections"), &[2, 1, 1, 0])
            .add_u32(&k("full_attention_interval"), 2)
            .add_u32(&k("ssm.conv_kernel"), CONV as u32)
            .add_u32(&k("ssm.state_size"), sh as u32)
            .add_u32(&k("ssm.group_count"), n_kh as u32)
            .add_u32(&k("ssm.time_step_rank"), n_vh as u32)
            .add_u32(&k("ssm.inner_size"), (sh * n_vh) as u32)
            .add_str("tokenizer.ggml.model", "gpt2")
            .add_str("tokenizer.ggml.pre", "default")
            .add_str_array("tokenizer.ggml.tokens", &tokens)
            .add_i32_array("tokenizer.ggml.token_type", &types)
            .add_str_array("tokenizer.ggml.merges", &merges)
            .add_u32("tokenizer.ggml.eos_token_id", n_vocab as u32 - 1);
        let mut r = SplitMix64(self.seed);
        let mut add = |g: &mut GgufWriter, name: &str, dims: &[usize], scale: f32, offset: f32| {
            let count = dims.iter().product::<usize>();
            let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
            g.add_tensor(
                name,
                &dims,
                GgmlType::F32,
                r.f32_bytes(count, scale, offset),
            );
        };
        add(&mut g, "token_embd.weight", &[E, n_vocab], 1.0, 0.0);
        add(&mut g, "output_norm.weight", &[E], 0.5, 1.0);
        add(&mut g, "output.weight", &[E, n_vocab], 0.3, 0.0);
        let (q, kv) = (hd * n_head, hd * n_kv);
        let (ch, inner) = (sh * (2 * n_kh + n_vh), sh * n_vh);
        for l in 0..LAYERS {
            let n = |s: &str| format!("blk.{l}.{s}");
            add(&mut g, &n("attn_norm.weight"), &[E], 0.5, 1.0);
            if l % 2 == 0 {
                add(&mut g, &n("attn_qkv.weight"), &[E, ch], 0.3, 0.0);
                add(&mut g, &n("attn_gate.weight"), &[E, inner], 0.3, 0.0);
                add(&mut g, &n("ssm_conv1d.weight"), &[CONV, ch], 0.5, 0.0);
                add(&mut g, &n("ssm_dt.bias"), &[n_vh], 0.5, 0.0);
                // -exp(A_log): negative, so the state decays.
                add(&mut g, &n("ssm_a"), &[n_vh], 0.5, -1.0);
                add(&mut g, &n("ssm_beta.weight"), &[E, n_vh], 0.3, 0.0);
                add(&mut g, &n("ssm_alpha.weight"), &[E, n_vh], 0.3, 0.0);
                add(&mut g, &n("ssm_norm.weight"), &[sh], 0.5, 1.0);
                add(&mut g, &n("ssm_out.weight"), &[inner, E], 0.3, 0.0);
            } else {
                add(&mut g, &n("attn_q.weight"), &[E, 2 * q], 0.3, 0.0);
                add(&mut g, &n("attn_k.weight"), &[E, kv], 0.3, 0.0);
                add(&mut g, &n("attn_v.weight"), &[E, kv], 0.3, 0.0);
                add(&mut g, &n("attn_q_norm.weight"), &[hd], 0.5, 1.0);
                add(&mut g, &n("attn_k_norm.weight"), &[hd], 0.5, 1.0);
                add(&mut g, &n("attn_output.weight"), &[q, E], 0.3, 0.0);
            }
            add(&mut g, &n("post_attention_norm.weight"), &[E], 0.5, 1.0);
            add(&mut g, &n("ffn_gate.weight"), &[E, FF], 0.3, 0.0);
            add(&mut g, &n("ffn_up.weight"), &[E, FF], 0.3, 0.0);
            add(&mut g, &n("ffn_down.weight"), &[FF, E], 0.3, 0.0);
        }
        g.write(path)
    }
}
