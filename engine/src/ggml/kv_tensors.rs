//! The KV page pool's tensors: per-layer K and V in one CPU buffer over anonymous memory (and,
//! for offloaded layers, in device memory), read through `&self`, written only through
//! `&mut self`.

use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::NonNull;

use ggml_sys as sys;

use super::{Backend, Buffer, Context, Device, RawTensorMut};
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
    /// Per layer: whether its K and V live in host memory (else in the device's).
    host: Vec<bool>,
    _buffer: Buffer,
    _ctx: Context<'static>,
    /// The device memory and metadata of the offloaded layers' tensors, if any.
    _device: Option<(Buffer, Context<'static>)>,
    /// A backend of its own on the device (its own stream), for batches of copies between the
    /// offloaded layers and host memory: queued asynchronously, then waited for once.
    transfer: Option<Backend>,
    /// The memory the tensors point into, owned here. (No drop order matters: freeing the
    /// buffer or the context never touches it.)
    _memory: memmap2::MmapMut,
}

// SAFETY: the pool has no thread affinity (anonymous memory, ggml metadata); it is not `Sync`,
// and every write goes through `&mut self`, so one thread at a time reads or writes it.
unsafe impl Send for KvTensors {}

/// Alignment of each tensor inside the pool's memory (ggml's CPU buffers need 32): a memory
/// page, so that a pool page's rows of one layer, when they fill whole memory pages, can be
/// handed back to the system ([`KvTensors::release`]).
const KV_TENSOR_ALIGN: usize = 4096;

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
    /// whole blocks: [`Error::KvTypeHeadDim`] otherwise), in host memory.
    #[cfg(test)]
    pub(crate) fn new(
        k_dims: &[usize],
        v_dims: &[usize],
        type_k: KvType,
        type_v: KvType,
        n_cells: usize,
    ) -> Result<KvTensors> {
        KvTensors::placed(k_dims, v_dims, type_k, type_v, n_cells, None, true)
    }

    /// As [`KvTensors::new`], with the layers from `device.1` on in `device.0`'s memory.
    /// `reserve`: the host memory is reserved (committed) at once, so a pool larger than the
    /// memory the system can commit fails here; without, only its address space is taken (a
    /// pool under a RAM budget, whose pages past the budget never become resident).
    pub(crate) fn placed(
        k_dims: &[usize],
        v_dims: &[usize],
        type_k: KvType,
        type_v: KvType,
        n_cells: usize,
        device: Option<(Device, usize)>,
        reserve: bool,
    ) -> Result<KvTensors> {
        let too_big = || Error::OutOfMemory { what: "KV cache" };
        let n_layers = k_dims.len();
        let layer_on_host: Vec<bool> = (0..n_layers)
            .map(|l| device.is_none_or(|(_, first)| l < first))
            .collect();
        let n_device = layer_on_host.iter().filter(|h| !**h).count();
        let ctx = Context::new(k_dims.len() + v_dims.len() + 1, 0)?;
        let dev_ctx = match device {
            Some(_) if n_device > 0 => Some(Context::new(2 * n_device + 1, 0)?),
            _ => None,
        };
        let layer_of = |i: usize| i.checked_sub(n_layers).unwrap_or(i);
        let has_device = dev_ctx.is_some();
        let on_host = |i: usize| !has_device || layer_on_host[layer_of(i)];
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
            .enumerate()
            .filter(|(i, _)| on_host(*i))
            .try_fold(0usize, |acc, (_, &s)| acc.checked_add(s))
            .ok_or_else(too_big)?
            .max(KV_TENSOR_ALIGN);
        let mut options = memmap2::MmapOptions::new();
        options.len(total);
        if !reserve {
            options.no_reserve_swap();
        }
        let mut memory = options.map_anon().map_err(|_| too_big())?;
        let base = memory.as_mut_ptr();
        // SAFETY: the mapping is page-aligned and `total` bytes long; it is owned by the
        // returned value together with every tensor placed in the buffer.
        let buffer = unsafe { Buffer::from_memory(base, memory.len()) }.ok_or_else(too_big)?;
        let mut offset = 0usize;
        let mut tensors = Vec::with_capacity(sizes.len());
        for (i, ((dims, kv_type), &size)) in typed().zip(&sizes).enumerate() {
            let home = match &dev_ctx {
                Some(dev) if !on_host(i) => dev,
                _ => &ctx,
            };
            // SAFETY: live context with room for every tensor (counted above); both dimensions
            // fit `i64` (checked with the sizes).
            let t = unsafe {
                sys::ggml_new_tensor_2d(
                    home.as_ptr(),
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
            if !on_host(i) {
                // Placed in device memory below.
                tensors.push(t);
                continue;
            }
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
        let host: Vec<bool> = (0..n_layers).map(on_host).collect();
        let transfer = match (device, &dev_ctx) {
            (Some((device, _)), Some(_)) => Some(Backend::on(device, 1)?),
            _ => None,
        };
        let device_part = match (device, dev_ctx) {
            (Some((device, _)), Some(dev_ctx)) => {
                // Zeroed, as the anonymous memory is.
                let dev_buffer =
                    Buffer::alloc_tensors(&dev_ctx, device)?.ok_or(Error::OutOfMemory {
                        what: "KV cache in device memory",
                    })?;
                Some((dev_buffer, dev_ctx))
            }
            _ => None,
        };
        let v = tensors.split_off(k_dims.len());
        Ok(KvTensors {
            k: tensors,
            v,
            host,
            _buffer: buffer,
            _ctx: ctx,
            _device: device_part,
            transfer,
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

    /// Address of layer `layer`'s K (or V) cells in host memory (`None` on a device): for
    /// page tables that point attention at the pool's rows.
    pub(crate) fn host_address(&self, layer: usize, value: bool) -> Option<usize> {
        if !self.host[layer] {
            return None;
        }
        // SAFETY: a live tensor; only its header is read.
        Some(unsafe { (*self.tensor(layer, value).as_ptr()).data } as usize)
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
        // SAFETY: live tensor (host or device memory); the range lies inside it (asserted
        // above) and ggml copies those bytes into `out`, which has room for them.
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
        // SAFETY: live tensor (host or device memory); the range lies inside it (asserted
        // above); ggml copies `data` into it, and `&mut self` excludes every other reader and
        // writer.
        unsafe {
            sys::ggml_backend_tensor_set(t.as_ptr(), data.as_ptr().cast(), offset, data.len())
        }
    }

    /// Copies many ranges out at once: each `(layer, value, offset, out)` gets `out.len()`
    /// bytes from byte `offset` of that layer's K (or V) tensor. Ranges in device memory are
    /// queued as asynchronous downloads on the transfer stream and waited for once, at the end.
    ///
    /// # Panics
    /// If a range is not inside its tensor.
    pub(crate) fn read_many(&self, parts: &mut [(usize, bool, usize, &mut [u8])]) {
        // Every range is checked before any copy is queued: a failed check must not unwind
        // while the device still writes into the buffers of `parts`.
        for (layer, value, offset, out) in parts.iter() {
            let n = self.n_bytes(*layer, *value);
            assert!(
                offset.checked_add(out.len()).is_some_and(|end| end <= n),
                "KV read out of range"
            );
        }
        let mut queued = false;
        for (layer, value, offset, out) in parts.iter_mut() {
            let (layer, value, offset) = (*layer, *value, *offset);
            let t = self.tensor(layer, value);
            match &self.transfer {
                Some(backend) if !self.host[layer] => {
                    // SAFETY: live device tensor, range inside it (checked above); `out`
                    // stays borrowed until the synchronization below, after which the copy
                    // has landed.
                    unsafe {
                        sys::ggml_backend_tensor_get_async(
                            backend.0.as_ptr(),
                            t.as_ptr(),
                            out.as_mut_ptr().cast(),
                            offset,
                            out.len(),
                        )
                    };
                    queued = true;
                }
                // SAFETY: as in `read`.
                _ => unsafe {
                    sys::ggml_backend_tensor_get(
                        t.as_ptr(),
                        out.as_mut_ptr().cast(),
                        offset,
                        out.len(),
                    )
                },
            }
        }
        if let (true, Some(backend)) = (queued, &self.transfer) {
            // SAFETY: a live backend; waits for every copy queued above.
            unsafe { sys::ggml_backend_synchronize(backend.0.as_ptr()) };
        }
    }

    /// Writes many ranges at once, as [`KvTensors::read_many`] reads them: uploads to device
    /// memory are queued and waited for once.
    ///
    /// # Panics
    /// If a range is not inside its tensor.
    pub(crate) fn write_many(&mut self, parts: &[(usize, bool, usize, &[u8])]) {
        // Every range is checked before any copy is queued (and before anything is written):
        // a failed check must not unwind while the device still reads the buffers of `parts`.
        for &(layer, value, offset, data) in parts {
            let n = self.n_bytes(layer, value);
            assert!(
                offset.checked_add(data.len()).is_some_and(|end| end <= n),
                "KV write out of range"
            );
        }
        let mut queued = false;
        for &(layer, value, offset, data) in parts {
            let t = self.tensor(layer, value);
            match &self.transfer {
                Some(backend) if !self.host[layer] => {
                    // SAFETY: live device tensor, range inside it (checked above); `data`
                    // stays borrowed until the synchronization below; `&mut self` excludes
                    // every other reader and writer.
                    unsafe {
                        sys::ggml_backend_tensor_set_async(
                            backend.0.as_ptr(),
                            t.as_ptr(),
                            data.as_ptr().cast(),
                            offset,
                            data.len(),
                        )
                    };
                    queued = true;
                }
                // SAFETY: as in `write`.
                _ => unsafe {
                    sys::ggml_backend_tensor_set(
                        t.as_ptr(),
                        data.as_ptr().cast(),
                        offset,
                        data.len(),
                    )
                },
            }
        }
        if let (true, Some(backend)) = (queued, &self.transfer) {
            // SAFETY: a live backend; waits for every copy queued above.
            unsafe { sys::ggml_backend_synchronize(backend.0.as_ptr()) };
        }
    }

    /// Touches the first `fraction_num / fraction_den` of every tensor's memory (zeros over
    /// zeros), so that writes there later take no page faults: what a pool that will be filled
    /// soon (a session's own context) pays once at creation instead of in a restore.
    pub(crate) fn prefault(&mut self, fraction_num: usize, fraction_den: usize) {
        for layer in (0..self.k.len()).filter(|&l| self.host[l]) {
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

    /// Hands the memory of bytes `offset .. offset + len` of layer `layer`'s K (or V) tensor
    /// back to the system, when the layer lives in host memory: the whole memory pages inside
    /// the range (the pages it shares with neighbouring rows stay). Those bytes read as zeros
    /// afterwards, and cost RAM again only once written. Returns the bytes released.
    ///
    /// # Panics
    /// If the range is not inside the tensor.
    pub(crate) fn release(
        &mut self,
        layer: usize,
        value: bool,
        offset: usize,
        len: usize,
    ) -> usize {
        let n = self.n_bytes(layer, value);
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= n),
            "KV release out of range"
        );
        if !self.host[layer] {
            return 0;
        }
        let t = self.tensor(layer, value);
        // SAFETY: a live CPU tensor; its data pointer lies inside `_memory` (placed there by
        // `placed`), so the difference is the tensor's offset in the mapping.
        let data = unsafe { (*t.as_ptr()).data } as usize;
        let start = data - self._memory.as_ptr() as usize + offset;
        let page = memory_page();
        let (first, end) = (start.next_multiple_of(page), (start + len) / page * page);
        if end <= first {
            return 0;
        }
        release_range(&self._memory, first, end - first);
        end - first
    }

    /// Whether layer `layer`'s K and V live in host memory.
    pub(crate) fn is_host(&self, layer: usize) -> bool {
        self.host[layer]
    }

    /// Whether a CPU kernel can read layer `layer`'s K and V in place: they live in the pool's
    /// host memory, or in a device buffer that is host memory (the CPU as the offload device).
    pub(crate) fn cpu_readable(&self, layer: usize) -> bool {
        if self.host[layer] {
            return true;
        }
        // SAFETY: a live tensor of this pool; its buffer is set when the pool is made and
        // never changes; only the buffer's kind is asked.
        unsafe {
            let buffer = (*self.k[layer].as_ptr()).buffer;
            !buffer.is_null() && sys::ggml_backend_buffer_is_host(buffer)
        }
    }

    /// Bytes of the pool's host memory that are resident in RAM now, as the system counts them
    /// (`None` where it cannot tell).
    pub(crate) fn resident_bytes(&self) -> Option<usize> {
        resident(&self._memory)
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
        if !self.host[layer] {
            // Device memory: through the host, with ggml's copies.
            let mut bytes = vec![0u8; len];
            self.read(layer, value, from, &mut bytes);
            self.write(layer, value, to, &bytes);
            return;
        }
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

/// The size of a memory page.
fn memory_page() -> usize {
    #[cfg(unix)]
    {
        // SAFETY: `sysconf` reads a constant of the system.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
    }
    #[cfg(not(unix))]
    {
        4096
    }
}

/// Drops the memory pages of `len` bytes at `offset` of the anonymous mapping `memory` (both
/// page multiples): the system takes them back and they read as zeros next time.
fn release_range(memory: &memmap2::MmapMut, offset: usize, len: usize) {
    #[cfg(unix)]
    {
        // SAFETY: the range lies inside the private anonymous mapping, which only this pool's
        // tensors use; `&mut KvTensors` (the caller's) excludes every reader and writer, and
        // zeros are what these rows are meant to read as once released (nothing attends them).
        let _ = unsafe {
            memory.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len)
        };
    }
    #[cfg(not(unix))]
    {
        let _ = (memory, offset, len);
    }
}

/// Bytes of `memory` resident in RAM (`mincore`).
fn resident(memory: &memmap2::MmapMut) -> Option<usize> {
    #[cfg(unix)]
    {
        let page = memory_page();
        let mut flags = vec![0u8; memory.len().div_ceil(page)];
        // SAFETY: the mapping is page-aligned and `memory.len()` long; `flags` has one byte
        // per page of it, which `mincore` fills.
        let rc = unsafe {
            libc::mincore(
                memory.as_ptr() as *mut libc::c_void,
                memory.len(),
                flags.as_mut_ptr().cast(),
            )
        };
        (rc == 0).then(|| flags.iter().filter(|&&f| f & 1 == 1).count() * page)
    }
    #[cfg(not(unix))]
    {
        let _ = memory;
        None
    }
}
