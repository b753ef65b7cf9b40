//! Products of weights and activations: the integer-sum kernels by weight type, which columns
//! take them, and the packed columns that products over the same activations share.

use std::ffi::c_int;
use std::marker::PhantomData;

use ggml_sys as sys;

use super::{Graph, Tensor};

/// Which columns of a graph's products over weights of an integer-sum type sum each block's
/// products exactly in integers first (see [`Graph::allow_integer_sums`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IntegerSums {
    /// Every column of every such product, whatever its count (decoding included): a column's
    /// bits then never depend on the others ([`Evaluation::Invariant`](crate::Evaluation)).
    Everywhere,
    /// In a product over the batch's `.0` rows, the leading `.1` (when at least the kernel's
    /// `min_rows`); every other column, and every other product, keeps ggml's bits.
    Leading(usize, usize),
}

/// A product that sums each weight block's products exactly in integers, for one weight type
/// (f32 activations): `kernel` computes every column of its node, and [`Graph::mul_mat`] gives
/// it only the batch's leading rows that [`Graph::allow_integer_sums`] allows.
pub(crate) struct IntegerSumKernel {
    /// The weight type.
    pub(crate) w_type: sys::ggml_type,
    /// Elements per weight block: `k` must be a multiple of it.
    pub(crate) block: usize,
    /// Fewest leading rows worth the kernel; fewer take `ggml_mul_mat`.
    pub(crate) min_rows: usize,
    /// The custom op: `dst` (f32 `[m, n]`) from `dst->src[0]` (the weights, `[k, m]`) and
    /// `dst->src[1]` (f32 `[k, n]`, contiguous rows); `userdata` 0.
    pub(crate) kernel:
        unsafe extern "C" fn(*mut sys::ggml_tensor, c_int, c_int, *mut std::ffi::c_void),
    /// 1 when the kernel was built with vector instructions; otherwise ggml's product is
    /// faster and the kernel is not used.
    pub(crate) vectorized: unsafe extern "C" fn() -> c_int,
    /// Whether the kernel also reads its columns packed by `ggml_sys_pack_q80` (the column
    /// count as `userdata`), so that products over the same columns pack them once.
    pub(crate) packs: bool,
}

/// The integer-sum products by weight type (q4_1's kernel, which also gives ggml's bits, has
/// its own branch in [`Graph::mul_mat`]).
pub(crate) const INTEGER_SUM_KERNELS: &[IntegerSumKernel] = &[
    IntegerSumKernel {
        w_type: sys::GGML_TYPE_Q4_0,
        block: 32,
        min_rows: 64,
        kernel: sys::kernels::ggml_sys_mul_mat_q4_0,
        vectorized: sys::kernels::ggml_sys_mul_mat_q4_0_isum,
        packs: true,
    },
    IntegerSumKernel {
        w_type: sys::GGML_TYPE_Q5_0,
        block: 32,
        min_rows: 64,
        kernel: sys::kernels::ggml_sys_mul_mat_q5_0,
        vectorized: sys::kernels::ggml_sys_mul_mat_q5_0_isum,
        packs: true,
    },
    IntegerSumKernel {
        w_type: sys::GGML_TYPE_Q8_0,
        block: 32,
        min_rows: 64,
        kernel: sys::kernels::ggml_sys_mul_mat_q8_0,
        vectorized: sys::kernels::ggml_sys_mul_mat_q8_0_isum,
        packs: true,
    },
    IntegerSumKernel {
        w_type: sys::GGML_TYPE_Q4_K,
        block: 256,
        min_rows: 64,
        kernel: sys::kernels::ggml_sys_mul_mat_q4_k,
        vectorized: sys::kernels::ggml_sys_mul_mat_qk_isum,
        packs: false,
    },
    IntegerSumKernel {
        w_type: sys::GGML_TYPE_Q5_K,
        block: 256,
        min_rows: 64,
        kernel: sys::kernels::ggml_sys_mul_mat_q5_k,
        vectorized: sys::kernels::ggml_sys_mul_mat_qk_isum,
        packs: false,
    },
    IntegerSumKernel {
        w_type: sys::GGML_TYPE_Q6_K,
        block: 256,
        min_rows: 64,
        kernel: sys::kernels::ggml_sys_mul_mat_q6_k,
        vectorized: sys::kernels::ggml_sys_mul_mat_qk_isum,
        packs: false,
    },
];

impl<'g, 'w> Graph<'g, 'w> {
    /// Which columns of this graph's products over weights of an integer-sum type (q4_1, and
    /// those of [`INTEGER_SUM_KERNELS`]) sum each block's products in integers first (ggml's
    /// result up to rounding; about twice as fast from 64 columns). Not set: none.
    pub(crate) fn allow_integer_sums(&mut self, sums: IntegerSums) {
        self.integer_sums = sums;
    }

    /// How many leading columns of a product with `n` columns take integer sums, and whether
    /// an [`INTEGER_SUM_KERNELS`] kernel with `min_rows` is worth running over them.
    fn integer_sum_columns(&self, n: usize, min_rows: usize) -> (usize, bool) {
        match self.integer_sums {
            IntegerSums::Everywhere => (n, true),
            IntegerSums::Leading(rows, lead) if n == rows => (lead.min(n), lead.min(n) >= min_rows),
            IntegerSums::Leading(..) => (0, false),
        }
    }

    /// `w` is `[k, m]`, `x` is `[k, n]`: the result is `[m, n]`. A two-dimensional product of
    /// q4_1 weights in host memory with two f32 rows or more runs ggml-sys's q4_1 kernel (each
    /// weight block unpacked once for several columns; the same bits as `ggml_mul_mat` unless
    /// [`Graph::allow_integer_sums`]); one of weights of an [`INTEGER_SUM_KERNELS`] type runs
    /// that kernel over the leading rows [`Graph::allow_integer_sums`] allows (when at least
    /// its `min_rows`) and `ggml_mul_mat` over the others. Everything else is ggml's: one row
    /// (decoding one sequence reads every weight once, and ggml's row chunks do that faster),
    /// weights on a GPU.
    pub(crate) fn mul_mat(&mut self, w: Tensor<'g>, x: Tensor<'g>) -> Tensor<'g> {
        // SAFETY: both tensors are live for 'g (see `op!`); only their headers are read.
        let (w_type, x_type) = unsafe { ((*w.raw).type_, (*x.raw).type_) };
        let plain = |t: &Tensor<'g>| t.ne(2) == 1 && t.ne(3) == 1;
        // SAFETY: as above; a weight's buffer is set once at load and never changes.
        let w_on_host = unsafe {
            let buffer = (*w.raw).buffer;
            buffer.is_null() || sys::ggml_backend_buffer_is_host(buffer)
        };
        if w_type == sys::GGML_TYPE_Q4_1
            && w_on_host
            && x_type == sys::GGML_TYPE_F32
            && plain(&w)
            && plain(&x)
            && x.nb(0) == 4
            && w.ne(0) == x.ne(0)
            && w.ne(0).is_multiple_of(32)
            && (x.ne(1) > 1 || self.integer_sums == IntegerSums::Everywhere)
        {
            let (m, n) = (w.ne(1), x.ne(1));
            // The kernel reads `dst->src[0..2]` (the sources, which ggml copies into the node)
            // within the shapes checked above, and writes only `dst`. `userdata` counts the
            // leading columns that take integer sums: every column, or only those of a
            // product over the batch's rows (not, say, its output rows).
            let (leading, _) = self.integer_sum_columns(n, 0);
            return self.custom(
                [m, n, 1],
                &mut [w.raw, x.raw],
                Some(sys::kernels::ggml_sys_mul_mat_q4_1),
                leading,
            );
        }
        let entry = INTEGER_SUM_KERNELS.iter().find(|e| e.w_type == w_type);
        if let Some(entry) = entry.filter(|e| {
            w_on_host
                && x_type == sys::GGML_TYPE_F32
                && plain(&w)
                && plain(&x)
                && x.nb(0) == 4
                && w.ne(0) == x.ne(0)
                && w.ne(0).is_multiple_of(e.block)
                && self.integer_sum_columns(x.ne(1), e.min_rows).1
                // SAFETY: a plain query.
                && unsafe { (e.vectorized)() } == 1
        }) {
            return self.integer_sum_product(entry, w, x);
        }
        op!(self, sys::ggml_mul_mat(self.ctx(), w.raw, x.raw))
    }

    /// `w` times the batch's rows `x` (checked by [`Graph::mul_mat`]): `entry`'s kernel over
    /// the leading integer-sum rows, `ggml_mul_mat` over the others (a view of them, so their
    /// bits are ggml's), the two joined.
    fn integer_sum_product(
        &mut self,
        entry: &IntegerSumKernel,
        w: Tensor<'g>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let (k, m, n) = (x.ne(0), w.ne(1), x.ne(1));
        let (lead, _) = self.integer_sum_columns(n, entry.min_rows);
        let col = x.nb(1);
        let head = if lead == n {
            x
        } else {
            self.view_3d(x, [k, lead, 1], [col, col * lead], 0)
        };
        // The kernel reads `dst->src[0..2]` (the sources, which ggml copies into the node)
        // within the shapes checked by `mul_mat`, and writes only `dst`; with a column count
        // as `userdata`, `src[1]` is `ggml_sys_pack_q80`'s packing of those columns.
        let fast = match self.packed_columns(entry, head) {
            Some(packed) => {
                self.custom([m, lead, 1], &mut [w.raw, packed], Some(entry.kernel), lead)
            }
            None => self.custom([m, lead, 1], &mut [w.raw, head.raw], Some(entry.kernel), 0),
        };
        if lead == n {
            return fast;
        }
        let rest = self.view_3d(x, [k, n - lead, 1], [col, col * (n - lead)], col * lead);
        let rest = op!(self, sys::ggml_mul_mat(self.ctx(), w.raw, rest.raw));
        self.concat(fast, rest, 1)
    }

    /// The columns `x` quantized and packed for `entry`'s kernel, made once per graph for
    /// each columns' tensor and weight type; `None` when the kernel takes them as they are.
    fn packed_columns(
        &mut self,
        entry: &IntegerSumKernel,
        x: Tensor<'g>,
    ) -> Option<*mut sys::ggml_tensor> {
        if !entry.packs {
            return None;
        }
        if let Some(&(_, _, p)) = self
            .packed
            .iter()
            .find(|(t, ty, _)| *t == x.raw && *ty == entry.w_type)
        {
            return Some(p);
        }
        // SAFETY: a plain query.
        let bytes = unsafe {
            sys::kernels::ggml_sys_q80_packed_bytes(
                entry.w_type as c_int,
                x.ne(0) as i64,
                x.ne(1) as i64,
            )
        };
        if bytes <= 0 {
            return None;
        }
        // The kernel reads `src[0]` (f32, contiguous rows, checked by `mul_mat`) and writes
        // only its result, at least `bytes` long; `userdata` is the weight type.
        let packed = self.custom(
            [(bytes as usize).div_ceil(4), 1, 1],
            &mut [x.raw],
            Some(sys::kernels::ggml_sys_pack_q80),
            entry.w_type as usize,
        );
        self.packed.push((x.raw, entry.w_type, packed.raw));
        Some(packed.raw)
    }
}
