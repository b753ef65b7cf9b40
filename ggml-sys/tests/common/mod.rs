//! What the crate's test files share.
#![allow(dead_code)]

use ggml_sys::*;
use std::ffi::c_int;

/// Computes `t` (an f32 tensor of `ctx`) with `threads` threads and returns its elements.
///
/// # Safety
/// `ctx` is live, `t` is one of its tensors, and ggml can compute it in place.
pub unsafe fn compute_f32(ctx: *mut ggml_context, t: *mut ggml_tensor, threads: c_int) -> Vec<f32> {
    // SAFETY: the caller's promise; a contiguous f32 tensor holds `ggml_nelements` floats.
    unsafe {
        let graph = ggml_new_graph(ctx);
        ggml_build_forward_expand(graph, t);
        assert_eq!(
            ggml_graph_compute_with_ctx(ctx, graph, threads),
            GGML_STATUS_SUCCESS
        );
        assert!(ggml_is_contiguous(t));
        std::slice::from_raw_parts((*t).data as *const f32, ggml_nelements(t) as usize).to_vec()
    }
}

/// A deterministic pseudo-random source (SplitMix64), so failures reproduce.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `n` values of [`Rng::f32`].
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}
