//! The crate's attention kernel (`kernels::ggml_sys_flash_attn_f16`, run as a ggml custom op)
//! against attention computed in f64 on the same tensors, and against ggml's
//! `ggml_flash_attn_ext` where ggml computes in f32 too (64 queries or more; below, ggml rounds
//! queries to f16): equal within float rounding for grouped-query and plain heads, causal and
//! sliding-window masks, windows that end inside a tile, one to three threads; and a row's
//! result the same bits whatever else the batch holds. A q8_0 cache is checked against the f64
//! attention over its values (d * q of each block, decoded here by hand).

use ggml_sys::*;
use std::ffi::c_int;

mod common;

use common::Rng;

/// One attention problem: `m` queries (the last `m` positions of `n_kv`) of `heads` heads over
/// `kv_heads` heads of size `d`.
#[derive(Clone, Copy, Debug)]
struct Shape {
    d: i64,
    m: i64,
    n_kv: i64,
    heads: i64,
    kv_heads: i64,
    /// Sliding window: a query at position p sees cells in (p - window, p]; 0: no window.
    window: i64,
}

/// The mask of `s`: query `i` sits at position `n_kv - m + i`.
fn mask(s: Shape) -> Vec<u16> {
    let mut out = Vec::new();
    for i in 0..s.m {
        let p = s.n_kv - s.m + i;
        for c in 0..s.n_kv {
            let open = c <= p && (s.window == 0 || c > p - s.window);
            out.push(if open { 0 } else { 0xFC00 });
        }
    }
    out
}

/// Attention in f64: `q` `[d, heads, m]`, `k` and `v` `[d * kv_heads, n_kv]` (as f32), `mask`
/// `[n_kv, m]` (f16 bits); result `[d, heads, m]`.
fn reference(
    s: Shape,
    m: i64,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &[u16],
    scale: f32,
) -> Vec<f32> {
    let (d, gqa) = (s.d as usize, (s.heads / s.kv_heads) as usize);
    let (n_kv, heads) = (s.n_kv as usize, s.heads as usize);
    let row = d * s.kv_heads as usize;
    let mut out = vec![0.0f32; d * heads * m as usize];
    for t in 0..m as usize {
        for h in 0..heads {
            let g = h / gqa;
            let qr = &q[(t * heads + h) * d..][..d];
            let scores: Vec<f64> = (0..n_kv)
                .map(|c| {
                    if mask[t * n_kv + c] == 0xFC00 {
                        return f64::NEG_INFINITY;
                    }
                    let kr = &k[c * row + g * d..][..d];
                    let dot: f64 = qr.iter().zip(kr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    dot * scale as f64
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = w.iter().sum();
            for i in 0..d {
                let acc: f64 = (0..n_kv)
                    .map(|c| w[c] * v[c * row + g * d + i] as f64)
                    .sum();
                out[(t * heads + h) * d + i] = (acc / total) as f32;
            }
        }
    }
    out
}

/// ggml's `ggml_flash_attn_ext`, the kernel and [`reference`] on the same random tensors
/// (`rows` of the queries kept: the kernel then sees a batch of only those), with `threads`
/// threads; results `[d, heads, rows]`.
fn both(
    s: Shape,
    rows: std::ops::Range<i64>,
    threads: c_int,
    seed: u64,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (ggml, got, exact, _) = all_ways(s, rows, threads, seed, GGML_TYPE_F16);
    (ggml, got, exact)
}

/// The values of K or V, `t` a view of an f16 or q8_0 tensor (a q8_0 block: an f16 scale `d`,
/// then 32 int8 `q`; each value is `d * q`).
///
/// # Safety
/// `t` is a live view of a contiguous tensor of either type with `ne[0..3]` elements.
unsafe fn values(t: *mut ggml_tensor) -> Vec<f32> {
    // SAFETY: as the function's contract says.
    unsafe {
        let n = ((*t).ne[0] * (*t).ne[1] * (*t).ne[2]) as usize;
        let src = (*t).view_src;
        if (*src).type_ == GGML_TYPE_F16 {
            let h = std::slice::from_raw_parts((*src).data as *const u16, n);
            return h.iter().map(|&h| ggml_fp16_to_fp32(h)).collect();
        }
        assert_eq!((*src).type_, GGML_TYPE_Q8_0);
        let bytes = std::slice::from_raw_parts((*src).data as *const u8, n / 32 * 34);
        bytes
            .chunks_exact(34)
            .flat_map(|b| {
                let d = ggml_fp16_to_fp32(u16::from_le_bytes([b[0], b[1]]));
                b[2..].iter().map(move |&q| q as i8 as f32 * d)
            })
            .collect()
    }
}

/// As [`both`], and the window split into its tiles of 64 keys (`ggml_sys_flash_attn_f16_part`,
/// then `_merge`); empty when the rows are too many for it.
fn all_ways(
    s: Shape,
    rows: std::ops::Range<i64>,
    threads: c_int,
    seed: u64,
    kv_type: ggml_type,
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut rng = Rng(seed);
    let scale = 1.0 / (s.d as f32).sqrt();
    // SAFETY: the context owns every tensor; data writes stay within freshly allocated tensors
    // of the sizes written; results are contiguous f32 tensors of d * heads * rows floats.
    unsafe {
        let ctx = ggml_init(ggml_init_params {
            mem_size: 512 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        });
        assert!(!ctx.is_null());
        // q as the engine gives it: [d, heads, m] permuted to [d, m, heads].
        let q_full = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, s.d, s.heads, s.m);
        let qd = std::slice::from_raw_parts_mut(
            (*q_full).data as *mut f32,
            (s.d * s.heads * s.m) as usize,
        );
        for x in qd.iter_mut() {
            *x = rng.f32() * 2.0;
        }
        let n = rows.end - rows.start;
        let q_rows = ggml_view_3d(
            ctx,
            q_full,
            s.d,
            s.heads,
            n,
            (*q_full).nb[1],
            (*q_full).nb[2],
            rows.start as usize * (*q_full).nb[2],
        );
        let q = ggml_permute(ctx, q_rows, 0, 2, 1, 3);
        // K and V as the pool holds them: a cell's row is every head's, heads side by side.
        let mut kv = Vec::new();
        for _ in 0..2 {
            let t = ggml_new_tensor_2d(ctx, kv_type, s.d * s.kv_heads, s.n_kv);
            let count = (s.d * s.kv_heads * s.n_kv) as usize;
            let drawn: Vec<f32> = (0..count).map(|_| rng.f32() * 1.5).collect();
            if kv_type == GGML_TYPE_F16 {
                let data = std::slice::from_raw_parts_mut((*t).data as *mut u16, count);
                for (x, v) in data.iter_mut().zip(&drawn) {
                    *x = ggml_fp32_to_fp16(*v);
                }
            } else {
                ggml_quantize_chunk(
                    kv_type,
                    drawn.as_ptr(),
                    (*t).data,
                    0,
                    s.n_kv,
                    s.d * s.kv_heads,
                    std::ptr::null(),
                );
            }
            let row = (*t).nb[1];
            kv.push(ggml_view_3d(
                ctx,
                t,
                s.d,
                s.n_kv,
                s.kv_heads,
                row,
                row / s.kv_heads as usize,
                0,
            ));
        }
        let full_mask = mask(s);
        let mk = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, s.n_kv, n);
        let md = std::slice::from_raw_parts_mut((*mk).data as *mut u16, (s.n_kv * n) as usize);
        md.copy_from_slice(
            &full_mask[(rows.start * s.n_kv) as usize..(rows.end * s.n_kv) as usize],
        );

        let want = ggml_flash_attn_ext(ctx, q, kv[0], kv[1], mk, scale, 0.0, 0.0);
        ggml_flash_attn_ext_set_prec(want, GGML_PREC_F32);
        let q_rows_data =
            &qd[(rows.start * s.d * s.heads) as usize..(rows.end * s.d * s.heads) as usize];
        let exact = reference(s, n, q_rows_data, &values(kv[0]), &values(kv[1]), md, scale);
        let mut args = [q, kv[0], kv[1], mk];
        let got = ggml_custom_4d(
            ctx,
            GGML_TYPE_F32,
            s.d,
            s.heads,
            n,
            1,
            args.as_mut_ptr(),
            4,
            Some(kernels::ggml_sys_flash_attn_f16),
            GGML_N_TASKS_MAX,
            scale.to_bits() as usize as *mut std::ffi::c_void,
        );
        for t in [want, got] {
            assert_eq!([(*t).ne[0], (*t).ne[1], (*t).ne[2]], [s.d, s.heads, n]);
        }
        let gqa = s.heads / s.kv_heads;
        let split = if n * gqa <= 128 {
            let chunks: i64 = (s.n_kv + 63) / 64;
            let part = ggml_custom_4d(
                ctx,
                GGML_TYPE_F32,
                s.d + 2,
                n * gqa,
                s.kv_heads * chunks,
                1,
                args.as_mut_ptr(),
                4,
                Some(kernels::ggml_sys_flash_attn_f16_part),
                GGML_N_TASKS_MAX,
                scale.to_bits() as usize as *mut std::ffi::c_void,
            );
            let mut parts = [part];
            let merged = ggml_custom_4d(
                ctx,
                GGML_TYPE_F32,
                s.d,
                s.heads,
                n,
                1,
                parts.as_mut_ptr(),
                1,
                Some(kernels::ggml_sys_flash_attn_f16_merge),
                GGML_N_TASKS_MAX,
                chunks as usize as *mut std::ffi::c_void,
            );
            common::compute_f32(ctx, merged, threads)
        } else {
            Vec::new()
        };
        let want = common::compute_f32(ctx, want, threads);
        let got = common::compute_f32(ctx, got, threads);
        ggml_free(ctx);
        (want, got, exact, split)
    }
}

fn assert_close(want: &[f32], got: &[f32], what: &str) {
    assert_eq!(want.len(), got.len(), "{what}");
    let mut worst = (0.0f32, 0);
    for (i, (a, b)) in want.iter().zip(got).enumerate() {
        assert!(b.is_finite(), "{what}: element {i} is {b}");
        let err = (a - b).abs() / (1.0 + a.abs());
        if err > worst.0 {
            worst = (err, i);
        }
    }
    assert!(
        worst.0 < 2e-5,
        "{what}: element {} is {} against ggml's {} (relative error {})",
        worst.1,
        got[worst.1],
        want[worst.1],
        worst.0
    );
}

#[test]
fn the_kernel_agrees_with_f64_and_with_ggml() {
    let shapes = [
        // SmolLM2-135M: 9 heads over 3, head size 64; a turn of 85 tokens after 4,125.
        Shape {
            d: 64,
            m: 85,
            n_kv: 4210,
            heads: 9,
            kv_heads: 3,
            window: 0,
        },
        // A short turn over a long window (the engine sends 2 to 63 queries here once the
        // window has 1,024 cells).
        Shape {
            d: 64,
            m: 20,
            n_kv: 4100,
            heads: 9,
            kv_heads: 3,
            window: 0,
        },
        // One token (decoding), a window ending inside a tile.
        Shape {
            d: 64,
            m: 1,
            n_kv: 1000,
            heads: 9,
            kv_heads: 3,
            window: 0,
        },
        Shape {
            d: 64,
            m: 7,
            n_kv: 71,
            heads: 4,
            kv_heads: 4,
            window: 0,
        },
        // Decoding without grouped heads, fewer heads than threads want (a block cannot be
        // smaller than one row).
        Shape {
            d: 32,
            m: 1,
            n_kv: 300,
            heads: 2,
            kv_heads: 2,
            window: 0,
        },
        // A sliding window that masks whole tiles; head size 128 and 256.
        Shape {
            d: 128,
            m: 40,
            n_kv: 700,
            heads: 8,
            kv_heads: 2,
            window: 100,
        },
        Shape {
            d: 256,
            m: 3,
            n_kv: 130,
            heads: 4,
            kv_heads: 1,
            window: 0,
        },
    ];
    let q8 = shapes.iter().map(|&s| (s, GGML_TYPE_Q8_0));
    let all = shapes.iter().map(|&s| (s, GGML_TYPE_F16)).chain(q8);
    for (i, (s, kv_type)) in all.enumerate() {
        for threads in 1..=3 {
            let (ggml, got, exact, split) = all_ways(s, 0..s.m, threads, 17 + i as u64, kv_type);
            let what = format!("{s:?}, {threads} threads, KV type {kv_type}");
            assert_close(&exact, &got, &format!("{what}, against f64"));
            if !split.is_empty() {
                // The split form folds the same tile states in the same order.
                let differing = got
                    .iter()
                    .zip(&split)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                assert_eq!(
                    differing, 0,
                    "{what}: the split window differs from the single node"
                );
            }
            // ggml rounds the queries to q8_0 for a q8_0 cache: compared in f64 only.
            if s.m >= 64 && kv_type == GGML_TYPE_F16 {
                assert_close(&ggml, &got, &format!("{what}, against ggml"));
            }
        }
    }
}

#[test]
fn a_row_has_the_same_bits_alone_or_in_any_batch() {
    let s = Shape {
        d: 64,
        m: 85,
        n_kv: 1300,
        heads: 9,
        kv_heads: 3,
        window: 0,
    };
    let (_, all, _) = both(s, 0..s.m, 2, 5);
    let per_token = (s.d * s.heads) as usize;
    // The same tensors (same seed) with only some of the queries in the batch.
    for (rows, threads) in [
        (0..1, 2),
        (84..85, 1),
        (10..11, 3),
        (3..40, 2),
        (40..85, 3),
        (1..2, 1),
    ] {
        let (_, part, _) = both(s, rows.clone(), threads, 5);
        let start = rows.start as usize * per_token;
        let want = &all[start..start + part.len()];
        let differing = want
            .iter()
            .zip(&part)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differing, 0,
            "rows {rows:?} with {threads} threads: {differing} elements differ"
        );
    }
}
