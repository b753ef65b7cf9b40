//! The ops of recurrent (gated delta-net, Mamba-2) layers and of M-RoPE.

use std::ffi::c_int;
use std::marker::PhantomData;

use ggml_sys as sys;

use super::{Graph, RopeParams, Tensor, TensorMut};

impl<'g, 'w> Graph<'g, 'w> {
    /// `1 / (1 + exp(-x))`, element-wise.
    pub(crate) fn sigmoid(&mut self, x: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_sigmoid(self.ctx(), x.raw))
    }

    /// `ln(1 + exp(x))`, element-wise.
    pub(crate) fn softplus(&mut self, x: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_softplus(self.ctx(), x.raw))
    }

    /// A four-dimensional view of `x`: strides `nb` (bytes) of dimensions 1 to 3, from byte
    /// `offset`. Panics when the view would reach past `x`.
    pub(crate) fn view_4d(
        &mut self,
        x: Tensor<'g>,
        ne: [usize; 4],
        nb: [usize; 3],
        offset: usize,
    ) -> Tensor<'g> {
        assert!(
            ne.iter().all(|&d| d > 0 && i64::try_from(d).is_ok()),
            "empty or too large view"
        );
        // SAFETY: `x` is a live tensor of this graph; pure computations over its metadata.
        let (row, have) = unsafe {
            (
                sys::ggml_row_size((*x.raw).type_, ne[0] as i64),
                sys::ggml_nbytes(x.raw),
            )
        };
        let extent = (0..3)
            .try_fold(row, |acc, i| {
                (ne[i + 1] - 1)
                    .checked_mul(nb[i])
                    .and_then(|s| acc.checked_add(s))
            })
            .and_then(|span| span.checked_add(offset));
        assert!(
            extent.is_some_and(|end| end <= have),
            "view of {ne:?} with strides {nb:?} at {offset} reaches past its source's {have} bytes"
        );
        op!(
            self,
            sys::ggml_view_4d(
                self.ctx(),
                x.raw,
                ne[0] as i64,
                ne[1] as i64,
                ne[2] as i64,
                ne[3] as i64,
                nb[0],
                nb[1],
                nb[2],
                offset
            )
        )
    }

    /// Copies `src` into the contiguous bytes of `dst` from byte `offset` (as many elements as
    /// `src` has, converted to `dst`'s type); returns the copy, which must be expanded into the
    /// graph. Panics when it would reach past `dst`.
    pub(crate) fn store(
        &mut self,
        dst: TensorMut<'g>,
        offset: usize,
        src: Tensor<'g>,
    ) -> Tensor<'g> {
        let dst = dst.as_tensor();
        // SAFETY: live tensors of this graph; pure computations over their metadata.
        let (n, bytes, have) = unsafe {
            let n = sys::ggml_nelements(src.raw);
            (
                n,
                sys::ggml_row_size((*dst.raw).type_, n),
                sys::ggml_nbytes(dst.raw),
            )
        };
        assert!(
            offset.checked_add(bytes).is_some_and(|end| end <= have),
            "store past its destination"
        );
        let view = op!(self, sys::ggml_view_1d(self.ctx(), dst.raw, n, offset));
        op!(self, sys::ggml_cpy(self.ctx(), src.raw, view.raw))
    }

    /// ggml's causal convolution: `x` is `[kernel - 1 + m, channels, n_seqs]` (the previous
    /// inputs, then the new ones, time first), `kernel` `[kernel, channels]`; the result is
    /// `[channels, m, n_seqs]`.
    pub(crate) fn ssm_conv(&mut self, x: Tensor<'g>, kernel: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_ssm_conv(self.ctx(), x.raw, kernel.raw))
    }

    /// ggml's gated delta rule over `m` tokens of `n_seqs` sequences: `q`, `k`
    /// `[head_dim, n_k_heads, m, n_seqs]`, `v` `[head_dim, n_v_heads, m, n_seqs]` (value head
    /// `h` reads key head `h % n_k_heads`), `g` and `beta` `[1, n_v_heads, m, n_seqs]`, `state`
    /// `[head_dim, head_dim, n_v_heads, n_seqs]`. The result holds the outputs
    /// (`[head_dim, n_v_heads, m, n_seqs]`) followed by the final states.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gated_delta_net(
        &mut self,
        q: Tensor<'g>,
        k: Tensor<'g>,
        v: Tensor<'g>,
        g: Tensor<'g>,
        beta: Tensor<'g>,
        state: Tensor<'g>,
    ) -> Tensor<'g> {
        op!(
            self,
            sys::ggml_gated_delta_net(
                self.ctx(),
                q.raw,
                k.raw,
                v.raw,
                g.raw,
                beta.raw,
                state.raw,
                1
            )
        )
    }

    /// ggml's Mamba-2 selective scan over `m` tokens of one sequence: `s` the state
    /// (`[d_state, head_dim, n_head, 1]`, contiguous), `x` `[head_dim, n_head, m, 1]`, `dt`
    /// `[n_head, m, 1]` (contiguous; the scan takes its softplus), `a` `[1, n_head]`, `b` and
    /// `c` `[d_state, n_group, m, 1]`. The result holds the outputs (`[head_dim, n_head, m]`)
    /// followed by the final state.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ssm_scan(
        &mut self,
        s: Tensor<'g>,
        x: Tensor<'g>,
        dt: Tensor<'g>,
        a: Tensor<'g>,
        b: Tensor<'g>,
        c: Tensor<'g>,
    ) -> Tensor<'g> {
        // The state is read from row `ids[0]` of `s`: its only one.
        let ids = self.input(super::DType::I32, &[1], 0i32.to_le_bytes().to_vec());
        op!(
            self,
            sys::ggml_ssm_scan(
                self.ctx(),
                s.raw,
                x.raw,
                dt.raw,
                a.raw,
                b.raw,
                c.raw,
                ids.raw,
                1
            )
        )
    }

    /// `max(x, 0)²`, element-wise (ReLU²).
    pub(crate) fn relu_sqr(&mut self, x: Tensor<'g>) -> Tensor<'g> {
        let r = op!(self, sys::ggml_relu(self.ctx(), x.raw));
        op!(self, sys::ggml_sqr(self.ctx(), r.raw))
    }

    /// Multi-section rotary embedding of `x` (`[head_dim, n_head, n]`) at `positions` (i32
    /// `[4 * n]`: each section's positions in turn), `sections` dimensions pairs each.
    pub(crate) fn rope_multi(
        &mut self,
        x: Tensor<'g>,
        positions: Tensor<'g>,
        sections: [i32; 4],
        p: &RopeParams,
    ) -> Tensor<'g> {
        let mut sections: [c_int; 4] = sections;
        op!(
            self,
            sys::ggml_rope_multi(
                self.ctx(),
                x.raw,
                positions.raw,
                std::ptr::null_mut(),
                p.n_dims as c_int,
                sections.as_mut_ptr(),
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
