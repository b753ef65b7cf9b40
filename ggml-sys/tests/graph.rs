//! ggml's CPU kernels against naive Rust references, on small graphs with random data.

use ggml_sys::*;
use std::ffi::c_int;

mod common;

use common::Rng;

/// A ggml context that owns its tensors' memory; freed on drop.
struct Ctx(*mut ggml_context);
impl Ctx {
    fn new() -> Ctx {
        let params = ggml_init_params {
            mem_size: 64 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        };
        // SAFETY: plain FFI call with valid parameters; ggml allocates the arena itself.
        let ctx = unsafe { ggml_init(params) };
        assert!(!ctx.is_null());
        Ctx(ctx)
    }
    /// A 1-4D f32 tensor (ggml order: ne[0] is the contiguous dimension) filled with `data`.
    fn f32(&self, ne: &[i64], data: &[f32]) -> *mut ggml_tensor {
        assert_eq!(ne.iter().product::<i64>() as usize, data.len());
        // SAFETY: the context is live; shapes are positive; the copy stays within the tensor's
        // freshly allocated, contiguous data of exactly data.len() floats.
        unsafe {
            let t = ggml_new_tensor(self.0, GGML_TYPE_F32, ne.len() as c_int, ne.as_ptr());
            std::ptr::copy_nonoverlapping(data.as_ptr(), (*t).data as *mut f32, data.len());
            t
        }
    }
    fn i32(&self, data: &[i32]) -> *mut ggml_tensor {
        // SAFETY: as in `f32`.
        unsafe {
            let t = ggml_new_tensor_1d(self.0, GGML_TYPE_I32, data.len() as i64);
            std::ptr::copy_nonoverlapping(data.as_ptr(), (*t).data as *mut i32, data.len());
            t
        }
    }
    /// Computes `out` with two threads and returns its elements in ggml order.
    fn compute(&self, out: *mut ggml_tensor) -> Vec<f32> {
        // SAFETY: `out` belongs to this context; after computing, an f32 result tensor holds
        // ggml_nelements contiguous floats.
        unsafe {
            let graph = ggml_new_graph(self.0);
            ggml_build_forward_expand(graph, out);
            assert_eq!(
                ggml_graph_compute_with_ctx(self.0, graph, 2),
                GGML_STATUS_SUCCESS
            );
            assert_eq!((*out).type_, GGML_TYPE_F32);
            assert!(ggml_is_contiguous(out));
            let n = ggml_nelements(out) as usize;
            std::slice::from_raw_parts((*out).data as *const f32, n).to_vec()
        }
    }
}
impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: created by ggml_init and freed once.
        unsafe { ggml_free(self.0) }
    }
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: ggml {g}, reference {w}"
        );
    }
}

#[test]
fn mul_mat_matches_naive_product() {
    let (k, m, n) = (67usize, 13usize, 9usize);
    let mut rng = Rng(1);
    let a = rng.vec(k * m); // m rows of k
    let b = rng.vec(k * n); // n rows of k
    let ctx = Ctx::new();
    let ta = ctx.f32(&[k as i64, m as i64], &a);
    let tb = ctx.f32(&[k as i64, n as i64], &b);
    // SAFETY: tensors from this context with matching ne[0].
    let got = ctx.compute(unsafe { ggml_mul_mat(ctx.0, ta, tb) });
    // Result ne = [m, n]: element (i, j) at j * m + i is row i of a dotted with row j of b.
    let mut want = vec![0f32; m * n];
    for j in 0..n {
        for i in 0..m {
            want[j * m + i] = (0..k).map(|x| a[i * k + x] * b[j * k + x]).sum();
        }
    }
    assert_close(&got, &want, 1e-4, "mul_mat");
}

#[test]
fn add_and_mul_broadcast_rows() {
    let (cols, rows) = (31usize, 5usize);
    let mut rng = Rng(2);
    let x = rng.vec(cols * rows);
    let row = rng.vec(cols);
    let ctx = Ctx::new();
    let tx = ctx.f32(&[cols as i64, rows as i64], &x);
    let tr = ctx.f32(&[cols as i64], &row);
    // SAFETY: row broadcasts over rows, as ggml_can_repeat allows.
    let sum = ctx.compute(unsafe { ggml_add(ctx.0, tx, tr) });
    let prod = ctx.compute(unsafe { ggml_mul(ctx.0, tx, tr) });
    let want_sum: Vec<f32> = x
        .iter()
        .enumerate()
        .map(|(i, v)| v + row[i % cols])
        .collect();
    let want_prod: Vec<f32> = x
        .iter()
        .enumerate()
        .map(|(i, v)| v * row[i % cols])
        .collect();
    assert_close(&sum, &want_sum, 1e-6, "add");
    assert_close(&prod, &want_prod, 1e-6, "mul");
}

#[test]
fn rms_norm_matches_definition() {
    let (cols, rows, eps) = (64usize, 3usize, 1e-5f32);
    let mut rng = Rng(3);
    let x = rng.vec(cols * rows);
    let ctx = Ctx::new();
    let tx = ctx.f32(&[cols as i64, rows as i64], &x);
    // SAFETY: f32 input from this context.
    let got = ctx.compute(unsafe { ggml_rms_norm(ctx.0, tx, eps) });
    let mut want = Vec::new();
    for r in x.chunks(cols) {
        let ms = r.iter().map(|v| v * v).sum::<f32>() / cols as f32;
        let scale = 1.0 / (ms + eps).sqrt();
        want.extend(r.iter().map(|v| v * scale));
    }
    assert_close(&got, &want, 1e-5, "rms_norm");
}

#[test]
fn soft_max_with_scale_and_causal_mask() {
    let (cols, rows, scale) = (12usize, 4usize, 0.7f32);
    let mut rng = Rng(4);
    let x: Vec<f32> = rng.vec(cols * rows).iter().map(|v| v * 5.0).collect();
    // Row r may see columns 0..=r + 8 (like a cache of 8 earlier tokens).
    let mask: Vec<f32> = (0..rows * cols)
        .map(|i| {
            if i % cols <= i / cols + 8 {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    let ctx = Ctx::new();
    let tx = ctx.f32(&[cols as i64, rows as i64], &x);
    let tm = ctx.f32(&[cols as i64, rows as i64], &mask);
    // SAFETY: mask has the input's shape; no ALiBi.
    let got = ctx.compute(unsafe { ggml_soft_max_ext(ctx.0, tx, tm, scale, 0.0) });
    let mut want = Vec::new();
    for r in 0..rows {
        let z: Vec<f32> = (0..cols)
            .map(|c| x[r * cols + c] * scale + mask[r * cols + c])
            .collect();
        let max = z.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = z.iter().map(|v| (v - max).exp()).collect();
        let s: f32 = e.iter().sum();
        want.extend(e.iter().map(|v| v / s));
    }
    assert_close(&got, &want, 1e-5, "soft_max");
}

/// Rotary embedding of `x` ([head_dim, n_head, n_tok]) at `positions`, normal or NeoX pairing.
fn rope_reference(
    x: &[f32],
    head_dim: usize,
    n_head: usize,
    positions: &[i32],
    base: f32,
    neox: bool,
) -> Vec<f32> {
    let mut out = x.to_vec();
    for (t, &p) in positions.iter().enumerate() {
        for h in 0..n_head {
            let off = (t * n_head + h) * head_dim;
            for i in 0..head_dim / 2 {
                let theta = p as f32 * base.powf(-2.0 * i as f32 / head_dim as f32);
                let (a, b) = if neox {
                    (off + i, off + i + head_dim / 2)
                } else {
                    (off + 2 * i, off + 2 * i + 1)
                };
                let (x0, x1) = (x[a], x[b]);
                out[a] = x0 * theta.cos() - x1 * theta.sin();
                out[b] = x0 * theta.sin() + x1 * theta.cos();
            }
        }
    }
    out
}

#[test]
fn rope_normal_and_neox_match_rotation() {
    let (head_dim, n_head, base) = (16usize, 3usize, 10000.0f32);
    let positions = [0i32, 1, 5, 17, 300];
    let mut rng = Rng(5);
    let x = rng.vec(head_dim * n_head * positions.len());
    for (mode, neox) in [(0, false), (GGML_ROPE_TYPE_NEOX as c_int, true)] {
        let ctx = Ctx::new();
        let tx = ctx.f32(
            &[head_dim as i64, n_head as i64, positions.len() as i64],
            &x,
        );
        let tp = ctx.i32(&positions);
        // SAFETY: positions has one entry per token (ne[2]); no frequency factors.
        let got = ctx.compute(unsafe {
            ggml_rope_ext(
                ctx.0,
                tx,
                tp,
                std::ptr::null_mut(),
                head_dim as c_int,
                mode,
                0,
                base,
                1.0,
                0.0,
                1.0,
                0.0,
                0.0,
            )
        });
        let want = rope_reference(&x, head_dim, n_head, &positions, base, neox);
        assert_close(
            &got,
            &want,
            2e-4,
            if neox { "rope neox" } else { "rope normal" },
        );
    }
}

#[test]
fn get_rows_gathers_rows() {
    let (cols, rows) = (7usize, 6usize);
    let mut rng = Rng(6);
    let table = rng.vec(cols * rows);
    let ids = [4i32, 0, 4, 5, 2];
    let ctx = Ctx::new();
    let tt = ctx.f32(&[cols as i64, rows as i64], &table);
    let ti = ctx.i32(&ids);
    // SAFETY: every id is a valid row.
    let got = ctx.compute(unsafe { ggml_get_rows(ctx.0, tt, ti) });
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&i| table[i as usize * cols..(i as usize + 1) * cols].to_vec())
        .collect();
    assert_close(&got, &want, 0.0, "get_rows");
}
