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

// An 8 x 8 block of floats transposed in registers: c[i] lane j = r[j] lane i.
static inline void ggml_sys_transpose8(const __m256 * r, __m256 * c) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    c[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    c[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    c[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    c[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    c[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    c[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    c[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    c[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// The results of R <= 8 weight rows against W (8 or 16) columns, `res[r * W + c]`, stored as
// columns: column c (c < cols) gets its R values at `out + c * col_stride` (a float stride),
// rows in order. Eight by eight transposes in registers instead of one scalar move per value;
// values are only moved, never changed.
static inline void ggml_sys_store_columns(const float * res, int W, int R, int cols, float * out,
                                          size_t col_stride) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(R), lane);
    for (int c0 = 0; c0 < W && c0 < cols; c0 += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) {
            r[i] = i < R ? _mm256_loadu_ps(res + i * W + c0) : _mm256_setzero_ps();
        }
        // Column c0 + i of the eight rows.
        __m256 col[8];
        ggml_sys_transpose8(r, col);
        for (int i = 0; i < 8 && c0 + i < cols; ++i) {
            float * dst = out + (size_t) (c0 + i) * col_stride;
            if (R == 8) {
                _mm256_storeu_ps(dst, col[i]);
            } else {
                _mm256_maskstore_ps(dst, keep, col[i]);
            }
        }
    }
}

#endif
