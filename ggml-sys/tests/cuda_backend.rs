//! ggml's CUDA backend against its CPU backend: the same graphs over the same bytes, on both.
//!
//! Built only with the `cuda` feature. The test is `#[ignore]`d, so a run without a GPU lists
//! it as ignored rather than passing it; the GPU check (`scripts/gpu-check.sh`) runs it with
//! `--ignored`, and there a missing GPU fails it.
#![cfg(feature = "cuda")]

use std::ffi::c_int;

use ggml_sys::cuda::*;
use ggml_sys::*;

mod common;

use common::Rng;

/// A graph description: leaf tensors with their bytes, and the output.
struct Leaves(Vec<(*mut ggml_tensor, Vec<u8>)>);

impl Leaves {
    /// A new leaf of type `ty` and shape `ne` holding `bytes`.
    fn add(
        &mut self,
        ctx: *mut ggml_context,
        ty: ggml_type,
        ne: &[i64],
        bytes: Vec<u8>,
    ) -> *mut ggml_tensor {
        // SAFETY: a live no-alloc context with room (see `run`); shapes are positive.
        let t = unsafe { ggml_new_tensor(ctx, ty, ne.len() as c_int, ne.as_ptr()) };
        assert!(!t.is_null());
        // SAFETY: metadata only.
        assert_eq!(unsafe { ggml_nbytes(t) }, bytes.len(), "leaf size");
        self.0.push((t, bytes));
        t
    }

    fn f32(&mut self, ctx: *mut ggml_context, ne: &[i64], v: &[f32]) -> *mut ggml_tensor {
        self.add(
            ctx,
            GGML_TYPE_F32,
            ne,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }
}

/// `v` in ggml type `ty`, rows of `row` elements (quantized with ggml's own reference code).
fn encode(ty: ggml_type, v: &[f32], row: usize) -> Vec<u8> {
    let rows = v.len() / row;
    // SAFETY: pure size computations and conversions into a buffer of exactly the size ggml
    // reports for `rows` rows of `row` elements.
    unsafe {
        let size = ggml_row_size(ty, row as i64) * rows;
        let mut out = vec![0u8; size];
        if ty == GGML_TYPE_F32 {
            return v.iter().flat_map(|x| x.to_le_bytes()).collect();
        } else if ty == GGML_TYPE_F16 {
            ggml_fp32_to_fp16_row(v.as_ptr(), out.as_mut_ptr().cast(), v.len() as i64);
        } else {
            let n = ggml_quantize_chunk(
                ty,
                v.as_ptr(),
                out.as_mut_ptr().cast(),
                0,
                rows as i64,
                row as i64,
                std::ptr::null(),
            );
            assert_eq!(n, size);
        }
        out
    }
}

/// Builds the graph with `build` on `backend`, uploads the leaves, computes, returns the output.
fn run(
    backend: ggml_backend_t,
    build: &dyn Fn(*mut ggml_context, &mut Leaves) -> *mut ggml_tensor,
) -> Vec<f32> {
    // SAFETY: a no-alloc context for metadata; every tensor is then allocated in one backend
    // buffer, leaves are written within their sizes (checked in `Leaves::add`), and the f32
    // output is read after the computation finished.
    unsafe {
        let ctx = ggml_init(ggml_init_params {
            mem_size: 256 * ggml_tensor_overhead() + ggml_graph_overhead(),
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        });
        assert!(!ctx.is_null());
        let mut leaves = Leaves(Vec::new());
        let out = build(ctx, &mut leaves);
        let graph = ggml_new_graph(ctx);
        ggml_build_forward_expand(graph, out);
        let buffer = ggml_backend_alloc_ctx_tensors(ctx, backend);
        assert!(!buffer.is_null(), "backend buffer");
        for (t, bytes) in &leaves.0 {
            ggml_backend_tensor_set(*t, bytes.as_ptr().cast(), 0, bytes.len());
        }
        assert_eq!(
            ggml_backend_graph_compute(backend, graph),
            GGML_STATUS_SUCCESS
        );
        assert_eq!((*out).type_, GGML_TYPE_F32);
        let n = ggml_nelements(out) as usize;
        let mut result = vec![0f32; n];
        ggml_backend_tensor_get(out, result.as_mut_ptr().cast(), 0, n * 4);
        ggml_backend_buffer_free(buffer);
        ggml_free(ctx);
        result
    }
}

/// Largest difference relative to the CPU result's largest magnitude.
fn rel_diff(gpu: &[f32], cpu: &[f32]) -> f32 {
    assert_eq!(gpu.len(), cpu.len());
    let scale = cpu.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    let worst = gpu
        .iter()
        .zip(cpu)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(gpu.iter().all(|v| v.is_finite()), "non-finite GPU output");
    worst / scale
}

/// A graph to compute on both backends: its name, its builder, and the largest relative
/// difference allowed between the two results.
type Case = (
    String,
    Box<dyn Fn(*mut ggml_context, &mut Leaves) -> *mut ggml_tensor>,
    f32,
);

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn cuda_backend_matches_the_cpu_backend() {
    // SAFETY: plain constructors and queries; both backends are freed at the end.
    let (gpu, cpu) = unsafe {
        let n = ggml_backend_cuda_get_device_count();
        assert!(n > 0, "no CUDA device: this test needs a GPU");
        let gpu = ggml_backend_cuda_init(0);
        let cpu = ggml_backend_cpu_init();
        assert!(!gpu.is_null() && !cpu.is_null());
        ggml_backend_cpu_set_n_threads(cpu, 4);
        (gpu, cpu)
    };
    let mut cases = mul_mat_cases();
    cases.extend(norm_and_soft_max_cases());
    cases.extend(rope_cases());
    cases.extend(flash_attn_cases());

    let mut failed = Vec::new();
    for (name, build, tol) in &cases {
        let (g, c) = (run(gpu, build.as_ref()), run(cpu, build.as_ref()));
        let d = rel_diff(&g, &c);
        println!("{name:<28} max relative difference {d:.2e} (tolerance {tol:.0e})");
        if d > *tol {
            failed.push(name.clone());
        }
    }
    // SAFETY: created above, freed once.
    unsafe {
        ggml_backend_free(gpu);
        ggml_backend_free(cpu);
    }
    assert!(failed.is_empty(), "beyond tolerance: {failed:?}");
    println!("{} graphs agree", cases.len());
}

/// Matrix products of every weight type the engine meets, at decode and prefill widths.
fn mul_mat_cases() -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    let (k, m) = (256usize, 96usize);
    for (ty, name, tol) in [
        (GGML_TYPE_F32, "f32", 1e-4),
        (GGML_TYPE_F16, "f16", 2e-3),
        (GGML_TYPE_Q4_0, "q4_0", 2e-2),
        (GGML_TYPE_Q4_1, "q4_1", 2e-2),
        (GGML_TYPE_Q8_0, "q8_0", 1e-2),
    ] {
        for n in [1usize, 7, 64, 300] {
            let w = encode(ty, &Rng(1).vec(k * m), k);
            let x = Rng(2).vec(k * n);
            cases.push((
                format!("mul_mat {name} n={n}"),
                Box::new(move |ctx, l| {
                    let tw = l.add(ctx, ty, &[k as i64, m as i64], w.clone());
                    let tx = l.f32(ctx, &[k as i64, n as i64], &x);
                    // SAFETY: shapes agree in ne[0].
                    unsafe { ggml_mul_mat(ctx, tw, tx) }
                }),
                tol,
            ));
        }
    }
    cases
}

/// RMS norm, and a soft max under a mask.
fn norm_and_soft_max_cases() -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    let x = Rng(3).vec(576 * 5);
    cases.push((
        "rms_norm".into(),
        Box::new(move |ctx, l| {
            let t = l.f32(ctx, &[576, 5], &x);
            // SAFETY: an f32 tensor.
            unsafe { ggml_rms_norm(ctx, t, 1e-5) }
        }),
        1e-4,
    ));
    let (kv, q) = (40usize, 7usize);
    let scores = Rng(4).vec(kv * q);
    let mask: Vec<f32> = (0..kv * q)
        .map(|i| {
            if i % kv > 30 + i / kv {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    cases.push((
        "soft_max with mask".into(),
        Box::new(move |ctx, l| {
            let s = l.f32(ctx, &[kv as i64, q as i64], &scores);
            let mk = l.f32(ctx, &[kv as i64, q as i64], &mask);
            // SAFETY: the mask has the scores' shape.
            unsafe { ggml_soft_max_ext(ctx, s, mk, 0.125, 0.0) }
        }),
        1e-4,
    ));
    cases
}

/// Rotary position embeddings, both layouts.
fn rope_cases() -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    for (mode, name) in [
        (0, "rope normal"),
        (GGML_ROPE_TYPE_NEOX as c_int, "rope neox"),
    ] {
        let x = Rng(5).vec(64 * 9 * 6);
        let pos: Vec<u8> = [0i32, 1, 2, 17, 300, 4095]
            .iter()
            .flat_map(|p| p.to_le_bytes())
            .collect();
        cases.push((
            name.into(),
            Box::new(move |ctx, l| {
                let t = l.f32(ctx, &[64, 9, 6], &x);
                let p = l.add(ctx, GGML_TYPE_I32, &[6], pos.clone());
                // SAFETY: one position per token (ne[2]).
                unsafe {
                    ggml_rope_ext(
                        ctx,
                        t,
                        p,
                        std::ptr::null_mut(),
                        64,
                        mode,
                        0,
                        100000.0,
                        1.0,
                        0.0,
                        1.0,
                        0.0,
                        0.0,
                    )
                }
            }),
            1e-4,
        ));
    }
    cases
}

/// Flash attention over an f16 cache with a causal mask (SmolLM2's head shape).
fn flash_attn_cases() -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    for n_q in [1usize, 9] {
        let (d, heads, heads_kv, n_kv) = (64usize, 9usize, 3usize, 256usize);
        let qv = Rng(6).vec(d * n_q * heads);
        let kb = encode(GGML_TYPE_F16, &Rng(7).vec(d * n_kv * heads_kv), d);
        let vb = encode(GGML_TYPE_F16, &Rng(8).vec(d * n_kv * heads_kv), d);
        let mask: Vec<f32> = (0..n_kv * n_q)
            .map(|i| {
                if i % n_kv > 200 + i / n_kv {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        cases.push((
            format!("flash_attn_ext f16 n_q={n_q}"),
            Box::new(move |ctx, l| {
                let tq = l.f32(ctx, &[d as i64, n_q as i64, heads as i64], &qv);
                // SAFETY: permutes of live tensors; head counts divide (GQA 3:1).
                unsafe {
                    let tq = ggml_permute(ctx, tq, 0, 2, 1, 3);
                    let tk = l.add(
                        ctx,
                        GGML_TYPE_F16,
                        &[d as i64, n_kv as i64, heads_kv as i64],
                        kb.clone(),
                    );
                    let tv = l.add(
                        ctx,
                        GGML_TYPE_F16,
                        &[d as i64, n_kv as i64, heads_kv as i64],
                        vb.clone(),
                    );
                    let mb = encode(GGML_TYPE_F16, &mask, n_kv);
                    let tm = l.add(ctx, GGML_TYPE_F16, &[n_kv as i64, n_q as i64], mb);
                    let fa = ggml_flash_attn_ext(ctx, tq, tk, tv, tm, 0.125, 0.0, 0.0);
                    ggml_flash_attn_ext_set_prec(fa, GGML_PREC_F32);
                    ggml_cont(ctx, fa)
                }
            }),
            1e-2,
        ));
    }
    cases
}
