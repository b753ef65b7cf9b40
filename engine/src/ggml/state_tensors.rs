//! Per-sequence recurrent state in backend memory: per recurrent layer, one f32 tensor of
//! convolution states and, for delta-nets, one of matrix states, each `[row, n_slots]` (a slot
//! is a column of one sequence's state), in one zeroed CPU buffer. Read through `&self`, written only
//! through `&mut self` (byte writes, or graphs holding [`StateTensors::tensors_mut`]).

use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::NonNull;

use ggml_sys as sys;

use super::{Buffer, Context, Device, RawTensorMut};
use crate::error::{Error, Result};

/// The state tensors of `n` recurrent layers: `conv[r]` and `ssm[r]` (none when the layers
/// keep no matrix state), `n_slots` rows each.
pub(crate) struct StateTensors {
    conv: Vec<NonNull<sys::ggml_tensor>>,
    ssm: Vec<NonNull<sys::ggml_tensor>>,
    n_slots: usize,
    _buffer: Buffer,
    _ctx: Context<'static>,
}

// SAFETY: as the KV pool's tensors: no thread affinity, not `Sync`, every write through
// `&mut self`.
unsafe impl Send for StateTensors {}

/// The state tensors borrowed mutably for one graph that writes into them.
#[derive(Clone, Copy)]
pub(crate) struct StateTensorsMut<'a> {
    conv: &'a [NonNull<sys::ggml_tensor>],
    ssm: &'a [NonNull<sys::ggml_tensor>],
    _excl: PhantomData<&'a mut StateTensors>,
}

impl<'a> StateTensorsMut<'a> {
    /// Recurrent layer `r`'s convolution states.
    pub(crate) fn conv(self, r: usize) -> RawTensorMut<'a> {
        RawTensorMut {
            ptr: self.conv[r],
            _owner: PhantomData,
        }
    }

    /// Recurrent layer `r`'s delta-net states.
    ///
    /// # Panics
    /// If the layers keep no matrix state (short convolutions).
    pub(crate) fn ssm(self, r: usize) -> RawTensorMut<'a> {
        RawTensorMut {
            ptr: self.ssm[r],
            _owner: PhantomData,
        }
    }
}

impl StateTensors {
    /// `n_layers` pairs of zeroed tensors of `n_slots` rows of `conv_len` and `ssm_len` f32
    /// values (with `ssm_len` 0, the convolution's tensors alone).
    pub(crate) fn new(
        n_layers: usize,
        conv_len: usize,
        ssm_len: usize,
        n_slots: usize,
    ) -> Result<StateTensors> {
        let too_big = || Error::OutOfMemory {
            what: "recurrent state",
        };
        let fits = |row: usize| {
            row.checked_mul(n_slots)
                .and_then(|n| n.checked_mul(4))
                .is_some_and(|b| i64::try_from(b).is_ok())
        };
        if !(fits(conv_len) && fits(ssm_len)) {
            return Err(too_big());
        }
        let ctx = Context::new(2 * n_layers + 1, 0)?;
        let make = |kind: &str, r: usize, row: usize| -> Result<NonNull<sys::ggml_tensor>> {
            // SAFETY: live context with room for every tensor (counted above); the sizes fit
            // `i64` (checked above).
            let t = unsafe {
                sys::ggml_new_tensor_2d(
                    ctx.as_ptr(),
                    sys::GGML_TYPE_F32,
                    row as i64,
                    n_slots as i64,
                )
            };
            let t = NonNull::new(t).ok_or(Error::Ggml {
                what: "state context is full",
            })?;
            let name = CString::new(format!("state_{kind}_r{r}")).expect("no NUL in the name");
            // SAFETY: live tensor; ggml copies the NUL-terminated name.
            unsafe { sys::ggml_set_name(t.as_ptr(), name.as_ptr()) };
            Ok(t)
        };
        let mut conv = Vec::with_capacity(n_layers);
        let mut ssm = Vec::with_capacity(n_layers);
        for r in 0..n_layers {
            conv.push(make("conv", r, conv_len)?);
            if ssm_len > 0 {
                ssm.push(make("ssm", r, ssm_len)?);
            }
        }
        let buffer = Buffer::alloc_tensors(&ctx, Device::cpu()?)?.ok_or_else(too_big)?;
        Ok(StateTensors {
            conv,
            ssm,
            n_slots,
            _buffer: buffer,
            _ctx: ctx,
        })
    }

    /// Rows (slots) per tensor.
    pub(crate) fn n_slots(&self) -> usize {
        self.n_slots
    }

    /// Every tensor, for a graph that reads and writes slots: they stay borrowed mutably while
    /// the graph is built and computed.
    pub(crate) fn tensors_mut(&mut self) -> StateTensorsMut<'_> {
        StateTensorsMut {
            conv: &self.conv,
            ssm: &self.ssm,
            _excl: PhantomData,
        }
    }

    fn tensor(&self, r: usize, ssm: bool) -> NonNull<sys::ggml_tensor> {
        if ssm {
            self.ssm[r]
        } else {
            self.conv[r]
        }
    }

    /// Bytes of one slot of layer `r`'s convolution (or delta-net) tensor.
    pub(crate) fn row_bytes(&self, r: usize, ssm: bool) -> usize {
        // SAFETY: live tensor; only its header is read.
        unsafe { (*self.tensor(r, ssm).as_ptr()).nb[1] }
    }

    /// Copies slot `slot` of layer `r`'s convolution (or delta-net) tensor into `out`, which
    /// must be [`StateTensors::row_bytes`] long.
    ///
    /// # Panics
    /// If `slot` or the length is out of range.
    pub(crate) fn read(&self, r: usize, ssm: bool, slot: usize, out: &mut [u8]) {
        let row = self.row_bytes(r, ssm);
        assert!(
            slot < self.n_slots && out.len() == row,
            "state read out of range"
        );
        // SAFETY: live host tensor; the range is one of its rows (asserted above) and `out`
        // has room for it.
        unsafe {
            sys::ggml_backend_tensor_get(
                self.tensor(r, ssm).as_ptr(),
                out.as_mut_ptr().cast(),
                slot * row,
                row,
            )
        }
    }

    /// Writes `data` (one row) into slot `slot` of layer `r`'s convolution (or delta-net)
    /// tensor.
    ///
    /// # Panics
    /// If `slot` or the length is out of range.
    pub(crate) fn write(&mut self, r: usize, ssm: bool, slot: usize, data: &[u8]) {
        let row = self.row_bytes(r, ssm);
        assert!(
            slot < self.n_slots && data.len() == row,
            "state write out of range"
        );
        // SAFETY: live host tensor; the range is one of its rows (asserted above); `&mut
        // self` excludes every other reader and writer.
        unsafe {
            sys::ggml_backend_tensor_set(
                self.tensor(r, ssm).as_ptr(),
                data.as_ptr().cast(),
                slot * row,
                row,
            )
        }
    }
}
