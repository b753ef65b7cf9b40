//! Model weights mapped in place: ggml tensors pointing into the GGUF file's bytes, which the
//! weights hold; the tensors of offloaded layers are copied once into device memory.

use std::ffi::{c_int, CString};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use ggml_sys as sys;

use super::{type_facts, Buffer, Context, Device, RawTensor};
use crate::error::{Error, Result};
use crate::gguf::Gguf;

/// Model weights: tensor metadata in one context, data left in place in the GGUF file's bytes,
/// which the weights hold, so the tensors cannot outlive the memory they point into.
pub(crate) struct Weights {
    tensors: Vec<NonNull<sys::ggml_tensor>>,
    _buffer: Buffer,
    _ctx: Context<'static>,
    /// The device memory and metadata of the tensors placed on a device, if any.
    _device: Option<(Buffer, Context<'static>)>,
    /// Repacked copies of matrix weights (see [`repack`]), if any.
    _repacked: Option<(Buffer, Context<'static>)>,
    /// Owner of the bytes the tensors point into. Behind an `Arc` the `Gguf` never moves, and
    /// it has no `&mut` method, so its bytes neither move nor change while it is held here.
    /// (No drop order matters: freeing the buffer or the context never touches these bytes.)
    _gguf: Arc<Gguf>,
}

// SAFETY: after `map` returns, nothing writes weight tensors: no `Weights` method takes
// `&mut self`; graphs take them as sources only (`RawTensor`; `set_rows` writes only into a
// `RawTensorMut`); `Compute::run` refuses a lifted tensor as its output (marking it would set its
// flags); every weight has a non-empty name (checked in `map`), so building a graph never names
// it; and ggml's CPU kernels read sources without modifying their data or metadata. So sharing
// them between threads is sharing read-only memory.
unsafe impl Send for Weights {}
// SAFETY: as above.
unsafe impl Sync for Weights {}

/// Describes one weight tensor for [`Weights::map`].
pub(crate) struct WeightSpec<'a> {
    pub name: &'a str,
    pub ggml_type: u32,
    pub shape: &'a [u64],
    /// Byte offset of the tensor's data within the file.
    pub offset: usize,
    pub n_bytes: usize,
    /// Copied into the device's memory at load instead of read where it lies.
    pub on_device: bool,
    /// Used only as a matrix-multiplication weight: when the model runs on the CPU alone and
    /// ggml has a repacked layout for its type and shape, a repacked copy is used instead.
    pub matmul_only: bool,
}

impl WeightSpec<'_> {
    /// The shape in ggml's `i64`, after checking everything `ggml_new_tensor` assumes: 1 to 4
    /// dimensions, a type ggml knows, rows a whole number of blocks, and `n_bytes` equal to the
    /// size computed without overflow (so ggml's own size arithmetic cannot overflow either).
    pub(super) fn checked_ne(&self) -> Result<Vec<i64>> {
        let bad = |reason: String| Error::BadTensor {
            name: self.name.to_owned(),
            reason,
        };
        if self.shape.is_empty() || self.shape.len() > 4 {
            return Err(bad(format!("{} dimensions", self.shape.len())));
        }
        let facts = type_facts(self.ggml_type)
            .ok_or_else(|| bad(format!("unknown ggml type {}", self.ggml_type)))?;
        let ne0 = self.shape[0];
        let size = ne0
            .is_multiple_of(facts.block_size)
            .then(|| (ne0 / facts.block_size).checked_mul(facts.type_size))
            .flatten()
            .and_then(|row| {
                self.shape[1..]
                    .iter()
                    .try_fold(row, |acc, &d| acc.checked_mul(d))
            });
        if size != Some(self.n_bytes as u64) {
            return Err(bad(format!(
                "shape {:?} of type {} does not make {} bytes",
                self.shape, facts.name, self.n_bytes
            )));
        }
        self.shape
            .iter()
            .map(|&d| i64::try_from(d).map_err(|_| bad(format!("dimension {d} too large"))))
            .collect()
    }
}

impl Weights {
    /// Wraps the bytes of `gguf` (the whole model file) as a ggml CPU buffer and points one
    /// tensor per spec at its bytes, without copying; specs marked `on_device` are copied once
    /// into `device`'s memory instead, and with `repack_weights` (and no device) matrix weights
    /// ggml can repack get a repacked copy ([`repack`]). The weights keep `gguf` alive.
    pub(crate) fn map(
        gguf: Arc<Gguf>,
        specs: &[WeightSpec<'_>],
        device: Option<Device>,
        repack_weights: bool,
    ) -> Result<Weights> {
        let (base, len) = gguf.raw_memory();
        let ctx = Context::new(specs.len() + 1, 0)?;
        let n_device = specs.iter().filter(|s| s.on_device).count();
        let device = device.filter(|_| n_device > 0);
        let dev_ctx = match device {
            Some(_) => Some(Context::new(n_device + 1, 0)?),
            None => None,
        };
        // SAFETY: the memory (the file's read-only map, or its bytes) is owned by `gguf`, which
        // the returned value holds (in an `Arc`, with no way to mutate it) for as long as the
        // tensors placed in the buffer exist. The pointer is cast to `*mut` only because the
        // constructor is shared with writable buffers: ggml never writes weight tensors (see
        // the `Sync` impl above). Only ggml reads it; no Rust reference is made into it.
        let buffer = unsafe { Buffer::from_memory(base.cast_mut(), len) }.ok_or(Error::Ggml {
            what: "could not wrap the model's memory (its start is not 32-byte aligned)",
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
            let ne = spec.checked_ne()?;
            if spec
                .offset
                .checked_add(spec.n_bytes)
                .is_none_or(|end| end > len)
            {
                return Err(Error::BadTensor {
                    name: spec.name.to_owned(),
                    reason: format!(
                        "{} bytes at offset {} run past the file's {} bytes",
                        spec.n_bytes, spec.offset, len
                    ),
                });
            }
            if spec.name.is_empty() {
                // ggml names unnamed leaves when a graph reaches them: a write into tensors that
                // other threads read.
                return Err(Error::BadTensor {
                    name: String::new(),
                    reason: "empty name".into(),
                });
            }
            let name = CString::new(spec.name).map_err(|_| Error::BadTensor {
                name: spec.name.to_owned(),
                reason: "NUL in name".into(),
            })?;
            let home = match &dev_ctx {
                Some(dev) if spec.on_device => dev,
                _ => &ctx,
            };
            // SAFETY: live context with room for every spec (counted above); the type is one
            // ggml knows and the 1-4 dimensions were checked by `checked_ne`.
            let t = unsafe {
                sys::ggml_new_tensor(
                    home.as_ptr(),
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
            if need != spec.n_bytes {
                return Err(Error::BadTensor {
                    name: spec.name.to_owned(),
                    reason: format!("ggml sizes it {need} bytes, the file {}", spec.n_bytes),
                });
            }
            // SAFETY: live tensor; the name is NUL-terminated and ggml copies it.
            unsafe { sys::ggml_set_name(t.as_ptr(), name.as_ptr()) };
            if dev_ctx.is_some() && spec.on_device {
                // Placed and uploaded below, once the device buffer exists.
                tensors.push(t);
                continue;
            }
            // SAFETY: `offset + need <= len` (checked above), so the address lies in
            // the buffer with the tensor's bytes after it.
            let status = unsafe {
                sys::ggml_backend_tensor_alloc(
                    buffer.0.as_ptr(),
                    t.as_ptr(),
                    base.add(spec.offset).cast_mut().cast(),
                )
            };
            if status != sys::GGML_STATUS_SUCCESS {
                return Err(Error::BadTensor {
                    name: spec.name.to_owned(),
                    reason: "ggml could not place it in the model's buffer".into(),
                });
            }
            tensors.push(t);
        }
        let device_part = match (device, dev_ctx) {
            (Some(device), Some(dev_ctx)) => Some(upload(device, dev_ctx, specs, &tensors, base)?),
            _ => None,
        };
        let repacked = match (device, repack_weights) {
            (None, true) => repack(specs, &mut tensors, base)?,
            _ => None,
        };
        Ok(Weights {
            tensors,
            _buffer: buffer,
            _ctx: ctx,
            _device: device_part,
            _repacked: repacked,
            _gguf: gguf,
        })
    }

    /// The tensor made from `specs[index]`, borrowed from the weights.
    pub(crate) fn get(&self, index: usize) -> RawTensor<'_> {
        RawTensor {
            ptr: self.tensors[index],
            _owner: PhantomData,
        }
    }
}

/// Allocates the device buffer for the tensors `dev_ctx` holds (`tensors` has one per spec, those
/// of the specs marked `on_device` made in `dev_ctx`) and copies each one's bytes from the
/// model's memory at `base` (every spec's range checked to lie within it by [`Weights::map`]).
fn upload(
    device: Device,
    dev_ctx: Context<'static>,
    specs: &[WeightSpec<'_>],
    tensors: &[NonNull<sys::ggml_tensor>],
    base: *const u8,
) -> Result<(Buffer, Context<'static>)> {
    let dev_buffer = Buffer::alloc_tensors(&dev_ctx, device)?.ok_or(Error::OutOfMemory {
        what: "device memory for the offloaded weights",
    })?;
    // SAFETY: live buffer; usage tells the scheduler to run ops on these weights'
    // device.
    unsafe {
        sys::ggml_backend_buffer_set_usage(
            dev_buffer.0.as_ptr(),
            sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
        )
    };
    for (spec, t) in specs.iter().zip(tensors) {
        if spec.on_device {
            // SAFETY: the tensor was placed in the device buffer, and its size is
            // `n_bytes` (checked against ggml_nbytes by `Weights::map`); the source range lies
            // in the file's bytes (checked there too). The copy completes before the
            // call returns.
            unsafe {
                sys::ggml_backend_tensor_set(
                    t.as_ptr(),
                    base.add(spec.offset).cast(),
                    0,
                    spec.n_bytes,
                )
            };
        }
    }
    Ok((dev_buffer, dev_ctx))
}

/// ggml's CPU buffer type whose tensors hold weights in an interleaved ("repacked") layout that
/// its faster matrix kernels read (`CPU_REPACK`), if this build has it.
fn repack_buffer_type() -> Option<sys::ggml_backend_buffer_type_t> {
    // SAFETY: the CPU registry and its device are static objects. The procedure named
    // `ggml_backend_dev_get_extra_bufts` has the signature `ggml_backend_dev_get_extra_bufts_t`
    // (device -> NULL-terminated array of buffer types); the array is static.
    unsafe {
        let reg = sys::ggml_backend_cpu_reg();
        if reg.is_null() || sys::ggml_backend_reg_dev_count(reg) == 0 {
            return None;
        }
        let dev = sys::ggml_backend_reg_dev_get(reg, 0);
        let f = sys::ggml_backend_reg_get_proc_address(
            reg,
            c"ggml_backend_dev_get_extra_bufts".as_ptr(),
        );
        if dev.is_null() || f.is_null() {
            return None;
        }
        type ExtraBufts =
            unsafe extern "C" fn(sys::ggml_backend_dev_t) -> *mut sys::ggml_backend_buffer_type_t;
        let extra_bufts: ExtraBufts = std::mem::transmute(f);
        let mut p = extra_bufts(dev);
        while !p.is_null() && !(*p).is_null() {
            let name = sys::ggml_backend_buft_name(*p);
            if !name.is_null() && std::ffi::CStr::from_ptr(name).to_bytes() == b"CPU_REPACK" {
                return Some(*p);
            }
            p = p.add(1);
        }
        None
    }
}

/// Gives the matrix-only weights that ggml can repack for this CPU (by type and shape, e.g.
/// q4_0 and q4_K on AVX2) a repacked copy, replacing their entries in `tensors`; llama.cpp runs
/// its CPU matrix products on the same layout by default, so both compute the same sums, and
/// its kernels are faster for batches. The copies cost RAM (the mapped originals stay mapped
/// but unused). Which tensors qualify is asked of ggml itself: tensors placed in a repack
/// buffer get their layout's traits (`extra`) at placement, before any data is written, so a
/// first placement without data sorts them and a second holds only those.
fn repack(
    specs: &[WeightSpec<'_>],
    tensors: &mut [NonNull<sys::ggml_tensor>],
    base: *const u8,
) -> Result<Option<(Buffer, Context<'static>)>> {
    let Some(buft) = repack_buffer_type() else {
        return Ok(None);
    };
    // Matrices only: stacks of experts (3-D) stay as they are.
    let candidates: Vec<usize> = (0..specs.len())
        .filter(|&i| specs[i].matmul_only && specs[i].shape.len() == 2)
        .collect();
    if candidates.is_empty() {
        return Ok(None);
    }
    // A copy of each candidate's metadata in `ctx`.
    let copy = |ctx: &Context<'static>, i: usize| -> Result<NonNull<sys::ggml_tensor>> {
        // SAFETY: live context with room (sized by the caller); the source tensor is live.
        let t = unsafe { sys::ggml_dup_tensor(ctx.as_ptr(), tensors[i].as_ptr()) };
        NonNull::new(t).ok_or(Error::Ggml {
            what: "repack context is full",
        })
    };
    let supported: Vec<usize> = {
        let probe = Context::new(candidates.len() + 1, 0)?;
        let probes = candidates
            .iter()
            .map(|&i| copy(&probe, i))
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: a live context whose tensors have no buffer yet; ggml sizes and places them
        // (the memory is reserved, never written, and freed when `_placed` drops).
        let raw = unsafe { sys::ggml_backend_alloc_ctx_tensors_from_buft(probe.as_ptr(), buft) };
        let Some(raw) = NonNull::new(raw) else {
            return Ok(None);
        };
        let _placed = Buffer(raw);
        candidates
            .iter()
            .zip(&probes)
            // SAFETY: live tensors; `extra` was set by the repack buffer at placement.
            .filter(|(_, t)| unsafe { !(*t.as_ptr()).extra.is_null() })
            .map(|(&i, _)| i)
            .collect()
    };
    if supported.is_empty() {
        return Ok(None);
    }
    let ctx = Context::new(supported.len() + 1, 0)?;
    let copies = supported
        .iter()
        .map(|&i| copy(&ctx, i))
        .collect::<Result<Vec<_>>>()?;
    // SAFETY: as above.
    let raw = unsafe { sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx.as_ptr(), buft) };
    let buffer = Buffer(NonNull::new(raw).ok_or(Error::OutOfMemory {
        what: "the repacked weights",
    })?);
    // SAFETY: live buffer; usage is a hint for schedulers.
    unsafe {
        sys::ggml_backend_buffer_set_usage(
            buffer.0.as_ptr(),
            sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
        )
    };
    for (&i, &t) in supported.iter().zip(&copies) {
        let spec = &specs[i];
        // SAFETY: `t` was placed in the repack buffer with a layout (`extra`, checked by the
        // probe for the same type and shape) and is `n_bytes` long (its metadata was copied
        // from a tensor checked against `n_bytes`); the source range lies in the file's bytes
        // (checked in `map`). The repack completes before the call returns.
        unsafe {
            debug_assert!(!(*t.as_ptr()).extra.is_null());
            sys::ggml_set_name(t.as_ptr(), sys::ggml_get_name(tensors[i].as_ptr()));
            sys::ggml_backend_tensor_set(t.as_ptr(), base.add(spec.offset).cast(), 0, spec.n_bytes);
        }
        tensors[i] = t;
    }
    Ok(Some((buffer, ctx)))
}
