//! Q4_0 and Q8_0 weights take ggml-sys's integer-sum products for the rows of items of 64
//! tokens or more: on a tiny llama written with Q4_0 matrices in one layer and Q8_0 in the
//! other (and the output head), a batch of a long and a short item gives the long item logits
//! close to those of the batch-invariant context (which has no integer-sum rows) and the short
//! item the same bits.

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

/// The tiny model with its matrices quantized: layer 0's to Q4_0, layer 1's and the output
/// head to Q8_0.
fn write_model(path: &Path) {
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
        if !matrix {
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
        } else {
            (GgmlType::Q8_0, q8_0(&values))
        };
        w.replace_tensor(&t.name, &t.shape, dtype, bytes);
        quantized += 1;
    }
    assert_eq!(quantized, 15, "7 matrices per layer and the head");
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

#[test]
fn q4_0_and_q8_0_products_are_close_for_long_items_and_ggml_s_for_short_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-q.gguf");
    write_model(&path);
    let model = Model::load(&path).unwrap();
    let (long, short) = logits(&model, Evaluation::Fast);
    let (long_ggml, short_ggml) = logits(&model, Evaluation::LlamaCpp);
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
}
