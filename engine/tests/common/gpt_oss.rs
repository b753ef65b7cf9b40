//! A tiny gpt-oss model written by the tests, laid out as llama.cpp's converter leaves the
//! published files (experts in MXFP4, other matrices f16, norms, biases and sinks f32), and a
//! naive Rust forward pass of the same network that rounds where ggml's kernels round.

use std::path::Path;
use std::sync::Arc;

use engine::gguf::{GgmlType, GgufWriter};
use engine::testing::SplitMix64;
use engine::Model;

use super::{add_tiny_vocab, f16_bytes, f32_bytes, matvec, rms_norm, via_f16};

/// Vocabulary size: the other tiny models' byte-level vocabulary.
pub const N_VOCAB: usize = 97;
pub const N_EMBD: usize = 32;
pub const N_HEAD: usize = 4;
pub const N_HEAD_KV: usize = 2;
/// `attention.key_length`: as in the published models, heads times head size is not the
/// embedding width.
pub const HEAD_DIM: usize = 16;
pub const N_LAYER: usize = 2;
/// Experts per block, used per token, and each one's width (a whole MXFP4 block).
pub const N_EXPERT: usize = 4;
pub const N_USED: usize = 2;
pub const N_FF: usize = 32;
/// `attention.sliding_window`: the first of every two layers sees the last 4 positions.
pub const WINDOW: usize = 4;
pub const ROPE_BASE: f32 = 150_000.0;
/// YaRN's factor and original context (the published models: 32 and 4,096).
pub const YARN_FACTOR: f32 = 4.0;
pub const YARN_CTX_ORIG: usize = 64;
pub const N_CTX_TRAIN: usize = 256;
pub const EPS: f32 = 1e-5;
/// llama.cpp's constants of `swiglu_oai` for gpt-oss.
const ALPHA: f32 = 1.702;
const LIMIT: f32 = 7.0;

/// One block's weights, in ggml order (a matrix `[k, m]` is m rows of k values), as the model
/// computes with them: f16 matrices rounded through f16, experts through MXFP4.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub wo: Vec<f32>,
    pub bq: Vec<f32>,
    pub bk: Vec<f32>,
    pub bv: Vec<f32>,
    pub bo: Vec<f32>,
    pub sinks: Vec<f32>,
    pub post_attn_norm: Vec<f32>,
    /// Router `[n_embd, n_expert]` (f32) and its bias.
    pub router: Vec<f32>,
    pub router_b: Vec<f32>,
    /// Expert stacks: gate, up `[n_embd, n_ff, n_expert]`, down `[n_ff, n_embd, n_expert]`.
    pub gate: Mxfp4,
    pub up: Mxfp4,
    pub down: Mxfp4,
    /// Expert biases: gate, up `[n_ff, n_expert]`, down `[n_embd, n_expert]`.
    pub gate_b: Vec<f32>,
    pub up_b: Vec<f32>,
    pub down_b: Vec<f32>,
}

pub struct Weights {
    pub embd: Vec<f32>,
    pub out_norm: Vec<f32>,
    pub output: Vec<f32>,
    pub layers: Vec<Layer>,
}

/// An MXFP4 tensor: its bytes, and the values they hold (each block's doubled E2M1 codes and
/// scale, for products that sum as ggml's kernel does).
pub struct Mxfp4 {
    pub bytes: Vec<u8>,
    /// Per block of 32: the scale's half (`2^(e - 128)`) and the 32 doubled codes.
    pub blocks: Vec<(f32, [i8; 32])>,
}

/// The E2M1 values MXFP4 codes stand for, doubled (codes 8..16 are the negatives).
const E2M1_DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e - 128)`: half of the E8M0 scale `e` (the codes are doubled values).
fn e8m0_half(e: u8) -> f32 {
    2f32.powi(i32::from(e) - 128)
}

/// Quantizes `values` (a multiple of 32) to MXFP4: per block one E8M0 byte, chosen so that
/// the largest magnitude lands on the top code's range, then 16 bytes of nibbles, element `j`
/// in the low nibble of byte `j` and element `j + 16` in its high nibble; each value takes the
/// nearest code.
pub fn mxfp4(values: &[f32]) -> Mxfp4 {
    assert!(values.len().is_multiple_of(32), "whole blocks");
    let mut bytes = Vec::with_capacity(values.len() / 32 * 17);
    let mut blocks = Vec::with_capacity(values.len() / 32);
    for block in values.chunks(32) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = if amax > 0.0 {
            (amax.log2().floor() as i32 - 2 + 127).clamp(0, 254) as u8
        } else {
            0
        };
        let d = e8m0_half(e);
        let nearest = |x: f32| -> u8 {
            (0..16u8)
                .min_by(|&a, &b| {
                    let ea = (f32::from(E2M1_DOUBLED[a as usize]) * d - x).abs();
                    let eb = (f32::from(E2M1_DOUBLED[b as usize]) * d - x).abs();
                    ea.total_cmp(&eb)
                })
                .unwrap_or(0)
        };
        let codes: Vec<u8> = block.iter().map(|&x| nearest(x)).collect();
        bytes.push(e);
        bytes.extend((0..16).map(|j| codes[j] | (codes[j + 16] << 4)));
        let mut doubled = [0i8; 32];
        for (slot, &c) in doubled.iter_mut().zip(&codes) {
            *slot = E2M1_DOUBLED[c as usize];
        }
        blocks.push((d, doubled));
    }
    Mxfp4 { bytes, blocks }
}

pub fn make_weights(seed: u64) -> Weights {
    let mut r = SplitMix64(seed);
    let (e, q, kv) = (N_EMBD, N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM);
    let norm = |r: &mut SplitMix64| r.f32_vec(e, 0.5).iter().map(|v| 1.0 + v).collect();
    let layers = (0..N_LAYER)
        .map(|_| Layer {
            attn_norm: norm(&mut r),
            wq: via_f16(&r.f32_vec(e * q, 0.3)),
            wk: via_f16(&r.f32_vec(e * kv, 0.3)),
            wv: via_f16(&r.f32_vec(e * kv, 0.3)),
            wo: via_f16(&r.f32_vec(q * e, 0.3)),
            bq: r.f32_vec(q, 0.2),
            bk: r.f32_vec(kv, 0.2),
            bv: r.f32_vec(kv, 0.2),
            bo: r.f32_vec(e, 0.2),
            // Sinks comparable with the scores, so that they move the softmax.
            sinks: r.f32_vec(N_HEAD, 2.0),
            post_attn_norm: norm(&mut r),
            router: r.f32_vec(e * N_EXPERT, 0.5),
            router_b: r.f32_vec(N_EXPERT, 0.2),
            gate: mxfp4(&r.f32_vec(e * N_FF * N_EXPERT, 0.5)),
            up: mxfp4(&r.f32_vec(e * N_FF * N_EXPERT, 0.5)),
            down: mxfp4(&r.f32_vec(N_FF * e * N_EXPERT, 0.5)),
            gate_b: r.f32_vec(N_FF * N_EXPERT, 0.2),
            up_b: r.f32_vec(N_FF * N_EXPERT, 0.2),
            down_b: r.f32_vec(e * N_EXPERT, 0.2),
        })
        .collect();
    Weights {
        embd: via_f16(&r.f32_vec(e * N_VOCAB, 1.0)),
        out_norm: norm(&mut r),
        output: via_f16(&r.f32_vec(e * N_VOCAB, 0.3)),
        layers,
    }
}

/// Writes the model as llama.cpp's converter lays out a gpt-oss file.
pub fn write_model(w: &Weights, path: &Path) {
    let mut g = GgufWriter::new();
    let arch = "gpt-oss";
    g.add_str("general.architecture", arch);
    let k = |s: &str| format!("{arch}.{s}");
    g.add_u32(&k("context_length"), N_CTX_TRAIN as u32);
    g.add_u32(&k("embedding_length"), N_EMBD as u32);
    g.add_u32(&k("block_count"), N_LAYER as u32);
    g.add_u32(&k("feed_forward_length"), N_FF as u32);
    g.add_u32(&k("attention.head_count"), N_HEAD as u32);
    g.add_u32(&k("attention.head_count_kv"), N_HEAD_KV as u32);
    g.add_u32(&k("attention.key_length"), HEAD_DIM as u32);
    g.add_u32(&k("attention.value_length"), HEAD_DIM as u32);
    g.add_f32(&k("attention.layer_norm_rms_epsilon"), EPS);
    g.add_f32(&k("rope.freq_base"), ROPE_BASE);
    g.add_u32(&k("expert_count"), N_EXPERT as u32);
    g.add_u32(&k("expert_used_count"), N_USED as u32);
    g.add_u32(&k("expert_feed_forward_length"), N_FF as u32);
    g.add_u32(&k("attention.sliding_window"), WINDOW as u32);
    g.add_str(&k("rope.scaling.type"), "yarn");
    g.add_f32(&k("rope.scaling.factor"), YARN_FACTOR);
    g.add_u32(
        &k("rope.scaling.original_context_length"),
        YARN_CTX_ORIG as u32,
    );
    add_tiny_vocab(&mut g, N_VOCAB);

    let (e, v) = (N_EMBD as u64, N_VOCAB as u64);
    let (q, kv) = ((N_HEAD * HEAD_DIM) as u64, (N_HEAD_KV * HEAD_DIM) as u64);
    let (n_x, ff) = (N_EXPERT as u64, N_FF as u64);
    let (f16, f32) = (GgmlType::F16, GgmlType::F32);
    g.add_tensor("token_embd.weight", &[e, v], f16, f16_bytes(&w.embd));
    g.add_tensor("output_norm.weight", &[e], f32, f32_bytes(&w.out_norm));
    g.add_tensor("output.weight", &[e, v], f16, f16_bytes(&w.output));
    for (l, lw) in w.layers.iter().enumerate() {
        let n = |s: &str| format!("blk.{l}.{s}");
        for (name, shape, data) in [
            ("attn_norm.weight", vec![e], &lw.attn_norm),
            ("attn_q.bias", vec![q], &lw.bq),
            ("attn_k.bias", vec![kv], &lw.bk),
            ("attn_v.bias", vec![kv], &lw.bv),
            ("attn_output.bias", vec![e], &lw.bo),
            ("attn_sinks.weight", vec![N_HEAD as u64], &lw.sinks),
            ("post_attention_norm.weight", vec![e], &lw.post_attn_norm),
            ("ffn_gate_inp.weight", vec![e, n_x], &lw.router),
            ("ffn_gate_inp.bias", vec![n_x], &lw.router_b),
            ("ffn_gate_exps.bias", vec![ff, n_x], &lw.gate_b),
            ("ffn_up_exps.bias", vec![ff, n_x], &lw.up_b),
            ("ffn_down_exps.bias", vec![e, n_x], &lw.down_b),
        ] {
            g.add_tensor(&n(name), &shape, f32, f32_bytes(data));
        }
        for (name, shape, data) in [
            ("attn_q.weight", [e, q], &lw.wq),
            ("attn_k.weight", [e, kv], &lw.wk),
            ("attn_v.weight", [e, kv], &lw.wv),
            ("attn_output.weight", [q, e], &lw.wo),
        ] {
            g.add_tensor(&n(name), &shape, f16, f16_bytes(data));
        }
        for (name, shape, data) in [
            ("ffn_gate_exps.weight", [e, ff, n_x], &lw.gate),
            ("ffn_up_exps.weight", [e, ff, n_x], &lw.up),
            ("ffn_down_exps.weight", [ff, e, n_x], &lw.down),
        ] {
            g.add_tensor(&n(name), &shape, GgmlType::MXFP4, data.bytes.clone());
        }
    }
    g.write(path).unwrap();
}

/// The tiny model of `seed`, written to a temporary directory and loaded.
pub fn build(seed: u64) -> (tempfile::TempDir, Arc<Model>, Weights) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpt-oss.gguf");
    let w = make_weights(seed);
    write_model(&w, &path);
    let model = Model::load(&path).unwrap();
    (dir, model, w)
}

/// `x` as ggml's q8_0 holds it for a product with MXFP4 weights: per block of 32, the scale
/// `max |x| / 127` (stored as f16) and each value's nearest multiple of it.
fn q8_0(x: &[f32]) -> Vec<(f32, [i8; 32])> {
    x.chunks(32)
        .map(|b| {
            let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut q = [0i8; 32];
            for (slot, v) in q.iter_mut().zip(b) {
                *slot = (v * id).round() as i8;
            }
            (half::f16::from_f32(d).to_f32(), q)
        })
        .collect()
}

/// Rows `rows` of an MXFP4 stack times `x`: per block the integer sum of codes times values,
/// scaled by both scales (as ggml's MXFP4 × q8_0 product).
fn mxfp4_matvec(w: &Mxfp4, first_row: usize, n_rows: usize, x: &[f32]) -> Vec<f32> {
    let xq = q8_0(x);
    let per_row = xq.len();
    (first_row..first_row + n_rows)
        .map(|r| {
            w.blocks[r * per_row..(r + 1) * per_row]
                .iter()
                .zip(&xq)
                .map(|((dw, cw), (dx, cx))| {
                    let sum: i32 = cw
                        .iter()
                        .zip(cx)
                        .map(|(&a, &b)| i32::from(a) * i32::from(b))
                        .sum();
                    sum as f32 * dw * dx
                })
                .sum()
        })
        .collect()
}

/// NeoX RoPE with YaRN, as ggml computes it: frequencies interpolated by `1 / YARN_FACTOR`
/// except in the dimensions below the ramp's end, magnitudes scaled by `1 + 0.1 ln(factor)`.
fn rope_yarn(x: &mut [f32], pos: usize) {
    let n_dims = HEAD_DIM as f32;
    let corr = |rot: f32| {
        n_dims * (YARN_CTX_ORIG as f32 / (rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * ROPE_BASE.ln())
    };
    let (low, high) = (
        corr(32.0).floor().max(0.0),
        corr(1.0).ceil().min(n_dims - 1.0),
    );
    let freq_scale = 1.0 / YARN_FACTOR;
    let mscale = 1.0 + 0.1 * YARN_FACTOR.ln();
    for head in x.chunks_mut(HEAD_DIM) {
        for i in 0..HEAD_DIM / 2 {
            let extrap = pos as f32 * ROPE_BASE.powf(-2.0 * i as f32 / n_dims);
            let interp = freq_scale * extrap;
            let y = (i as f32 - low) / (high - low).max(0.001);
            let ramp = 1.0 - y.clamp(0.0, 1.0);
            let theta = interp * (1.0 - ramp) + extrap * ramp;
            let (cos, sin) = (theta.cos() * mscale, theta.sin() * mscale);
            let (a, b) = (i, i + HEAD_DIM / 2);
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
}

fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// How the reference computes attention: as ggml's fused kernel for few queries does, or as
/// its unfused ops do. The rounding differs (see [`attend`]), and the experts' products, whose
/// activations are quantized to q8_0, turn a difference of rounding into one of a few 1e-2 in
/// the logits: the reference rounds as the kernel under test does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Attention {
    Fused,
    Unfused,
}

/// The whole network on `tokens`, one position at a time; returns logits after each token.
pub fn reference(w: &Weights, tokens: &[u32], attention: Attention) -> Vec<Vec<f32>> {
    let (e, hd) = (N_EMBD, HEAD_DIM);
    let group = N_HEAD / N_HEAD_KV;
    let mut keys: Vec<Vec<Vec<f32>>> = vec![Vec::new(); N_LAYER];
    let mut values: Vec<Vec<Vec<f32>>> = vec![Vec::new(); N_LAYER];
    let mut all = Vec::new();
    for (pos, &t) in tokens.iter().enumerate() {
        let mut x = w.embd[t as usize * e..(t as usize + 1) * e].to_vec();
        for (l, lw) in w.layers.iter().enumerate() {
            // ggml multiplies f16 weights with activations converted to f16.
            let h = via_f16(&rms_norm(&x, &lw.attn_norm, EPS));
            let mut q = add(&matvec(&lw.wq, &h), &lw.bq);
            let mut k = add(&matvec(&lw.wk, &h), &lw.bk);
            let v = add(&matvec(&lw.wv, &h), &lw.bv);
            rope_yarn(&mut q, pos);
            rope_yarn(&mut k, pos);
            keys[l].push(via_f16(&k));
            values[l].push(via_f16(&v));
            let q = via_f16(&q);
            // The first of every two layers sees the last WINDOW positions.
            let first = match l % 2 {
                0 => (pos + 1).saturating_sub(WINDOW),
                _ => 0,
            };
            let mut att = Vec::with_capacity(N_HEAD * hd);
            for head in 0..N_HEAD {
                let kvh = head / group;
                let cells: Vec<(&[f32], &[f32])> = (first..=pos)
                    .map(|p| {
                        let r = kvh * hd..(kvh + 1) * hd;
                        (&keys[l][p][r.clone()], &values[l][p][r])
                    })
                    .collect();
                let qh = &q[head * hd..(head + 1) * hd];
                att.extend(attend(qh, &cells, lw.sinks[head], attention));
            }
            let o = add(&matvec(&lw.wo, &via_f16(&att)), &lw.bo);
            x = add(&x, &o);
            let h = rms_norm(&x, &lw.post_attn_norm, EPS);
            x = add(&x, &experts(lw, &h));
        }
        let h = via_f16(&rms_norm(&x, &w.out_norm, EPS));
        all.push(matvec(&w.output, &h));
    }
    all
}

/// One head's attention of `q` over `cells` (K and V rows, f16 values, in position order),
/// the head's `sink` in the softmax's denominator, attending to nothing. Fused, as ggml's
/// kernel for few queries: an online softmax whose V sum is kept in f16 (rounded after each
/// step), the sink folded in at the end. Unfused, as ggml's ops: the softmax in f32, then its
/// weights rounded to f16 for the product with V.
fn attend(q: &[f32], cells: &[(&[f32], &[f32])], sink: f32, attention: Attention) -> Vec<f32> {
    let f16 = |x: f32| half::f16::from_f32(x).to_f32();
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    let scores: Vec<f32> = cells
        .iter()
        .map(|(k, _)| k.iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * scale)
        .collect();
    if attention == Attention::Unfused {
        let max = scores.iter().fold(sink, |m, &s| m.max(s));
        let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum = exps.iter().map(|&x| f64::from(x)).sum::<f64>() + f64::from((sink - max).exp());
        let inv = (1.0 / sum) as f32;
        let mut out = vec![0f32; HEAD_DIM];
        for (ex, (_, v)) in exps.iter().zip(cells) {
            let p = f16(ex * inv);
            for (o, x) in out.iter_mut().zip(*v) {
                *o += p * x;
            }
        }
        return out;
    }
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    let mut acc = [0f32; HEAD_DIM];
    for (&s, (_, v)) in scores.iter().zip(cells) {
        let (mut ms, mut vs) = (1.0, 1.0);
        if s > m {
            ms = (m - s).exp();
            m = s;
            acc.iter_mut().for_each(|a| *a = f16(*a * ms));
        } else {
            vs = (s - m).exp();
        }
        for (a, x) in acc.iter_mut().zip(*v) {
            *a = f16(x.mul_add(vs, *a));
        }
        sum = sum * ms + vs;
    }
    let (mut ms, mut vs) = (1.0, 1.0);
    if sink > m {
        ms = (m - sink).exp();
        acc.iter_mut().for_each(|a| *a *= ms);
    } else {
        vs = (sink - m).exp();
    }
    sum = sum * ms + vs;
    acc.iter().map(|a| a * (1.0 / sum)).collect()
}

/// The mixture on one token's normed `h`: the router's `N_USED` largest logits, their softmax
/// as weights, each chosen expert's clamped SwiGLU network with its biases.
fn experts(lw: &Layer, h: &[f32]) -> Vec<f32> {
    let logits = add(&matvec(&lw.router, h), &lw.router_b);
    let mut order: Vec<usize> = (0..N_EXPERT).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let chosen = &order[..N_USED];
    let max = logits[chosen[0]];
    let exps: Vec<f32> = chosen.iter().map(|&x| (logits[x] - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    let mut out = vec![0f32; N_EMBD];
    for (&x, ex) in chosen.iter().zip(&exps) {
        let bias = |b: &[f32], n: usize| b[x * n..(x + 1) * n].to_vec();
        let gate = add(
            &mxfp4_matvec(&lw.gate, x * N_FF, N_FF, h),
            &bias(&lw.gate_b, N_FF),
        );
        let up = add(
            &mxfp4_matvec(&lw.up, x * N_FF, N_FF, h),
            &bias(&lw.up_b, N_FF),
        );
        let act: Vec<f32> = gate
            .iter()
            .zip(&up)
            .map(|(&g, &u)| {
                let g = g.min(LIMIT);
                let u = u.clamp(-LIMIT, LIMIT);
                g / (1.0 + (-ALPHA * g).exp()) * (u + 1.0)
            })
            .collect();
        let down = mxfp4_matvec(&lw.down, x * N_EMBD, N_EMBD, &act);
        let down = add(&down, &bias(&lw.down_b, N_EMBD));
        for (o, d) in out.iter_mut().zip(&down) {
            *o += ex / sum * d;
        }
    }
    out
}
