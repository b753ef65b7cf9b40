//! The graph's ops for mixtures of experts beyond the routing and products of `graph.rs`:
//! per-expert biases and gpt-oss's clamped SwiGLU.

use std::marker::PhantomData;

use ggml_sys as sys;

use super::{Graph, Tensor};

impl<'g, 'w> Graph<'g, 'w> {
    /// `a + b[:, ids]`: `a` is `[ne0, n_used, n]` (a [`Graph::mul_mat_id`] result), `b` a
    /// stack of per-expert biases `[ne0, n_expert]` (f32), `ids` the chosen experts (i32
    /// `[n_used, n]`); row `j` of column `t` gets expert `ids[j, t]`'s bias.
    pub(crate) fn add_id(&mut self, a: Tensor<'g>, b: Tensor<'g>, ids: Tensor<'g>) -> Tensor<'g> {
        op!(self, sys::ggml_add_id(self.ctx(), a.raw, b.raw, ids.raw))
    }

    /// gpt-oss's gated activation (ggml's `swiglu_oai`), element-wise over f32 `gate` and `up`
    /// of one shape: with `x = min(gate, limit)` and `y = clamp(up, -limit, limit)`,
    /// `x * sigmoid(alpha * x) * (y + 1)`.
    pub(crate) fn swiglu_oai(
        &mut self,
        gate: Tensor<'g>,
        up: Tensor<'g>,
        alpha: f32,
        limit: f32,
    ) -> Tensor<'g> {
        op!(
            self,
            sys::ggml_swiglu_oai(self.ctx(), gate.raw, up.raw, alpha, limit)
        )
    }
}
