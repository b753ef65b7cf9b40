//! The crate's q4_1 kernel (`kernels::ggml_sys_mul_mat_q4_1`, run as a ggml custom op), three
//! ways: with no columns given integer sums, against `ggml_mul_mat` on the same tensors, equal
//! bit for bit; with all of them, against its definition (`reference` below: per block an
//! exact integer sum, then one chain of fused multiply-adds over the blocks) bit for bit and
//! against `ggml_mul_mat` within rounding; and with only the leading ones, each column its own
//! way. For every column count (the narrow path takes columns four at a time; from 16 the wide
//! paths take them in groups, split between threads by group or, with few groups, by row; the
//! integer sums take a few columns one weight row per vector lane), odd row counts, one to four
//! threads, and strided columns. And the integer sums' batch invariance: each column of an
//! N-column product has the bits of the same column computed alone and inside a 100-column
//! product, whatever N, the thread count, or the group, lane or tile the column lands in.

use ggml_sys::*;
use std::ffi::c_int;

mod common;

use common::Rng;

/// Each `(k, m, n, threads)` against the definition and `ggml_mul_mat`, columns contiguous.
fn assert_shapes(shapes: &[(i64, i64, i64, c_int)]) {
    for &(k, m, n, threads) in shapes {
        check(k, m, n, k, threads, (k * m + n) as u64);
    }
}

/// The kernel on one product, three ways: ggml's bits with no integer sums; with all columns
/// allowed, the definition's bits where the path applies (and ggml's result within rounding),
/// else ggml's bits; with the leading columns allowed, each column as its own way says.
fn check(k: i64, m: i64, n: i64, stride: i64, threads: c_int, seed: u64) {
    let r = run(k, m, n, stride, threads, seed);
    let what = format!("k {k}, m {m}, n {n}, stride {stride}, {threads} threads");
    assert_same_bits(&r.ggml, &r.exact, &what);
    // SAFETY: a plain query.
    let isum = unsafe { kernels::ggml_sys_mul_mat_q4_1_isum() } == 1;
    if isum {
        assert_same_bits(&r.reference, &r.isum, &format!("{what}, integer sums"));
        assert_close(&r.ggml, &r.isum, &r.magnitude, &what);
    } else {
        assert_same_bits(&r.ggml, &r.isum, &format!("{what}, integer sums allowed"));
    }
    let split = split_at(n) as usize * m as usize;
    let want: &[f32] = if isum {
        &r.reference[..split]
    } else {
        &r.ggml[..split]
    };
    assert_same_bits(want, &r.split[..split], &format!("{what}, leading columns"));
    assert_same_bits(
        &r.ggml[split..],
        &r.split[split..],
        &format!("{what}, other columns"),
    );
}

/// How many leading columns of `n` the third way allows integer sums (none of one column).
fn split_at(n: i64) -> i64 {
    n / 2
}

/// The kernel's node for `w` (q4_1 `[k, m]`) times `x` (f32 `[k, n]`), integer sums allowed
/// for the first `isum` columns.
///
/// # Safety
/// `ctx` is live and `w`, `x` are its tensors of those types and shapes.
unsafe fn kernel_node(
    ctx: *mut ggml_context,
    w: *mut ggml_tensor,
    x: *mut ggml_tensor,
    isum: i64,
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
            Some(kernels::ggml_sys_mul_mat_q4_1),
            GGML_N_TASKS_MAX,
            // A count, never dereferenced.
            isum as usize as *mut std::ffi::c_void,
        )
    }
}

/// One product computed three ways, each `m * n` in ggml's order (row fastest).
struct Run {
    ggml: Vec<f32>,
    /// The kernel with a null `userdata`.
    exact: Vec<f32>,
    /// The kernel with integer sums allowed.
    isum: Vec<f32>,
    /// The kernel with integer sums allowed for the first `split_at(n)` columns.
    split: Vec<f32>,
    reference: Vec<f32>,
    /// Per output: the sum of the magnitudes of its terms, the scale of its rounding.
    magnitude: Vec<f32>,
}

/// `ggml_mul_mat(w, x)`, the kernel three ways and the definition on the same `w` (q4_1, `k` × `m`) and
/// `x` (f32, `k` × `n`, columns `stride` floats apart), computed with `threads` threads.
fn run(k: i64, m: i64, n: i64, stride: i64, threads: c_int, seed: u64) -> Run {
    let mut rng = Rng(seed);
    // SAFETY: the context owns every tensor; data copies stay within freshly allocated
    // tensors of the sizes written; results are f32 tensors of m * n contiguous floats.
    unsafe {
        let ctx = ggml_init(ggml_init_params {
            mem_size: 256 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        });
        assert!(!ctx.is_null());
        let w = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_1, k, m);
        let weights: Vec<f32> = (0..k * m).map(|_| rng.f32() * 0.5).collect();
        ggml_quantize_chunk(
            GGML_TYPE_Q4_1,
            weights.as_ptr(),
            (*w).data,
            0,
            m,
            k,
            std::ptr::null(),
        );
        let backing = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, stride, n);
        let data =
            std::slice::from_raw_parts_mut((*backing).data as *mut f32, (stride * n) as usize);
        for v in data.iter_mut() {
            *v = rng.f32() * 3.0;
        }
        let x = ggml_view_2d(ctx, backing, k, n, (*backing).nb[1], 0);
        let want = ggml_mul_mat(ctx, w, x);
        let exact = kernel_node(ctx, w, x, 0);
        let isum = kernel_node(ctx, w, x, n);
        let split = kernel_node(ctx, w, x, split_at(n));
        let ggml = common::compute_f32(ctx, want, threads);
        let exact = common::compute_f32(ctx, exact, threads);
        let isum = common::compute_f32(ctx, isum, threads);
        let split = common::compute_f32(ctx, split, threads);
        assert_eq!(ggml.len(), (m * n) as usize);
        let blocks = std::slice::from_raw_parts((*w).data as *const u8, (m * k / 32 * 20) as usize);
        let columns: Vec<&[f32]> = (0..n)
            .map(|c| &data[(c * stride) as usize..(c * stride + k) as usize])
            .collect();
        let (reference, magnitude) = reference(blocks, k as usize, m as usize, &columns);
        ggml_free(ctx);
        Run {
            ggml,
            exact,
            isum,
            split,
            reference,
            magnitude,
        }
    }
}

/// A q4_1 block: scale, minimum, and its 32 values 0..15 in element order.
fn q4_1_block(b: &[u8]) -> (f32, f32, [u8; 32]) {
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = b[4 + j] & 0x0F;
        q[j + 16] = b[4 + j] >> 4;
    }
    (f16(&b[0..2]), f16(&b[2..4]), q)
}

fn f16(b: &[u8]) -> f32 {
    // SAFETY: a plain conversion of two bytes.
    unsafe { ggml_fp16_to_fp32(u16::from_le_bytes([b[0], b[1]])) }
}

/// The kernel's definition, written out one output at a time: each column quantized by
/// ggml's q8_1 routine (scale d1, sum s1), then for row blocks (d0, m0, q4) and column blocks
/// (d1, s1, q8): `acc = fma(d0 * d1, dot, acc)` and `sm = fma(m0, s1, sm)` over the blocks in
/// order, `acc + sm`. Also each output's scale: the sum of its terms' magnitudes.
fn reference(blocks: &[u8], k: usize, m: usize, columns: &[&[f32]]) -> (Vec<f32>, Vec<f32>) {
    let nb = k / 32;
    // SAFETY: the q8_1 traits are static; `from_float` writes nb blocks of 36 bytes.
    let from_float =
        unsafe { (*ggml_get_type_traits_cpu(GGML_TYPE_Q8_1)).from_float }.expect("q8_1 quantizes");
    let quantized: Vec<Vec<u8>> = columns
        .iter()
        .map(|col| {
            let mut q = vec![0u8; nb * 36];
            // SAFETY: `col` holds k floats, `q` nb q8_1 blocks.
            unsafe { from_float(col.as_ptr(), q.as_mut_ptr().cast(), k as i64) };
            q
        })
        .collect();
    let mut out = vec![0f32; m * columns.len()];
    let mut magnitude = vec![0f32; m * columns.len()];
    for (c, q) in quantized.iter().enumerate() {
        for r in 0..m {
            let (mut acc, mut sm, mut mag) = (0f32, 0f32, 0f32);
            for i in 0..nb {
                let (d0, m0, x) = q4_1_block(&blocks[(r * nb + i) * 20..]);
                let y = &q[i * 36..(i + 1) * 36];
                let (d1, s1) = (f16(&y[0..2]), f16(&y[2..4]));
                let dot: i32 = (0..32).map(|e| x[e] as i32 * y[4 + e] as i8 as i32).sum();
                acc = (d0 * d1).mul_add(dot as f32, acc);
                sm = m0.mul_add(s1, sm);
                let abs: i32 = (0..32)
                    .map(|e| (x[e] as i32 * y[4 + e] as i8 as i32).abs())
                    .sum();
                mag += (d0 * d1).abs() * abs as f32 + (m0 * s1).abs();
            }
            out[c * m + r] = acc + sm;
            magnitude[c * m + r] = mag;
        }
    }
    (out, magnitude)
}

/// `got` within rounding of `want`: a few units of f32 precision of each output's terms.
fn assert_close(want: &[f32], got: &[f32], magnitude: &[f32], what: &str) {
    assert_eq!(want.len(), got.len(), "{what}");
    assert!(magnitude.iter().any(|&m| m > 0.0), "{what}: all zero");
    for (i, ((a, b), mag)) in want.iter().zip(got).zip(magnitude).enumerate() {
        assert!(
            (a - b).abs() <= mag * 1e-6 + 1e-30,
            "{what}: output {i}: ggml {a}, kernel {b} (terms' magnitude {mag})"
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
        .find(|(a, b)| a.to_bits() != b.to_bits());
    assert_eq!(
        differing, 0,
        "{what}: {differing} elements differ, first {first:?}"
    );
}

#[test]
fn every_column_count_gives_its_paths_bits() {
    for n in (1..=37).chain(60..=70).chain([95, 96, 97, 130]) {
        check(96, 7, n, 96, 2, n as u64);
    }
    check(64, 5, 70, 64, 1, 70);
}

#[test]
fn model_shapes_threads_and_strided_columns() {
    assert_shapes(&[
        (576, 1536, 4, 2),
        (1536, 576, 8, 3),
        (576, 192, 1, 2),
        (576, 577, 33, 2),
        (32, 1, 5, 4),
    ]);
    // Columns 160 floats apart, of which the product reads the first 128.
    check(128, 9, 6, 160, 2, 9);
}

#[test]
fn the_wide_paths_give_their_bits_by_group_and_by_row() {
    // Prefill shapes: more groups than threads (split by group, a last group partly filled)
    // and few groups (split by row), with K of one and of several tiles of groups.
    assert_shapes(&[
        (576, 192, 64, 2),
        (576, 1536, 130, 2),
        (1536, 576, 77, 3),
        (576, 64, 512, 4),
        (96, 33, 16, 4),
        (64, 9, 23, 1),
        (2048, 5, 200, 2),
        (576, 1536, 512, 2),
        (1536, 576, 512, 2),
        (576, 64, 64, 4),
    ]);
    check(128, 9, 41, 160, 2, 41);
    check(128, 9, 100, 160, 2, 100);
    // Every row count of the integer-sum path's row sets (8 or 4 rows), one thread and two.
    for m in 1..=17 {
        check(64, m, 64, 64, 1 + (m % 2) as c_int, m as u64);
    }
}

#[test]
fn the_kernel_computes_the_product() {
    // Not only the definition's bits: the product of known values, each weight exactly representable.
    let (k, m, n) = (64i64, 3i64, 2i64);
    // SAFETY: as in `both`.
    unsafe {
        let ctx = ggml_init(ggml_init_params {
            mem_size: 16 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        });
        let w = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_1, k, m);
        // Row r holds r + (i % 16) / 4: a q4_1 block stores it exactly (step 0.25, min r).
        let weights: Vec<f32> = (0..m)
            .flat_map(|r| (0..k).map(move |i| r as f32 + (i % 16) as f32 / 4.0))
            .collect();
        ggml_quantize_chunk(
            GGML_TYPE_Q4_1,
            weights.as_ptr(),
            (*w).data,
            0,
            m,
            k,
            std::ptr::null(),
        );
        let x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
        // Column c is all 1 (c = 0) or all 2 (c = 1): q8_1 holds both exactly.
        let xs = std::slice::from_raw_parts_mut((*x).data as *mut f32, (k * n) as usize);
        for (i, v) in xs.iter_mut().enumerate() {
            *v = if (i as i64) < k { 1.0 } else { 2.0 };
        }
        let out = common::compute_f32(ctx, kernel_node(ctx, w, x, 0), 2);
        assert_eq!(out.len(), (m * n) as usize);
        for c in 0..n {
            for r in 0..m {
                let row_sum: f32 = weights[(r * k) as usize..((r + 1) * k) as usize]
                    .iter()
                    .sum();
                let want = row_sum * (c + 1) as f32;
                let v = out[(c * m + r) as usize];
                assert!(
                    (v - want).abs() <= want.abs() * 1e-3 + 1e-3,
                    "row {r} column {c}: {v} against {want}"
                );
            }
        }
        ggml_free(ctx);
    }
}

/// The column counts of the batch-invariance checks: every count around the few-column path's
/// chunks (4) and row tiles (8), and across the wide path's groups (8, 16).
const COUNTS: [i64; 21] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 31, 33, 64, 100,
];

/// Every column of the integer-sum product of `w` (q4_1 `[k, m]`) and the first N of 100
/// columns, for each N of [`COUNTS`], against the same column computed alone and inside the
/// 100-column product: the same bits. The products of one call share a graph, so each runs
/// with `threads` threads.
fn assert_batch_invariant(k: i64, m: i64, threads: c_int, seed: u64) {
    let mut rng = Rng(seed);
    let n_max = 100i64;
    // SAFETY: as in `run`; views stay within the 100-column tensor.
    unsafe {
        let ctx = ggml_init(ggml_init_params {
            mem_size: 64 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        });
        assert!(!ctx.is_null());
        let w = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_1, k, m);
        let weights: Vec<f32> = (0..k * m).map(|_| rng.f32() * 0.5).collect();
        ggml_quantize_chunk(
            GGML_TYPE_Q4_1,
            weights.as_ptr(),
            (*w).data,
            0,
            m,
            k,
            std::ptr::null(),
        );
        let x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n_max);
        let xs = std::slice::from_raw_parts_mut((*x).data as *mut f32, (k * n_max) as usize);
        for v in xs.iter_mut() {
            *v = rng.f32() * 3.0;
        }
        let col = (*x).nb[1];
        let graph = ggml_new_graph(ctx);
        let node = |n: i64, first: i64| {
            let view = ggml_view_2d(ctx, x, k, n, col, first as usize * col);
            let t = kernel_node(ctx, w, view, n);
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
        let (_, full) = counts[counts.len() - 1];
        let full = read(full);
        for &(n, t) in &counts {
            let got = read(t);
            let what = format!("k {k}, m {m}, {threads} threads, {n} columns");
            assert_same_bits(
                &full[..(n * m) as usize],
                &got,
                &format!("{what}, against 100"),
            );
            for c in 0..n {
                let one = read(alone[c as usize]);
                let c = c as usize;
                let m = m as usize;
                assert_same_bits(
                    &one,
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
    // SAFETY: a plain query.
    if unsafe { kernels::ggml_sys_mul_mat_q4_1_isum() } == 0 {
        return;
    }
    // Row counts in and past whole tiles; blocks of one and several per row.
    for (k, m, threads) in [
        (96, 19, 2),
        (576, 40, 3),
        (32, 8, 1),
        (64, 1, 4),
        (1536, 13, 2),
    ] {
        assert_batch_invariant(k, m, threads, (k * m) as u64);
    }
}
