//! The crate's k-quant kernels (`kernels::ggml_sys_mul_mat_q4_k`, `_q5_k` and `_q6_k`, run as
//! ggml custom ops) against two references: the exact product, in f64, of the weights as our
//! own decoding of the block layouts reads them (itself checked against ggml's dequantization)
//! and of the columns as ggml's q8_K routine quantizes them, within a few units of f32 rounding
//! per super-block term; and `ggml_mul_mat` on the same tensors, within both sides' rounding.
//! Column counts below, at and above the vector width (8 or 16 columns per group), odd row
//! counts, one to four threads (columns split by group or rows split by thread), strided
//! columns, and activations with a large common offset (a wrong minimum or -32 correction is
//! then far outside the bound). And bit identity: every column the same bits alone, among a
//! few columns (the few-column path), among many (the wide path, its partial group and its
//! few-column tail), and, with the integer sums, the same bits as the kernels' definition
//! evaluated here in f32, so the same on every CPU path.

use ggml_sys::*;
use std::ffi::c_int;

mod common;

use common::Rng;

/// Values per super-block.
const QK_K: usize = 256;

/// One of the weight types the kernels take.
#[derive(Clone, Copy)]
struct Kind {
    ty: ggml_type,
    name: &'static str,
    kernel: unsafe extern "C" fn(*mut ggml_tensor, c_int, c_int, *mut std::ffi::c_void),
}

const KINDS: [Kind; 3] = [
    Kind {
        ty: GGML_TYPE_Q4_K,
        name: "q4_K",
        kernel: kernels::ggml_sys_mul_mat_q4_k,
    },
    Kind {
        ty: GGML_TYPE_Q5_K,
        name: "q5_K",
        kernel: kernels::ggml_sys_mul_mat_q5_k,
    },
    Kind {
        ty: GGML_TYPE_Q6_K,
        name: "q6_K",
        kernel: kernels::ggml_sys_mul_mat_q6_k,
    },
];

/// How the test's activations are drawn.
#[derive(Clone, Copy, PartialEq)]
enum Columns {
    /// Uniform in [-3, 3).
    Centred,
    /// 5 plus uniform in [-0.5, 0.5): the products' sums are dominated by the offset times
    /// the weights' sums, which the minimums (Q4_K, Q5_K) and the -32 (Q6_K) carry.
    Offset,
}

/// One decoded weight: `scale * q - offset`, every factor exact in f64.
#[derive(Clone, Copy)]
struct Weight {
    scale: f64,
    q: i32,
    offset: f64,
}

impl Weight {
    fn value(self) -> f64 {
        self.scale * self.q as f64 - self.offset
    }
    /// The magnitudes of its two parts, the scale of the rounding of the terms they enter.
    fn magnitude(self) -> f64 {
        (self.scale * self.q as f64).abs() + self.offset.abs()
    }
}

fn f16(b: &[u8], at: usize) -> f64 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f64()
}

/// Q4_K's and Q5_K's 12 bytes of six-bit scales and minimums, as two arrays of eight.
fn scales_and_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for t in 0..4 {
        sc[t] = s[t] & 0x3F;
        mn[t] = s[t + 4] & 0x3F;
        // Their top two bits complete the second four, whose low four bits are in bytes 8..12.
        sc[t + 4] = (s[t + 8] & 0x0F) | ((s[t] >> 6) << 4);
        mn[t + 4] = (s[t + 8] >> 4) | ((s[t + 4] >> 6) << 4);
    }
    (sc, mn)
}

/// Our own reading of one super-block of `ty` (ggml-common.h's layouts): its 256 weights.
fn decode(ty: ggml_type, b: &[u8]) -> Vec<Weight> {
    match ty {
        GGML_TYPE_Q4_K | GGML_TYPE_Q5_K => {
            let (d, dmin) = (f16(b, 0), f16(b, 2));
            let (sc, mn) = scales_and_mins(&b[4..16]);
            let (qh, qs) = if ty == GGML_TYPE_Q5_K {
                (Some(&b[16..48]), &b[48..176])
            } else {
                (None, &b[16..144])
            };
            (0..QK_K)
                .map(|e| {
                    // 64 values per 32 bytes: the low nibbles first, then the high ones.
                    let (chunk, half, l) = (e / 64, (e / 32) % 2, e % 32);
                    let byte = qs[32 * chunk + l];
                    let mut q = if half == 0 { byte & 0x0F } else { byte >> 4 } as i32;
                    if let Some(qh) = qh {
                        q |= (((qh[l] >> (2 * chunk + half)) & 1) as i32) << 4;
                    }
                    let j = e / 32;
                    Weight {
                        scale: d * sc[j] as f64,
                        q,
                        offset: dmin * mn[j] as f64,
                    }
                })
                .collect()
        }
        GGML_TYPE_Q6_K => {
            let (ql, qh) = (&b[0..128], &b[128..192]);
            let sc = &b[192..208];
            let d = f16(b, 208);
            (0..QK_K)
                .map(|e| {
                    let (h, t, l) = (e / 128, (e % 128) / 32, e % 32);
                    // Values 32t + l of a half: t = 0, 1 the low nibbles of ql's two 32-byte
                    // rows, t = 2, 3 their high nibbles; bits 2t and 2t + 1 of qh[l] above.
                    let byte = ql[64 * h + 32 * (t % 2) + l];
                    let low = if t < 2 { byte & 0x0F } else { byte >> 4 };
                    let high = (qh[32 * h + l] >> (2 * t)) & 3;
                    Weight {
                        scale: d * (sc[e / 16] as i8) as f64,
                        q: (low | (high << 4)) as i32 - 32,
                        offset: 0.0,
                    }
                })
                .collect()
        }
        _ => unreachable!("not a k-quant of this test"),
    }
}

/// `m` rows of `k` weights quantized to `ty` by ggml, with their decoding checked against
/// ggml's own dequantization. Weights vary in scale and centre from one sub-block of 16 to the
/// next, so that every scale, minimum and sign is exercised.
fn weights(ty: ggml_type, k: usize, m: usize, rng: &mut Rng) -> (Vec<u8>, Vec<Vec<Weight>>) {
    let mut x = Vec::with_capacity(k * m);
    for _ in 0..k * m / 16 {
        let (scale, centre) = (0.05 + (rng.f32() + 1.0), rng.f32() * 0.8);
        for _ in 0..16 {
            x.push((rng.f32() + centre) * scale);
        }
    }
    // SAFETY: traits are static; `q` holds exactly the m rows' bytes that ggml reports.
    unsafe {
        let row = ggml_row_size(ty, k as i64);
        let mut q = vec![0u8; row * m];
        let written = ggml_quantize_chunk(
            ty,
            x.as_ptr(),
            q.as_mut_ptr().cast(),
            0,
            m as i64,
            k as i64,
            std::ptr::null(),
        );
        assert_eq!(written, q.len());
        let mut back = vec![0f32; k * m];
        let to_float = (*ggml_get_type_traits(ty)).to_float.expect("dequantizes");
        to_float(q.as_ptr().cast(), back.as_mut_ptr(), (k * m) as i64);
        let block = row / (k / QK_K);
        let rows: Vec<Vec<Weight>> = (0..m)
            .map(|r| {
                (0..k / QK_K)
                    .flat_map(|i| decode(ty, &q[r * row + i * block..r * row + (i + 1) * block]))
                    .collect()
            })
            .collect();
        for (r, row) in rows.iter().enumerate() {
            for (e, w) in row.iter().enumerate() {
                // ggml computes scale * q - offset in f32: one rounding.
                let got = back[r * k + e] as f64;
                assert!(
                    (got - w.value()).abs() <= w.magnitude() * f64::powi(2.0, -23),
                    "row {r} value {e}: ggml dequantizes to {got}, we decode {}",
                    w.value()
                );
            }
        }
        (q, rows)
    }
}

/// Column `c` as ggml's q8_K routine quantizes it (the kernels' and ggml_mul_mat's input),
/// dequantized exactly.
fn q8_k(column: &[f32]) -> Vec<f64> {
    let nb = column.len() / QK_K;
    let mut q = vec![0u8; nb * 292];
    // SAFETY: the traits are static; `q` holds nb q8_K blocks (f32 scale, 256 int8, 16 int16).
    unsafe {
        let from_float = (*ggml_get_type_traits_cpu(GGML_TYPE_Q8_K))
            .from_float
            .expect("q8_K quantizes");
        from_float(column.as_ptr(), q.as_mut_ptr().cast(), column.len() as i64);
    }
    (0..column.len())
        .map(|e| {
            let b = &q[(e / QK_K) * 292..];
            let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64;
            d * (b[4 + e % QK_K] as i8) as f64
        })
        .collect()
}

/// The kernel's node for `w` times `x`.
///
/// # Safety
/// `ctx` is live and `w`, `x` are its tensors.
unsafe fn kernel_node(
    ctx: *mut ggml_context,
    kind: Kind,
    w: *mut ggml_tensor,
    x: *mut ggml_tensor,
) -> *mut ggml_tensor {
    let mut args = [w, x];
    // SAFETY: the caller's promise; ggml copies `args` into the node.
    unsafe {
        ggml_custom_4d(
            ctx,
            GGML_TYPE_F32,
            (*w).ne[1],
            (*x).ne[1],
            1,
            1,
            args.as_mut_ptr(),
            2,
            Some(kind.kernel),
            GGML_N_TASKS_MAX,
            std::ptr::null_mut(),
        )
    }
}

/// One product: the kernel, ggml_mul_mat, the f64 reference and each output's magnitude
/// (the sum over its terms of |weight parts| * |activation|), each `m * n` row fastest.
struct Run {
    kernel: Vec<f32>,
    ggml: Vec<f32>,
    reference: Vec<f64>,
    magnitude: Vec<f64>,
}

/// `w` (`kind`, `k` × `m`) times `x` (f32, `k` × `n`, columns `stride` floats apart) with
/// `threads` threads.
fn run(
    kind: Kind,
    (k, m, n): (usize, usize, usize),
    stride: usize,
    threads: c_int,
    columns: Columns,
    seed: u64,
) -> Run {
    let mut rng = Rng(seed);
    let (q, rows) = weights(kind.ty, k, m, &mut rng);
    let data: Vec<f32> = (0..stride * n)
        .map(|_| match columns {
            Columns::Centred => rng.f32() * 3.0,
            Columns::Offset => 5.0 + rng.f32() * 0.5,
        })
        .collect();
    // SAFETY: the context owns every tensor; copies stay within freshly allocated tensors of
    // the sizes written; results are f32 tensors of m * n contiguous floats.
    let (kernel, ggml) = unsafe {
        let ctx = ggml_init(ggml_init_params {
            mem_size: (q.len() + data.len() * 4 + m * n * 8) + (16 << 20),
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        });
        assert!(!ctx.is_null());
        let w = ggml_new_tensor_2d(ctx, kind.ty, k as i64, m as i64);
        std::ptr::copy_nonoverlapping(q.as_ptr(), (*w).data.cast(), q.len());
        let backing = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, stride as i64, n as i64);
        std::ptr::copy_nonoverlapping(data.as_ptr(), (*backing).data.cast(), data.len());
        let x = ggml_view_2d(ctx, backing, k as i64, n as i64, (*backing).nb[1], 0);
        let want = ggml_mul_mat(ctx, w, x);
        let got = kernel_node(ctx, kind, w, x);
        let ggml = common::compute_f32(ctx, want, threads);
        let kernel = common::compute_f32(ctx, got, threads);
        ggml_free(ctx);
        (kernel, ggml)
    };
    let mut reference = vec![0f64; m * n];
    let mut magnitude = vec![0f64; m * n];
    for c in 0..n {
        let y = q8_k(&data[c * stride..c * stride + k]);
        for (r, row) in rows.iter().enumerate() {
            let (mut sum, mut mag) = (0f64, 0f64);
            for (w, &y) in row.iter().zip(&y) {
                sum += w.value() * y;
                mag += w.magnitude() * y.abs();
            }
            reference[c * m + r] = sum;
            magnitude[c * m + r] = mag;
        }
    }
    Run {
        kernel,
        ggml,
        reference,
        magnitude,
    }
}

/// The kernel within rounding of the exact product and of ggml_mul_mat. Per output, with u =
/// 2^-24 (f32's unit roundoff) and nb super-blocks: the kernel rounds each super-block's
/// term (the scale product, the integer sum's conversion: 2u of it, twice with the
/// minimums) and its running sum (u of the sum, 2nb times), so it lies within (2nb + 4) u of
/// the terms' magnitudes from the exact value; ggml's sum in another order obeys the same
/// bound, so the two lie within twice that of each other. A wrong integer sum, scale, minimum
/// or offset moves an output by a sizeable fraction of its magnitude.
fn check(
    kind: Kind,
    shape: (usize, usize, usize),
    stride: usize,
    threads: c_int,
    columns: Columns,
) {
    let (k, m, n) = shape;
    let seed = (k * 131 + m * 31 + n) as u64 ^ kind.ty as u64;
    let r = run(kind, shape, stride, threads, columns, seed);
    let what = format!(
        "{}: k {k}, m {m}, n {n}, stride {stride}, {threads} threads",
        kind.name
    );
    assert_eq!(r.kernel.len(), m * n, "{what}");
    assert!(
        r.magnitude.iter().all(|&x| x > 0.0),
        "{what}: a zero output"
    );
    let u = f64::powi(2.0, -24);
    let bound = (2.0 * (k / QK_K) as f64 + 4.0) * u;
    for i in 0..m * n {
        let (got, ggml, want, mag) = (
            r.kernel[i] as f64,
            r.ggml[i] as f64,
            r.reference[i],
            r.magnitude[i],
        );
        let (row, col) = (i % m, i / m);
        assert!(
            (got - want).abs() <= bound * mag,
            "{what}: row {row} column {col}: kernel {got}, exact {want} (magnitude {mag})"
        );
        assert!(
            (got - ggml).abs() <= 2.0 * bound * mag,
            "{what}: row {row} column {col}: kernel {got}, ggml {ggml} (magnitude {mag})"
        );
    }
}

#[test]
fn every_column_count_around_the_vector_width() {
    for kind in KINDS {
        for n in (1..=18).chain([31, 32, 33, 47, 48, 49, 64, 65]) {
            let threads = 1 + (n % 4) as c_int;
            check(kind, (256, 7, n), 256, threads, Columns::Centred);
        }
    }
}

#[test]
fn every_row_count_of_a_pass_and_thread_splits() {
    for kind in KINDS {
        // A pass takes 8 rows (4 without AVX-512): every remainder, split by group (many
        // columns) and by row (one or two groups).
        for m in 1..=17 {
            let threads = 1 + (m % 3) as c_int;
            check(kind, (512, m, 70), 512, threads, Columns::Centred);
            check(kind, (512, m, 16), 512, threads + 1, Columns::Centred);
        }
    }
}

#[test]
fn model_shapes_and_strided_columns() {
    for kind in KINDS {
        // Gemma 3 270M's down projection and attention output (k 2048 and 1024, m 640).
        check(kind, (2048, 40, 512), 2048, 2, Columns::Centred);
        check(kind, (1024, 640, 24), 1024, 3, Columns::Centred);
        check(kind, (768, 33, 100), 768, 4, Columns::Centred);
        // Columns 320 floats apart, of which the product reads the first 256.
        check(kind, (256, 9, 41), 320, 2, Columns::Centred);
    }
}

#[test]
fn a_common_offset_needs_the_minimums() {
    for kind in KINDS {
        check(kind, (512, 17, 40), 512, 2, Columns::Offset);
        check(kind, (1024, 5, 9), 1024, 1, Columns::Offset);
    }
}

#[test]
fn a_mismatched_weight_type_gives_nan() {
    // The q6_K kernel handed q4_K weights: every output NaN, not a silent misreading.
    let (q4, q6) = (KINDS[0], KINDS[2]);
    let (k, m, n) = (256i64, 3i64, 20i64);
    // SAFETY: as in `run`.
    unsafe {
        let ctx = ggml_init(ggml_init_params {
            mem_size: 16 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        });
        let w = ggml_new_tensor_2d(ctx, q4.ty, k, m);
        std::ptr::write_bytes((*w).data.cast::<u8>(), 0, ggml_nbytes(w));
        let x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
        std::ptr::write_bytes((*x).data.cast::<u8>(), 0, ggml_nbytes(x));
        let out = common::compute_f32(ctx, kernel_node(ctx, q6, w, x), 2);
        assert_eq!(out.len(), (m * n) as usize);
        assert!(out.iter().all(|v| v.is_nan()), "{out:?}");
        ggml_free(ctx);
    }
}

/// One weight super-block's integers as the kernels' definition reads them (see the header of
/// `csrc/mul_mat_qk.c`): Q4_K and Q5_K `d`, `dmin`, eight scales and minimums and the values q;
/// Q6_K `d`, sixteen signed scales and the values v = u - 32 (`dmin` and the minimums zero).
struct Ints {
    d: f32,
    dmin: f32,
    scales: Vec<i32>,
    mins: Vec<i32>,
    q: Vec<i32>,
}

fn f16_f32(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn ints(ty: ggml_type, b: &[u8]) -> Ints {
    // `decode` reads the values; its scale already multiplies d (exact in f64), so the integers
    // come from the scale bytes again.
    let w = decode(ty, b);
    let q: Vec<i32> = w.iter().map(|w| w.q).collect();
    match ty {
        GGML_TYPE_Q6_K => Ints {
            d: f16_f32(b, 208),
            dmin: 0.0,
            scales: b[192..208].iter().map(|&s| s as i8 as i32).collect(),
            mins: vec![0; 16],
            q,
        },
        _ => {
            let (sc, mn) = scales_and_mins(&b[4..16]);
            Ints {
                d: f16_f32(b, 0),
                dmin: f16_f32(b, 2),
                scales: sc.iter().map(|&s| s as i32).collect(),
                mins: mn.iter().map(|&m| m as i32).collect(),
                q,
            }
        }
    }
}

/// A column as ggml's q8_K routine quantizes it: per super-block d8 and 256 int8 values.
fn q8_k_ints(column: &[f32]) -> Vec<(f32, Vec<i32>)> {
    let nb = column.len() / QK_K;
    let mut q = vec![0u8; nb * 292];
    // SAFETY: as in `q8_k`.
    unsafe {
        let from_float = (*ggml_get_type_traits_cpu(GGML_TYPE_Q8_K))
            .from_float
            .expect("q8_K quantizes");
        from_float(column.as_ptr(), q.as_mut_ptr().cast(), column.len() as i64);
    }
    (0..nb)
        .map(|i| {
            let b = &q[i * 292..];
            let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            (d, b[4..4 + QK_K].iter().map(|&v| v as i8 as i32).collect())
        })
        .collect()
}

/// The definition, in f32 with fused multiply-adds, in its order: per super-block the exact
/// integer sums, then acc = fma(d * d8, sumi, acc) and for Q4_K and Q5_K acc = fma(-dmin * d8,
/// summ, acc).
fn definition(ty: ggml_type, row: &[Ints], column: &[(f32, Vec<i32>)]) -> f32 {
    let sub = if ty == GGML_TYPE_Q6_K { 16 } else { 32 };
    let mut acc = 0f32;
    for (x, (d8, y)) in row.iter().zip(column) {
        let (mut sumi, mut summ) = (0i64, 0i64);
        for j in 0..QK_K / sub {
            let e = j * sub..(j + 1) * sub;
            let dot: i64 = e.clone().map(|e| (x.q[e] * y[e]) as i64).sum();
            let bsum: i64 = e.map(|e| y[e] as i64).sum();
            sumi += x.scales[j] as i64 * dot;
            summ += x.mins[j] as i64 * bsum;
        }
        acc = (x.d * d8).mul_add(sumi as f32, acc);
        if ty != GGML_TYPE_Q6_K {
            acc = (-x.dmin * d8).mul_add(summ as f32, acc);
        }
    }
    acc
}

/// The kernel's product of `w` (`kind`, k × m, bytes `q`) with columns `first .. first + n` of
/// `data` (k floats each), `threads` threads: m * n outputs, row fastest.
fn kernel_only(
    kind: Kind,
    (k, m): (usize, usize),
    q: &[u8],
    data: &[f32],
    (first, n): (usize, usize),
    threads: c_int,
) -> Vec<f32> {
    // SAFETY: as in `run`.
    unsafe {
        let ctx = ggml_init(ggml_init_params {
            mem_size: q.len() + (k + m) * n * 4 + (1 << 20),
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        });
        assert!(!ctx.is_null());
        let w = ggml_new_tensor_2d(ctx, kind.ty, k as i64, m as i64);
        std::ptr::copy_nonoverlapping(q.as_ptr(), (*w).data.cast(), q.len());
        let x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k as i64, n as i64);
        std::ptr::copy_nonoverlapping(data[first * k..].as_ptr(), (*x).data.cast(), k * n);
        let out = common::compute_f32(ctx, kernel_node(ctx, kind, w, x), threads);
        ggml_free(ctx);
        out
    }
}

/// Every column of an n-column product is the same bits as that column computed alone and
/// inside a 100-column product, for n below, at and above the few-column limit and the vector
/// widths, rows in whole and partial blocks, one to three threads; where the kernels sum in
/// integers (AVX2 and up), those bits are also the definition's, evaluated here in f32 (so the
/// same bits on every CPU path). One column holds an all-zero super-block (q8_K's scale 0).
#[test]
fn a_column_is_the_same_bits_at_every_column_count() {
    const ALL: usize = 100;
    // SAFETY: a plain query.
    let isum = unsafe { kernels::ggml_sys_mul_mat_qk_isum() } != 0;
    for kind in KINDS {
        let (k, m) = (512, 21);
        let mut rng = Rng(0x5EED ^ kind.ty as u64);
        let (q, _) = weights(kind.ty, k, m, &mut rng);
        let mut data: Vec<f32> = (0..k * ALL).map(|_| rng.f32() * 3.0).collect();
        data[5 * k..5 * k + QK_K].fill(0.0);
        let all = kernel_only(kind, (k, m), &q, &data, (0, ALL), 2);
        let row_bytes = q.len() / m;
        let block = row_bytes / (k / QK_K);
        let rows: Vec<Vec<Ints>> = (0..m)
            .map(|r| {
                (0..k / QK_K)
                    .map(|i| ints(kind.ty, &q[r * row_bytes + i * block..][..block]))
                    .collect()
            })
            .collect();
        for c in 0..ALL {
            let alone = kernel_only(kind, (k, m), &q, &data, (c, 1), 1 + (c % 3) as c_int);
            let column = q8_k_ints(&data[c * k..(c + 1) * k]);
            for r in 0..m {
                assert_eq!(
                    alone[r].to_bits(),
                    all[c * m + r].to_bits(),
                    "{}: row {r} column {c}: alone {}, in {ALL} columns {}",
                    kind.name,
                    alone[r],
                    all[c * m + r]
                );
                if isum {
                    let want = definition(kind.ty, &rows[r], &column);
                    assert_eq!(
                        alone[r].to_bits(),
                        want.to_bits(),
                        "{}: row {r} column {c}: kernel {}, definition {want}",
                        kind.name,
                        alone[r]
                    );
                }
            }
        }
        for n in (2..=17).chain([31, 33, 64]) {
            let got = kernel_only(kind, (k, m), &q, &data, (0, n), 1 + (n % 3) as c_int);
            for i in 0..m * n {
                assert_eq!(
                    got[i].to_bits(),
                    all[i].to_bits(),
                    "{}: {n} columns: row {} column {}: {}, in {ALL} columns {}",
                    kind.name,
                    i % m,
                    i / m,
                    got[i],
                    all[i]
                );
            }
        }
    }
}
