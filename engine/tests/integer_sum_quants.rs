//! Q4_0, Q5_0 and Q8_0 weights take ggml-sys's integer-sum products for the rows of items of 64
//! tokens or more: on a tiny llama written with Q4_0 matrices in one layer, Q8_0 attention and
//! Q5_0 feed-forward matrices in the other (and a Q8_0 output head), a batch of a long and a
//! short item gives the long item logits close to those of llama.cpp's evaluation (which has no
//! integer-sum rows) and the short item the same bits. And the default, batch-invariant
//! evaluation (integer sums everywhere) gives each token of the same model the same bits alone,
//! split into items, or beside another sequence.

use std::path::Path;
use std::sync::Arc;

use engine::gguf::{GgmlType, Gguf, GgufWriter};
use engine::testing::TinyChatModel;
use engine::{Batch, Context, ContextParams, Evaluation, Logits, Model};
use half::f16;

/// `values` (rows of a multiple of 32) as Q8_0 blocks: scale `max |v| / 127` as f16, the
/// values over it rounded to int8.
fn q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 32 * 34);
    for b in values.chunks(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
    }
    out
}

/// `values` as Q4_0 blocks: scale `-m / 8` for the value `m` of largest magnitude, as f16; the
/// values over it plus 8, rounded into 0..15, two to a byte (element j low, j + 16 high).
fn q4_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 32 * 18);
    for b in values.chunks(32) {
        let max = b
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -8.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
        out.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
    }
    out
}

/// `values` as Q5_0 blocks: scale `-m / 16` for the value `m` of largest magnitude, as f16; the
/// values over it plus 16, rounded into 0..31: the low four bits two to a byte (element j low,
/// j + 16 high) after a little-endian u32 of the fifth bits (bit j for element j).
fn q5_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 32 * 22);
    for b in values.chunks(32) {
        let max = b
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -16.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        let q: Vec<u32> = b
            .iter()
            .map(|&v| ((v * id + 16.5) as i32).clamp(0, 31) as u32)
            .collect();
        let high = (0..32).fold(0u32, |h, j| h | (q[j] >> 4) << j);
        out.extend_from_slice(&high.to_le_bytes());
        out.extend((0..16).map(|j| ((q[j] & 15) | (q[j + 16] & 15) << 4) as u8));
    }
    out
}

/// The tiny model with its matrices quantized: layer 0's to Q4_0, layer 1's feed-forward to
/// Q5_0 and its attention and the output head to Q8_0; with `q5_0_only`, layer 1's
/// feed-forward alone (the rest f32).
fn write_model(path: &Path, q5_0_only: bool) {
    let plain = path.with_extension("f32.gguf");
    TinyChatModel {
        n_embd: 64,
        n_ff: 96,
        ..TinyChatModel::default()
    }
    .write(&plain)
    .unwrap();
    let gguf = Gguf::open(&plain).unwrap();
    let mut w = GgufWriter::from_gguf(&gguf).unwrap();
    let mut quantized = 0;
    for t in gguf.tensors() {
        let matrix = t.name == "output.weight"
            || [
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_gate",
                "ffn_up",
                "ffn_down",
            ]
            .iter()
            .any(|m| t.name.ends_with(&format!("{m}.weight")));
        let q5_0_matrix = t.name.starts_with("blk.1.ffn_");
        if !matrix || (q5_0_only && !q5_0_matrix) {
            continue;
        }
        assert_eq!(t.dtype, GgmlType::F32);
        let values: Vec<f32> = gguf
            .read_tensor(t)
            .unwrap()
            .chunks(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let (dtype, bytes) = if t.name.starts_with("blk.0.") {
            (GgmlType::Q4_0, q4_0(&values))
        } else if q5_0_matrix {
            (GgmlType::Q5_0, q5_0(&values))
        } else {
            (GgmlType::Q8_0, q8_0(&values))
        };
        w.replace_tensor(&t.name, &t.shape, dtype, bytes);
        quantized += 1;
    }
    let want = if q5_0_only { 3 } else { 15 };
    assert_eq!(quantized, want, "7 matrices per layer and the head, or 3");
    w.write(path).unwrap();
}

/// The logits of every token of a 70-token and a 9-token item decoded in one batch (attention
/// as separate products: ggml's flash attention takes 64 queries or more in tiles, with other
/// rounding than the batch-invariant context's query by query).
fn logits(model: &Arc<Model>, evaluation: Evaluation) -> (Vec<f32>, Vec<f32>) {
    let mut ctx = Context::new(
        Arc::clone(model),
        ContextParams {
            n_ctx: 256,
            kv_tokens: 1024,
            n_threads: 2,
            n_batch: 128,
            flash_attn: false,
            evaluation,
            ..ContextParams::default()
        },
    )
    .unwrap();
    let long: Vec<u32> = (0..70).map(|i| (i * 37 + 11) % 256).collect();
    let short: Vec<u32> = (0..9).map(|i| (i * 53 + 7) % 256).collect();
    let (a, b) = (ctx.new_sequence(), ctx.new_sequence());
    let mut batch = Batch::new();
    // The short item first: the plan still puts the long item's rows first.
    let short_item = batch.add_at(b, 0, &short, Logits::All);
    let long_item = batch.add_at(a, 0, &long, Logits::All);
    let out = ctx.decode(&batch).unwrap();
    (
        out.logits(long_item).to_vec(),
        out.logits(short_item).to_vec(),
    )
}

/// The fast evaluation against llama.cpp's on `model`: the short item's logits the same bits,
/// the long item's within rounding. Returns how many of the long item's differ in any bit.
fn long_close_short_same(model: &Arc<Model>) -> usize {
    let (long, short) = logits(model, Evaluation::Fast);
    let (long_ggml, short_ggml) = logits(model, Evaluation::LlamaCpp);
    assert_eq!(short.len(), short_ggml.len());
    let differing = short
        .iter()
        .zip(&short_ggml)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(differing, 0, "the short item's logits are ggml's bits");
    assert_eq!(long.len(), long_ggml.len());
    // Float rounding of the products only (attention without flash attention is the same ops
    // in both contexts: without integer sums the logits are the same bits): a wrong block sum
    // would move the logits by their own scale.
    let scale = long_ggml.iter().fold(1f32, |m, v| m.max(v.abs()));
    let worst = long
        .iter()
        .zip(&long_ggml)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= 1e-5 * scale,
        "long item: largest difference {worst} against the logits' scale {scale}"
    );
    long.iter()
        .zip(&long_ggml)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count()
}

#[test]
fn q4_0_q5_0_and_q8_0_products_are_close_for_long_items_and_ggml_s_for_short_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-q.gguf");
    write_model(&path, false);
    long_close_short_same(&Model::load(&path).unwrap());
}

#[test]
fn q5_0_products_take_the_integer_sum_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-q5.gguf");
    write_model(&path, true);
    let differing = long_close_short_same(&Model::load(&path).unwrap());
    // The q5_0 matrices are the only quantized ones: where the kernel has vector instructions
    // it runs (ggml's product otherwise), and its rounding shows in some of the long item's
    // logits. (They are the last layer's feed-forward: their results reach the logits without
    // the cache's f16 rounding, which can magnify a difference in the last bit beyond the
    // bound above.)
    let vector = ["avx2", "avx-vnni", "avx512", "avx512-vnni"];
    if vector.contains(&engine::cpu_path().name) {
        assert!(differing > 0, "the long item's logits are ggml's bits");
    }
}

/// A context of the default (batch-invariant) evaluation on `model`.
fn invariant_context(model: &Arc<Model>) -> Context {
    let params = ContextParams {
        n_ctx: 256,
        kv_tokens: 1024,
        n_threads: 2,
        n_batch: 128,
        ..ContextParams::default()
    };
    Context::new(Arc::clone(model), params).unwrap()
}

/// Every token's logits of `tokens` fed alone into a fresh context in items ending at `cuts`
/// (the last item to the end).
fn alone(model: &Arc<Model>, tokens: &[u32], cuts: &[usize]) -> Vec<f32> {
    let mut ctx = invariant_context(model);
    let seq = ctx.new_sequence();
    let mut all = Vec::new();
    let mut at = 0;
    for &c in cuts.iter().chain([&tokens.len()]) {
        all.extend(ctx.feed(seq, &tokens[at..c], Logits::All).unwrap());
        at = c;
    }
    all
}

#[test]
fn the_default_evaluation_gives_each_token_the_same_bits_however_it_is_batched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-q.gguf");
    write_model(&path, false);
    let model = Model::load(&path).unwrap();
    let long: Vec<u32> = (0..90).map(|i| (i * 37 + 11) % 256).collect();
    let short: Vec<u32> = (0..9).map(|i| (i * 53 + 7) % 256).collect();
    let same = |a: &[f32], b: &[f32]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    };
    // Each product's column count differs between the ways (90, 99, 9, 1, 20, 64, 5 rows):
    // column groups, few columns per weight row, and one column.
    let cold = alone(&model, &long, &[]);
    assert!(cold.iter().all(|v| v.is_finite()));
    let split = alone(&model, &long, &[1, 21, 85]);
    assert!(same(&cold, &split), "the long prompt split into items");
    let short_cold = alone(&model, &short, &[]);
    let mut ctx = invariant_context(&model);
    let (a, b) = (ctx.new_sequence(), ctx.new_sequence());
    let mut batch = Batch::new();
    let short_item = batch.add_at(b, 0, &short, Logits::All);
    let long_item = batch.add_at(a, 0, &long, Logits::All);
    let out = ctx.decode(&batch).unwrap();
    assert!(
        same(out.logits(long_item), &cold),
        "the long prompt beside the short one"
    );
    assert!(
        same(out.logits(short_item), &short_cold),
        "the short prompt beside the long one"
    );
}
