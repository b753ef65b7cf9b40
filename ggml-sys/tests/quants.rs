//! Quantize -> dequantize round trips of Q4_0, Q4_1 and Q8_0 through ggml, checked against the
//! block layouts decoded independently in Rust and against each format's error bound.

use ggml_sys::*;
use half::f16;

const QK: usize = 32;

fn data(n: usize, seed: u64) -> Vec<f32> {
    // A mix of scales per block, including an all-zero block and a constant block.
    let mut s = seed;
    (0..n)
        .map(|i| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            match (i / QK) % 4 {
                0 => u,
                1 => u * 40.0,
                2 => 0.0,
                _ => 0.25,
            }
        })
        .collect()
}

/// Quantizes `x` with ggml and dequantizes it with ggml's own `to_float`.
fn ggml_round_trip(ty: ggml_type, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    // SAFETY: traits are static; the destination has exactly the byte size ggml reports for
    // one row of x.len() elements (x.len() is a multiple of the block size).
    unsafe {
        let traits = &*ggml_get_type_traits(ty);
        assert_eq!(traits.blck_size as usize, QK);
        let mut q = vec![0u8; ggml_row_size(ty, x.len() as i64)];
        let written = ggml_quantize_chunk(
            ty,
            x.as_ptr(),
            q.as_mut_ptr().cast(),
            0,
            1,
            x.len() as i64,
            std::ptr::null(),
        );
        assert_eq!(written, q.len());
        let mut back = vec![0f32; x.len()];
        (traits.to_float.expect("quantized types dequantize"))(
            q.as_ptr().cast(),
            back.as_mut_ptr(),
            x.len() as i64,
        );
        (q, back)
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Our own reading of the block layouts (ggml-common.h), independent of ggml's code.
fn decode(ty: ggml_type, q: &[u8]) -> Vec<f32> {
    let (block_bytes, mut out) = match ty {
        GGML_TYPE_Q4_0 => (2 + QK / 2, Vec::new()),
        GGML_TYPE_Q4_1 => (4 + QK / 2, Vec::new()),
        GGML_TYPE_Q8_0 => (2 + QK, Vec::new()),
        _ => unreachable!(),
    };
    assert_eq!(q.len() % block_bytes, 0);
    for b in q.chunks(block_bytes) {
        let d = f16_at(b, 0);
        let mut block = [0f32; QK];
        match ty {
            GGML_TYPE_Q8_0 => {
                for (i, v) in block.iter_mut().enumerate() {
                    *v = d * b[2 + i] as i8 as f32;
                }
            }
            GGML_TYPE_Q4_0 | GGML_TYPE_Q4_1 => {
                let (min, qs) = if ty == GGML_TYPE_Q4_1 {
                    (f16_at(b, 2), &b[4..])
                } else {
                    (0.0, &b[2..])
                };
                let offset = if ty == GGML_TYPE_Q4_0 { 8.0 } else { 0.0 };
                // Low nibbles hold elements 0..16, high nibbles 16..32.
                for (j, byte) in qs.iter().enumerate() {
                    block[j] = d * ((byte & 0x0F) as f32 - offset) + min;
                    block[j + QK / 2] = d * ((byte >> 4) as f32 - offset) + min;
                }
            }
            _ => unreachable!(),
        }
        out.extend_from_slice(&block);
    }
    out
}

/// Largest error a correct quantizer may make on `block` (with a little room for the f16 scale).
fn bound(ty: ggml_type, block: &[f32]) -> f32 {
    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (min, max) = block
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    let slack = 1e-3 * amax + 1e-6;
    match ty {
        // Scale amax/127, round to nearest: half a step.
        GGML_TYPE_Q8_0 => amax / 127.0 * 0.5 + slack,
        // Scale amax/8 with levels -8..7: the value opposite the extreme may sit a full step out.
        GGML_TYPE_Q4_0 => amax / 8.0 + slack,
        // 16 levels spanning [min, max], round to nearest: half a step.
        GGML_TYPE_Q4_1 => (max - min) / 15.0 * 0.5 + slack,
        _ => unreachable!(),
    }
}

fn check(ty: ggml_type, name: &str) {
    let x = data(QK * 64, 42 + ty as u64);
    let (q, back) = ggml_round_trip(ty, &x);
    let ours = decode(ty, &q);
    assert_eq!(ours.len(), x.len());
    for i in 0..x.len() {
        assert_eq!(
            back[i], ours[i],
            "{name}[{i}]: ggml dequantizes to {}, the layout says {}",
            back[i], ours[i]
        );
    }
    for (bi, (orig, deq)) in x.chunks(QK).zip(ours.chunks(QK)).enumerate() {
        let limit = bound(ty, orig);
        for (i, (a, b)) in orig.iter().zip(deq).enumerate() {
            assert!(
                (a - b).abs() <= limit,
                "{name} block {bi}[{i}]: {a} came back as {b} (bound {limit})"
            );
        }
    }
    // Quantization must carry information: an all-zero block stays zero, others don't collapse.
    assert!(
        ours[2 * QK..3 * QK].iter().all(|v| *v == 0.0),
        "{name}: zero block"
    );
    let err: f32 = x.iter().zip(&ours).map(|(a, b)| (a - b).abs()).sum::<f32>() / x.len() as f32;
    let mean: f32 = x.iter().map(|v| v.abs()).sum::<f32>() / x.len() as f32;
    assert!(
        err < mean * 0.2,
        "{name}: mean error {err} against mean magnitude {mean}"
    );
}

#[test]
fn q4_0_round_trip() {
    check(GGML_TYPE_Q4_0, "q4_0");
}

#[test]
fn q4_1_round_trip() {
    check(GGML_TYPE_Q4_1, "q4_1");
}

#[test]
fn q8_0_round_trip() {
    check(GGML_TYPE_Q8_0, "q8_0");
}

#[test]
fn linked_library_is_the_pinned_version() {
    // SAFETY: returns a static NUL-terminated string.
    let version = unsafe { std::ffi::CStr::from_ptr(ggml_version()) }
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        version, GGML_VERSION,
        "the committed bindings were generated for another ggml"
    );
    assert_eq!(BUILT_GGML_VERSION, GGML_VERSION);
}
