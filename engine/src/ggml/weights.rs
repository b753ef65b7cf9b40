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
    /// Byte offset of the tensor's data within the file's bytes ([`Gguf::bytes`]).
    pub offset: usize,
    pub n_bytes: usize,
    /// Copied into the device's memory at load instead of read where it lies.
    pub on_device: bool,
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
    /// into `device`'s memory instead. The weights keep `gguf` alive.
    pub(crate) fn map(
        gguf: Arc<Gguf>,
        specs: &[WeightSpec<'_>],
        device: Option<Device>,
    ) -> Result<Weights> {
        let mapped = gguf.bytes();
        let ctx = Context::new(specs.len() + 1, 0)?;
        let n_device = specs.iter().filter(|s| s.on_device).count();
        let device = device.filter(|_| n_device > 0);
        let dev_ctx = match device {
            Some(_) => Some(Context::new(n_device + 1, 0)?),
            None => None,
        };
        // SAFETY: `mapped` is owned by `gguf`, which the returned value holds (in an `Arc`, with
        // no way to mutate it) for as long as the tensors placed in the buffer exist. The pointer
        // is cast to `*mut` only because the constructor is shared with writable buffers: ggml
        // never writes weight tensors (see the `Sync` impl above).
        let buffer = unsafe { Buffer::from_memory(mapped.as_ptr().cast_mut(), mapped.len()) }
            .ok_or(Error::Ggml {
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
                .is_none_or(|end| end > mapped.len())
            {
                return Err(Error::BadTensor {
                    name: spec.name.to_owned(),
                    reason: format!(
                        "{} bytes at offset {} run past the file's {} bytes",
                        spec.n_bytes,
                        spec.offset,
                        mapped.len()
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
            // SAFETY: `offset + need <= mapped.len()` (checked above), so the address lies in
            // the buffer with the tensor's bytes after it.
            let status = unsafe {
                sys::ggml_backend_tensor_alloc(
                    buffer.0.as_ptr(),
                    t.as_ptr(),
                    mapped.as_ptr().add(spec.offset).cast_mut().cast(),
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
            (Some(device), Some(dev_ctx)) => {
                let dev_buffer =
                    Buffer::alloc_tensors(&dev_ctx, device)?.ok_or(Error::OutOfMemory {
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
                for (spec, t) in specs.iter().zip(&tensors) {
                    if spec.on_device {
                        // SAFETY: the tensor was placed in the device buffer, and its size is
                        // `n_bytes` (checked against ggml_nbytes above); the source range lies
                        // in the file's bytes (checked above). The copy completes before the
                        // call returns.
                        unsafe {
                            sys::ggml_backend_tensor_set(
                                t.as_ptr(),
                                mapped.as_ptr().add(spec.offset).cast(),
                                0,
                                spec.n_bytes,
                            )
                        };
                    }
                }
                Some((dev_buffer, dev_ctx))
            }
            _ => None,
        };
        Ok(Weights {
            tensors,
            _buffer: buffer,
            _ctx: ctx,
            _device: device_part,
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
