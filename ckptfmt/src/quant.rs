//! q8_0-style quantisation of f16 KV at rest.
//!
//! The f16 values of a block payload are taken 32 at a time (the last group
//! is padded with zeros). Each group is stored as its scale `d = max|x| / 127`
//! (f16, LE) followed by 32 signed bytes `q = round(x / d)` (half away from zero); decoding gives
//! `q * d`. That is 34 bytes per 64 bytes of f16: 53.1 % of the raw size.
//! Measured error on realistic KV distributions is in FORMAT.md.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Values per quantisation group.
pub const GROUP: usize = 32;
/// Bytes per stored group (f16 scale + 32 × i8).
pub const GROUP_BYTES: usize = 2 + GROUP;

/// Stored length of `raw_len` bytes of f16 once quantised.
pub fn q8_0_len(raw_len: u64) -> u64 {
    let n_values = raw_len / 2;
    n_values.div_ceil(GROUP as u64) * GROUP_BYTES as u64
}

/// Rounds half away from zero and clamps to ±127. Written with a truncating
/// cast (no `f32::round`, which is a library call on baseline x86-64) so the
/// loop vectorises; `as` maps NaN to 0.
#[inline]
fn round_to_i8(y: f32) -> u8 {
    let y = y.clamp(-127.0, 127.0);
    let half = if y >= 0.0 { 0.5 } else { -0.5 };
    ((y + half) as i32) as i8 as u8
}

/// Values converted per batch (a multiple of [`GROUP`]).
const BATCH: usize = GROUP * 128;

/// Quantises f16 bytes (LE) to q8_0. `raw.len()` must be even; an odd last
/// byte is ignored (callers validate the geometry so it never happens).
pub fn quantize_f16(raw: &[u8]) -> Vec<u8> {
    let n_values = raw.len() / 2;
    let mut out = vec![0u8; q8_0_len(raw.len() as u64) as usize];
    let mut halves = vec![f16::ZERO; BATCH];
    let mut vals = vec![0f32; BATCH];
    let mut out_groups = out.chunks_exact_mut(GROUP_BYTES);
    for batch in raw[..n_values * 2].chunks(BATCH * 2) {
        let n = batch.len() / 2;
        let padded = n.next_multiple_of(GROUP);
        for (h, b) in halves.iter_mut().zip(batch.chunks_exact(2)) {
            *h = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
        }
        halves[n..padded].fill(f16::ZERO);
        // One bulk conversion per batch uses the CPU's f16 instructions when present.
        halves[..padded].convert_to_f32_slice(&mut vals[..padded]);
        for (group, dst) in vals[..padded].chunks_exact(GROUP).zip(&mut out_groups) {
            let amax = group.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = f16::from_f32(amax / 127.0);
            let df = d.to_f32();
            let inv = if df > 0.0 && df.is_finite() {
                1.0 / df
            } else {
                0.0
            };
            dst[..2].copy_from_slice(&d.to_le_bytes());
            for (q, &v) in dst[2..].iter_mut().zip(group) {
                *q = round_to_i8(v * inv);
            }
        }
    }
    out
}

/// Decodes q8_0 back to `raw_len` bytes of f16. Returns `None` when `q`
/// does not have exactly [`q8_0_len`]`(raw_len)` bytes.
pub fn dequantize_f16(q: &[u8], raw_len: u64) -> Option<Vec<u8>> {
    if q.len() as u64 != q8_0_len(raw_len) || !raw_len.is_multiple_of(2) {
        return None;
    }
    let mut out = vec![0u8; raw_len as usize];
    let mut vals = vec![0f32; BATCH];
    let mut halves = vec![f16::ZERO; BATCH];
    let mut out_chunks = out.chunks_mut(BATCH * 2);
    for (batch, dst) in q.chunks(GROUP_BYTES * (BATCH / GROUP)).zip(&mut out_chunks) {
        let n_groups = batch.len() / GROUP_BYTES;
        for (g, v) in batch
            .chunks_exact(GROUP_BYTES)
            .zip(vals.chunks_exact_mut(GROUP))
        {
            let d = f16::from_le_bytes([g[0], g[1]]).to_f32();
            for (x, &b) in v.iter_mut().zip(&g[2..]) {
                *x = f32::from(b as i8) * d;
            }
        }
        let n = n_groups * GROUP;
        halves[..n].convert_from_f32_slice(&vals[..n]);
        for (o, h) in dst.chunks_exact_mut(2).zip(&halves[..n]) {
            o.copy_from_slice(&h.to_bits().to_le_bytes());
        }
    }
    Some(out)
}

/// Error statistics of a lossy round trip, over f16 values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantError {
    /// Largest absolute error.
    pub max_abs: f64,
    /// Root-mean-square error.
    pub rms: f64,
    /// RMS error divided by the RMS of the original values.
    pub rel_rms: f64,
}

/// Compares two equally long f16 buffers.
pub fn measure_error(original: &[u8], decoded: &[u8]) -> QuantError {
    let mut max_abs = 0f64;
    let mut se = 0f64;
    let mut ss = 0f64;
    let mut n = 0u64;
    for (a, b) in original.chunks_exact(2).zip(decoded.chunks_exact(2)) {
        let x = f64::from(f16::from_le_bytes([a[0], a[1]]).to_f32());
        let y = f64::from(f16::from_le_bytes([b[0], b[1]]).to_f32());
        if !x.is_finite() {
            continue;
        }
        let e = (x - y).abs();
        max_abs = max_abs.max(e);
        se += e * e;
        ss += x * x;
        n += 1;
    }
    let n = n.max(1) as f64;
    let rms = (se / n).sqrt();
    let rms_x = (ss / n).sqrt();
    QuantError {
        max_abs,
        rms,
        rel_rms: if rms_x > 0.0 { rms / rms_x } else { 0.0 },
    }
}
