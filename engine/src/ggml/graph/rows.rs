//! Norms and gated activations through ggml-sys's row kernels (`csrc/rows.c`) where the graph
//! allows them: vector code where ggml's CPU backend runs one element at a time, each output
//! row a function of its own input row only (so batch-invariant), the same bits at every level.

use std::marker::PhantomData;
use std::sync::OnceLock;

use ggml_sys as sys;

use super::{Graph, Tensor};

/// Whether ggml-sys's row kernels were built with their vector code (else ggml's ops are as
/// fast and keep ggml's bits).
fn row_kernels_vectorized() -> bool {
    static SIMD: OnceLock<bool> = OnceLock::new();
    // SAFETY: a pure function of how the crate was compiled.
    *SIMD.get_or_init(|| unsafe { sys::kernels::ggml_sys_rows_simd() } == 1)
}

impl<'g, 'w> Graph<'g, 'w> {
    /// Whether this graph's norms ([`Graph::rms_norm_mul`]) and GELU-gated products
    /// ([`Graph::geglu`]) may take ggml-sys's row kernels: their own bits (a norm's sum of
    /// squares summed in a fixed order of its own), not ggml's. Not set: ggml's ops.
    pub(crate) fn allow_row_kernels(&mut self, allow: bool) {
        self.row_kernels = allow;
    }

    /// Whether a row kernel may take `x` as its first source: allowed, vectorized, f32 with
    /// contiguous elements, at most three dimensions.
    fn row_kernel_takes(&self, x: &Tensor<'g>) -> bool {
        // SAFETY: a live tensor of this graph (see `op!`); only its header is read.
        let f32_rows = unsafe { (*x.raw).type_ == sys::GGML_TYPE_F32 };
        self.row_kernels && row_kernels_vectorized() && f32_rows && x.nb(0) == 4 && x.ne(3) == 1
    }

    /// RMSNorm of each row of `x`, times `w` (one row of `x`'s length, broadcast over the
    /// rows).
    pub(crate) fn rms_norm_mul(&mut self, x: Tensor<'g>, w: Tensor<'g>, eps: f32) -> Tensor<'g> {
        // SAFETY: as in `row_kernel_takes`.
        let w_f32 = unsafe { (*w.raw).type_ == sys::GGML_TYPE_F32 };
        let one_row = (1..4).all(|i| w.ne(i) == 1);
        if self.row_kernel_takes(&x) && w_f32 && one_row && w.ne(0) == x.ne(0) && w.nb(0) == 4 {
            // The kernel reads `dst->src[0..2]` within the shapes checked here and writes only
            // `dst`; `userdata` carries eps's bits.
            return self.custom(
                [x.ne(0), x.ne(1), x.ne(2)],
                &mut [x.raw, w.raw],
                Some(sys::kernels::ggml_sys_rms_norm_mul),
                eps.to_bits() as usize,
            );
        }
        let norm = self.rms_norm(x, eps);
        self.mul(norm, w)
    }

    /// `gelu(gate) * up` (GELU's tanh approximation, as ggml computes it: the row kernel gives
    /// ggml's bits too).
    pub(crate) fn geglu(&mut self, gate: Tensor<'g>, up: Tensor<'g>) -> Tensor<'g> {
        // SAFETY: as in `row_kernel_takes`.
        let up_f32 = unsafe { (*up.raw).type_ == sys::GGML_TYPE_F32 };
        let same_shape = (0..4).all(|i| gate.ne(i) == up.ne(i));
        if self.row_kernel_takes(&gate) && up_f32 && same_shape && up.nb(0) == 4 {
            // The kernel reads both sources within their (equal) shapes, writes only `dst`.
            return self.custom(
                [gate.ne(0), gate.ne(1), gate.ne(2)],
                &mut [gate.raw, up.raw],
                Some(sys::kernels::ggml_sys_geglu),
                0,
            );
        }
        op!(self, sys::ggml_geglu_split(self.ctx(), gate.raw, up.raw))
    }
}
