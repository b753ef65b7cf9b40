// Small AVX helpers shared by this crate's kernels (included where AVX2 is compiled in).
#ifndef GGML_SYS_SIMD_X86_H
#define GGML_SYS_SIMD_X86_H

#include <immintrin.h>

// The sum of the eight lanes: the high half onto the low, then pairs, then the last two (the
// order of ggml's own horizontal sum, which the q4_1 kernel's bit-for-bit results rely on).
static inline float ggml_sys_hsum8(__m256 x) {
    __m128 r = _mm256_extractf128_ps(x, 1);
    r = _mm_add_ps(r, _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

#endif
