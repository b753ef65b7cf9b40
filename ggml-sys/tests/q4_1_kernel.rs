//! The crate's q4_1 kernel (`kernels::ggml_sys_mul_mat_q4_1`, run as a ggml custom op) against
//! `ggml_mul_mat` on the same tensors: equal bit for bit, for every column count (the narrow
//! path takes columns four at a time and in tiles of sixteen; from 16 columns the wide path
//! takes them in groups of eight, split between threads by group or, with few groups, by row),
//! odd row counts, one to four threads, and strided columns.

use ggml_sys::*;
use std::ffi::c_int;

mod common;

use common::Rng;

/// Each `(k, m, n, threads)` against `ggml_mul_mat`, columns contiguous.
fn assert_shapes(shapes: &[(i64, i64, i64, c_int)]) {
    for &(k, m, n, threads) in shapes {
        let (want, got) = both(k, m, n, k, threads, (k * m + n) as u64);
        assert_same_bits(
            &want,
            &got,
            &format!("k {k}, m {m}, n {n}, {threads} threads"),
        );
    }
}

/// The kernel's node for `w` (q4_1 `[k, m]`) times `x` (f32 `[k, n]`).
///
/// # Safety
/// `ctx` is live and `w`, `x` are its tensors of those types and shapes.
unsafe fn kernel_node(
    ctx: *mut ggml_context,
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
            Some(kernels::ggml_sys_mul_mat_q4_1),
            GGML_N_TASKS_MAX,
            std::ptr::null_mut(),
        )
    }
}

/// `ggml_mul_mat(w, x)` and the kernel on the same `w` (q4_1, `k` × `m`) and `x` (f32, `k` ×
/// `n`, columns `stride` floats apart), computed with `threads` threads.
fn both(k: i64, m: i64, n: i64, stride: i64, threads: c_int, seed: u64) -> (Vec<f32>, Vec<f32>) {
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
        let got = kernel_node(ctx, w, x);
        let want = common::compute_f32(ctx, want, threads);
        let got = common::compute_f32(ctx, got, threads);
        assert_eq!(want.len(), (m * n) as usize);
        ggml_free(ctx);
        (want, got)
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
fn every_column_count_gives_ggml_mul_mat_bits() {
    for n in 1..=37 {
        let (want, got) = both(96, 7, n, 96, 2, n as u64);
        assert_same_bits(&want, &got, &format!("k 96, m 7, n {n}"));
    }
    let (want, got) = both(64, 5, 70, 64, 1, 70);
    assert_same_bits(&want, &got, "n 70, one thread");
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
    let (want, got) = both(128, 9, 6, 160, 2, 9);
    assert_same_bits(&want, &got, "strided columns");
}

#[test]
fn the_wide_path_gives_ggml_mul_mat_bits_by_group_and_by_row() {
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
    ]);
    let (want, got) = both(128, 9, 41, 160, 2, 41);
    assert_same_bits(&want, &got, "strided columns, wide");
}

#[test]
fn the_kernel_computes_the_product() {
    // Not only ggml's bits: the product of known values, each weight exactly representable.
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
        let out = common::compute_f32(ctx, kernel_node(ctx, w, x), 2);
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
