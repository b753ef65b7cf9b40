//! The row-wise kernels (`kernels::ggml_sys_rms_norm_mul` and `ggml_sys_geglu`, run as ggml
//! custom ops) against references written here from their definitions (`csrc/rows.c`) and
//! against ggml's own ops on the same tensors: the norm within f64 rounding of the exact one
//! and within float rounding of ggml's; GELU-gating bit for bit what ggml's CPU backend gives.
//! Row lengths around the vector widths (tails included), strided (view) rows, one to three
//! threads, values spanning the GELU table's edges (-10 and 10). And each row the same bits
//! alone as among others.

use ggml_sys::*;
use std::ffi::c_int;

mod common;

use common::Rng;

/// A context for one case.
fn context() -> *mut ggml_context {
    // SAFETY: a plain allocation of ggml's; freed by the caller.
    let ctx = unsafe {
        ggml_init(ggml_init_params {
            mem_size: 64 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        })
    };
    assert!(!ctx.is_null());
    ctx
}

/// A new f32 tensor `[ne0, ne1, ne2]` of `ctx` holding `values`.
///
/// # Safety
/// `ctx` is live with room for it; `values` has `ne0 * ne1 * ne2` elements.
unsafe fn tensor(ctx: *mut ggml_context, ne: [i64; 3], values: &[f32]) -> *mut ggml_tensor {
    // SAFETY: as the function's contract says; the tensor is contiguous f32 of that count.
    unsafe {
        let t = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, ne[0], ne[1], ne[2]);
        assert_eq!(ggml_nelements(t) as usize, values.len());
        std::slice::from_raw_parts_mut((*t).data as *mut f32, values.len()).copy_from_slice(values);
        t
    }
}

/// Our op over `srcs`, shaped as `srcs[0]`.
///
/// # Safety
/// The sources are live tensors of `ctx` that the kernel reads within their shapes.
unsafe fn ours(
    ctx: *mut ggml_context,
    srcs: &mut [*mut ggml_tensor],
    kernel: ggml_custom_op_t,
    userdata: usize,
) -> *mut ggml_tensor {
    // SAFETY: as the function's contract says.
    unsafe {
        let x = srcs[0];
        ggml_custom_4d(
            ctx,
            GGML_TYPE_F32,
            (*x).ne[0],
            (*x).ne[1],
            (*x).ne[2],
            1,
            srcs.as_mut_ptr(),
            srcs.len() as c_int,
            kernel,
            GGML_N_TASKS_MAX,
            userdata as *mut std::ffi::c_void,
        )
    }
}

/// The definition's sum of squares: sixteen f64 partial sums, combined in their fixed order.
fn sum_squares(x: &[f32]) -> f64 {
    let mut p = [0f64; 16];
    for (i, v) in x.iter().enumerate() {
        p[i % 16] += (v * v) as f64;
    }
    let q: Vec<f64> = (0..4)
        .map(|l| (p[l] + p[l + 8]) + (p[l + 4] + p[l + 12]))
        .collect();
    (q[0] + q[2]) + (q[1] + q[3])
}

/// Runs the norm over `rows` rows of `n` (as a view with `pad` more floats per row when
/// `pad` > 0) with `threads` threads: (ours, ggml's).
fn norm_case(
    n: i64,
    rows: i64,
    pad: i64,
    threads: c_int,
    rng: &mut Rng,
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let eps = 1e-6f32;
    let stride = n + pad;
    let x: Vec<f32> = (0..stride * rows)
        .map(|i| rng.f32() * (1.0 + (i % 7) as f32))
        .collect();
    let w: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
    let ctx = context();
    // SAFETY: tensors of `ctx` of the sizes written; views within their parents.
    let (got, want) = unsafe {
        let xt = tensor(ctx, [stride, rows, 1], &x);
        let xv = ggml_view_2d(ctx, xt, n, rows, (*xt).nb[1], 0);
        let wt = tensor(ctx, [n, 1, 1], &w);
        let got = ours(
            ctx,
            &mut [xv, wt],
            Some(kernels::ggml_sys_rms_norm_mul),
            eps.to_bits() as usize,
        );
        let want = ggml_mul(ctx, ggml_rms_norm(ctx, xv, eps), wt);
        (
            common::compute_f32(ctx, got, threads),
            common::compute_f32(ctx, want, threads),
        )
    };
    // SAFETY: created above, freed once.
    unsafe { ggml_free(ctx) };
    let rows_x: Vec<f32> = (0..rows)
        .flat_map(|r| x[(r * stride) as usize..(r * stride + n) as usize].to_vec())
        .collect();
    (got, want, rows_x, w)
}

#[test]
fn the_norm_is_its_definition_and_ggml_up_to_rounding() {
    let mut rng = Rng(7);
    for n in [1i64, 15, 16, 17, 64, 100, 256, 640, 1000] {
        for (pad, threads) in [(0i64, 1 as c_int), (3, 2), (0, 3)] {
            let rows = 5;
            let (got, want, x, w) = norm_case(n, rows, pad, threads, &mut rng);
            for r in 0..rows as usize {
                let xr = &x[r * n as usize..(r + 1) * n as usize];
                // The definition evaluated here, in its order: the same bits.
                let mean = (sum_squares(xr) / n as f64) as f32;
                let s = 1.0f32 / (mean + 1e-6f32).sqrt();
                for i in 0..n as usize {
                    let def = (xr[i] * s) * w[i];
                    let k = r * n as usize + i;
                    assert_eq!(
                        got[k].to_bits(),
                        def.to_bits(),
                        "n {n}, row {r}, element {i}"
                    );
                    // ggml: one f64 chain, so the scale may differ in its last bit.
                    let tol = 4.0 * f32::EPSILON * def.abs() + f32::MIN_POSITIVE;
                    assert!(
                        (got[k] - want[k]).abs() <= tol,
                        "n {n}: {} vs ggml {}",
                        got[k],
                        want[k]
                    );
                }
            }
        }
    }
}

#[test]
fn a_norm_row_has_the_same_bits_alone_or_among_others() {
    let n = 640;
    let mut rng = Rng(11);
    let (all, _, x, w) = norm_case(n, 9, 0, 2, &mut rng);
    for r in [0usize, 4, 8] {
        let xr = &x[r * n as usize..(r + 1) * n as usize];
        let ctx = context();
        // SAFETY: tensors of `ctx` of the sizes written.
        let alone = unsafe {
            let xt = tensor(ctx, [n, 1, 1], xr);
            let wt = tensor(ctx, [n, 1, 1], &w);
            let t = ours(
                ctx,
                &mut [xt, wt],
                Some(kernels::ggml_sys_rms_norm_mul),
                1e-6f32.to_bits() as usize,
            );
            common::compute_f32(ctx, t, 1)
        };
        // SAFETY: created above, freed once.
        unsafe { ggml_free(ctx) };
        let differing = alone
            .iter()
            .zip(&all[r * n as usize..])
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differing, 0, "row {r}");
    }
}

#[test]
fn gelu_gating_is_ggmls_bit_for_bit() {
    let mut rng = Rng(3);
    for n in [1i64, 7, 8, 9, 33, 640, 2048] {
        for (rows, threads) in [(1i64, 1 as c_int), (6, 2), (4, 3)] {
            // Values across the table's range and past its edges, exact edges included.
            let mut a: Vec<f32> = (0..n * rows).map(|_| rng.f32() * 14.0).collect();
            for (i, v) in [-10.0f32, 10.0, -9.999, 9.999, 0.0, -0.0]
                .iter()
                .enumerate()
            {
                if i < a.len() {
                    a[i] = *v;
                }
            }
            let b: Vec<f32> = (0..n * rows).map(|_| rng.f32() * 2.0).collect();
            let ctx = context();
            // SAFETY: tensors of `ctx` of the sizes written.
            let (got, want) = unsafe {
                let at = tensor(ctx, [n, rows, 1], &a);
                let bt = tensor(ctx, [n, rows, 1], &b);
                let got = ours(ctx, &mut [at, bt], Some(kernels::ggml_sys_geglu), 0);
                let want = ggml_geglu_split(ctx, at, bt);
                (
                    common::compute_f32(ctx, got, threads),
                    common::compute_f32(ctx, want, threads),
                )
            };
            // SAFETY: created above, freed once.
            unsafe { ggml_free(ctx) };
            for i in 0..got.len() {
                assert_eq!(
                    got[i].to_bits(),
                    want[i].to_bits(),
                    "n {n}, element {i}: gelu({}) * {}: ours {} ggml {}",
                    a[i],
                    b[i],
                    got[i],
                    want[i]
                );
            }
            // Beyond the edges, the definition's own values: 0 (not -0) and a * b.
            for i in 0..got.len() {
                if a[i] <= -10.0 {
                    assert_eq!(got[i].to_bits(), 0, "element {i}");
                } else if a[i] >= 10.0 {
                    assert_eq!(got[i].to_bits(), (a[i] * b[i]).to_bits(), "element {i}");
                }
            }
        }
    }
}
