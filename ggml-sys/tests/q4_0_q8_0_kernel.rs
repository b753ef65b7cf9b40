//! The crate's Q4_0, Q5_0 and Q8_0 integer-sum kernels (`kernels::ggml_sys_mul_mat_q4_0`,
//! `_q5_0` and `_q8_0`, run as ggml custom ops), three ways on each product: bit for bit against their
//! definition written out here (per block an exact integer sum, then one chain of fused
//! multiply-adds over the blocks); within `(nb + 2)` units of 2^-24 of each output's terms'
//! magnitude of an f64 product of ggml's dequantized weights and the q8_0-quantized columns;
//! and within twice that (both sides round) of `ggml_mul_mat`. Over column counts below, at and
//! above the lane widths (8, 16) and the split between threads by group or by row, odd row
//! counts, one to four threads, strided columns, weights quantized by ggml and raw blocks of
//! random bytes (every int8 value; every five-bit value and high-bit pattern of Q5_0), and columns with a large common offset (where a wrong correction for the
//! unsigned weights would show). And batch invariance: each column of an N-column product has
//! the bits of the same column computed alone and inside a 100-column product, whatever N (the
//! few-column path's rows per vector lane or the column groups), the thread count, or the
//! group, lane or tile the column lands in. Where the product reads packed columns, the same
//! product over columns packed once by `ggml_sys_pack_q80`'s own node gives the same bits.

use ggml_sys::*;
use std::ffi::c_int;

mod common;

use common::Rng;

/// The weights of a product.
#[derive(Clone, Copy)]
enum Weights {
    /// Random values quantized by ggml.
    Quantized,
    /// Raw blocks: random scales and random bytes, every value the block can hold.
    Raw,
    /// Raw blocks of random scales whose other bytes are all 0xFF: every integer the largest
    /// unsigned value (15 for Q4_0, 31 for Q5_0), where the 16-bit partial sums of the paths
    /// without VNNI come nearest their bounds.
    Saturated,
}

/// One product's shape and data.
#[derive(Clone, Copy)]
struct Case {
    ty: ggml_type,
    k: i64,
    m: i64,
    n: i64,
    /// Floats between the columns' starts (at least `k`).
    stride: i64,
    threads: c_int,
    weights: Weights,
    /// Added to every activation.
    offset: f32,
    seed: u64,
}

impl Case {
    fn new(ty: ggml_type, k: i64, m: i64, n: i64, threads: c_int) -> Case {
        Case {
            ty,
            k,
            m,
            n,
            stride: k,
            threads,
            weights: Weights::Quantized,
            offset: 0.0,
            seed: (k * 7919 + m * 104_729 + n) as u64 ^ ty as u64,
        }
    }
}

const TYPES: [ggml_type; 3] = [GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0];

fn block_bytes(ty: ggml_type) -> usize {
    match ty {
        GGML_TYPE_Q4_0 => 18,
        GGML_TYPE_Q5_0 => 22,
        _ => 34,
    }
}

fn kernel(ty: ggml_type) -> ggml_custom_op_t {
    match ty {
        GGML_TYPE_Q4_0 => Some(kernels::ggml_sys_mul_mat_q4_0),
        GGML_TYPE_Q5_0 => Some(kernels::ggml_sys_mul_mat_q5_0),
        _ => Some(kernels::ggml_sys_mul_mat_q8_0),
    }
}

/// The product of `ty` weights `w` `[k, m]` and the columns `x` `[k, n]` over a pack node of
/// `pack_floats` floats (`ggml_sys_pack_q80`'s result), the column count as `userdata`.
///
/// # Safety
/// `w` and `x` are live tensors of `ctx`, of the shapes above.
unsafe fn packed_product(
    ctx: *mut ggml_context,
    ty: ggml_type,
    w: *mut ggml_tensor,
    x: *mut ggml_tensor,
    pack_floats: i64,
) -> *mut ggml_tensor {
    // SAFETY: the caller's tensors; ggml copies `src` and `args` into the nodes.
    unsafe {
        let (m, n) = ((*w).ne[1], (*x).ne[1]);
        let mut src = [x];
        let pack = ggml_custom_4d(
            ctx,
            GGML_TYPE_F32,
            pack_floats,
            1,
            1,
            1,
            src.as_mut_ptr(),
            1,
            Some(kernels::ggml_sys_pack_q80),
            GGML_N_TASKS_MAX,
            ty as usize as *mut std::ffi::c_void,
        );
        let mut args = [w, pack];
        ggml_custom_4d(
            ctx,
            GGML_TYPE_F32,
            m,
            n,
            1,
            1,
            args.as_mut_ptr(),
            2,
            kernel(ty),
            GGML_N_TASKS_MAX,
            n as usize as *mut std::ffi::c_void,
        )
    }
}

fn f16(b: &[u8]) -> f32 {
    // SAFETY: a plain conversion of two bytes.
    unsafe { ggml_fp16_to_fp32(u16::from_le_bytes([b[0], b[1]])) }
}

/// A weight block's scale and its 32 integers in element order (q - 8 for Q4_0; for Q5_0
/// q - 16, q five bits: a nibble of the 16 bytes after the scale and the 4-byte mask, and the
/// mask's bit of the same element).
fn decode(ty: ggml_type, b: &[u8]) -> (f32, [i32; 32]) {
    let mut w = [0i32; 32];
    if ty == GGML_TYPE_Q4_0 {
        for j in 0..16 {
            w[j] = (b[2 + j] & 0x0F) as i32 - 8;
            w[j + 16] = (b[2 + j] >> 4) as i32 - 8;
        }
    } else if ty == GGML_TYPE_Q5_0 {
        let high = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for (e, v) in w.iter_mut().enumerate() {
            let byte = b[6 + e % 16];
            let nibble = if e < 16 { byte & 0x0F } else { byte >> 4 };
            let q = nibble as i32 | (((high >> e) & 1) as i32) << 4;
            *v = q - 16;
        }
    } else {
        for (j, v) in w.iter_mut().enumerate() {
            *v = b[2 + j] as i8 as i32;
        }
    }
    (f16(&b[0..2]), w)
}

/// The results of one product.
struct Run {
    ggml: Vec<f32>,
    kernel: Vec<f32>,
    /// The kernel's results from columns packed by `ggml_sys_pack_q80` (where the product
    /// reads packed columns).
    packed: Option<Vec<f32>>,
    /// The definition's bits.
    definition: Vec<f32>,
    /// The exact product of the dequantized weights and the quantized columns, in f64.
    exact: Vec<f64>,
    /// Per output: the sum of its terms' magnitudes, the scale of its rounding.
    magnitude: Vec<f64>,
}

fn run(c: Case) -> Run {
    let Case {
        ty,
        k,
        m,
        n,
        stride,
        ..
    } = c;
    let mut rng = Rng(c.seed);
    let nb = (k / 32) as usize;
    // SAFETY: the context owns every tensor; data writes stay within freshly allocated tensors
    // of the sizes written; results are f32 tensors of m * n contiguous floats.
    unsafe {
        let ctx = ggml_init(ggml_init_params {
            mem_size: 512 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        });
        assert!(!ctx.is_null());
        let w = ggml_new_tensor_2d(ctx, ty, k, m);
        let bytes = m as usize * nb * block_bytes(ty);
        assert_eq!(ggml_nbytes(w), bytes);
        let blocks = std::slice::from_raw_parts_mut((*w).data as *mut u8, bytes);
        match c.weights {
            Weights::Quantized => {
                let values: Vec<f32> = (0..k * m).map(|_| rng.f32() * 0.5).collect();
                ggml_quantize_chunk(ty, values.as_ptr(), (*w).data, 0, m, k, std::ptr::null());
            }
            Weights::Raw | Weights::Saturated => {
                for b in blocks.chunks_mut(block_bytes(ty)) {
                    // A normal f16 of either sign, magnitude 2^-10 to 2^-3.
                    let scale = (rng.next_u64() % 0x1C00) as u16 + 0x1400;
                    let sign = if rng.next_u64() & 1 == 1 { 0x8000 } else { 0 };
                    b[0..2].copy_from_slice(&(scale | sign).to_le_bytes());
                    for v in &mut b[2..] {
                        *v = match c.weights {
                            Weights::Saturated => 0xFF,
                            _ => rng.next_u64() as u8,
                        };
                    }
                }
            }
        }
        let blocks = blocks.to_vec();
        let backing = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, stride, n);
        let data =
            std::slice::from_raw_parts_mut((*backing).data as *mut f32, (stride * n) as usize);
        for v in data.iter_mut() {
            *v = rng.f32() * 3.0 + c.offset;
        }
        let x = ggml_view_2d(ctx, backing, k, n, (*backing).nb[1], 0);
        let want = ggml_mul_mat(ctx, w, x);
        let mut args = [w, x];
        // ggml copies `args` into the node; `userdata` is unused.
        let node = ggml_custom_4d(
            ctx,
            GGML_TYPE_F32,
            m,
            n,
            1,
            1,
            args.as_mut_ptr(),
            2,
            kernel(ty),
            GGML_N_TASKS_MAX,
            std::ptr::null_mut(),
        );
        let ggml = common::compute_f32(ctx, want, c.threads);
        let kernel = common::compute_f32(ctx, node, c.threads);
        // The same product over the columns packed once by their own node, as the engine
        // shares one packing between products over the same columns.
        let packed_bytes = kernels::ggml_sys_q80_packed_bytes(ty as c_int, k, n);
        let packed = (packed_bytes > 0).then(|| {
            let node = packed_product(ctx, ty, w, x, (packed_bytes + 3) / 4);
            common::compute_f32(ctx, node, c.threads)
        });
        assert_eq!(ggml.len(), (m * n) as usize);
        // The weights as ggml dequantizes them, for the f64 product.
        let to_float = (*ggml_get_type_traits(ty)).to_float.expect("dequantizes");
        let mut dequantized = vec![0f32; (k * m) as usize];
        to_float((*w).data, dequantized.as_mut_ptr(), k * m);
        let columns: Vec<&[f32]> = (0..n)
            .map(|c| &data[(c * stride) as usize..(c * stride + k) as usize])
            .collect();
        let r = reference(ty, &blocks, &dequantized, k as usize, m as usize, &columns);
        ggml_free(ctx);
        Run {
            ggml,
            kernel,
            packed,
            definition: r.0,
            exact: r.1,
            magnitude: r.2,
        }
    }
}

/// The definition, one output at a time: each column quantized by ggml's q8_0 routine (int8
/// y, scale d1); for weight blocks (d0, w) `acc = fma(d0 * d1, sum w * y, acc)` over the blocks
/// in order. Also the f64 product of the dequantized weights and the dequantized columns, and
/// each output's terms' magnitude, `sum |d0 d1| * sum |w y|`.
fn reference(
    ty: ggml_type,
    blocks: &[u8],
    dequantized: &[f32],
    k: usize,
    m: usize,
    columns: &[&[f32]],
) -> (Vec<f32>, Vec<f64>, Vec<f64>) {
    let nb = k / 32;
    let bb = block_bytes(ty);
    // SAFETY: the q8_0 traits are static; `from_float` writes nb blocks of 34 bytes.
    let from_float =
        unsafe { (*ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)).from_float }.expect("q8_0 quantizes");
    let n = columns.len();
    let (mut out, mut exact, mut magnitude) =
        (vec![0f32; m * n], vec![0f64; m * n], vec![0f64; m * n]);
    for (c, col) in columns.iter().enumerate() {
        let mut q = vec![0u8; nb * 34];
        // SAFETY: `col` holds k floats, `q` nb q8_0 blocks.
        unsafe { from_float(col.as_ptr(), q.as_mut_ptr().cast(), k as i64) };
        for r in 0..m {
            let (mut acc, mut sum, mut mag) = (0f32, 0f64, 0f64);
            for i in 0..nb {
                let (d0, w) = decode(ty, &blocks[(r * nb + i) * bb..]);
                let y = &q[i * 34..(i + 1) * 34];
                let d1 = f16(&y[0..2]);
                let y: Vec<i32> = y[2..].iter().map(|&v| v as i8 as i32).collect();
                let dot: i32 = (0..32).map(|e| w[e] * y[e]).sum();
                acc = (d0 * d1).mul_add(dot as f32, acc);
                let abs: i32 = (0..32).map(|e| (w[e] * y[e]).abs()).sum();
                mag += (d0 as f64 * d1 as f64).abs() * abs as f64;
                for e in 0..32 {
                    let wv = dequantized[r * k + i * 32 + e] as f64;
                    sum += wv * (d1 as f64 * y[e] as f64);
                }
            }
            out[c * m + r] = acc;
            exact[c * m + r] = sum;
            magnitude[c * m + r] = mag;
        }
    }
    (out, exact, magnitude)
}

/// Checks one product three ways (see the top).
fn check(c: Case) {
    let r = run(c);
    let what = format!(
        "type {}, k {}, m {}, n {}, stride {}, {} threads, offset {}",
        c.ty, c.k, c.m, c.n, c.stride, c.threads, c.offset
    );
    assert_same_bits(&r.definition, &r.kernel, &what);
    if let Some(packed) = &r.packed {
        assert_same_bits(&r.definition, packed, &format!("{what}, packed"));
    }
    assert!(r.magnitude.iter().any(|&m| m > 0.0), "{what}: all zero");
    // Each fused multiply-add rounds once and each product d0 * d1 once: at most nb + 1
    // roundings of at most 2^-24 of the terms' magnitude (and a little second-order slack).
    let nb = (c.k / 32) as f64;
    let unit = (2f64).powi(-24);
    for (i, ((&got, &want), &mag)) in r.kernel.iter().zip(&r.exact).zip(&r.magnitude).enumerate() {
        assert!(
            (got as f64 - want).abs() <= (nb + 2.0) * unit * mag + 1e-30,
            "{what}: output {i}: kernel {got}, exact {want} (terms' magnitude {mag})"
        );
    }
    // ggml sums the same exact block sums in eight lanes, then three additions: both sides
    // within (nb + 5) roundings of the exact value.
    for (i, ((&got, &want), &mag)) in r.kernel.iter().zip(&r.ggml).zip(&r.magnitude).enumerate() {
        assert!(
            (got as f64 - want as f64).abs() <= 2.0 * (nb + 5.0) * unit * mag + 1e-30,
            "{what}: output {i}: kernel {got}, ggml {want} (terms' magnitude {mag})"
        );
    }
}

fn assert_same_bits(want: &[f32], got: &[f32], what: &str) {
    assert_eq!(want.len(), got.len(), "{what}");
    let differing = want
        .iter()
        .zip(got)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let first = want
        .iter()
        .zip(got)
        .enumerate()
        .find(|(_, (a, b))| a.to_bits() != b.to_bits());
    assert_eq!(
        differing, 0,
        "{what}: {differing} elements differ from the definition, first {first:?}"
    );
}

#[test]
fn every_column_count_around_the_lane_widths() {
    for ty in TYPES {
        for n in (1..=34).chain([47, 48, 49, 63, 64, 65, 95, 96, 97, 130]) {
            check(Case::new(ty, 96, 7, n, 2));
        }
    }
}

#[test]
fn every_row_count_of_a_pass_and_thread_counts() {
    for ty in TYPES {
        for m in 1..=17 {
            check(Case::new(ty, 64, m, 64, 1 + (m % 4) as c_int));
        }
    }
}

#[test]
fn model_shapes_by_group_and_by_row() {
    for ty in TYPES {
        for (k, m, n, threads) in [
            (576, 1536, 512, 2),
            (1536, 576, 130, 3),
            (576, 192, 64, 2),
            (576, 577, 77, 4),
            (2048, 5, 200, 2),
            (32, 1, 5, 4),
            (576, 64, 16, 4),
        ] {
            check(Case::new(ty, k, m, n, threads));
        }
    }
}

#[test]
fn raw_blocks_of_every_value_and_strided_columns() {
    for ty in TYPES {
        for (k, m, n, threads) in [(96, 9, 70, 2), (1536, 13, 33, 3), (64, 3, 16, 1)] {
            check(Case {
                weights: Weights::Raw,
                ..Case::new(ty, k, m, n, threads)
            });
        }
        // Columns 160 floats apart, of which the product reads the first 128.
        check(Case {
            stride: 160,
            ..Case::new(ty, 128, 9, 41, 2)
        });
    }
}

#[test]
fn a_common_offset_in_the_columns() {
    // Columns near 20 (all int8 values of a block near 127): sum(y) is large, so the
    // correction for the unsigned weights (-8, -16 or -128 times it) dominates the block sums;
    // with saturated weights too, the 16-bit partial sums come near their bounds. Column
    // groups, and few columns (one weight row per lane) on both sides of a tile.
    for ty in TYPES {
        for weights in [Weights::Quantized, Weights::Raw, Weights::Saturated] {
            for (offset, k, m, n, threads) in [
                (20.0, 576, 11, 72, 2),
                (-20.0, 96, 5, 17, 1),
                (20.0, 576, 19, 5, 2),
                (-20.0, 64, 3, 1, 1),
            ] {
                check(Case {
                    weights,
                    offset,
                    ..Case::new(ty, k, m, n, threads)
                });
            }
        }
    }
}

#[test]
fn the_kernels_compute_known_products() {
    // Not only the definition's bits: every weight 0.5 times columns of all 1 and all -2.
    let (k, m, n) = (64i64, 3i64, 70i64);
    for ty in TYPES {
        // SAFETY: as in `run`.
        unsafe {
            let ctx = ggml_init(ggml_init_params {
                mem_size: 16 << 20,
                mem_buffer: std::ptr::null_mut(),
                no_alloc: false,
            });
            let w = ggml_new_tensor_2d(ctx, ty, k, m);
            let weights = vec![0.5f32; (k * m) as usize];
            ggml_quantize_chunk(ty, weights.as_ptr(), (*w).data, 0, m, k, std::ptr::null());
            let x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
            let xs = std::slice::from_raw_parts_mut((*x).data as *mut f32, (k * n) as usize);
            for (i, v) in xs.iter_mut().enumerate() {
                *v = if (i as i64 / k) % 2 == 0 { 1.0 } else { -2.0 };
            }
            let mut args = [w, x];
            let node = ggml_custom_4d(
                ctx,
                GGML_TYPE_F32,
                m,
                n,
                1,
                1,
                args.as_mut_ptr(),
                2,
                kernel(ty),
                GGML_N_TASKS_MAX,
                std::ptr::null_mut(),
            );
            let out = common::compute_f32(ctx, node, 2);
            for c in 0..n {
                let want = if c % 2 == 0 { 32.0 } else { -64.0 };
                for r in 0..m {
                    let v = out[(c * m + r) as usize];
                    // q8_0's scales are f16: each factor within 2^-11 of its value.
                    assert!(
                        (v - want).abs() <= want.abs() * 2e-3,
                        "type {ty}: row {r} column {c}: {v} against {want}"
                    );
                }
            }
            ggml_free(ctx);
        }
    }
}

#[test]
fn packed_columns_too_short_give_nan_not_a_read_past_them() {
    // The pack node and the product each check the packed tensor's size: a tensor for half the
    // columns is left unwritten, and the product over it gives NaN everywhere.
    let (k, m, n) = (64i64, 5i64, 70i64);
    for ty in TYPES {
        let bytes = unsafe { kernels::ggml_sys_q80_packed_bytes(ty as c_int, k, n) };
        if bytes == 0 {
            // A build that reads no packed columns (plain C).
            continue;
        }
        // SAFETY: as in `run`.
        unsafe {
            let ctx = ggml_init(ggml_init_params {
                mem_size: 16 << 20,
                mem_buffer: std::ptr::null_mut(),
                no_alloc: false,
            });
            let w = ggml_new_tensor_2d(ctx, ty, k, m);
            let weights = vec![0.5f32; (k * m) as usize];
            ggml_quantize_chunk(ty, weights.as_ptr(), (*w).data, 0, m, k, std::ptr::null());
            let x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
            let xs = std::slice::from_raw_parts_mut((*x).data as *mut f32, (k * n) as usize);
            xs.fill(1.0);
            let node = packed_product(ctx, ty, w, x, bytes / 8);
            let out = common::compute_f32(ctx, node, 2);
            assert!(
                out.iter().all(|v| v.is_nan()),
                "type {ty}: {} of {} outputs are not NaN",
                out.iter().filter(|v| !v.is_nan()).count(),
                out.len()
            );
            ggml_free(ctx);
        }
    }
}

/// The column counts of the batch-invariance checks: every count around the few-column path's
/// chunks (4) and row tiles (8), and across the column groups (8, 16).
const COUNTS: [i64; 21] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 31, 33, 64, 100,
];

/// Every column of the product of `ty` weights `[k, m]` and the first N of 100 columns, for
/// each N of [`COUNTS`], against the same column computed alone and inside the 100-column
/// product: the same bits. The products of one call share a graph, run with `threads` threads.
fn assert_batch_invariant(ty: ggml_type, weights: Weights, k: i64, m: i64, threads: c_int) {
    let mut rng = Rng((k * m) as u64 ^ ty as u64);
    let n_max = 100i64;
    // SAFETY: as in `run`; views stay within the 100-column tensor.
    unsafe {
        let ctx = ggml_init(ggml_init_params {
            mem_size: 64 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        });
        assert!(!ctx.is_null());
        let w = ggml_new_tensor_2d(ctx, ty, k, m);
        let bytes = ggml_nbytes(w);
        match weights {
            Weights::Quantized => {
                let values: Vec<f32> = (0..k * m).map(|_| rng.f32() * 0.5).collect();
                ggml_quantize_chunk(ty, values.as_ptr(), (*w).data, 0, m, k, std::ptr::null());
            }
            Weights::Raw | Weights::Saturated => {
                let blocks = std::slice::from_raw_parts_mut((*w).data as *mut u8, bytes);
                for b in blocks.chunks_mut(block_bytes(ty)) {
                    let scale = (rng.next_u64() % 0x1C00) as u16 + 0x1400;
                    b[0..2].copy_from_slice(&scale.to_le_bytes());
                    for v in &mut b[2..] {
                        *v = match weights {
                            Weights::Saturated => 0xFF,
                            _ => rng.next_u64() as u8,
                        };
                    }
                }
            }
        }
        let x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n_max);
        let xs = std::slice::from_raw_parts_mut((*x).data as *mut f32, (k * n_max) as usize);
        for v in xs.iter_mut() {
            *v = rng.f32() * 3.0;
        }
        let col = (*x).nb[1];
        let graph = ggml_new_graph(ctx);
        let node = |n: i64, first: i64| {
            let mut args = [w, ggml_view_2d(ctx, x, k, n, col, first as usize * col)];
            let t = ggml_custom_4d(
                ctx,
                GGML_TYPE_F32,
                m,
                n,
                1,
                1,
                args.as_mut_ptr(),
                2,
                kernel(ty),
                GGML_N_TASKS_MAX,
                std::ptr::null_mut(),
            );
            ggml_build_forward_expand(graph, t);
            t
        };
        let counts: Vec<_> = COUNTS.iter().map(|&n| (n, node(n, 0))).collect();
        let alone: Vec<_> = (0..n_max).map(|c| node(1, c)).collect();
        assert_eq!(
            ggml_graph_compute_with_ctx(ctx, graph, threads),
            GGML_STATUS_SUCCESS
        );
        let read = |t: *mut ggml_tensor| {
            std::slice::from_raw_parts((*t).data as *const f32, ggml_nelements(t) as usize).to_vec()
        };
        let full = read(counts[counts.len() - 1].1);
        let (m, k) = (m as usize, k as usize);
        for &(n, t) in &counts {
            let got = read(t);
            let what = format!("type {ty}, k {k}, m {m}, {threads} threads, {n} columns");
            assert_same_bits(
                &full[..n as usize * m],
                &got,
                &format!("{what}, against 100"),
            );
            for (c, &one) in alone.iter().take(n as usize).enumerate() {
                assert_same_bits(
                    &read(one),
                    &got[c * m..(c + 1) * m],
                    &format!("{what}, column {c} alone"),
                );
            }
        }
        ggml_free(ctx);
    }
}

#[test]
fn each_column_has_the_same_bits_in_every_product() {
    // Row counts in and past whole tiles; blocks of one and several per row.
    for ty in TYPES {
        for (k, m, threads) in [
            (96, 19, 2),
            (576, 40, 3),
            (32, 8, 1),
            (64, 1, 4),
            (1536, 13, 2),
        ] {
            assert_batch_invariant(ty, Weights::Quantized, k, m, threads);
        }
        assert_batch_invariant(ty, Weights::Raw, 128, 21, 2);
    }
}
