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
    let mut groups = out.chunks_mut(BATCH * 2);
    for (batch, dst) in q.chunks(GROUP_BYTES * (BATCH / GROUP)).zip(&mut groups) {
        let whole = (batch.len() / GROUP_BYTES * GROUP * 2).min(dst.len());
        dequantize_groups(batch, &mut dst[..whole]);
    }
    Some(out)
}

/// Decodes whole q8_0 groups `q` into `out`, which holds the f16 bytes of
/// exactly as many values (`q.len() / 34 * 64` bytes), with the bits
/// [`dequantize_f16`] gives; for a reader that widens rows in place (a
/// spilled KV page attended to from its file). Returns `false`, writing
/// nothing, when the lengths do not match.
pub fn dequantize_f16_into(q: &[u8], out: &mut [u8]) -> bool {
    if !q.len().is_multiple_of(GROUP_BYTES) || out.len() != q.len() / GROUP_BYTES * GROUP * 2 {
        return false;
    }
    for (batch, dst) in q
        .chunks(GROUP_BYTES * (BATCH / GROUP))
        .zip(out.chunks_mut(BATCH * 2))
    {
        dequantize_groups(batch, dst);
    }
    true
}

/// Decodes the groups of `q` (at most a batch) into `dst`, up to its length.
fn dequantize_groups(q: &[u8], dst: &mut [u8]) {
    let mut vals = [0f32; BATCH];
    let mut halves = [f16::ZERO; BATCH];
    let n_groups = q.len() / GROUP_BYTES;
    for (g, v) in q
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_in_place_gives_the_bits_of_a_whole_decode() {
        // 3 rows of 192 values and 9 batches' worth, from a simple generator.
        for n in [3 * 192, 9 * BATCH + 64] {
            let raw: Vec<u8> = (0..n)
                .flat_map(|i| {
                    let x = ((i * 7919 % 2003) as f32 - 1001.0) / 97.0;
                    f16::from_f32(x).to_le_bytes()
                })
                .collect();
            let q = quantize_f16(&raw);
            let whole = dequantize_f16(&q, raw.len() as u64).unwrap();
            let mut rows = vec![0u8; raw.len()];
            assert!(dequantize_f16_into(&q, &mut rows));
            assert_eq!(rows, whole);
            // Part of it, from a group boundary on.
            let mut part = vec![0u8; 64 * 5];
            assert!(dequantize_f16_into(&q[34 * 2..34 * 7], &mut part));
            assert_eq!(part, whole[64 * 2..64 * 7]);
            assert!(!dequantize_f16_into(&q[..33], &mut part));
        }
    }
}
