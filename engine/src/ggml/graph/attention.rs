//! The graph's attention ops: ggml's fused flash attention, or ggml-sys's kernel over a window
//! of the pool or through page tables (pages that lie anywhere, `spill.rs`), and the staging
//! and prefetch ops of spilled pages.

use std::marker::PhantomData;

use ggml_sys as sys;

use super::{Graph, Tensor};
use crate::ggml::stage::{prefetch_spans, stage_rows, StageOp};

impl<'g, 'w> Graph<'g, 'w> {
    /// A staged window of `cache` (one layer's K or V in the pool, after this batch's rows
    /// were stored): `op`'s rows, in the cache's type, from the pool or from mapped block files
    /// (see `spill.rs`). The op must outlive the graph's computation, and every map it names.
    pub(crate) fn stage(&mut self, cache: Tensor<'g>, op: &StageOp) -> Tensor<'g> {
        // SAFETY: live tensor; only its header is read.
        let dtype = unsafe { (*cache.raw).type_ };
        let mut srcs = [cache.raw];
        op!(
            self,
            sys::ggml_custom_4d(
                self.ctx(),
                dtype,
                cache.ne(0) as i64,
                op.n_rows() as i64,
                1,
                1,
                srcs.as_mut_ptr(),
                1,
                Some(stage_rows),
                sys::GGML_N_TASKS_MAX,
                op as *const StageOp as *mut std::ffi::c_void,
            )
        )
    }

    /// Fused attention. `q`: `[head_dim, n_tokens, n_head]`, `k`/`v`: `[head_dim, n_kv,
    /// n_head_kv]` (f16), `mask`: f16 `[n_kv, n_tokens]`; scores are scaled, then soft-capped
    /// to `softcap * tanh(s / softcap)` unless `softcap` is 0; with `sinks` (f32 `[n_head]`),
    /// each head's sink takes part in its softmax's denominator. The result is `[head_dim,
    /// n_head, n_tokens]`. With `ours` (the plan's choice, for `k` and `v` the CPU can read
    /// in place), f16 `k` and `v`, no soft cap, no sinks and a head size it takes, ggml-sys's
    /// attention kernel runs it (the query heads of a group share each converted K and V
    /// tile); otherwise ggml's.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn flash_attn(
        &mut self,
        q: Tensor<'g>,
        k: Tensor<'g>,
        v: Tensor<'g>,
        mask: Tensor<'g>,
        scale: f32,
        softcap: f32,
        sinks: Option<Tensor<'g>>,
        ours: bool,
    ) -> Tensor<'g> {
        if ours && sinks.is_none() && self.kernel_takes(q, k, v, mask, softcap) {
            return self.kernel_attention(&mut [q.raw, k.raw, v.raw, mask.raw], q, k, scale);
        }
        let t = op!(
            self,
            sys::ggml_flash_attn_ext(
                self.ctx(),
                q.raw,
                k.raw,
                v.raw,
                mask.raw,
                scale,
                0.0,
                softcap
            )
        );
        // SAFETY: live flash-attention node; `sinks` is a live tensor of this graph (or a
        // lifted weight), which ggml records as the node's fifth source.
        unsafe {
            sys::ggml_flash_attn_ext_set_prec(t.raw, sys::GGML_PREC_F32);
            if let Some(s) = sinks {
                sys::ggml_flash_attn_ext_add_sinks(t.raw, s.raw);
            }
        }
        t
    }

    /// `softmax(x * scale + mask)` over `ne[0]`, as [`Graph::soft_max`], with each head's sink
    /// (f32 `[n_head]`, `x`'s dimension 2) in its denominator when there are `sinks`.
    pub(crate) fn soft_max_sinks(
        &mut self,
        x: Tensor<'g>,
        mask: Tensor<'g>,
        scale: f32,
        sinks: Option<Tensor<'g>>,
    ) -> Tensor<'g> {
        let t = self.soft_max(x, mask, scale);
        if let Some(s) = sinks {
            // SAFETY: live soft_max node and tensor of this graph (or a lifted weight), which
            // ggml records as the node's third source.
            unsafe { sys::ggml_soft_max_add_sinks(t.raw, s.raw) };
        }
        t
    }

    /// Whether ggml-sys's attention kernel takes `q` over `k` and `v` with `mask`: built with
    /// its vector code and not turned off, f16 or q8_0 `k` and `v` whose rows the CPU reads in
    /// place, no soft cap, a head size it takes.
    pub(crate) fn kernel_takes(
        &self,
        q: Tensor<'g>,
        k: Tensor<'g>,
        v: Tensor<'g>,
        mask: Tensor<'g>,
        softcap: f32,
    ) -> bool {
        let of_type = |t: &Tensor<'g>, ty: sys::ggml_type| {
            // SAFETY: live tensor of this graph; only its header is read.
            unsafe { (*t.raw).type_ == ty }
        };
        let f16 = |t: &Tensor<'g>| of_type(t, sys::GGML_TYPE_F16);
        // Rows of whole elements (f16) or whole q8_0 blocks of 32, contiguous.
        let cache = |t: &Tensor<'g>| {
            (f16(t) && t.nb(0) == 2)
                || (of_type(t, sys::GGML_TYPE_Q8_0) && t.nb(0) == 34 && t.ne(0).is_multiple_of(32))
        };
        let head_dim = q.ne(0);
        softcap == 0.0
            && kernel_attention()
            && cache(&k)
            && cache(&v)
            && f16(&mask)
            && q.nb(0) == 4
            && head_dim.is_multiple_of(16)
            && head_dim <= 256
            && v.ne(0) == head_dim
            && k.ne(2) > 0
            && q.ne(2).is_multiple_of(k.ne(2))
    }

    /// [`Graph::flash_attn`] by ggml-sys's kernel (the caller checked
    /// [`Graph::kernel_takes`]), reading K's and V's rows through the page tables `pages`
    /// (i64 addresses of each 64 rows' first, for `k` and for `v`) rather than from their
    /// data; `k` and `v` give the shape and strides. The addresses must stay valid, with
    /// 64 rows of `k`'s and `v`'s strides readable at each, until the graph has run.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn flash_attn_paged(
        &mut self,
        q: Tensor<'g>,
        k: Tensor<'g>,
        v: Tensor<'g>,
        mask: Tensor<'g>,
        scale: f32,
        pages: [Tensor<'g>; 2],
    ) -> Tensor<'g> {
        let mut args = [q.raw, k.raw, v.raw, mask.raw, pages[0].raw, pages[1].raw];
        self.kernel_attention(&mut args, q, k, scale)
    }

    /// ggml-sys's attention over `args` (q, k, v, mask and perhaps two page tables).
    fn kernel_attention(
        &mut self,
        args: &mut [*mut sys::ggml_tensor],
        q: Tensor<'g>,
        k: Tensor<'g>,
        scale: f32,
    ) -> Tensor<'g> {
        let head_dim = q.ne(0);
        let (m, n_kv) = (q.ne(1), k.ne(1));
        let gqa = q.ne(2) / k.ne(2);
        // The kernels read their sources within the shapes checked by `kernel_takes` (and
        // the page tables' addresses, which their callers vouch for) and write only their
        // result; `userdata` is the scale's bits (then, for the merge, the chunk count),
        // never dereferenced.
        let scale_bits = scale.to_bits() as usize;
        if m * gqa <= SPLIT_ROWS && n_kv >= SPLIT_KV {
            // Few rows over a long window (decoding): each tile's state, the tiles shared
            // among the threads, then folded in order: the same bits as the single node.
            let tiles = n_kv.div_ceil(KERNEL_TILE);
            let part = self.custom(
                [head_dim + 2, m * gqa, k.ne(2) * tiles],
                args,
                Some(sys::kernels::ggml_sys_flash_attn_f16_part),
                scale_bits,
            );
            return self.custom(
                [head_dim, q.ne(2), m],
                &mut [part.raw],
                Some(sys::kernels::ggml_sys_flash_attn_f16_merge),
                tiles,
            );
        }
        self.custom(
            [head_dim, q.ne(2), m],
            args,
            Some(sys::kernels::ggml_sys_flash_attn_f16),
            scale_bits,
        )
    }

    /// A node hinting `op`'s ranges to the kernel when it runs (see `spill.rs`), after
    /// `after`; its result (one float) is meaningless.
    pub(crate) fn prefetch(&mut self, after: Tensor<'g>, op: &StageOp) -> Tensor<'g> {
        self.custom(
            [1, 1, 1],
            &mut [after.raw],
            Some(prefetch_spans),
            op as *const StageOp as usize,
        )
    }
}

/// At most this many rows (queries times the heads of a KV head) over [`SPLIT_KV`] keys or
/// more: our attention computes each tile's state apart, the tiles shared among the threads (a
/// decoding step's three KV heads would otherwise leave a thread idle for a third of it on two
/// threads), then folds them in order, with the same bits as one node.
const SPLIT_ROWS: usize = 16;
/// See [`SPLIT_ROWS`].
const SPLIT_KV: usize = 1024;
/// Keys per tile of ggml-sys's attention (its `BK`, the engine's page).
const KERNEL_TILE: usize = 64;

/// Whether ggml-sys's attention kernel takes every attention of a model with heads of
/// `head_dim` (keys and values alike) and no soft cap, over an f16 cache the CPU reads in
/// place (the caller checks the cache): the condition of [`Graph::kernel_takes`] that a plan
/// can know before the graph is built.
pub(crate) fn kernel_takes_model(head_dim: usize, softcap: Option<f32>) -> bool {
    kernel_attention() && head_dim.is_multiple_of(16) && head_dim <= 256 && softcap.is_none()
}

/// Whether ggml-sys's attention kernel runs: it was built with its vector code (else ggml's
/// kernel is used: the plain loops are for correctness, not speed), and the environment does
/// not set `LLAMA_HDD_ATTENTION=ggml` (ggml's kernel everywhere, to compare the two).
fn kernel_attention() -> bool {
    static USE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USE.get_or_init(|| {
        // SAFETY: a pure function of how the crate was compiled.
        let simd = unsafe { sys::kernels::ggml_sys_flash_attn_f16_simd() } == 1;
        simd && std::env::var("LLAMA_HDD_ATTENTION").as_deref() != Ok("ggml")
    })
}
