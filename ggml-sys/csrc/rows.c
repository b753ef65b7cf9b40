// Row-wise ops for ggml's CPU backend, run as ggml custom ops (`ggml_custom_4d`): RMS norm
// times weights, and GELU-gated products. ggml computes both one element at a time (the norm's
// sum of squares as one f64 chain, GELU through a table read element by element); these run
// in vectors. Each output row is a function of its own input row only, by the same operations
// in the same order at every ISA level, so its bits never depend on the batch, on the row's
// place in it, on the thread count or on the level.
//
// Definitions (n elements a row).
// - `ggml_sys_rms_norm_mul`: y = (x * s) * w, element by element in f32, where
//       s  = 1 / sqrtf((float) (ss / n) + eps),
//       ss = the sum of the f32 squares x_i * x_i in f64: sixteen partial sums P_l, P_l the
//            elements i = l mod 16 in order, combined as ((P_l + P_l+8) + (P_l+4 + P_l+12))
//            for l < 4, then lanes l and l + 2, then 0 and 1.
//   ggml's sum is the same squares in one chain: the two differ by f64 rounding only.
// - `ggml_sys_geglu`: y = G(a) * b, G(v) = 0 for v <= -10, v for v >= 10, else T[f16(v)], T the
//   f16 rounding of GELU's tanh form 0.5 v (1 + tanh(sqrt(2 / pi) v (1 + 0.044715 v^2)))
//   evaluated in f32 at each f16 value (a table of 65,536 entries built once), f16(v) v rounded
//   to the nearest f16, ties to even: what ggml's CPU backend computes, by its own table.

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "ggml.h"
#include "ggml-cpu.h"
#include "half.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define ROWS_SIMD 1
#endif

int ggml_sys_rows_simd(void) {
#ifdef ROWS_SIMD
    return 1;
#else
    return 0;
#endif
}

// Row r (of ne1 * ne2) of a tensor with rows of nb[1] and planes of nb[2] bytes.
static inline const float * row_of(const struct ggml_tensor * t, int64_t r) {
    const int64_t i1 = r % t->ne[1], i2 = r / t->ne[1];
    return (const float *) ((const char *) t->data + i1 * t->nb[1] + i2 * t->nb[2]);
}

static inline float * row_of_mut(struct ggml_tensor * t, int64_t r) {
    return (float *) row_of(t, r);
}

// ss of the definition over x[0 .. n).
static double sum_squares(const float * x, int64_t n) {
    double p[16] = {0};
    int64_t i = 0;
#if defined(ROWS_SIMD) && defined(__AVX512F__)
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m512 sq = _mm512_mul_ps(v, v);
        a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
        a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_castpd_ps(
                                   _mm512_extractf64x4_pd(_mm512_castps_pd(sq), 1))));
    }
    _mm512_storeu_pd(p, a0);
    _mm512_storeu_pd(p + 8, a1);
#elif defined(ROWS_SIMD)
    __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
    for (; i + 16 <= n; i += 16) {
        for (int j = 0; j < 2; ++j) {
            const __m256 v = _mm256_loadu_ps(x + i + 8 * j);
            const __m256 sq = _mm256_mul_ps(v, v);
            a[2 * j] = _mm256_add_pd(a[2 * j], _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
            a[2 * j + 1] = _mm256_add_pd(a[2 * j + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
        }
    }
    for (int j = 0; j < 4; ++j) {
        _mm256_storeu_pd(p + 4 * j, a[j]);
    }
#endif
    for (; i < n; ++i) {
        const float sq = x[i] * x[i];
        p[i % 16] += (double) sq;
    }
    double q[4];
    for (int l = 0; l < 4; ++l) {
        q[l] = (p[l] + p[l + 8]) + (p[l + 4] + p[l + 12]);
    }
    return (q[0] + q[2]) + (q[1] + q[3]);
}

// dst (f32, x's shape, contiguous) = RMS norm of each row of src 0 (x: f32, elements
// contiguous) times src 1 (w: f32, one row of x's length, contiguous); eps is the f32 whose
// bits are `userdata`'s low 32 bits.
void ggml_sys_rms_norm_mul(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    const struct ggml_tensor * xt = dst->src[0];
    const float * w = (const float *) dst->src[1]->data;
    const int64_t n = xt->ne[0], rows = xt->ne[1] * xt->ne[2];
    const uint32_t bits = (uint32_t) (uintptr_t) userdata;
    float eps;
    memcpy(&eps, &bits, sizeof eps);
    for (int64_t r = ith; r < rows; r += nth) {
        const float * x = row_of(xt, r);
        float * y = row_of_mut(dst, r);
        const float mean = (float) (sum_squares(x, n) / (double) n);
        const float s = 1.0f / sqrtf(mean + eps);
        int64_t i = 0;
#if defined(ROWS_SIMD)
        const __m256 vs = _mm256_set1_ps(s);
        for (; i + 8 <= n; i += 8) {
            const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
            _mm256_storeu_ps(y + i, _mm256_mul_ps(v, _mm256_loadu_ps(w + i)));
        }
#endif
        for (; i < n; ++i) {
            y[i] = (x[i] * s) * w[i];
        }
    }
}

// T of the definition, one entry past the end so that a 32-bit gather of the last reads
// inside the table.
static uint16_t gelu_table[(1 << 16) + 2];
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

static void gelu_fill(void) {
    const float c = 0.79788456080286535587989211986876f;  // sqrt(2 / pi)
    for (uint32_t h = 0; h < (1u << 16); ++h) {
        const float v = ggml_sys_f16((uint16_t) h);
        const float g = 0.5f * v * (1.0f + tanhf(c * v * (1.0f + 0.044715f * v * v)));
        gelu_table[h] = ggml_fp32_to_fp16(g);
    }
}

// G(v) * b, +0 at or below -10.
static inline float gelu_gated(float v, float b) {
    if (v <= -10.0f) {
        return 0.0f;
    }
    if (v >= 10.0f) {
        return v * b;
    }
    return ggml_sys_f16(gelu_table[ggml_fp32_to_fp16(v)]) * b;
}

// dst (f32, src 0's shape, contiguous) = G(src 0) * src 1 (both f32 of one shape, elements
// contiguous; G of the top comment). `userdata` is unused.
void ggml_sys_geglu(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    pthread_once(&gelu_once, gelu_fill);
    const struct ggml_tensor * at = dst->src[0];
    const struct ggml_tensor * bt = dst->src[1];
    const int64_t n = at->ne[0], rows = at->ne[1] * at->ne[2];
    for (int64_t r = ith; r < rows; r += nth) {
        const float * a = row_of(at, r);
        const float * b = row_of(bt, r);
        float * y = row_of_mut(dst, r);
        int64_t i = 0;
#if defined(ROWS_SIMD)
        const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
        const __m256i low16 = _mm256_set1_epi32(0xFFFF);
        for (; i + 8 <= n; i += 8) {
            const __m256 v = _mm256_loadu_ps(a + i);
            const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m256i idx = _mm256_cvtepu16_epi32(h);
            const __m256i t = _mm256_and_si256(
                _mm256_i32gather_epi32((const int *) gelu_table, idx, 2), low16);
            // The eight 16-bit entries packed back into 128 bits, then widened.
            const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(t),
                                                    _mm256_extracti128_si256(t, 1));
            const __m256 g = _mm256_blendv_ps(_mm256_cvtph_ps(packed), v,
                                              _mm256_cmp_ps(v, hi, _CMP_GE_OQ));
            // At or below -10: +0, not 0 * b.
            const __m256 p = _mm256_mul_ps(g, _mm256_loadu_ps(b + i));
            _mm256_storeu_ps(y + i, _mm256_andnot_ps(_mm256_cmp_ps(v, lo, _CMP_LE_OQ), p));
        }
#endif
        for (; i < n; ++i) {
            y[i] = gelu_gated(a[i], b[i]);
        }
    }
}
