//! The engine's only door to ggml: safe owners over ggml's raw objects.
//!
//! Every `unsafe` call into `ggml_sys` lives in this module. Owners free what they own in `Drop`;
//! a [`Tensor`] handle borrows the graph under construction (`'g`) so it cannot outlive it; model
//! weights and KV tensors live in contexts that the owning [`Weights`] or [`KvTensors`] frees.
//!
//! Shapes are written in ggml order (`ne[0]` first, the contiguous dimension), the reverse of
//! PyTorch's.

#![allow(unsafe_code)]

use std::ffi::{c_int, c_void, CString};
use std::marker::PhantomData;
use std::ptr::NonNull;

use ggml_sys as sys;

use crate::error::{Error, Result};

/// Element types the engine creates tensors of, mapped to ggml's type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DType {
    F16,
    I32,
    I64,
}

impl DType {
    fn raw(self) -> sys::ggml_type {
        match self {
            DType::F16 => sys::GGML_TYPE_F16,
            DType::I32 => sys::GGML_TYPE_I32,
            DType::I64 => sys::GGML_TYPE_I64,
        }
    }
}

/// Quiets ggml's own logging unless `LLAMA_HDD_GGML_LOG` is set (ggml prints to stderr).
fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("LLAMA_HDD_GGML_LOG").is_none() {
            unsafe extern "C" fn quiet(
                _level: sys::ggml_log_level,
                _text: *const std::ffi::c_char,
                _user: *mut c_void,
            ) {
            }
            // SAFETY: installs a callback with the signature ggml expects; it ignores its
            // arguments and so cannot misuse them.
            unsafe { sys::ggml_log_set(Some(quiet), std::ptr::null_mut()) };
        }
    });
}

/// A ggml context in `no_alloc` mode: it holds tensor metadata only.
struct Context(NonNull<sys::ggml_context>);

impl Context {
    fn new(n_tensors: usize, extra: usize) -> Result<Context> {
        Context::with_arena(Context::arena_size(n_tensors, extra), std::ptr::null_mut())
    }

    fn arena_size(n_tensors: usize, extra: usize) -> usize {
        // SAFETY: a pure size computation.
        n_tensors * unsafe { sys::ggml_tensor_overhead() } + extra
    }

    /// A context whose metadata lives in `arena` (`mem_size` bytes, 16-byte aligned, owned by
    /// the caller and kept alive and unused elsewhere until the context is dropped), or in
    /// memory ggml allocates when `arena` is null.
    fn with_arena(mem_size: usize, arena: *mut c_void) -> Result<Context> {
        init_logging();
        let params = sys::ggml_init_params {
            mem_size,
            mem_buffer: arena,
            no_alloc: true,
        };
        // SAFETY: ggml allocates the metadata arena itself; null means out of memory.
        let raw = unsafe { sys::ggml_init(params) };
        NonNull::new(raw).map(Context).ok_or(Error::Ggml {
            what: "ggml_init returned no context",
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: created by ggml_init, freed exactly once here.
        unsafe { sys::ggml_free(self.0.as_ptr()) }
    }
}

/// A ggml CPU backend with its thread count. One per session: ggml's CPU backend keeps a work
/// buffer and must not compute two graphs at once.
pub(crate) struct Backend(NonNull<sys::ggml_backend>);

// SAFETY: the backend is used by one thread at a time (it is owned by a session, which needs
// `&mut self` to compute); moving it between threads is allowed by ggml.
unsafe impl Send for Backend {}

impl Backend {
    /// A CPU backend computing with `n_threads` threads.
    pub(crate) fn cpu(n_threads: usize) -> Result<Backend> {
        init_logging();
        // SAFETY: plain constructor; null means it failed.
        let raw = unsafe { sys::ggml_backend_cpu_init() };
        let backend = NonNull::new(raw).map(Backend).ok_or(Error::Ggml {
            what: "could not start ggml's CPU backend",
        })?;
        // SAFETY: `raw` is a live CPU backend.
        unsafe {
            sys::ggml_backend_cpu_set_n_threads(backend.0.as_ptr(), n_threads.max(1) as c_int)
        };
        Ok(backend)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: created by ggml_backend_cpu_init, freed once.
        unsafe { sys::ggml_backend_free(self.0.as_ptr()) }
    }
}

/// An owned backend buffer.
struct Buffer(NonNull<sys::ggml_backend_buffer>);

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: created by a ggml buffer constructor, freed once.
        unsafe { sys::ggml_backend_buffer_free(self.0.as_ptr()) }
    }
}

/// A handle to a tensor of a long-lived context (weights or KV). Valid while its owner lives;
/// the owner hands these out only to graphs built while it is borrowed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawTensor(NonNull<sys::ggml_tensor>);

// SAFETY: weight and KV tensors are plain metadata pointing at memory that outlives them; they
// are only read concurrently (weights) or mutated under `&mut` of their session (KV).
unsafe impl Send for RawTensor {}
// SAFETY: as above.
unsafe impl Sync for RawTensor {}

/// Model weights: tensor metadata in one context, data left in place in the memory-mapped file.
pub(crate) struct Weights {
    tensors: Vec<RawTensor>,
    _buffer: Buffer,
    _ctx: Context,
}

// SAFETY: after loading, weights are read-only; ggml's CPU kernels only read them.
unsafe impl Send for Weights {}
// SAFETY: as above.
unsafe impl Sync for Weights {}

/// Describes one weight tensor for [`Weights::map`].
pub(crate) struct WeightSpec<'a> {
    pub name: &'a str,
    pub ggml_type: u32,
    pub shape: &'a [u64],
    /// Byte offset of the tensor's data within the mapped bytes.
    pub offset: usize,
    pub n_bytes: usize,
}

impl Weights {
    /// Wraps `mapped` (the whole model file, mapped read-only) as a ggml CPU buffer and points
    /// one tensor per spec at its bytes, without copying.
    ///
    /// The caller keeps `mapped` alive, unmodified, for as long as the returned value lives.
    pub(crate) fn map(mapped: &[u8], specs: &[WeightSpec<'_>]) -> Result<Weights> {
        let ctx = Context::new(specs.len() + 1, 0)?;
        // SAFETY: ggml only reads weight buffers (no op writes into its sources); the pointer is
        // cast to `*mut` because the constructor's signature is shared with writable buffers.
        let raw = unsafe {
            sys::ggml_backend_cpu_buffer_from_ptr(mapped.as_ptr() as *mut c_void, mapped.len())
        };
        let buffer = NonNull::new(raw).map(Buffer).ok_or(Error::Ggml {
            what: "could not wrap the model's memory",
        })?;
        // SAFETY: live buffer; usage is a hint for schedulers.
        unsafe {
            sys::ggml_backend_buffer_set_usage(
                buffer.0.as_ptr(),
                sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
            )
        };
        let mut tensors = Vec::with_capacity(specs.len());
        for spec in specs {
            if spec.shape.is_empty() || spec.shape.len() > 4 {
                return Err(Error::BadTensor {
                    name: spec.name.to_owned(),
                    reason: format!("{} dimensions", spec.shape.len()),
                });
            }
            let ne: Vec<i64> = spec.shape.iter().map(|&d| d as i64).collect();
            // SAFETY: the type id was validated by the GGUF reader; shape has 1-4 positive dims.
            let t = unsafe {
                sys::ggml_new_tensor(
                    ctx.0.as_ptr(),
                    spec.ggml_type,
                    ne.len() as c_int,
                    ne.as_ptr(),
                )
            };
            let t = NonNull::new(t).ok_or(Error::Ggml {
                what: "weight context is full",
            })?;
            // SAFETY: `t` is live; ggml_nbytes is a pure computation over its metadata.
            let need = unsafe { sys::ggml_nbytes(t.as_ptr()) };
            if need != spec.n_bytes
                || spec
                    .offset
                    .checked_add(need)
                    .is_none_or(|end| end > mapped.len())
            {
                return Err(Error::BadTensor {
                    name: spec.name.to_owned(),
                    reason: format!(
                        "needs {need} bytes at offset {}, file has {} bytes for it",
                        spec.offset, spec.n_bytes
                    ),
                });
            }
            let name = CString::new(spec.name).map_err(|_| Error::BadTensor {
                name: spec.name.to_owned(),
                reason: "NUL in name".into(),
            })?;
            // SAFETY: the address lies inside the buffer with `need` bytes after it (checked
            // above); the name is NUL-terminated and ggml copies it.
            unsafe {
                sys::ggml_set_name(t.as_ptr(), name.as_ptr());
                let status = sys::ggml_backend_tensor_alloc(
                    buffer.0.as_ptr(),
                    t.as_ptr(),
                    mapped.as_ptr().add(spec.offset) as *mut c_void,
                );
                if status != sys::GGML_STATUS_SUCCESS {
                    return Err(Error::BadTensor {
                        name: spec.name.to_owned(),
                        reason: "misaligned data".into(),
                    });
                }
            }
            tensors.push(RawTensor(t));
        }
        Ok(Weights {
            tensors,
            _buffer: buffer,
            _ctx: ctx,
        })
    }

    /// The tensor made from `specs[index]`.
    pub(crate) fn get(&self, index: usize) -> RawTensor {
        self.tensors[index]
    }
}

/// Per-layer K and V tensors of a KV page pool, each `[row_bytes / 2, n_cells]` in f16 (one row
/// per cell, token-major), in one CPU buffer over anonymous memory.
///
/// The memory is mapped anonymously, so the kernel hands out zeroed pages on first touch: a large
/// pool costs address space, not RAM, until its cells are used, and never-written cells read as
/// zeros (finite, so masked attention over them stays defined).
pub(crate) struct KvTensors {
    k: Vec<RawTensor>,
    v: Vec<RawTensor>,
    _buffer: Buffer,
    _ctx: Context,
    /// Declared after the buffer that points into it, so it is unmapped last.
    _memory: memmap2::MmapMut,
}

// SAFETY: owned by one context; mutated only through `&mut self` or graphs run under it.
unsafe impl Send for KvTensors {}

/// Alignment of each tensor inside the pool's memory (ggml's CPU buffers need 32).
const KV_TENSOR_ALIGN: usize = 64;

impl KvTensors {
    /// Allocates `n_layers` pairs of f16 tensors of `n_cells` rows with `k_dims[l]`/`v_dims[l]`
    /// elements per row.
    pub(crate) fn new(k_dims: &[usize], v_dims: &[usize], n_cells: usize) -> Result<KvTensors> {
        let ctx = Context::new(2 * k_dims.len() + 1, 0)?;
        let sizes: Vec<usize> = k_dims
            .iter()
            .chain(v_dims)
            .map(|&d| (d * 2 * n_cells).next_multiple_of(KV_TENSOR_ALIGN))
            .collect();
        let total = sizes.iter().sum::<usize>().max(KV_TENSOR_ALIGN);
        let mut memory = memmap2::MmapMut::map_anon(total)
            .map_err(|_| Error::OutOfMemory { what: "KV cache" })?;
        // SAFETY: the mapping is page-aligned, `total` bytes long, and outlives the buffer
        // (field order of `KvTensors`).
        let raw = unsafe {
            sys::ggml_backend_cpu_buffer_from_ptr(memory.as_mut_ptr().cast(), memory.len())
        };
        let buffer = NonNull::new(raw)
            .map(Buffer)
            .ok_or(Error::OutOfMemory { what: "KV cache" })?;
        let base = memory.as_mut_ptr();
        let mut offset = 0usize;
        let mut tensors = Vec::with_capacity(sizes.len());
        for (&dims, &size) in k_dims.iter().chain(v_dims).zip(&sizes) {
            // SAFETY: live context with room for every tensor (counted above).
            let t = unsafe {
                sys::ggml_new_tensor_2d(
                    ctx.0.as_ptr(),
                    sys::GGML_TYPE_F16,
                    dims as i64,
                    n_cells as i64,
                )
            };
            let t = NonNull::new(t).ok_or(Error::Ggml {
                what: "KV context is full",
            })?;
            // SAFETY: `offset + size <= total` by construction, and `size` covers the tensor's
            // bytes; the address is 64-byte aligned within the page-aligned mapping.
            let status = unsafe {
                sys::ggml_backend_tensor_alloc(
                    buffer.0.as_ptr(),
                    t.as_ptr(),
                    base.add(offset).cast(),
                )
            };
            if status != sys::GGML_STATUS_SUCCESS {
                return Err(Error::Ggml {
                    what: "could not place a KV tensor",
                });
            }
            offset += size;
            tensors.push(RawTensor(t));
        }
        let v = tensors.split_off(k_dims.len());
        Ok(KvTensors {
            k: tensors,
            v,
            _buffer: buffer,
            _ctx: ctx,
            _memory: memory,
        })
    }

    pub(crate) fn k(&self, layer: usize) -> RawTensor {
        self.k[layer]
    }

    pub(crate) fn v(&self, layer: usize) -> RawTensor {
        self.v[layer]
    }

    fn tensor(&self, layer: usize, value: bool) -> RawTensor {
        if value {
            self.v[layer]
        } else {
            self.k[layer]
        }
    }

    /// Copies `out.len()` bytes starting at byte `offset` of layer `layer`'s K (or V) tensor.
    pub(crate) fn read(&self, layer: usize, value: bool, offset: usize, out: &mut [u8]) {
        let t = self.tensor(layer, value);
        // SAFETY: live tensor; the range is inside it (asserted), and ggml copies bytes.
        unsafe {
            assert!(offset + out.len() <= sys::ggml_nbytes(t.0.as_ptr()));
            sys::ggml_backend_tensor_get(t.0.as_ptr(), out.as_mut_ptr().cast(), offset, out.len())
        }
    }

    /// Writes `data` at byte `offset` of layer `layer`'s K (or V) tensor.
    pub(crate) fn write(&mut self, layer: usize, value: bool, offset: usize, data: &[u8]) {
        let t = self.tensor(layer, value);
        // SAFETY: live tensor; the range is inside it (asserted), and ggml copies bytes.
        unsafe {
            assert!(offset + data.len() <= sys::ggml_nbytes(t.0.as_ptr()));
            sys::ggml_backend_tensor_set(t.0.as_ptr(), data.as_ptr().cast(), offset, data.len())
        }
    }

    /// Copies `len` bytes at `from` to `to` within layer `layer`'s K (or V) tensor (ranges must
    /// not overlap).
    pub(crate) fn copy_within(
        &mut self,
        layer: usize,
        value: bool,
        from: usize,
        to: usize,
        len: usize,
    ) {
        let t = self.tensor(layer, value);
        // SAFETY: live CPU tensor whose data pointer covers `ggml_nbytes` bytes; both ranges
        // lie inside it and do not overlap (asserted).
        unsafe {
            let n = sys::ggml_nbytes(t.0.as_ptr());
            assert!(from + len <= n && to + len <= n && (from + len <= to || to + len <= from));
            let data = (*t.0.as_ptr()).data.cast::<u8>();
            std::ptr::copy_nonoverlapping(data.add(from), data.add(to), len);
        }
    }
}

/// Builds and runs graphs on one backend, reusing the compute buffer between runs.
pub(crate) struct Compute {
    galloc: NonNull<sys::ggml_gallocr>,
    /// Metadata arena reused by every graph: a fresh allocation per token would cost page
    /// faults on each decode step.
    arena: Vec<u128>,
}

// SAFETY: owned by one session and used under `&mut self`.
unsafe impl Send for Compute {}

impl Drop for Compute {
    fn drop(&mut self) {
        // SAFETY: created by ggml_gallocr_new, freed once.
        unsafe { sys::ggml_gallocr_free(self.galloc.as_ptr()) }
    }
}

/// The largest graph we build (nodes).
const MAX_NODES: usize = 8192;

impl Compute {
    pub(crate) fn new() -> Result<Compute> {
        // SAFETY: the CPU buffer type is a static object.
        let galloc = unsafe { sys::ggml_gallocr_new(sys::ggml_backend_cpu_buffer_type()) };
        NonNull::new(galloc)
            .map(|galloc| Compute {
                galloc,
                arena: Vec::new(),
            })
            .ok_or(Error::Ggml {
                what: "could not create a graph allocator",
            })
    }

    /// Builds a graph with `build`, allocates it, uploads its inputs, computes it on `backend`
    /// and returns the f32 contents of the output tensor that `build` returned.
    pub(crate) fn run<F>(&mut self, backend: &Backend, build: F) -> Result<Vec<f32>>
    where
        F: for<'g> FnOnce(&mut Graph<'g>) -> Result<Tensor<'g>>,
    {
        // SAFETY: a pure size computation.
        let extra = unsafe { sys::ggml_graph_overhead_custom(MAX_NODES, false) };
        let size = Context::arena_size(MAX_NODES, extra);
        if self.arena.len() * 16 < size {
            self.arena = vec![0u128; size.div_ceil(16)];
        }
        // The arena outlives `ctx` (dropped at the end of this call) and nothing else uses it
        // meanwhile: `run` holds `&mut self`.
        let ctx = Context::with_arena(size, self.arena.as_mut_ptr().cast())?;
        // SAFETY: the context has room for a graph of MAX_NODES nodes.
        let graph = unsafe { sys::ggml_new_graph_custom(ctx.0.as_ptr(), MAX_NODES, false) };
        let graph = NonNull::new(graph).ok_or(Error::Ggml {
            what: "graph context is full",
        })?;
        let mut g = Graph {
            ctx: &ctx,
            graph,
            inputs: Vec::new(),
            _lt: PhantomData,
        };
        let out = build(&mut g)?;
        let inputs = std::mem::take(&mut g.inputs);
        // SAFETY: the graph, its tensors and the allocator are live; inputs were created by this
        // graph with exactly the byte sizes of their data (checked in `Graph::input`); the output
        // is an f32 tensor whose bytes are read after the computation finished.
        unsafe {
            sys::ggml_set_output(out.raw);
            sys::ggml_build_forward_expand(graph.as_ptr(), out.raw);
            if !sys::ggml_gallocr_alloc_graph(self.galloc.as_ptr(), graph.as_ptr()) {
                return Err(Error::OutOfMemory {
                    what: "compute buffer",
                });
            }
            for (t, bytes) in &inputs {
                sys::ggml_backend_tensor_set(*t, bytes.as_ptr().cast(), 0, bytes.len());
            }
            let status = sys::ggml_backend_graph_compute(backend.0.as_ptr(), graph.as_ptr());
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

/// A graph under construction. Tensors made here are valid until the graph is computed.
pub(crate) struct Graph<'g> {
    ctx: &'g Context,
    graph: NonNull<sys::ggml_cgraph>,
    inputs: Vec<(*mut sys::ggml_tensor, Vec<u8>)>,
    _lt: PhantomData<&'g ()>,
}

/// A tensor of a graph under construction.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tensor<'g> {
    raw: *mut sys::ggml_tensor,
    _lt: PhantomData<&'g ()>,
}

impl<'g> Tensor<'g> {
    /// Size of dimension `i` (ggml order).
    pub(crate) fn ne(&self, i: usize) -> usize {
        // SAFETY: the tensor is live for 'g; `ne` has four entries and the index is clamped
        // to 3.
        unsafe { (*self.raw).ne[i.min(3)] as usize }
    }
}

macro_rules! op {
    ($self:ident, $call:expr) => {{
        // SAFETY: every operand is a live tensor of this graph's context or of a long-lived
        // owner (weights, KV) that outlives the graph; ggml checks shapes and aborts on misuse,
        // which the model code prevents by construction (shapes come from validated hparams).
        let raw = unsafe { $call };
        debug_assert!(!raw.is_null());
        Tensor {
            raw,
            _lt: PhantomData,
        }
    }};
}

impl<'g> Graph<'g> {
    fn ctx(&self) -> *mut sys::ggml_context {
        self.ctx.0.as_ptr()
    }

    /// Brings a long-lived tensor (weight or KV) into this graph.
    pub(crate) fn lift(&self, t: RawTensor) -> Tensor<'g> {
        Tensor {
            raw: t.0.as_ptr(),
            _lt: PhantomData,
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
    pub(crate) fn rms_norm(&mut self, x: Tensor<'g>, eps: f32) -> Tensor<'g> {
        op!(self, sys::ggml_rms_norm(self.ctx(), x.raw, eps))
    }
    pub(crate) fn mul(&mut self, a: Tensor<'g>, b: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_mul(self.ctx(), a.raw, b.raw))
    }
    pub(crate) fn add(&mut self, a: Tensor<'g>, b: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_add(self.ctx(), a.raw, b.raw))
    }
    /// `w` is `[k, m]`, `x` is `[k, n]`: the result is `[m, n]`.
    pub(crate) fn mul_mat(&mut self, w: Tensor<'g>, x: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_mul_mat(self.ctx(), w.raw, x.raw))
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
    /// (`[ne0, m]`), converting to `dst`'s type; returns a view of `dst`.
    pub(crate) fn set_rows(
        &mut self,
        dst: Tensor<'g>,
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

    /// Attention with ggml's fused kernel. `q`: `[head_dim, n_tokens, n_head]`, `k`/`v`:
    /// `[head_dim, n_kv, n_head_kv]` (f16), `mask`: f16 `[n_kv, n_tokens]`. The result is
    /// `[head_dim, n_head, n_tokens]`.
    pub(crate) fn flash_attn(
        &mut self,
        q: Tensor<'g>,
        k: Tensor<'g>,
        v: Tensor<'g>,
        mask: Tensor<'g>,
        scale: f32,
    ) -> Tensor<'g> {
        let t = op!(
            self,
            sys::ggml_flash_attn_ext(self.ctx(), q.raw, k.raw, v.raw, mask.raw, scale, 0.0, 0.0)
        );
        // SAFETY: live flash-attention node.
        unsafe { sys::ggml_flash_attn_ext_set_prec(t.raw, sys::GGML_PREC_F32) };
        t
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

/// Whether ggml knows `ggml_type` and can compute with it on the CPU.
pub(crate) fn type_is_supported(ggml_type: u32) -> bool {
    if ggml_type >= sys::GGML_TYPE_COUNT {
        return false;
    }
    // SAFETY: type id is in range.
    let traits = unsafe { &*sys::ggml_get_type_traits(ggml_type) };
    traits.blck_size > 0 && traits.type_size > 0
}

/// What ggml says about a tensor type: its block size, bytes per block and name, and what the
/// CPU backend can do with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TypeFacts {
    pub block_size: u64,
    pub type_size: u64,
    pub name: String,
    /// Usable as the weight of a matrix multiplication (the CPU has a dot product for it).
    pub matmul_weight: bool,
    /// Convertible to f32 (what `get_rows` needs of an embedding table).
    pub to_float: bool,
}

/// ggml's facts about `ggml_type`; `None` for codes ggml does not know or no longer supports.
pub(crate) fn type_facts(ggml_type: u32) -> Option<TypeFacts> {
    if ggml_type >= sys::GGML_TYPE_COUNT {
        return None;
    }
    // SAFETY: the type id is in range; both tables are static arrays indexed by it.
    let (traits, cpu) = unsafe {
        (
            &*sys::ggml_get_type_traits(ggml_type),
            &*sys::ggml_get_type_traits_cpu(ggml_type),
        )
    };
    if traits.blck_size <= 0 || traits.type_size == 0 || traits.type_name.is_null() {
        return None;
    }
    // SAFETY: ggml's type names are static NUL-terminated strings.
    let name = unsafe { std::ffi::CStr::from_ptr(traits.type_name) };
    Some(TypeFacts {
        block_size: traits.blck_size as u64,
        type_size: traits.type_size as u64,
        name: name.to_string_lossy().into_owned(),
        matmul_weight: cpu.vec_dot.is_some(),
        to_float: traits.to_float.is_some() || ggml_type == sys::GGML_TYPE_F32,
    })
}
