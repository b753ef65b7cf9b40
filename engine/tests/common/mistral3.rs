//! A tiny Mistral 3 text model with random weights: llama's blocks (two layers, grouped-query
//! attention) under YaRN with the file's own `beta_fast`, `beta_slow` and log multiplier (a
//! factor of 4 over an original context of 8 positions, so the prompts reach well past it), an
//! attention temperature growing every 8 positions, and an untied output.

use std::path::Path;

use engine::gguf::{GgmlType, GgufWriter};
use engine::testing::SplitMix64;

use super::{f16_bytes, f32_bytes};

pub const N_VOCAB: usize = 97;
pub const N_EMBD: usize = 32;
pub const N_HEAD: usize = 4;
pub const N_HEAD_KV: usize = 2;
pub const N_FF: usize = 48;
pub const N_LAYER: usize = 2;

/// Writes the tiny model (the same bytes for the same seed) to `path`; `temperature` sets
/// `attention.temperature_scale` (0 writes none).
pub fn write(path: &Path, seed: u64, temperature: f32) {
    let mut r = SplitMix64(seed);
    let mut g = GgufWriter::new();
    let k = |s: &str| format!("mistral3.{s}");
    g.add_str("general.architecture", "mistral3");
    g.add_u32(&k("context_length"), 256);
    g.add_u32(&k("embedding_length"), N_EMBD as u32);
    g.add_u32(&k("block_count"), N_LAYER as u32);
    g.add_u32(&k("feed_forward_length"), N_FF as u32);
    g.add_u32(&k("attention.head_count"), N_HEAD as u32);
    g.add_u32(&k("attention.head_count_kv"), N_HEAD_KV as u32);
    g.add_f32(&k("attention.layer_norm_rms_epsilon"), 1e-5);
    g.add_f32(&k("rope.freq_base"), 10_000.0);
    g.add_str(&k("rope.scaling.type"), "yarn");
    g.add_f32(&k("rope.scaling.factor"), 4.0);
    g.add_u32(&k("rope.scaling.original_context_length"), 8);
    g.add_f32(&k("rope.scaling.yarn_beta_fast"), 16.0);
    g.add_f32(&k("rope.scaling.yarn_beta_slow"), 2.0);
    g.add_f32(&k("rope.scaling.yarn_log_multiplier"), 0.7);
    if temperature != 0.0 {
        g.add_f32(&k("attention.temperature_scale"), temperature);
    }
    super::add_tiny_vocab(&mut g, N_VOCAB);

    let (e, v) = (N_EMBD as u64, N_VOCAB as u64);
    let hd = N_EMBD / N_HEAD;
    let kv = (hd * N_HEAD_KV) as u64;
    let f32t = |g: &mut GgufWriter, name: &str, shape: &[u64], w: Vec<f32>| {
        g.add_tensor(name, shape, GgmlType::F32, f32_bytes(&w));
    };
    let f16t = |g: &mut GgufWriter, name: &str, shape: &[u64], w: Vec<f32>| {
        g.add_tensor(name, shape, GgmlType::F16, f16_bytes(&w));
    };
    let norm = |r: &mut SplitMix64| -> Vec<f32> {
        r.f32_vec(N_EMBD, 0.5).iter().map(|x| 1.0 + x).collect()
    };
    f32t(
        &mut g,
        "token_embd.weight",
        &[e, v],
        r.f32_vec(N_EMBD * N_VOCAB, 1.0),
    );
    f32t(&mut g, "output_norm.weight", &[e], norm(&mut r));
    f32t(
        &mut g,
        "output.weight",
        &[e, v],
        r.f32_vec(N_EMBD * N_VOCAB, 0.3),
    );
    for l in 0..N_LAYER {
        let n = |s: &str| format!("blk.{l}.{s}");
        f32t(&mut g, &n("attn_norm.weight"), &[e], norm(&mut r));
        f32t(
            &mut g,
            &n("attn_q.weight"),
            &[e, e],
            r.f32_vec(N_EMBD * N_EMBD, 0.3),
        );
        f32t(
            &mut g,
            &n("attn_k.weight"),
            &[e, kv],
            r.f32_vec(N_EMBD * kv as usize, 0.3),
        );
        f32t(
            &mut g,
            &n("attn_v.weight"),
            &[e, kv],
            r.f32_vec(N_EMBD * kv as usize, 0.3),
        );
        f32t(
            &mut g,
            &n("attn_output.weight"),
            &[e, e],
            r.f32_vec(N_EMBD * N_EMBD, 0.3),
        );
        f32t(&mut g, &n("ffn_norm.weight"), &[e], norm(&mut r));
        let ff = N_FF as u64;
        f16t(
            &mut g,
            &n("ffn_gate.weight"),
            &[e, ff],
            r.f32_vec(N_EMBD * N_FF, 0.3),
        );
        f16t(
            &mut g,
            &n("ffn_up.weight"),
            &[e, ff],
            r.f32_vec(N_EMBD * N_FF, 0.3),
        );
        f16t(
            &mut g,
            &n("ffn_down.weight"),
            &[ff, e],
            r.f32_vec(N_EMBD * N_FF, 0.3),
        );
    }
    g.write(path).unwrap();
}
