//! Criterion benchmarks of ggml-sys's Q4_0, Q5_0 and Q8_0 integer-sum kernels
//! (`csrc/mul_mat_q8_0.c`) against `ggml_mul_mat` on the same tensors in the same process:
//! SmolLM2-135M's matrix shapes (576 → 1,536 and 1,536 → 576), 512 columns (a prefill chunk),
//! 2 threads. For Q4_0 also ggml's product over the weights repacked for this CPU
//! (`CPU_REPACK`, which llama.cpp uses for Q4_0 on the CPU), where ggml has a layout for it.
//!
//! ```text
//! cargo bench -p ggml-sys --bench kernels_q8_0
//! ```
//! Run it several times and compare the ratios of medians within one run: the machine's speed
//! drifts between runs. `KERNELS_Q8_0_THREADS=1` runs every side on one thread instead of two
//! (group names then end in `_t1`), for a machine whose other load starves one of two threads.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::ffi::c_int;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ggml_sys::*;

/// Threads of every product: 2, or `KERNELS_Q8_0_THREADS`.
fn threads() -> c_int {
    std::env::var("KERNELS_Q8_0_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2)
}
const COLUMNS: i64 = 512;

/// SmolLM2-135M's matrices, `(k, m)`: the feed-forward gate and up (576 → 1,536) and down
/// (1,536 → 576) projections.
const SHAPES: [(i64, i64); 2] = [(576, 1536), (1536, 576)];

/// A graph of one product node, planned once with its own work buffer.
struct Planned {
    graph: *mut ggml_cgraph,
    plan: ggml_cplan,
    _work: Vec<u8>,
}

impl Planned {
    /// # Safety
    /// `ctx` is live, holds `node` and has room for a graph.
    unsafe fn new(ctx: *mut ggml_context, node: *mut ggml_tensor) -> Planned {
        // SAFETY: the caller's promise; the work buffer's heap memory outlives every compute.
        unsafe {
            let graph = ggml_new_graph(ctx);
            ggml_build_forward_expand(graph, node);
            let mut plan = ggml_graph_plan(graph, threads(), std::ptr::null_mut());
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
        // (see `bench_one`); the plan's work buffer is self's.
        let status = unsafe { ggml_graph_compute(self.graph, &mut self.plan) };
        assert_eq!(status, GGML_STATUS_SUCCESS);
    }
}

/// ggml's CPU repack buffer type, if this build and CPU have one.
fn repack_buffer_type() -> Option<ggml_backend_buffer_type_t> {
    // SAFETY: the CPU registry and its device are static; the procedure named
    // `ggml_backend_dev_get_extra_bufts` maps a device to a NULL-terminated array of buffer
    // types.
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

/// Uniform values in [-1, 1) from a seeded SplitMix64.
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

type Kernel = unsafe extern "C" fn(*mut ggml_tensor, c_int, c_int, *mut std::ffi::c_void);

fn bench_one(c: &mut Criterion, ty: ggml_type, name: &str, kernel: Kernel, (k, m): (i64, i64)) {
    let weights: Vec<f32> = values(k as u64 * 7 + m as u64, (k * m) as usize)
        .iter()
        .map(|v| v * 0.1)
        .collect();
    let columns: Vec<f32> = values(k as u64, (k * COLUMNS) as usize)
        .iter()
        .map(|v| v * 3.0)
        .collect();
    // SAFETY: every tensor belongs to `ctx` (or, repacked, to `rctx` and its buffer), all of
    // which live until the end of this function, past every use of the graphs; copies stay
    // within freshly allocated tensors of the sizes written.
    unsafe {
        let ctx = ggml_init(ggml_init_params {
            mem_size: (k * m * 2) as usize
                + (k * COLUMNS * 4) as usize
                + (m * COLUMNS * 16) as usize
                + (64 << 20),
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        });
        assert!(!ctx.is_null());
        let w = ggml_new_tensor_2d(ctx, ty, k, m);
        ggml_quantize_chunk(ty, weights.as_ptr(), (*w).data, 0, m, k, std::ptr::null());
        let x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, COLUMNS);
        std::ptr::copy_nonoverlapping(columns.as_ptr(), (*x).data.cast(), columns.len());
        let mut args = [w, x];
        let ours = ggml_custom_4d(
            ctx,
            GGML_TYPE_F32,
            m,
            COLUMNS,
            1,
            1,
            args.as_mut_ptr(),
            2,
            Some(kernel),
            GGML_N_TASKS_MAX,
            std::ptr::null_mut(),
        );
        let mut sides = vec![
            ("ggml", Planned::new(ctx, ggml_mul_mat(ctx, w, x))),
            ("kernel", Planned::new(ctx, ours)),
        ];
        let rctx = ggml_init(ggml_init_params {
            mem_size: 1 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        });
        let mut rbuf: ggml_backend_buffer_t = std::ptr::null_mut();
        if let Some(buft) = repack_buffer_type() {
            let wr = ggml_dup_tensor(rctx, w);
            rbuf = ggml_backend_alloc_ctx_tensors_from_buft(rctx, buft);
            // A tensor ggml repacks gets `extra` (its kernels); others stay plain.
            if !rbuf.is_null() && !(*wr).extra.is_null() {
                ggml_backend_tensor_set(wr, (*w).data, 0, ggml_nbytes(w));
                sides.push(("ggml_repacked", Planned::new(ctx, ggml_mul_mat(ctx, wr, x))));
            }
        }
        let suffix = match threads() {
            2 => String::new(),
            t => format!("_t{t}"),
        };
        let mut g = c.benchmark_group(format!("{name}_k{k}_m{m}_n{COLUMNS}{suffix}"));
        g.sample_size(20);
        g.throughput(Throughput::Elements((k * m * COLUMNS) as u64));
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
    if unsafe { kernels::ggml_sys_mul_mat_q4_0_isum() } == 0 {
        eprintln!("the Q4_0/Q5_0/Q8_0 kernels were built without AVX2: plain C loops");
    }
    for shape in SHAPES {
        bench_one(
            c,
            GGML_TYPE_Q4_0,
            "q4_0",
            kernels::ggml_sys_mul_mat_q4_0,
            shape,
        );
        bench_one(
            c,
            GGML_TYPE_Q5_0,
            "q5_0",
            kernels::ggml_sys_mul_mat_q5_0,
            shape,
        );
        bench_one(
            c,
            GGML_TYPE_Q8_0,
            "q8_0",
            kernels::ggml_sys_mul_mat_q8_0,
            shape,
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
