//! Tiny llama- and qwen2-shaped models written by the tests, and a naive Rust forward pass of
//! the same network to check the engine against.

#![allow(dead_code)]

pub mod gemma4;
pub mod golden;
pub mod gpt_oss;
pub mod granite_hybrid;
pub mod lfm2;
pub mod mistral3;
pub mod nemotron_h;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use engine::gguf::{GgmlType, GgufWriter};
use engine::testing::SplitMix64;
use engine::{ContextParams, Model};

pub mod qwen35;
pub mod qwen3next;
pub mod recurrent;
use half::f16;

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Shape {
    Llama,
    Qwen2,
    /// qwen2 without biases, with per-head RMSNorm of Q and K before RoPE.
    Qwen3,
    /// qwen3's head norms, norms after attention and the FFN, a GELU FFN, scaled embeddings,
    /// and a sliding window (4 positions) on every other layer.
    Gemma3,
    /// gemma3 without head norms, with soft-capped scores and logits (5 each); tied output.
    Gemma2,
    /// llama with Q/K/V fused in one matrix, gate and up in another, NeoX RoPE.
    Phi3,
    /// qwen3 whose FFNs are 4 experts of width 16, 2 used per token.
    Qwen3Moe,
    /// llama with the same experts (Mixtral's layout).
    LlamaMoe,
    /// qwen2 (biases, NeoX RoPE) whose FFNs are the same experts, weights not normalised, plus
    /// a shared expert of width `SHARED_FF` gated by a sigmoid.
    Qwen2Moe,
}

/// Experts of the `Qwen3Moe` shape: count, used per token, width.
pub const MOE: (usize, usize, usize) = (4, 2, 16);

/// Width of the `Qwen2Moe` shape's shared expert.
pub const SHARED_FF: usize = 24;

impl Shape {
    /// The GGUF architecture name.
    pub fn arch(self) -> &'static str {
        match self {
            Shape::Llama => "llama",
            Shape::Qwen2 => "qwen2",
            Shape::Qwen3 => "qwen3",
            Shape::Gemma3 => "gemma3",
            Shape::Gemma2 => "gemma2",
            Shape::Phi3 => "phi3",
            Shape::Qwen3Moe => "qwen3moe",
            Shape::LlamaMoe => "llama",
            Shape::Qwen2Moe => "qwen2moe",
        }
    }

    /// Whether the FFNs are experts.
    pub fn moe(self) -> bool {
        matches!(self, Shape::Qwen3Moe | Shape::LlamaMoe | Shape::Qwen2Moe)
    }
}

pub struct Cfg {
    pub shape: Shape,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub tied: bool,
    pub eps: f32,
    pub base: f32,
    /// Llama-3-style RoPE frequency factors (`rope_freqs.weight`, `head_dim / 2` values).
    pub rope_freqs: Option<Vec<f32>>,
    /// `context_length`: the longest context a context of the model gets.
    pub n_ctx_train: u32,
}

impl Cfg {
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }
    pub fn kv_dim(&self) -> usize {
        self.head_dim() * self.n_head_kv
    }
}

/// Weights in ggml order: a matrix `[k, m]` is m rows of k contiguous values.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub wo: Vec<f32>,
    pub bq: Vec<f32>,
    pub bk: Vec<f32>,
    pub bv: Vec<f32>,
    /// Per-head norms of Q and K (`head_dim` values each; written for qwen3 only).
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    /// Norms after attention and after the FFN (written for gemma3 only).
    pub post_attn_norm: Vec<f32>,
    pub post_ffn_norm: Vec<f32>,
    /// Router `[n_embd, n_expert]` and expert stacks (gate, up `[n_embd, ff, n]`, down
    /// `[ff, n_embd, n]`), written for the shapes with experts only.
    pub gate_inp: Vec<f32>,
    pub gate_exps: Vec<f32>,
    pub up_exps: Vec<f32>,
    pub down_exps: Vec<f32>,
    /// The shared expert: its gate `[n_embd]` and its network (gate, up `[n_embd, SHARED_FF]`,
    /// down `[SHARED_FF, n_embd]`), written for qwen2moe only.
    pub shexp: [Vec<f32>; 4],
    pub ffn_norm: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

pub struct Weights {
    pub embd: Vec<f32>,
    pub out_norm: Vec<f32>,
    pub output: Vec<f32>,
    pub layers: Vec<Layer>,
}

pub fn make_weights(c: &Cfg, seed: u64) -> Weights {
    let mut r = SplitMix64(seed);
    let (e, kv, ff) = (c.n_embd, c.kv_dim(), c.n_ff);
    let norm = |r: &mut SplitMix64| {
        r.f32_vec(e, 0.5)
            .iter()
            .map(|v| 1.0 + v)
            .collect::<Vec<_>>()
    };
    let layers = (0..c.n_layer)
        .map(|_| Layer {
            attn_norm: norm(&mut r),
            wq: r.f32_vec(e * e, 0.3),
            wk: r.f32_vec(e * kv, 0.3),
            wv: r.f32_vec(e * kv, 0.3),
            wo: r.f32_vec(e * e, 0.3),
            bq: r.f32_vec(e, 0.2),
            bk: r.f32_vec(kv, 0.2),
            bv: r.f32_vec(kv, 0.2),
            q_norm: Vec::new(),
            k_norm: Vec::new(),
            post_attn_norm: Vec::new(),
            post_ffn_norm: Vec::new(),
            gate_inp: Vec::new(),
            gate_exps: Vec::new(),
            up_exps: Vec::new(),
            down_exps: Vec::new(),
            shexp: Default::default(),
            ffn_norm: norm(&mut r),
            gate: r.f32_vec(e * ff, 0.3),
            up: r.f32_vec(e * ff, 0.3),
            down: r.f32_vec(ff * e, 0.3),
        })
        .collect();
    let embd = r.f32_vec(e * c.n_vocab, 1.0);
    let output = if c.tied {
        embd.clone()
    } else {
        r.f32_vec(e * c.n_vocab, 0.3)
    };
    let out_norm = norm(&mut r);
    // Drawn last, so the other weights of a seed do not depend on them.
    let mut layers: Vec<Layer> = layers;
    for l in &mut layers {
        let head = |r: &mut SplitMix64| {
            r.f32_vec(c.head_dim(), 0.5)
                .iter()
                .map(|v| 1.0 + v)
                .collect::<Vec<_>>()
        };
        l.q_norm = head(&mut r);
        l.k_norm = head(&mut r);
    }
    for l in &mut layers {
        l.post_attn_norm = norm(&mut r);
        l.post_ffn_norm = norm(&mut r);
    }
    let (n_x, _, ff_x) = MOE;
    for l in &mut layers {
        l.gate_inp = r.f32_vec(e * n_x, 0.5);
        l.gate_exps = r.f32_vec(e * ff_x * n_x, 0.3);
        l.up_exps = r.f32_vec(e * ff_x * n_x, 0.3);
        l.down_exps = r.f32_vec(ff_x * e * n_x, 0.3);
    }
    for l in &mut layers {
        let ffs = e * SHARED_FF;
        let gate_inp = r.f32_vec(e, 0.5);
        l.shexp = [
            gate_inp,
            r.f32_vec(ffs, 0.3),
            r.f32_vec(ffs, 0.3),
            r.f32_vec(ffs, 0.3),
        ];
    }
    Weights {
        embd,
        out_norm,
        output,
        layers,
    }
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| f16::from_f32(*x).to_le_bytes())
        .collect()
}

/// Rounds through f16, for weights stored as f16.
pub fn via_f16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| f16::from_f32(*x).to_f32()).collect()
}

/// Writes the model; the FFN matrices are stored as f16 (so the reference rounds them too).
pub fn write_model(c: &Cfg, w: &mut Weights, path: &Path) {
    let arch = c.shape.arch();
    let mut g = GgufWriter::new();
    g.add_str("general.architecture", arch);
    let k = |s: &str| format!("{arch}.{s}");
    g.add_u32(&k("context_length"), c.n_ctx_train);
    g.add_u32(&k("embedding_length"), c.n_embd as u32);
    g.add_u32(&k("block_count"), c.n_layer as u32);
    // Mixtral-style experts are `feed_forward_length` wide.
    let n_ff = if c.shape == Shape::LlamaMoe {
        MOE.2
    } else {
        c.n_ff
    };
    g.add_u32(&k("feed_forward_length"), n_ff as u32);
    g.add_u32(&k("attention.head_count"), c.n_head as u32);
    g.add_u32(&k("attention.head_count_kv"), c.n_head_kv as u32);
    g.add_f32(&k("attention.layer_norm_rms_epsilon"), c.eps);
    g.add_f32(&k("rope.freq_base"), c.base);
    if c.shape.moe() {
        g.add_u32(&k("expert_count"), MOE.0 as u32);
        g.add_u32(&k("expert_used_count"), MOE.1 as u32);
        if matches!(c.shape, Shape::Qwen3Moe | Shape::Qwen2Moe) {
            g.add_u32(&k("expert_feed_forward_length"), MOE.2 as u32);
        }
        if c.shape == Shape::Qwen2Moe {
            g.add_u32(&k("expert_shared_feed_forward_length"), SHARED_FF as u32);
        }
    }
    if c.shape == Shape::Gemma2 {
        // The window pattern is gemma2's default (every other layer); the caps small enough to
        // bite on these weights.
        g.add_u32(&k("attention.sliding_window"), 4);
        g.add_f32(&k("attn_logit_softcapping"), 5.0);
        g.add_f32(&k("final_logit_softcapping"), 5.0);
    }
    if c.shape == Shape::Gemma3 {
        g.add_u32(&k("attention.sliding_window"), 4);
        g.add_u32(&k("attention.sliding_window_pattern"), 2);
        g.add_f32(&k("rope.freq_base_swa"), 100.0);
    }
    add_tiny_vocab(&mut g, c.n_vocab);

    let (e, v) = (c.n_embd as u64, c.n_vocab as u64);
    g.add_tensor(
        "token_embd.weight",
        &[e, v],
        GgmlType::F32,
        f32_bytes(&w.embd),
    );
    if let Some(f) = &c.rope_freqs {
        g.add_tensor(
            "rope_freqs.weight",
            &[f.len() as u64],
            GgmlType::F32,
            f32_bytes(f),
        );
    }
    g.add_tensor(
        "output_norm.weight",
        &[e],
        GgmlType::F32,
        f32_bytes(&w.out_norm),
    );
    if !c.tied {
        g.add_tensor(
            "output.weight",
            &[e, v],
            GgmlType::F32,
            f32_bytes(&w.output),
        );
    }
    for (l, lw) in w.layers.iter_mut().enumerate() {
        write_layer(&mut g, c, l, lw);
    }
    g.write(path).unwrap();
}

/// Adds the tiny models' vocabulary of `n_vocab` tokens to `g`: byte-level, single characters
/// (then doubled, tripled, ...), no merges, token 0 the end of text.
pub fn add_tiny_vocab(g: &mut GgufWriter, n_vocab: usize) {
    let tokens: Vec<String> = (0..n_vocab)
        .map(|i| {
            char::from(b'!' + (i % 90) as u8)
                .to_string()
                .repeat(1 + i / 90)
        })
        .collect();
    g.add_str("tokenizer.ggml.model", "gpt2");
    g.add_str("tokenizer.ggml.pre", "default");
    g.add_str_array("tokenizer.ggml.tokens", &tokens);
    g.add_i32_array("tokenizer.ggml.token_type", &vec![1; n_vocab]);
    g.add_str_array::<&str>("tokenizer.ggml.merges", &[]);
    g.add_u32("tokenizer.ggml.eos_token_id", 0);
}

/// Adds layer `l`'s tensors to `g` in the shape's layout, and leaves in `lw` what the model
/// will compute with: biases the shape lacks zeroed, f16-stored matrices rounded through f16.
fn write_layer(g: &mut GgufWriter, c: &Cfg, l: usize, lw: &mut Layer) {
    let (e, kv) = (c.n_embd as u64, c.kv_dim() as u64);
    let n = |s: &str| format!("blk.{l}.{s}");
    g.add_tensor(
        &n("attn_norm.weight"),
        &[e],
        GgmlType::F32,
        f32_bytes(&lw.attn_norm),
    );
    if c.shape == Shape::Phi3 {
        // One matrix: Q's rows, then K's, then V's.
        let fused: Vec<f32> = [&lw.wq, &lw.wk, &lw.wv]
            .into_iter()
            .flatten()
            .copied()
            .collect();
        g.add_tensor(
            &n("attn_qkv.weight"),
            &[e, e + 2 * kv],
            GgmlType::F32,
            f32_bytes(&fused),
        );
    } else {
        g.add_tensor(
            &n("attn_q.weight"),
            &[e, e],
            GgmlType::F32,
            f32_bytes(&lw.wq),
        );
        g.add_tensor(
            &n("attn_k.weight"),
            &[e, kv],
            GgmlType::F32,
            f32_bytes(&lw.wk),
        );
        g.add_tensor(
            &n("attn_v.weight"),
            &[e, kv],
            GgmlType::F32,
            f32_bytes(&lw.wv),
        );
    }
    g.add_tensor(
        &n("attn_output.weight"),
        &[e, e],
        GgmlType::F32,
        f32_bytes(&lw.wo),
    );
    if matches!(c.shape, Shape::Qwen3 | Shape::Gemma3 | Shape::Qwen3Moe) {
        let hd = c.head_dim() as u64;
        g.add_tensor(
            &n("attn_q_norm.weight"),
            &[hd],
            GgmlType::F32,
            f32_bytes(&lw.q_norm),
        );
        g.add_tensor(
            &n("attn_k_norm.weight"),
            &[hd],
            GgmlType::F32,
            f32_bytes(&lw.k_norm),
        );
    }
    if matches!(c.shape, Shape::Gemma3 | Shape::Gemma2) {
        g.add_tensor(
            &n("post_attention_norm.weight"),
            &[e],
            GgmlType::F32,
            f32_bytes(&lw.post_attn_norm),
        );
        g.add_tensor(
            &n("post_ffw_norm.weight"),
            &[e],
            GgmlType::F32,
            f32_bytes(&lw.post_ffn_norm),
        );
    }
    if matches!(c.shape, Shape::Qwen2 | Shape::Qwen2Moe) {
        g.add_tensor(&n("attn_q.bias"), &[e], GgmlType::F32, f32_bytes(&lw.bq));
        g.add_tensor(&n("attn_k.bias"), &[kv], GgmlType::F32, f32_bytes(&lw.bk));
        g.add_tensor(&n("attn_v.bias"), &[kv], GgmlType::F32, f32_bytes(&lw.bv));
    } else {
        lw.bq
            .iter_mut()
            .chain(lw.bk.iter_mut())
            .chain(lw.bv.iter_mut())
            .for_each(|b| *b = 0.0);
    }
    g.add_tensor(
        &n("ffn_norm.weight"),
        &[e],
        GgmlType::F32,
        f32_bytes(&lw.ffn_norm),
    );
    write_ffn(g, c, l, lw);
    lw.gate = via_f16(&lw.gate);
    lw.up = via_f16(&lw.up);
    lw.down = via_f16(&lw.down);
}

/// Adds layer `l`'s feed-forward tensors to `g`: experts (and a shared expert), phi3's fused
/// gate and up, or the dense gate, up and down.
fn write_ffn(g: &mut GgufWriter, c: &Cfg, l: usize, lw: &Layer) {
    let n = |s: &str| format!("blk.{l}.{s}");
    let (e, ff) = (c.n_embd as u64, c.n_ff as u64);
    if c.shape.moe() {
        let (n_x, ff_x) = (MOE.0 as u64, MOE.2 as u64);
        g.add_tensor(
            &n("ffn_gate_inp.weight"),
            &[e, n_x],
            GgmlType::F32,
            f32_bytes(&lw.gate_inp),
        );
        for (name, shape, w) in [
            ("ffn_gate_exps.weight", [e, ff_x, n_x], &lw.gate_exps),
            ("ffn_up_exps.weight", [e, ff_x, n_x], &lw.up_exps),
            ("ffn_down_exps.weight", [ff_x, e, n_x], &lw.down_exps),
        ] {
            g.add_tensor(&n(name), &shape, GgmlType::F16, f16_bytes(w));
        }
        if c.shape == Shape::Qwen2Moe {
            let (sh, ffs) = (&lw.shexp, SHARED_FF as u64);
            let gate = f32_bytes(&sh[0]);
            g.add_tensor(&n("ffn_gate_inp_shexp.weight"), &[e], GgmlType::F32, gate);
            for (name, shape, w) in [
                ("ffn_gate_shexp.weight", [e, ffs], &sh[1]),
                ("ffn_up_shexp.weight", [e, ffs], &sh[2]),
                ("ffn_down_shexp.weight", [ffs, e], &sh[3]),
            ] {
                g.add_tensor(&n(name), &shape, GgmlType::F16, f16_bytes(w));
            }
        }
    } else if c.shape == Shape::Phi3 {
        // One matrix: the gate's rows, then up's.
        let fused: Vec<f32> = lw.gate.iter().chain(&lw.up).copied().collect();
        g.add_tensor(
            &n("ffn_up.weight"),
            &[e, 2 * ff],
            GgmlType::F16,
            f16_bytes(&fused),
        );
    } else {
        g.add_tensor(
            &n("ffn_gate.weight"),
            &[e, ff],
            GgmlType::F16,
            f16_bytes(&lw.gate),
        );
        g.add_tensor(
            &n("ffn_up.weight"),
            &[e, ff],
            GgmlType::F16,
            f16_bytes(&lw.up),
        );
    }
    if !c.shape.moe() {
        g.add_tensor(
            &n("ffn_down.weight"),
            &[ff, e],
            GgmlType::F16,
            f16_bytes(&lw.down),
        );
    }
}

/// `w` holds `rows` rows of `x.len()` values: returns `w · x`.
pub fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(a, b)| a * s * b).collect()
}

/// RoPE over every head of `x` at position `pos`: adjacent pairs (llama) or halves (NeoX).
pub fn rope(
    x: &mut [f32],
    head_dim: usize,
    pos: usize,
    base: f32,
    neox: bool,
    factors: Option<&[f32]>,
) {
    for head in x.chunks_mut(head_dim) {
        for i in 0..head_dim / 2 {
            let factor = factors.map_or(1.0, |f| f[i]);
            let theta = pos as f32 * base.powf(-2.0 * i as f32 / head_dim as f32) / factor;
            let (a, b) = if neox {
                (i, i + head_dim / 2)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * theta.cos() - x1 * theta.sin();
            head[b] = x0 * theta.sin() + x1 * theta.cos();
        }
    }
}

/// The whole network on `tokens`, one position at a time; returns logits after each token.
pub fn reference(c: &Cfg, w: &Weights, tokens: &[u32]) -> Vec<Vec<f32>> {
    reference_hidden(c, w, tokens)
        .iter()
        .map(|h| matvec(&w.output, h))
        .collect()
}

/// The network up to its final norm: each token's embedding (the output head's input).
pub fn reference_hidden(c: &Cfg, w: &Weights, tokens: &[u32]) -> Vec<Vec<f32>> {
    let (e, hd) = (c.n_embd, c.head_dim());
    let group = c.n_head / c.n_head_kv;
    let mut keys: Vec<Vec<Vec<f32>>> = vec![Vec::new(); c.n_layer];
    let mut values: Vec<Vec<Vec<f32>>> = vec![Vec::new(); c.n_layer];
    let mut all = Vec::new();
    for (pos, &t) in tokens.iter().enumerate() {
        let mut x = w.embd[t as usize * e..(t as usize + 1) * e].to_vec();
        for (l, lw) in w.layers.iter().enumerate() {
            let h = rms_norm(&x, &lw.attn_norm, c.eps);
            let add =
                |v: Vec<f32>, b: &[f32]| v.iter().zip(b).map(|(a, b)| a + b).collect::<Vec<f32>>();
            let mut q = add(matvec(&lw.wq, &h), &lw.bq);
            let mut k = add(matvec(&lw.wk, &h), &lw.bk);
            let v = add(matvec(&lw.wv, &h), &lw.bv);
            if c.shape == Shape::Qwen3 {
                for (t, w) in [(&mut q, &lw.q_norm), (&mut k, &lw.k_norm)] {
                    for head in t.chunks_mut(hd) {
                        let normed = rms_norm(head, w, c.eps);
                        head.copy_from_slice(&normed);
                    }
                }
            }
            let neox = matches!(c.shape, Shape::Qwen2 | Shape::Qwen3 | Shape::Phi3);
            rope(&mut q, hd, pos, c.base, neox, c.rope_freqs.as_deref());
            rope(&mut k, hd, pos, c.base, neox, c.rope_freqs.as_deref());
            // The cache and the attention kernel hold Q, K and V as f16.
            keys[l].push(via_f16(&k));
            values[l].push(via_f16(&v));
            let q = via_f16(&q);
            let mut att = vec![0f32; e];
            for head in 0..c.n_head {
                let kvh = head / group;
                let qh = &q[head * hd..(head + 1) * hd];
                let scores: Vec<f32> = keys[l]
                    .iter()
                    .map(|kr| {
                        kr[kvh * hd..(kvh + 1) * hd]
                            .iter()
                            .zip(qh)
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                            / (hd as f32).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f32 = exps.iter().sum();
                for (p, ex) in exps.iter().enumerate() {
                    for d in 0..hd {
                        att[head * hd + d] += ex / sum * values[l][p][kvh * hd + d];
                    }
                }
            }
            let o = matvec(&lw.wo, &att);
            x = x.iter().zip(&o).map(|(a, b)| a + b).collect();
            // ggml multiplies f16 weights with activations converted to f16.
            let h = via_f16(&rms_norm(&x, &lw.ffn_norm, c.eps));
            let gate = matvec(&lw.gate, &h);
            let up = matvec(&lw.up, &h);
            let act: Vec<f32> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let d = matvec(&lw.down, &via_f16(&act));
            x = x.iter().zip(&d).map(|(a, b)| a + b).collect();
        }
        all.push(rms_norm(&x, &w.out_norm, c.eps));
    }
    all
}

pub fn cfg(shape: Shape, tied: bool) -> Cfg {
    Cfg {
        shape,
        n_vocab: 97,
        n_embd: 32,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 48,
        n_layer: 2,
        tied,
        eps: 1e-5,
        base: 10000.0,
        rope_freqs: None,
        n_ctx_train: 256,
    }
}

pub fn build(c: &Cfg, seed: u64) -> (tempfile::TempDir, Arc<Model>, Weights) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let mut w = make_weights(c, seed);
    write_model(c, &mut w, &path);
    let model = Model::load(&path).unwrap();
    (dir, model, w)
}

pub fn params(n_ubatch: usize) -> ContextParams {
    ContextParams {
        n_ctx: 128,
        n_threads: 2,
        n_batch: n_ubatch,
        flash_attn: true,
        ..ContextParams::default()
    }
}

/// Differences are judged relative to the largest logit: ggml's flash-attention kernel
/// accumulates f16 values in f16, which costs up to a few 1e-3 of the output's scale over 40
/// positions; a wrong rotation, mask or head mapping costs orders of magnitude more.
pub fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= tol * scale,
        "{what}: largest difference {worst} > {tol} x {scale}"
    );
}

pub fn tokens(n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % 97) as u32).collect()
}

/// The real model: `$LLAMA_HDD_MODEL`, else `<workspace>/models/SmolLM2-135M-Instruct.Q4_1.gguf`.
/// `None`, with a note on stderr, when it is absent; under CI (`CI` set) absence fails the test,
/// so the tests that need it cannot pass by skipping.
pub fn real_model_path() -> Option<PathBuf> {
    engine::testing::workspace_model(
        "LLAMA_HDD_MODEL",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "cargo xtask fetch-model",
    )
    .map_err(|note| eprintln!("{note}"))
    .ok()
}

/// Gemma 3 270M ([`engine::testing::gemma3_model_path`]); `None`, with a note, when absent.
pub fn gemma3_model_path() -> Option<PathBuf> {
    engine::testing::gemma3_model_path()
        .map_err(|note| eprintln!("{note}"))
        .ok()
}

/// A test vocabulary: the tokenizer built from it and its token texts, to name ids by text.
pub struct Vocab {
    pub tok: engine::tokenizer::Tokenizer,
    pub texts: Vec<String>,
}

impl Vocab {
    /// The id of the token whose text is `text`.
    pub fn id(&self, text: &str) -> u32 {
        self.texts
            .iter()
            .position(|t| t == text)
            .unwrap_or_else(|| panic!("no token {text}")) as u32
    }
    /// The ids of `texts`, in order.
    pub fn ids(&self, texts: &[&str]) -> Vec<u32> {
        texts.iter().map(|t| self.id(t)).collect()
    }
}

/// A sequence's KV as checkpoint spans: its full pages, then the partial last one.
pub struct Exported {
    pub tokens: Vec<u32>,
    pub blocks: Vec<Vec<u8>>,
    pub tail: Vec<u8>,
}

/// Copies `s`'s pages out with the page API.
pub fn export_pages(s: &engine::Session) -> Exported {
    let n = s.tokens().len();
    let read = |i| {
        let mut span = Vec::new();
        s.context().read_page(s.seq(), i, &mut span).unwrap();
        span
    };
    Exported {
        tokens: s.tokens().to_vec(),
        blocks: (0..n / engine::PAGE_TOKENS).map(read).collect(),
        tail: if n.is_multiple_of(engine::PAGE_TOKENS) {
            Vec::new()
        } else {
            read(n / engine::PAGE_TOKENS)
        },
    }
}

/// Fills `s` from `e` with the page API (no model evaluation).
pub fn import_pages(s: &mut engine::Session, e: &Exported) -> engine::Result<()> {
    let seq = s.seq();
    s.context_mut()
        .import(seq, &e.tokens, &e.tail, |i, _, sink| sink(&e.blocks[i]))
        .map(|_| ())
}

/// Writes `c`'s tiny model to `dir/name`, after `edit` has changed its metadata or tensors.
pub fn write_edited(
    c: &Cfg,
    dir: &Path,
    name: &str,
    edit: impl FnOnce(&mut GgufWriter),
) -> PathBuf {
    let base = dir.join("base.gguf");
    write_model(c, &mut make_weights(c, 7), &base);
    let gguf = engine::gguf::Gguf::open(&base).unwrap();
    let mut w = GgufWriter::from_gguf(&gguf).unwrap();
    edit(&mut w);
    let path = dir.join(name);
    w.write(&path).unwrap();
    path
}
