//! The KV page pool's tensors: per-layer K and V in one CPU buffer over anonymous memory, read
//! through `&self`, written only through `&mut self`.

use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::NonNull;

use ggml_sys as sys;

use super::{Buffer, Context, RawTensorMut};
use crate::error::{Error, Result};
use crate::kv::KvType;

/// ggml's id of a KV element type.
fn ggml_type(t: KvType) -> sys::ggml_type {
    match t {
        KvType::F16 => sys::GGML_TYPE_F16,
        KvType::Q8_0 => sys::GGML_TYPE_Q8_0,
    }
}

/// Per-layer K and V tensors of a KV page pool, each `[n_embd_kv, n_cells]` of its element type
/// (f16 or q8_0; one row per cell, token-major), in one CPU buffer over anonymous memory.
///
/// The memory is mapped anonymously, so the kernel hands out zeroed pages on first touch: a large
/// pool costs address space, not RAM, until its cells are used, and never-written cells read as
/// zeros (finite, so masked attention over them stays defined).
///
/// Reading takes `&self` ([`KvTensors::read`]); every write takes `&mut self`: byte writes
/// ([`KvTensors::write`], [`KvTensors::copy_within`]) and graphs, which write cells only
/// through the handles of [`KvTensors::tensors_mut`].
pub(crate) struct KvTensors {
    k: Vec<NonNull<sys::ggml_tensor>>,
    v: Vec<NonNull<sys::ggml_tensor>>,
    _buffer: Buffer,
    _ctx: Context<'static>,
    /// The memory the tensors point into, owned here. (No drop order matters: freeing the
    /// buffer or the context never touches it.)
    _memory: memmap2::MmapMut,
}

// SAFETY: the pool has no thread affinity (anonymous memory, ggml metadata); it is not `Sync`,
// and every write goes through `&mut self`, so one thread at a time reads or writes it.
unsafe impl Send for KvTensors {}

/// Alignment of each tensor inside the pool's memory (ggml's CPU buffers need 32).
const KV_TENSOR_ALIGN: usize = 64;

/// The K and V tensors of a pool, borrowed mutably for one graph that writes into them.
#[derive(Clone, Copy)]
pub(crate) struct KvTensorsMut<'a> {
    k: &'a [NonNull<sys::ggml_tensor>],
    v: &'a [NonNull<sys::ggml_tensor>],
    _excl: PhantomData<&'a mut KvTensors>,
}

impl<'a> KvTensorsMut<'a> {
    /// Layer `layer`'s K tensor.
    pub(crate) fn k(self, layer: usize) -> RawTensorMut<'a> {
        RawTensorMut {
            ptr: self.k[layer],
            _owner: PhantomData,
        }
    }

    /// Layer `layer`'s V tensor.
    pub(crate) fn v(self, layer: usize) -> RawTensorMut<'a> {
        RawTensorMut {
            ptr: self.v[layer],
            _owner: PhantomData,
        }
    }
}

impl KvTensors {
    /// Allocates `n_layers` pairs of tensors of `n_cells` rows with `k_dims[l]`/`v_dims[l]`
    /// elements per row, of types `type_k`/`type_v` (a quantized type needs dimensions that are
    /// whole blocks: [`Error::KvTypeHeadDim`] otherwise).
    pub(crate) fn new(
        k_dims: &[usize],
        v_dims: &[usize],
        type_k: KvType,
        type_v: KvType,
        n_cells: usize,
    ) -> Result<KvTensors> {
        let too_big = || Error::OutOfMemory { what: "KV cache" };
        let ctx = Context::new(k_dims.len() + v_dims.len() + 1, 0)?;
        let typed = || {
            k_dims
                .iter()
                .map(|&d| (d, type_k))
                .chain(v_dims.iter().map(|&d| (d, type_v)))
        };
        // Every dimension and byte count fits `i64`, ggml's type for both.
        let mut sizes = Vec::with_capacity(k_dims.len() + v_dims.len());
        for (d, t) in typed() {
            let row = t.row_bytes(d).ok_or(Error::KvTypeHeadDim {
                kv_type: t,
                block: t.block_elems(),
                head_dim: d,
            })?;
            let size = row
                .checked_mul(n_cells)
                .and_then(|b| b.checked_next_multiple_of(KV_TENSOR_ALIGN))
                .filter(|&b| {
                    i64::try_from(b).is_ok()
                        && i64::try_from(d).is_ok()
                        && i64::try_from(n_cells).is_ok()
                })
                .ok_or_else(too_big)?;
            sizes.push(size);
        }
        let total = sizes
            .iter()
            .try_fold(0usize, |acc, &s| acc.checked_add(s))
            .ok_or_else(too_big)?
            .max(KV_TENSOR_ALIGN);
        let mut memory = memmap2::MmapMut::map_anon(total).map_err(|_| too_big())?;
        let base = memory.as_mut_ptr();
        // SAFETY: the mapping is page-aligned and `total` bytes long; it is owned by the
        // returned value together with every tensor placed in the buffer.
        let buffer = unsafe { Buffer::from_memory(base, memory.len()) }.ok_or_else(too_big)?;
        let mut offset = 0usize;
        let mut tensors = Vec::with_capacity(sizes.len());
        for (i, ((dims, kv_type), &size)) in typed().zip(&sizes).enumerate() {
            // SAFETY: live context with room for every tensor (counted above); both dimensions
            // fit `i64` (checked with the sizes).
            let t = unsafe {
                sys::ggml_new_tensor_2d(
                    ctx.as_ptr(),
                    ggml_type(kv_type),
                    dims as i64,
                    n_cells as i64,
                )
            };
            let t = NonNull::new(t).ok_or(Error::Ggml {
                what: "KV context is full",
            })?;
            let (kind, layer) = match i.checked_sub(k_dims.len()) {
                None => ("k", i),
                Some(l) => ("v", l),
            };
            let name = CString::new(format!("cache_{kind}_l{layer}")).expect("no NUL in the name");
            // SAFETY: live tensor; the name is NUL-terminated and ggml copies it (a named leaf
            // is not renamed when a graph reaches it).
            unsafe { sys::ggml_set_name(t.as_ptr(), name.as_ptr()) };
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
            tensors.push(t);
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

    /// Every layer's K and V tensors, for a graph that writes cells: the pool stays borrowed
    /// mutably while the graph is built and computed.
    pub(crate) fn tensors_mut(&mut self) -> KvTensorsMut<'_> {
        KvTensorsMut {
            k: &self.k,
            v: &self.v,
            _excl: PhantomData,
        }
    }

    fn tensor(&self, layer: usize, value: bool) -> NonNull<sys::ggml_tensor> {
        if value {
            self.v[layer]
        } else {
            self.k[layer]
        }
    }

    /// Bytes of layer `layer`'s K (or V) tensor.
    fn n_bytes(&self, layer: usize, value: bool) -> usize {
        // SAFETY: live tensor; a pure computation over its metadata.
        unsafe { sys::ggml_nbytes(self.tensor(layer, value).as_ptr()) }
    }

    /// Copies `out.len()` bytes starting at byte `offset` of layer `layer`'s K (or V) tensor.
    ///
    /// # Panics
    /// If the range is not inside the tensor.
    pub(crate) fn read(&self, layer: usize, value: bool, offset: usize, out: &mut [u8]) {
        let n = self.n_bytes(layer, value);
        assert!(
            offset.checked_add(out.len()).is_some_and(|end| end <= n),
            "KV read out of range"
        );
        let t = self.tensor(layer, value);
        // SAFETY: live CPU tensor; the range lies inside it (asserted above) and ggml copies
        // those bytes into `out`, which has room for them.
        unsafe {
            sys::ggml_backend_tensor_get(t.as_ptr(), out.as_mut_ptr().cast(), offset, out.len())
        }
    }

    /// Writes `data` at byte `offset` of layer `layer`'s K (or V) tensor.
    ///
    /// # Panics
    /// If the range is not inside the tensor.
    pub(crate) fn write(&mut self, layer: usize, value: bool, offset: usize, data: &[u8]) {
        let n = self.n_bytes(layer, value);
        assert!(
            offset.checked_add(data.len()).is_some_and(|end| end <= n),
            "KV write out of range"
        );
        let t = self.tensor(layer, value);
        // SAFETY: live CPU tensor; the range lies inside it (asserted above); ggml copies
        // `data` into it, and `&mut self` excludes every other reader and writer.
        unsafe {
            sys::ggml_backend_tensor_set(t.as_ptr(), data.as_ptr().cast(), offset, data.len())
        }
    }

    /// Touches the first `fraction_num / fraction_den` of every tensor's memory (zeros over
    /// zeros), so that writes there later take no page faults: what a pool that will be filled
    /// soon (a session's own context) pays once at creation instead of in a restore.
    pub(crate) fn prefault(&mut self, fraction_num: usize, fraction_den: usize) {
        for layer in 0..self.k.len() {
            for value in [false, true] {
                let n = self.n_bytes(layer, value);
                let len = n / fraction_den.max(1) * fraction_num.min(fraction_den);
                let t = self.tensor(layer, value);
                // SAFETY: live CPU tensor; `0..len` lies inside its `n` bytes, and `&mut self`
                // excludes every other reader and writer.
                unsafe { sys::ggml_backend_tensor_memset(t.as_ptr(), 0, 0, len) }
            }
        }
    }

    /// Copies `len` bytes at `from` to `to` within layer `layer`'s K (or V) tensor.
    ///
    /// # Panics
    /// If either range is not inside the tensor, or the ranges overlap.
    pub(crate) fn copy_within(
        &mut self,
        layer: usize,
        value: bool,
        from: usize,
        to: usize,
        len: usize,
    ) {
        let n = self.n_bytes(layer, value);
        let (Some(from_end), Some(to_end)) = (from.checked_add(len), to.checked_add(len)) else {
            panic!("KV copy out of range");
        };
        assert!(
            from_end <= n && to_end <= n && (from_end <= to || to_end <= from),
            "KV copy out of range or overlapping"
        );
        let t = self.tensor(layer, value);
        // SAFETY: a live CPU tensor's data pointer covers its `n` bytes; both ranges lie inside
        // them and do not overlap (asserted above), and `&mut self` excludes every other reader
        // and writer.
        unsafe {
            let data = (*t.as_ptr()).data.cast::<u8>();
            std::ptr::copy_nonoverlapping(data.add(from), data.add(to), len);
        }
    }
}
