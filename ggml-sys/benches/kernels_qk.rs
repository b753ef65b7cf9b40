//! Criterion benchmarks of ggml-sys's k-quant kernels (`csrc/mul_mat_qk.c`) against
//! `ggml_mul_mat` on the same tensors in the same process: the shapes of Gemma 3 270M whose
//! weights are q4_K or q6_K in its Q4_K_M file. Groups `wide_*`: 512 columns (a prefill chunk),
//! 2 threads. Groups `few_*`: 1, 2, 4 and 8 columns (decoding, short items: the kernels'
//! few-column path), 1 and 2 threads, also a 1,536 → 576 matrix. For q4_K also ggml's product
//! over the weights repacked for this CPU (`CPU_REPACK`, the engine's default on the CPU), where
//! ggml has a layout for it. In each group ggml's sides and ours run one after the other.
//!
//! ```text
//! cargo bench -p ggml-sys --bench kernels_qk             # everything
//! cargo bench -p ggml-sys --bench kernels_qk -- few_     # the few-column cases only
//! cargo bench -p ggml-sys --bench kernels_qk -- _n1_     # decoding only
//! ```
//! Run it several times and compare the ratios of medians within one run: the machine's speed
//! drifts between runs.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::ffi::c_int;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ggml_sys::*;

/// The wide cases' columns and threads.
const COLUMNS: i64 = 512;
const THREADS: c_int = 2;
/// The few-column cases' columns and threads.
const FEW_COLUMNS: [i64; 4] = [1, 2, 4, 8];
const FEW_THREADS: [c_int; 2] = [1, 2];

/// Gemma 3 270M's k-quant matrices in its Q4_K_M file, `(k, m)`: the attention output (1,024 →
/// 640) is q4_K, the feed-forward down projection (2,048 → 640) q4_K in half the layers and q6_K
/// in the others (the rest have rows of 640, not whole super-blocks of 256: q5_0 and q8_0).
const Q4_K_SHAPES: [(i64, i64); 2] = [(2048, 640), (1024, 640)];
const Q6_K_SHAPES: [(i64, i64); 1] = [(2048, 640)];
/// The few-column cases add a 1,536 → 576 matrix (its 576 → 1,536 partner has rows of 576, not
/// whole super-blocks).
const FEW_SHAPES: [(i64, i64); 3] = [(2048, 640), (1024, 640), (1536, 576)];

/// A graph of one product node, planned once with its own work buffer (so that the context
/// never grows between iterations).
struct Planned {
    graph: *mut ggml_cgraph,
    plan: ggml_cplan,
    _work: Vec<u8>,
}

impl Planned {
    /// # Safety
    /// `ctx` is live, holds `node` and has room for a graph.
    unsafe fn new(ctx: *mut ggml_context, node: *mut ggml_tensor, threads: c_int) -> Planned {
        // SAFETY: the caller's promise; the work buffer outlives every compute (it is moved
        // with the plan, and a Vec's heap memory does not move).
        unsafe {
            let graph = ggml_new_graph(ctx);
            ggml_build_forward_expand(graph, node);
            let mut plan = ggml_graph_plan(graph, threads, std::ptr::null_mut());
            let mut work = vec![0u8; plan.work_size.max(1)];
            plan.work_data = work.as_mut_ptr();
            Planned {
                graph,
                plan,
                _work: work,
            }
        }
    }

    fn compute(&mut self) {
        // SAFETY: the graph and its tensors live as long as the context, which outlives self
        // (see `bench`); the plan's work buffer is self's.
        let status = unsafe { ggml_graph_compute(self.graph, &mut self.plan) };
        assert_eq!(status, GGML_STATUS_SUCCESS);
    }
}

/// ggml's CPU repack buffer type, if this build and CPU have one.
fn repack_buffer_type() -> Option<ggml_backend_buffer_type_t> {
    // SAFETY: the CPU registry, its device and the array of extra buffer types are static;
    // the procedure named `ggml_backend_dev_get_extra_bufts` maps a device to a
    // NULL-terminated array of buffer types.
    unsafe {
        let reg = ggml_backend_cpu_reg();
        if reg.is_null() || ggml_backend_reg_dev_count(reg) == 0 {
            return None;
        }
        let dev = ggml_backend_reg_dev_get(reg, 0);
        let f =
            ggml_backend_reg_get_proc_address(reg, c"ggml_backend_dev_get_extra_bufts".as_ptr());
        if dev.is_null() || f.is_null() {
            return None;
        }
        type ExtraBufts =
            unsafe extern "C" fn(ggml_backend_dev_t) -> *mut ggml_backend_buffer_type_t;
        let extra_bufts: ExtraBufts = std::mem::transmute(f);
        let mut p = extra_bufts(dev);
        while !p.is_null() && !(*p).is_null() {
            let name = ggml_backend_buft_name(*p);
            if !name.is_null() && std::ffi::CStr::from_ptr(name).to_bytes() == b"CPU_REPACK" {
                return Some(*p);
            }
            p = p.add(1);
        }
        None
    }
}

/// A deterministic pseudo-random source (SplitMix64) in [-1, 1).
struct Rng(u64);

impl Rng {
    fn f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

type Kernel = unsafe extern "C" fn(*mut ggml_tensor, c_int, c_int, *mut std::ffi::c_void);

/// One product's group: `what` names it, `columns` columns, `threads` threads, ggml's sides then
/// ours.
struct Case<'a> {
    what: &'a str,
    ty: ggml_type,
    name: &'a str,
    kernel: Kernel,
    shape: (i64, i64),
    columns: i64,
    threads: c_int,
}

fn bench_one(c: &mut Criterion, case: Case) {
    let Case {
        what,
        ty,
        name,
        kernel,
        shape: (k, m),
        columns: n,
        threads,
    } = case;
    let mut rng = Rng(k as u64 * 7 + m as u64);
    let weights: Vec<f32> = (0..k * m).map(|_| rng.f32() * 0.1).collect();
    let columns: Vec<f32> = (0..k * n).map(|_| rng.f32() * 3.0).collect();
    // SAFETY: every tensor belongs to `ctx` (or, repacked, to `rctx` and its buffer), all of
    // which live until the end of this function, past every use of the graphs; copies stay
    // within freshly allocated tensors of the sizes written.
    unsafe {
        let ctx = ggml_init(ggml_init_params {
            mem_size: (k * m) as usize + (k * n * 4) as usize + (m * n * 16) as usize + (64 << 20),
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        });
        assert!(!ctx.is_null());
        let w = ggml_new_tensor_2d(ctx, ty, k, m);
        ggml_quantize_chunk(ty, weights.as_ptr(), (*w).data, 0, m, k, std::ptr::null());
        let x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
        std::ptr::copy_nonoverlapping(columns.as_ptr(), (*x).data.cast(), columns.len());
        let mut args = [w, x];
        let ours = ggml_custom_4d(
            ctx,
            GGML_TYPE_F32,
            m,
            n,
            1,
            1,
            args.as_mut_ptr(),
            2,
            Some(kernel),
            GGML_N_TASKS_MAX,
            std::ptr::null_mut(),
        );
        let mut sides = vec![("ggml", Planned::new(ctx, ggml_mul_mat(ctx, w, x), threads))];
        // The repacked copy, where ggml repacks this type for this CPU.
        let rctx = ggml_init(ggml_init_params {
            mem_size: 1 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        });
        let mut rbuf: ggml_backend_buffer_t = std::ptr::null_mut();
        if let Some(buft) = repack_buffer_type() {
            let wr = ggml_dup_tensor(rctx, w);
            rbuf = ggml_backend_alloc_ctx_tensors_from_buft(rctx, buft);
            if !rbuf.is_null() && !(*wr).extra.is_null() {
                ggml_backend_tensor_set(wr, (*w).data, 0, ggml_nbytes(w));
                sides.push((
                    "ggml_repacked",
                    Planned::new(ctx, ggml_mul_mat(ctx, wr, x), threads),
                ));
            }
        }
        sides.push(("kernel", Planned::new(ctx, ours, threads)));
        let mut g = c.benchmark_group(format!("{what}_{name}_k{k}_m{m}_n{n}_t{threads}"));
        g.sample_size(20);
        if n < COLUMNS {
            g.warm_up_time(std::time::Duration::from_millis(500));
            g.measurement_time(std::time::Duration::from_secs(2));
        }
        g.throughput(Throughput::Elements((k * m * n) as u64));
        for (side, planned) in &mut sides {
            g.bench_function(*side, |b| b.iter(|| planned.compute()));
        }
        g.finish();
        drop(sides);
        if !rbuf.is_null() {
            ggml_backend_buffer_free(rbuf);
        }
        ggml_free(rctx);
        ggml_free(ctx);
    }
}

fn bench(c: &mut Criterion) {
    // SAFETY: a plain query.
    if unsafe { kernels::ggml_sys_mul_mat_qk_isum() } == 0 {
        eprintln!("the k-quant kernels were built without AVX2: they call ggml's dot product");
    }
    let q4_k = |shape, columns, threads, what| Case {
        what,
        ty: GGML_TYPE_Q4_K,
        name: "q4_K",
        kernel: kernels::ggml_sys_mul_mat_q4_k,
        shape,
        columns,
        threads,
    };
    let q6_k = |shape, columns, threads, what| Case {
        ty: GGML_TYPE_Q6_K,
        name: "q6_K",
        kernel: kernels::ggml_sys_mul_mat_q6_k,
        ..q4_k(shape, columns, threads, what)
    };
    for shape in FEW_SHAPES {
        for n in FEW_COLUMNS {
            for threads in FEW_THREADS {
                bench_one(c, q4_k(shape, n, threads, "few"));
                bench_one(c, q6_k(shape, n, threads, "few"));
            }
        }
    }
    for shape in Q4_K_SHAPES {
        bench_one(c, q4_k(shape, COLUMNS, THREADS, "wide"));
    }
    for shape in Q6_K_SHAPES {
        bench_one(c, q6_k(shape, COLUMNS, THREADS, "wide"));
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
