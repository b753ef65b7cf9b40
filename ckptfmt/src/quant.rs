//! q8_0-style quantisation of f16 KV at rest.
//!
//! The f16 values of a block payload are taken 32 at a time (the last group
//! is padded with zeros). Each group is stored as its scale `d = max|x| / 127`
//! (f16, LE) followed by 32 signed bytes `q = round(x / d)`; decoding gives
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

/// Quantises f16 bytes (LE) to q8_0. `raw.len()` must be even; an odd last
/// byte is ignored (callers validate the geometry so it never happens).
pub fn quantize_f16(raw: &[u8]) -> Vec<u8> {
    let n_values = raw.len() / 2;
    let mut out = Vec::with_capacity(q8_0_len(raw.len() as u64) as usize);
    let mut halves = [f16::ZERO; GROUP];
    let mut vals = [0f32; GROUP];
    for group in raw[..n_values * 2].chunks(GROUP * 2) {
        halves.fill(f16::ZERO);
        for (h, b) in halves.iter_mut().zip(group.chunks_exact(2)) {
            *h = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
        }
        // Bulk conversion uses the CPU's f16 instructions when present.
        halves.convert_to_f32_slice(&mut vals);
        let amax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = f16::from_f32(amax / 127.0);
        let df = d.to_f32();
        let inv = if df > 0.0 && df.is_finite() {
            1.0 / df
        } else {
            0.0
        };
        out.extend_from_slice(&d.to_le_bytes());
        // `as` saturates and maps NaN to 0, so this never overflows.
        out.extend(
            vals.iter()
                .map(|v| (v * inv).round().clamp(-127.0, 127.0) as i8 as u8),
        );
    }
    out
}

/// Decodes q8_0 back to `raw_len` bytes of f16. Returns `None` when `q`
/// does not have exactly [`q8_0_len`]`(raw_len)` bytes.
pub fn dequantize_f16(q: &[u8], raw_len: u64) -> Option<Vec<u8>> {
    if q.len() as u64 != q8_0_len(raw_len) || raw_len % 2 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(raw_len as usize);
    let mut left = (raw_len / 2) as usize;
    let mut vals = [0f32; GROUP];
    let mut halves = [f16::ZERO; GROUP];
    for group in q.chunks_exact(GROUP_BYTES) {
        let d = f16::from_le_bytes([group[0], group[1]]).to_f32();
        for (v, &b) in vals.iter_mut().zip(&group[2..]) {
            *v = f32::from(b as i8) * d;
        }
        halves.convert_from_f32_slice(&vals);
        let take = left.min(GROUP);
        for h in &halves[..take] {
            out.extend_from_slice(&h.to_bits().to_le_bytes());
        }
        left -= take;
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
