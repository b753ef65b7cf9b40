//! Criterion benchmarks of ggml-sys's integer-sum kernels on few columns (decoding is one
//! column, short items a few) against `ggml_mul_mat` (ggml's own dot product per row and
//! column, what llama.cpp decodes with) on the same tensors in the same process: SmolLM2-135M's
//! matrices in q4_1 and Q4_0 (hidden 576, feed-forward 1,536, k/v 192, output head 49,152), its
//! feed-forward matrices in Q5_0 (what a Q4_K_M file of it holds: 576 is no multiple of 256) and
//! Gemma 3 270M's in Q8_0 (hidden 640, feed-forward 2,048, output head 262,144), 1, 2, 4 and 8
//! columns, 1 and 2 threads. The two sides of each case run one after the other in one group.
//!
//! ```text
//! cargo bench -p ggml-sys --bench kernels_decode [-- <filter>]
//! ```
//! Group names are `<type>_k<k>_m<m>_n<columns>_t<threads>`. Compare the ratios of medians within
//! one run: the machine's speed drifts between runs.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::ffi::c_int;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ggml_sys::*;

/// A graph of one product node, planned once with its own work buffer.
struct Planned {
    graph: *mut ggml_cgraph,
    plan: ggml_cplan,
    _work: Vec<u8>,
}

impl Planned {
    /// # Safety
    /// `ctx` is live, holds `node` and has room for a graph.
    unsafe fn new(ctx: *mut ggml_context, node: *mut ggml_tensor, threads: c_int) -> Planned {
        // SAFETY: the caller's promise; the work buffer's heap memory outlives every compute.
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
        // (see `bench_shape`); the plan's work buffer is self's.
        let status = unsafe { ggml_graph_compute(self.graph, &mut self.plan) };
        assert_eq!(status, GGML_STATUS_SUCCESS);
    }
}

/// Uniform values in [-1, 1) from a seeded SplitMix64, continuing from `s`.
fn values(s: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = *s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

type Kernel = unsafe extern "C" fn(*mut ggml_tensor, c_int, c_int, *mut std::ffi::c_void);

const COLUMNS: [i64; 4] = [1, 2, 4, 8];
const THREADS: [c_int; 2] = [1, 2];

/// Every column count and thread count on one weight matrix `(k, m)` of `ty`.
fn bench_shape(c: &mut Criterion, ty: ggml_type, name: &str, kernel: Kernel, (k, m): (i64, i64)) {
    let n_max = *COLUMNS.iter().max().expect("counts");
    // SAFETY: every tensor belongs to `ctx`, which lives until the end of this function, past
    // every use of the graphs; copies stay within freshly allocated tensors of the sizes
    // written.
    unsafe {
        let ctx = ggml_init(ggml_init_params {
            mem_size: ggml_row_size(ty, k) * m as usize
                + (k * n_max * 4) as usize
                + (m * n_max * 4 * 2 * COLUMNS.len() as i64 * THREADS.len() as i64) as usize
                + (64 << 20),
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        });
        assert!(!ctx.is_null());
        let w = ggml_new_tensor_2d(ctx, ty, k, m);
        // The weights quantized a slice of rows at a time (the largest head is 168 M values).
        let mut seed = k as u64 * 7 + m as u64;
        let rows = (1 << 22) / k;
        let mut r = 0;
        while r < m {
            let n = rows.min(m - r);
            let slice: Vec<f32> = values(&mut seed, (k * n) as usize)
                .iter()
                .map(|v| v * 0.1)
                .collect();
            let dst = (*w)
                .data
                .cast::<u8>()
                .add(r as usize * ggml_row_size(ty, k));
            ggml_quantize_chunk(ty, slice.as_ptr(), dst.cast(), 0, n, k, std::ptr::null());
            r += n;
        }
        let x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n_max);
        let columns: Vec<f32> = values(&mut seed, (k * n_max) as usize)
            .iter()
            .map(|v| v * 3.0)
            .collect();
        std::ptr::copy_nonoverlapping(columns.as_ptr(), (*x).data.cast(), columns.len());
        for n in COLUMNS {
            let xn = ggml_view_2d(ctx, x, k, n, (*x).nb[1], 0);
            for threads in THREADS {
                let mut args = [w, xn];
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
                    // Integer sums for every column (q4_1 reads the count; the others ignore it).
                    n as usize as *mut std::ffi::c_void,
                );
                let mut sides = [
                    ("ggml", Planned::new(ctx, ggml_mul_mat(ctx, w, xn), threads)),
                    ("ours", Planned::new(ctx, ours, threads)),
                ];
                let mut g = c.benchmark_group(format!("{name}_k{k}_m{m}_n{n}_t{threads}"));
                g.sample_size(30);
                g.warm_up_time(Duration::from_millis(300));
                g.measurement_time(Duration::from_millis(1500));
                g.throughput(Throughput::Elements((k * m * n) as u64));
                for (side, planned) in &mut sides {
                    g.bench_function(*side, |b| b.iter(|| planned.compute()));
                }
                g.finish();
            }
        }
        ggml_free(ctx);
    }
}

fn bench(c: &mut Criterion) {
    // SAFETY: plain queries.
    let (q41, q40) = unsafe {
        (
            kernels::ggml_sys_mul_mat_q4_1_isum(),
            kernels::ggml_sys_mul_mat_q4_0_isum(),
        )
    };
    if q41 == 0 || q40 == 0 {
        eprintln!("the kernels were built without AVX2: ggml's product or plain C loops");
    }
    // SmolLM2-135M: q/o, k/v, gate/up, down, the output head.
    let smollm = [
        (576, 576),
        (576, 192),
        (576, 1536),
        (1536, 576),
        (576, 49152),
    ];
    for shape in smollm {
        bench_shape(
            c,
            GGML_TYPE_Q4_1,
            "q4_1",
            kernels::ggml_sys_mul_mat_q4_1,
            shape,
        );
    }
    for shape in smollm {
        bench_shape(
            c,
            GGML_TYPE_Q4_0,
            "q4_0",
            kernels::ggml_sys_mul_mat_q4_0,
            shape,
        );
    }
    // SmolLM2-135M requantized to Q4_K_M: its feed-forward matrices in Q5_0.
    for shape in [(576, 1536), (1536, 576)] {
        bench_shape(
            c,
            GGML_TYPE_Q5_0,
            "q5_0",
            kernels::ggml_sys_mul_mat_q5_0,
            shape,
        );
    }
    // Gemma 3 270M: gate/up, down, the output head.
    for shape in [(640, 2048), (2048, 640), (640, 262_144)] {
        bench_shape(
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
