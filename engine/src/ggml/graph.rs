//! Graphs: building one branded `Graph<'g, 'w>` of ops over its own tensors and lifted
//! long-lived ones, and computing it on a backend with a reused allocator.

use std::ffi::c_int;
use std::marker::PhantomData;
use std::ptr::NonNull;

use ggml_sys as sys;

use super::{ArenaChunk, Backend, Context, DType, Device, RawTensor, RawTensorMut};
use crate::error::{Error, Result};

/// Builds and runs graphs on its backends, reusing the compute buffers between runs: one CPU
/// backend with ggml's graph allocator, or a GPU and the CPU under ggml's backend scheduler,
/// which splits each graph by where its weights and KV tensors live.
pub(crate) struct Compute {
    alloc: Alloc,
    /// Metadata arena reused by every graph: a fresh allocation per token would cost page
    /// faults on each decode step.
    arena: Vec<ArenaChunk>,
    /// The backends the allocator computes on, freed after it (fields drop after `drop`).
    backends: Vec<Backend>,
}

enum Alloc {
    Single(NonNull<sys::ggml_gallocr>),
    Sched(NonNull<sys::ggml_backend_sched>),
}

// SAFETY: the allocator, the scheduler and the backends have no thread affinity; they are only
// used under `&mut self`.
unsafe impl Send for Compute {}

impl Drop for Compute {
    fn drop(&mut self) {
        // SAFETY: created by ggml_gallocr_new / ggml_backend_sched_new, freed once, before the
        // backends the scheduler points to (the `backends` field drops after this).
        unsafe {
            match self.alloc {
                Alloc::Single(g) => sys::ggml_gallocr_free(g.as_ptr()),
                Alloc::Sched(s) => sys::ggml_backend_sched_free(s.as_ptr()),
            }
        }
    }
}

/// The largest graph we build (nodes).
const MAX_NODES: usize = 8192;

impl Compute {
    /// Computes on one CPU backend with `n_threads` threads.
    pub(crate) fn cpu(n_threads: usize) -> Result<Compute> {
        let backend = Backend::cpu(n_threads)?;
        // SAFETY: the CPU buffer type is a static object.
        let galloc = unsafe { sys::ggml_gallocr_new(sys::ggml_backend_cpu_buffer_type()) };
        NonNull::new(galloc)
            .map(|galloc| Compute {
                alloc: Alloc::Single(galloc),
                arena: Vec::new(),
                backends: vec![backend],
            })
            .ok_or(Error::Ggml {
                what: "could not create a graph allocator",
            })
    }

    /// Computes under ggml's scheduler on `device` (when it is not the CPU) and the CPU, with
    /// `n_threads` CPU threads: each op runs where its weights or its KV tensor live, inputs
    /// start on the CPU, and the scheduler copies activations between the two.
    pub(crate) fn scheduled(device: Device, n_threads: usize) -> Result<Compute> {
        let mut backends = Vec::with_capacity(2);
        if !device.is_cpu() {
            backends.push(Backend::on(device, n_threads)?);
        }
        // ggml's scheduler wants the CPU last.
        backends.push(Backend::cpu(n_threads)?);
        let mut raw: Vec<sys::ggml_backend_t> = backends.iter().map(|b| b.0.as_ptr()).collect();
        // SAFETY: `raw` holds live backends, which the returned value owns and frees after the
        // scheduler; null buffer types mean each backend's default; no parallel copies, no
        // offloading of CPU-resident weights (ops run where their weights are).
        let sched = unsafe {
            sys::ggml_backend_sched_new(
                raw.as_mut_ptr(),
                std::ptr::null_mut(),
                raw.len() as c_int,
                MAX_NODES,
                false,
                false,
            )
        };
        NonNull::new(sched)
            .map(|sched| Compute {
                alloc: Alloc::Sched(sched),
                arena: Vec::new(),
                backends,
            })
            .ok_or(Error::Ggml {
                what: "could not create a backend scheduler",
            })
    }

    /// Builds a graph with `build`, allocates it, uploads its inputs, computes it on the backends
    /// and returns the f32 contents of the output tensor that `build` returned.
    ///
    /// `'w` is the borrow of the long-lived tensors (weights, KV) that the graph lifts; as a
    /// lifetime parameter of this call it outlives the computation. Each graph gets its own
    /// `'g`, so its tensors cannot leave `build` nor enter another graph.
    pub(crate) fn run<'w, F>(&mut self, build: F) -> Result<Vec<f32>>
    where
        F: for<'g> FnOnce(&mut Graph<'g, 'w>) -> Result<Tensor<'g>>,
    {
        // SAFETY: a pure size computation.
        let extra = unsafe { sys::ggml_graph_overhead_custom(MAX_NODES, false) };
        let size = Context::arena_size(MAX_NODES, extra);
        let chunks = size.div_ceil(std::mem::size_of::<ArenaChunk>());
        if self.arena.len() < chunks {
            self.arena = vec![ArenaChunk([0; 16]); chunks];
        }
        let ctx = Context::in_arena(&mut self.arena)?;
        // SAFETY: the context has room for a graph of MAX_NODES nodes.
        let graph = unsafe { sys::ggml_new_graph_custom(ctx.as_ptr(), MAX_NODES, false) };
        let graph = NonNull::new(graph).ok_or(Error::Ggml {
            what: "graph context is full",
        })?;
        let mut g = Graph {
            ctx: &ctx,
            graph,
            inputs: Vec::new(),
            integer_sums: IntegerSums::Leading(0, 0),
            row_kernels: false,
            packed: Vec::new(),
            _brand: PhantomData,
            _owners: PhantomData,
        };
        let out = build(&mut g)?;
        let inputs = std::mem::take(&mut g.inputs);
        // SAFETY: `out` is a tensor of this graph (its brand), live until `ctx` drops.
        if !unsafe { (*out.raw).buffer }.is_null() {
            // A lifted weight or KV tensor: marking it as the output would write its flags,
            // which other threads may be reading.
            return Err(Error::Ggml {
                what: "graph output is not a tensor the graph computes",
            });
        }
        // SAFETY: the graph, its tensors and the allocator are live; every tensor the graph
        // reaches is either made in `ctx` or lifted from an owner borrowed for `'w`, which
        // outlives this call, and KV tensors that the graph writes were lifted from a
        // `RawTensorMut`, whose exclusive borrow also spans this call. Inputs were made by this
        // graph with exactly the byte sizes of their data (asserted in `Graph::input`). The
        // output is read only after the computation finished, and only once it is known to be
        // a contiguous f32 tensor.
        unsafe {
            sys::ggml_set_output(out.raw);
            sys::ggml_build_forward_expand(graph.as_ptr(), out.raw);
            let allocated = match self.alloc {
                Alloc::Single(galloc) => {
                    sys::ggml_gallocr_alloc_graph(galloc.as_ptr(), graph.as_ptr())
                }
                Alloc::Sched(sched) => {
                    sys::ggml_backend_sched_reset(sched.as_ptr());
                    sys::ggml_backend_sched_alloc_graph(sched.as_ptr(), graph.as_ptr())
                }
            };
            if !allocated {
                return Err(Error::OutOfMemory {
                    what: "compute buffer",
                });
            }
            for (t, bytes) in &inputs {
                // An input no op of the graph reads (a gathered window's cells where the
                // kernel reads the pool through a page table instead) was not allocated.
                if (**t).buffer.is_null() {
                    continue;
                }
                sys::ggml_backend_tensor_set(*t, bytes.as_ptr().cast(), 0, bytes.len());
            }
            let status = match self.alloc {
                Alloc::Single(_) => {
                    sys::ggml_backend_graph_compute(self.backends[0].0.as_ptr(), graph.as_ptr())
                }
                Alloc::Sched(sched) => {
                    sys::ggml_backend_sched_graph_compute(sched.as_ptr(), graph.as_ptr())
                }
            };
            if status != sys::GGML_STATUS_SUCCESS {
                return Err(Error::Ggml {
                    what: "graph computation failed",
                });
            }
            if (*out.raw).type_ != sys::GGML_TYPE_F32 || !sys::ggml_is_contiguous(out.raw) {
                return Err(Error::Ggml {
                    what: "graph output is not contiguous f32",
                });
            }
            let n = sys::ggml_nelements(out.raw) as usize;
            let mut result = vec![0f32; n];
            sys::ggml_backend_tensor_get(out.raw, result.as_mut_ptr().cast(), 0, n * 4);
            Ok(result)
        }
    }
}

/// Makes a lifetime invariant: a graph's brand `'g` can be neither shortened nor lengthened,
/// so tensors of two graphs never unify.
type Invariant<'g> = PhantomData<fn(&'g ()) -> &'g ()>;

/// A graph under construction, branded `'g`; it may use long-lived tensors borrowed for `'w`.
/// Tensors made here are valid until the graph is computed.
pub(crate) struct Graph<'g, 'w> {
    ctx: &'g Context<'g>,
    graph: NonNull<sys::ggml_cgraph>,
    inputs: Vec<(*mut sys::ggml_tensor, Vec<u8>)>,
    /// Which columns may take integer sums (see [`Graph::allow_integer_sums`]).
    integer_sums: IntegerSums,
    /// Whether norms and gated activations may take ggml-sys's row kernels (`graph/rows.rs`).
    row_kernels: bool,
    /// Activations already quantized and packed for the q4_0, q5_0 and q8_0 products, by the
    /// columns' tensor and the weight type: products over the same columns (Q, K and V; gate
    /// and up) share one packing.
    packed: Vec<(*mut sys::ggml_tensor, sys::ggml_type, *mut sys::ggml_tensor)>,
    _brand: Invariant<'g>,
    _owners: PhantomData<&'w ()>,
}

/// A tensor of the graph branded `'g`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tensor<'g> {
    raw: *mut sys::ggml_tensor,
    _brand: Invariant<'g>,
}

impl<'g> Tensor<'g> {
    /// Size of dimension `i` (ggml order).
    pub(crate) fn ne(&self, i: usize) -> usize {
        // SAFETY: the tensor is live for 'g; `ne` has four entries and the index is clamped
        // to 3.
        unsafe { (*self.raw).ne[i.min(3)] as usize }
    }

    /// Stride in bytes of dimension `i` (`nb[1]` is the bytes of one row).
    pub(crate) fn nb(&self, i: usize) -> usize {
        // SAFETY: the tensor is live for 'g; `nb` has four entries and the index is clamped
        // to 3.
        unsafe { (*self.raw).nb[i.min(3)] }
    }
}

/// A KV tensor lifted into the graph branded `'g` as a destination of [`Graph::set_rows`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct TensorMut<'g> {
    raw: *mut sys::ggml_tensor,
    _brand: Invariant<'g>,
}

impl<'g> TensorMut<'g> {
    /// Address of the tensor's data (a KV tensor's, allocated with the pool and never moved),
    /// for page tables that point ggml-sys's attention at its rows; meaningful only where the
    /// pool lives in host memory.
    pub(crate) fn data_address(&self) -> usize {
        // SAFETY: the tensor is live for 'g; only its header is read.
        unsafe { (*self.raw).data as usize }
    }

    /// The same tensor as an operand (to read what the graph's stores wrote).
    pub(crate) fn as_tensor(self) -> Tensor<'g> {
        Tensor {
            raw: self.raw,
            _brand: PhantomData,
        }
    }
}

macro_rules! op {
    ($self:ident, $call:expr) => {{
        // SAFETY: every operand is a `Tensor<'g>`: made in this graph's context (the brand
        // `'g` is invariant, so no other graph's tensor fits), or lifted from an owner borrowed
        // for `'w`, which outlives the graph. ggml checks shapes and aborts on misuse (never
        // undefined behaviour), which the model code prevents by construction (shapes come from
        // validated hparams).
        let raw = unsafe { $call };
        debug_assert!(!raw.is_null());
        Tensor {
            raw,
            _brand: PhantomData,
        }
    }};
}

mod attention;
mod experts;
mod products;
mod recurrent;
mod rows;
pub(crate) use attention::kernel_takes_model;
pub(crate) use products::IntegerSums;

impl<'g, 'w> Graph<'g, 'w> {
    fn ctx(&self) -> *mut sys::ggml_context {
        self.ctx.as_ptr()
    }

    /// One of ggml-sys's kernels as a custom op over `srcs`, run by every thread: an f32
    /// result of shape `ne`, `userdata` passed as an integer. The caller has checked that the
    /// kernel reads its sources within their shapes, writes only its result and never
    /// dereferences `userdata`.
    fn custom(
        &mut self,
        ne: [usize; 3],
        srcs: &mut [*mut sys::ggml_tensor],
        kernel: sys::ggml_custom_op_t,
        userdata: usize,
    ) -> Tensor<'g> {
        op!(
            self,
            sys::ggml_custom_4d(
                self.ctx(),
                sys::GGML_TYPE_F32,
                ne[0] as i64,
                ne[1] as i64,
                ne[2] as i64,
                1,
                srcs.as_mut_ptr(),
                srcs.len() as i32,
                kernel,
                sys::GGML_N_TASKS_MAX,
                userdata as *mut std::ffi::c_void,
            )
        )
    }

    /// Brings a long-lived tensor (weight or KV), borrowed for `'w`, into this graph as an
    /// operand.
    pub(crate) fn lift(&self, t: RawTensor<'w>) -> Tensor<'g> {
        Tensor {
            raw: t.ptr.as_ptr(),
            _brand: PhantomData,
        }
    }

    /// Brings a KV tensor, borrowed mutably for `'w`, into this graph as a destination.
    pub(crate) fn lift_mut(&self, t: RawTensorMut<'w>) -> TensorMut<'g> {
        TensorMut {
            raw: t.ptr.as_ptr(),
            _brand: PhantomData,
        }
    }

    /// A new input tensor of `dtype` and `shape`, filled with `bytes` when the graph runs.
    pub(crate) fn input(&mut self, dtype: DType, shape: &[usize], bytes: Vec<u8>) -> Tensor<'g> {
        let ne: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let t = op!(
            self,
            sys::ggml_new_tensor(self.ctx(), dtype.raw(), ne.len() as c_int, ne.as_ptr())
        );
        // SAFETY: live tensor; marking it as input keeps the allocator from reusing its memory.
        unsafe {
            assert_eq!(sys::ggml_nbytes(t.raw), bytes.len(), "input size");
            sys::ggml_set_input(t.raw);
        }
        self.inputs.push((t.raw, bytes));
        t
    }

    /// Adds `t` (e.g. a copy into the KV cache) to the nodes that must run.
    pub(crate) fn expand(&mut self, t: Tensor<'g>) {
        // SAFETY: live graph and tensor.
        unsafe { sys::ggml_build_forward_expand(self.graph.as_ptr(), t.raw) }
    }

    pub(crate) fn get_rows(&mut self, table: Tensor<'g>, ids: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_get_rows(self.ctx(), table.raw, ids.raw))
    }
    /// Rows `ids` of the f16 `table`, still f16: `get_rows` widens them to f32 and the cast
    /// narrows them back, which is exact.
    pub(crate) fn gather_f16(&mut self, table: Tensor<'g>, ids: Tensor<'g>) -> Tensor<'g> {
        let rows = self.get_rows(table, ids);
        op!(
            self,
            sys::ggml_cast(self.ctx(), rows.raw, sys::GGML_TYPE_F16)
        )
    }
    pub(crate) fn rms_norm(&mut self, x: Tensor<'g>, eps: f32) -> Tensor<'g> {
        op!(self, sys::ggml_rms_norm(self.ctx(), x.raw, eps))
    }
    pub(crate) fn mul(&mut self, a: Tensor<'g>, b: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_mul(self.ctx(), a.raw, b.raw))
    }
    pub(crate) fn add(&mut self, a: Tensor<'g>, b: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_add(self.ctx(), a.raw, b.raw))
    }
    pub(crate) fn reshape_2d(&mut self, x: Tensor<'g>, ne0: usize, ne1: usize) -> Tensor<'g> {
        op!(
            self,
            sys::ggml_reshape_2d(self.ctx(), x.raw, ne0 as i64, ne1 as i64)
        )
    }
    pub(crate) fn reshape_3d(
        &mut self,
        x: Tensor<'g>,
        ne0: usize,
        ne1: usize,
        ne2: usize,
    ) -> Tensor<'g> {
        op!(
            self,
            sys::ggml_reshape_3d(self.ctx(), x.raw, ne0 as i64, ne1 as i64, ne2 as i64)
        )
    }
    pub(crate) fn permute(&mut self, x: Tensor<'g>, axes: [i32; 4]) -> Tensor<'g> {
        op!(
            self,
            sys::ggml_permute(self.ctx(), x.raw, axes[0], axes[1], axes[2], axes[3])
        )
    }
    pub(crate) fn view_3d(
        &mut self,
        x: Tensor<'g>,
        ne: [usize; 3],
        nb: [usize; 2],
        offset: usize,
    ) -> Tensor<'g> {
        // ggml checks a view's contiguous size against its source, not the extent its strides
        // reach, so a view with wide strides could reach past it: check the extent here.
        assert!(
            ne.iter().all(|&d| i64::try_from(d).is_ok()),
            "view too large"
        );
        // SAFETY: `x` is a live tensor of this graph; both are pure computations over its
        // metadata and the sizes given.
        let (row, have) = unsafe {
            (
                sys::ggml_row_size((*x.raw).type_, ne[0] as i64),
                sys::ggml_nbytes(x.raw),
            )
        };
        let extent = if ne.contains(&0) {
            Some(offset)
        } else {
            (ne[1] - 1)
                .checked_mul(nb[0])
                .zip((ne[2] - 1).checked_mul(nb[1]))
                .and_then(|(a, b)| a.checked_add(b))
                .and_then(|strided| strided.checked_add(row))
                .and_then(|span| span.checked_add(offset))
        };
        assert!(
            extent.is_some_and(|end| end <= have),
            "view of {ne:?} with strides {nb:?} at {offset} reaches past its source's {have} bytes"
        );
        op!(
            self,
            sys::ggml_view_3d(
                self.ctx(),
                x.raw,
                ne[0] as i64,
                ne[1] as i64,
                ne[2] as i64,
                nb[0],
                nb[1],
                offset
            )
        )
    }
    /// `a` and `b` joined along dimension `dim` (the other dimensions must agree).
    pub(crate) fn concat(&mut self, a: Tensor<'g>, b: Tensor<'g>, dim: i32) -> Tensor<'g> {
        op!(self, sys::ggml_concat(self.ctx(), a.raw, b.raw, dim))
    }
    /// Writes row `i` of `src` (`[ne0, n]`, f32) into row `rows[i]` (i64 `[n]`) of `dst`
    /// (`[ne0, m]`), converting to `dst`'s type; returns a view of `dst`. The only op that
    /// writes into a tensor the graph did not make, hence a [`TensorMut`] destination.
    pub(crate) fn set_rows(
        &mut self,
        dst: TensorMut<'g>,
        src: Tensor<'g>,
        rows: Tensor<'g>,
    ) -> Tensor<'g> {
        op!(
            self,
            sys::ggml_set_rows(self.ctx(), dst.raw, src.raw, rows.raw)
        )
    }
    pub(crate) fn cont(&mut self, x: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_cont(self.ctx(), x.raw))
    }
    /// `softmax(x * scale + mask)` over `ne[0]`; `mask` (f16 or f32 `[ne0, ne1]`) broadcasts.
    pub(crate) fn soft_max(&mut self, x: Tensor<'g>, mask: Tensor<'g>, scale: f32) -> Tensor<'g> {
        op!(
            self,
            sys::ggml_soft_max_ext(self.ctx(), x.raw, mask.raw, scale, 0.0)
        )
    }
    pub(crate) fn swiglu(&mut self, gate: Tensor<'g>, up: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_swiglu_split(self.ctx(), gate.raw, up.raw))
    }
    /// Softmax over `ne[0]`, no mask, no scale.
    pub(crate) fn soft_max_plain(&mut self, x: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_soft_max(self.ctx(), x.raw))
    }
    /// The indices (i32) of the `k` largest values of each row, largest first.
    pub(crate) fn argsort_top_k(&mut self, x: Tensor<'g>, k: usize) -> Tensor<'g> {
        op!(self, sys::ggml_argsort_top_k(self.ctx(), x.raw, k as c_int))
    }
    /// `as` is `[k, m, n_as]` (a stack of matrices), `b` `[k, n_used, n]`, `ids` i32
    /// `[n_used, n]`: row `j` of column `t` is multiplied by matrix `ids[j, t]`. The result is
    /// `[m, n_used, n]`.
    pub(crate) fn mul_mat_id(
        &mut self,
        stack: Tensor<'g>,
        b: Tensor<'g>,
        ids: Tensor<'g>,
    ) -> Tensor<'g> {
        op!(
            self,
            sys::ggml_mul_mat_id(self.ctx(), stack.raw, b.raw, ids.raw)
        )
    }
    /// The sum of each row (`[1, ne1, ..]`).
    pub(crate) fn sum_rows(&mut self, x: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_sum_rows(self.ctx(), x.raw))
    }
    pub(crate) fn clamp(&mut self, x: Tensor<'g>, lo: f32, hi: f32) -> Tensor<'g> {
        op!(self, sys::ggml_clamp(self.ctx(), x.raw, lo, hi))
    }
    /// `a / b`, `b` broadcast.
    pub(crate) fn div(&mut self, a: Tensor<'g>, b: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_div(self.ctx(), a.raw, b.raw))
    }
    /// A two-dimensional view of `x`: `ne1` rows of `ne0` elements, `nb1` bytes apart, from
    /// byte `offset`.
    pub(crate) fn view_2d(
        &mut self,
        x: Tensor<'g>,
        ne0: usize,
        ne1: usize,
        nb1: usize,
        offset: usize,
    ) -> Tensor<'g> {
        op!(
            self,
            sys::ggml_view_2d(self.ctx(), x.raw, ne0 as i64, ne1 as i64, nb1, offset)
        )
    }
    /// `silu(a[..n/2]) * a[n/2..]` along the rows of `a`: gate and up fused in one tensor.
    pub(crate) fn swiglu_fused(&mut self, a: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_swiglu(self.ctx(), a.raw))
    }
    /// `x * s`.
    pub(crate) fn scale(&mut self, x: Tensor<'g>, s: f32) -> Tensor<'g> {
        op!(self, sys::ggml_scale(self.ctx(), x.raw, s))
    }
    /// `x * sigmoid(x)`, element-wise.
    pub(crate) fn silu(&mut self, x: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_silu(self.ctx(), x.raw))
    }
    /// GELU (tanh approximation, as ggml computes it), element-wise.
    pub(crate) fn gelu(&mut self, x: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_gelu(self.ctx(), x.raw))
    }
    /// `x` repeated to the shape `ne` (each dimension a multiple of `x`'s).
    pub(crate) fn repeat_4d(&mut self, x: Tensor<'g>, ne: [usize; 4]) -> Tensor<'g> {
        op!(
            self,
            sys::ggml_repeat_4d(
                self.ctx(),
                x.raw,
                ne[0] as i64,
                ne[1] as i64,
                ne[2] as i64,
                ne[3] as i64
            )
        )
    }
    pub(crate) fn tanh(&mut self, x: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_tanh(self.ctx(), x.raw))
    }

    /// Rotary embedding of `x` (`[head_dim, n_head, n_tokens]`) at `positions` (i32 `[n_tokens]`).
    pub(crate) fn rope(
        &mut self,
        x: Tensor<'g>,
        positions: Tensor<'g>,
        freq_factors: Option<Tensor<'g>>,
        p: &RopeParams,
    ) -> Tensor<'g> {
        let ff = freq_factors.map_or(std::ptr::null_mut(), |t| t.raw);
        op!(
            self,
            sys::ggml_rope_ext(
                self.ctx(),
                x.raw,
                positions.raw,
                ff,
                p.n_dims as c_int,
                p.mode,
                p.n_ctx_orig as c_int,
                p.freq_base,
                p.freq_scale,
                p.ext_factor,
                p.attn_factor,
                p.beta_fast,
                p.beta_slow,
            )
        )
    }
}

/// Parameters of ggml's rotary embedding.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RopeParams {
    pub n_dims: usize,
    /// 0 = normal (adjacent pairs), 2 = NeoX (halves).
    pub mode: i32,
    pub n_ctx_orig: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
}
