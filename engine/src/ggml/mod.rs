//! The engine's only door to ggml: safe owners over ggml's raw objects.
//!
//! Every `unsafe` call into `ggml_sys` lives in this module, and the types carry what makes the
//! calls sound, so the compiler checks it:
//!
//! - Owners free what they own in `Drop`, once.
//! - [`Weights`] hold the `Gguf` whose bytes their tensors point into; [`KvTensors`] own their
//!   memory. Handles to their tensors borrow the owner: [`RawTensor<'a>`] from `&'a Weights`,
//!   [`RawTensorMut<'a>`] from `&'a mut KvTensors`.
//! - A graph is branded with its own invariant lifetime `'g` ([`Graph<'g, 'w>`], [`Tensor<'g>`]),
//!   so its tensors cannot outlive it nor enter another graph; it lifts only handles borrowed for
//!   `'w`, which outlives the computation ([`Compute::run`]).
//! - Whatever writes tensor data takes `&mut`: the KV byte copies take `&mut KvTensors`, and the
//!   one op that writes a tensor the graph did not make ([`Graph::set_rows`]) needs a
//!   [`TensorMut`], lifted from a [`RawTensorMut`] that holds the pool's `&mut` borrow for the
//!   whole build and computation. Weights are never written, so they are shared between threads.
//!
//! Shapes are written in ggml order (`ne[0]` first, the contiguous dimension), the reverse of
//! PyTorch's.
//!
//! Parts: this file holds the owners shared by all (contexts, backend, buffers), the tensor
//! handles and ggml's type facts; [`weights`] the mapped model weights, [`kv_tensors`] the KV
//! page pool's tensors, [`graph`] graph building and computation.

#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::ptr::NonNull;

use ggml_sys as sys;

use crate::error::{Error, Result};

mod graph;
mod kv_tensors;
pub(crate) mod stage;
mod state_tensors;
mod weights;

pub(crate) use graph::{
    kernel_takes_model, Compute, Graph, IntegerSums, RopeParams, Tensor, TensorMut,
};
pub(crate) use kv_tensors::{KvTensors, KvTensorsMut};
pub(crate) use state_tensors::{StateTensors, StateTensorsMut};
pub(crate) use weights::{WeightSpec, Weights};

/// Element types the engine creates tensors of, mapped to ggml's type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DType {
    F32,
    F16,
    I32,
    I64,
}

impl DType {
    fn raw(self) -> sys::ggml_type {
        match self {
            DType::F32 => sys::GGML_TYPE_F32,
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

/// A ggml context in `no_alloc` mode: it holds tensor metadata only, in memory ggml allocates
/// (`'static`) or in an arena borrowed for `'m`.
struct Context<'m> {
    raw: NonNull<sys::ggml_context>,
    _arena: PhantomData<&'m mut [ArenaChunk]>,
}

/// One 16-byte unit of a metadata arena: ggml requires the arena `GGML_MEM_ALIGN`-aligned
/// (16 bytes on 64-bit targets) and asserts it.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct ArenaChunk([u8; 16]);

impl Context<'static> {
    /// A context with room for `n_tensors` tensors and `extra` bytes, allocated by ggml.
    fn new(n_tensors: usize, extra: usize) -> Result<Context<'static>> {
        // SAFETY: a null buffer makes ggml allocate (and later free) the arena itself.
        unsafe { Context::init(Context::arena_size(n_tensors, extra), std::ptr::null_mut()) }
    }
}

impl<'m> Context<'m> {
    fn arena_size(n_tensors: usize, extra: usize) -> usize {
        // SAFETY: a pure size computation.
        n_tensors * unsafe { sys::ggml_tensor_overhead() } + extra
    }

    /// A context whose metadata lives in `arena`, which it borrows exclusively until dropped.
    fn in_arena(arena: &'m mut [ArenaChunk]) -> Result<Context<'m>> {
        let size = std::mem::size_of_val(arena);
        // SAFETY: the arena is `size` bytes, 16-byte aligned, and borrowed mutably by the
        // returned context (`'m`), so nothing else touches it while ggml uses it; ggml does not
        // free memory it was given.
        unsafe { Context::init(size, arena.as_mut_ptr().cast()) }
    }

    /// # Safety
    /// `arena` is null (ggml allocates), or `mem_size` bytes of 16-byte aligned memory that
    /// stays valid and unused by anything else for `'m`.
    unsafe fn init(mem_size: usize, arena: *mut c_void) -> Result<Context<'m>> {
        init_logging();
        let params = sys::ggml_init_params {
            mem_size,
            mem_buffer: arena,
            no_alloc: true,
        };
        // SAFETY: the caller vouches for `arena`; null means ggml could not allocate.
        let raw = unsafe { sys::ggml_init(params) };
        NonNull::new(raw)
            .map(|raw| Context {
                raw,
                _arena: PhantomData,
            })
            .ok_or(Error::Ggml {
                what: "ggml_init returned no context",
            })
    }

    fn as_ptr(&self) -> *mut sys::ggml_context {
        self.raw.as_ptr()
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: created by ggml_init, freed exactly once here (ggml frees the arena only if it
        // allocated it).
        unsafe { sys::ggml_free(self.raw.as_ptr()) }
    }
}

/// A device from ggml's backend registry: the CPU, or a GPU of a backend compiled in (`cuda`,
/// `metal`). Registry devices are static objects that live as long as the process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Device(NonNull<sys::ggml_backend_device>);

// SAFETY: registry devices are immutable static descriptions; every call made on them here
// (names, buffer types, backend creation) is thread-safe in ggml.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Device {
    /// ggml's CPU device.
    pub(crate) fn cpu() -> Result<Device> {
        init_logging();
        // SAFETY: a registry lookup; null when absent.
        let raw = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
        NonNull::new(raw).map(Device).ok_or(Error::Ggml {
            what: "ggml has no CPU device",
        })
    }

    /// The GPUs ggml's compiled-in backends found, in registry order.
    pub(crate) fn gpus() -> Vec<Device> {
        init_logging();
        // SAFETY: registry enumeration; indices below the count are valid.
        let n = unsafe { sys::ggml_backend_dev_count() };
        (0..n)
            .filter_map(|i| {
                // SAFETY: `i` is below the registry's device count.
                NonNull::new(unsafe { sys::ggml_backend_dev_get(i) })
            })
            .filter(|d| {
                // SAFETY: a live registry device.
                let t = unsafe { sys::ggml_backend_dev_type(d.as_ptr()) };
                t == sys::GGML_BACKEND_DEVICE_TYPE_GPU || t == sys::GGML_BACKEND_DEVICE_TYPE_IGPU
            })
            .map(Device)
            .collect()
    }

    /// Whether this is the CPU.
    pub(crate) fn is_cpu(self) -> bool {
        // SAFETY: a live registry device.
        unsafe { sys::ggml_backend_dev_type(self.0.as_ptr()) == sys::GGML_BACKEND_DEVICE_TYPE_CPU }
    }

    /// The device's name and description, as ggml reports them (`CUDA0`, `NVIDIA H200`).
    pub(crate) fn describe(self) -> String {
        let text = |p: *const std::ffi::c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: ggml returns NUL-terminated strings owned by the static device.
                unsafe { std::ffi::CStr::from_ptr(p) }
                    .to_string_lossy()
                    .into_owned()
            }
        };
        // SAFETY: a live registry device.
        let (name, desc) = unsafe {
            (
                text(sys::ggml_backend_dev_name(self.0.as_ptr())),
                text(sys::ggml_backend_dev_description(self.0.as_ptr())),
            )
        };
        format!("{name} ({desc})")
    }

    /// The device's own buffer type (device memory for a GPU).
    fn buffer_type(self) -> Result<sys::ggml_backend_buffer_type_t> {
        // SAFETY: a live registry device; its buffer type is static.
        let buft = unsafe { sys::ggml_backend_dev_buffer_type(self.0.as_ptr()) };
        if buft.is_null() {
            return Err(Error::Ggml {
                what: "the device has no buffer type",
            });
        }
        Ok(buft)
    }
}

/// A ggml backend (a stream of computation on one device). One per context: ggml's CPU backend
/// keeps a work buffer and must not compute two graphs at once, so computing takes
/// `&mut Compute`, which owns its backends.
pub(crate) struct Backend(NonNull<sys::ggml_backend>);

// SAFETY: the backend has no thread affinity; it is only used through `&mut Compute`, and it is
// not `Sync`, so one thread at a time uses it.
unsafe impl Send for Backend {}

impl Backend {
    /// A CPU backend computing with `n_threads` threads.
    pub(crate) fn cpu(n_threads: usize) -> Result<Backend> {
        Backend::on(Device::cpu()?, n_threads)
    }

    /// A backend on `device`; `n_threads` applies to the CPU.
    pub(crate) fn on(device: Device, n_threads: usize) -> Result<Backend> {
        init_logging();
        // SAFETY: a live registry device; null means the backend could not start.
        let raw = unsafe { sys::ggml_backend_dev_init(device.0.as_ptr(), std::ptr::null()) };
        let backend = NonNull::new(raw).map(Backend).ok_or(Error::Ggml {
            what: "could not start a ggml backend",
        })?;
        // SAFETY: `raw` is a live backend; the thread count is set only on a CPU backend.
        unsafe {
            if sys::ggml_backend_is_cpu(backend.0.as_ptr()) {
                sys::ggml_backend_cpu_set_n_threads(backend.0.as_ptr(), n_threads.max(1) as c_int)
            }
        };
        Ok(backend)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: created by a ggml backend constructor, freed once.
        unsafe { sys::ggml_backend_free(self.0.as_ptr()) }
    }
}

/// An owned CPU backend buffer over memory it does not own (`ggml_backend_cpu_buffer_from_ptr`):
/// freeing it never reads nor frees that memory.
struct Buffer(NonNull<sys::ggml_backend_buffer>);

impl Buffer {
    /// Wraps `len` bytes at `base` as a CPU buffer.
    ///
    /// # Safety
    /// `base..base + len` stays valid for as long as any tensor placed in the buffer is used.
    unsafe fn from_memory(base: *mut u8, len: usize) -> Option<Buffer> {
        // ggml asserts (aborts on) a base that is not TENSOR_ALIGNMENT-aligned.
        if !(base as usize).is_multiple_of(BUFFER_ALIGN) {
            return None;
        }
        // SAFETY: aligned (checked); the caller vouches for the memory.
        let raw = unsafe { sys::ggml_backend_cpu_buffer_from_ptr(base.cast(), len) };
        NonNull::new(raw).map(Buffer)
    }
}

impl Buffer {
    /// Allocates device memory on `device` for every tensor of `ctx` and places them in it,
    /// zeroed; `None` when the device is out of memory.
    fn alloc_tensors(ctx: &Context<'_>, device: Device) -> Result<Option<Buffer>> {
        let buft = device.buffer_type()?;
        // SAFETY: a live context whose tensors have no buffer yet; ggml sizes and places them.
        let raw = unsafe { sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx.as_ptr(), buft) };
        let Some(raw) = NonNull::new(raw) else {
            return Ok(None);
        };
        // SAFETY: the buffer was just allocated and nothing reads it yet.
        unsafe { sys::ggml_backend_buffer_clear(raw.as_ptr(), 0) };
        Ok(Some(Buffer(raw)))
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: created by a ggml buffer constructor, freed once.
        unsafe { sys::ggml_backend_buffer_free(self.0.as_ptr()) }
    }
}

/// ggml's `TENSOR_ALIGNMENT`: the base of a CPU buffer over caller memory must be aligned to it.
const BUFFER_ALIGN: usize = 32;

/// A read-only handle to a weight tensor, borrowed from the [`Weights`] for `'a`: it cannot
/// outlive them, and [`Graph::lift`] takes it only into graphs that the borrow outlives. Graphs
/// never write through it ([`Graph::set_rows`] writes only into a [`RawTensorMut`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawTensor<'a> {
    ptr: NonNull<sys::ggml_tensor>,
    _owner: PhantomData<&'a ()>,
}

/// A handle to a KV tensor that a graph may write into, from [`KvTensors::tensors_mut`]: it
/// carries that `&'a mut` borrow, so nothing else reads or writes the pool while a graph holding
/// it is built and computed. Copies share the one exclusive borrow.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawTensorMut<'a> {
    ptr: NonNull<sys::ggml_tensor>,
    _owner: PhantomData<&'a mut ()>,
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

#[cfg(test)]
mod tests;

/// The instruction-set path that ggml's CPU backend and our kernels run in this process, chosen
/// when it started: the highest one the CPU runs, unless `LLAMA_HDD_CPU` names another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuPath {
    /// Its name: `x86-64`, `avx2`, `avx-vnni`, `avx512`, `avx512-vnni`; `native` or `portable`
    /// for a build of one path.
    pub name: &'static str,
    /// What became of `LLAMA_HDD_CPU`.
    pub request: CpuRequest,
}

/// What became of the path that `LLAMA_HDD_CPU` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuRequest {
    /// The variable is not set: the highest path the CPU runs is taken.
    NotSet,
    /// The named path is taken.
    Taken,
    /// No path has that name; the highest path the CPU runs is taken.
    Unknown,
    /// This CPU cannot run the named path (or the build has only one other); the highest path
    /// it runs is taken.
    NotRunnable,
}

/// The path this process runs (see [`CpuPath`]).
pub fn cpu_path() -> CpuPath {
    // SAFETY: plain calls without arguments that point anywhere; the name is a static
    // NUL-terminated string for the index the dispatcher returns.
    let (name, request) = unsafe {
        let raw = sys::cpu::ggml_sys_cpu_path_name(sys::cpu::ggml_sys_cpu_path());
        let name = if raw.is_null() {
            "unknown"
        } else {
            std::ffi::CStr::from_ptr(raw).to_str().unwrap_or("unknown")
        };
        (name, sys::cpu::ggml_sys_cpu_request())
    };
    let request = match request {
        0 => CpuRequest::NotSet,
        1 => CpuRequest::Taken,
        sys::cpu::REQUEST_UNKNOWN => CpuRequest::Unknown,
        _ => CpuRequest::NotRunnable,
    };
    CpuPath { name, request }
}
