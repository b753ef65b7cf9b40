// A q4_1 matrix product for ggml's CPU backend that unpacks each weight block once for up to
// four activation columns, run as a ggml custom op (`ggml_custom_4d`).
//
// ggml multiplies a q4_1 weight row with one q8_1 activation column at a time, so a batch of N
// columns unpacks every weight block N times. Here the unpacked block serves four columns. Each
// output element is computed with the same operations in the same order as ggml's own x86
// q4_1 x q8_1 dot product (integer products summed per 32-bit lane, one fused multiply-add per
// block into eight float lanes, the same horizontal sum, the scalar `m * s` sum added last), and
// the columns are quantized by ggml's own q8_1 routine, so the result equals ggml_mul_mat's bit
// for bit, whatever the number of columns. Without AVX2 the op calls ggml's dot product.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-cpu.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include "simd_x86.h"
#define Q41_SIMD 1
#endif

#define QK 32

#if defined(__GNUC__) || defined(__clang__)
#define Q41_INLINE static inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define Q41_INLINE static __forceinline
#else
#define Q41_INLINE static inline
#endif

typedef struct {
    uint16_t d;
    uint16_t m;
    uint8_t qs[QK / 2];
} q41_block;

typedef struct {
    uint16_t d;
    uint16_t s;
    int8_t qs[QK];
} q81_block;

_Static_assert(sizeof(q41_block) == 20, "q4_1 block is 20 bytes");
_Static_assert(sizeof(q81_block) == 36, "q8_1 block is 36 bytes");

// Per thread: the activation columns quantized to q8_1 (each thread quantizes all of them; the
// columns are few or short next to the weights each thread multiplies them with).
// The q8_1 blocks are followed by their scales and sums as f32.
static _Thread_local char * q8_buf = NULL;
static _Thread_local size_t q8_cap = 0;

static char * q8_reserve(size_t n_blocks) {
    const size_t bytes = n_blocks * (sizeof(q81_block) + 2 * sizeof(float));
    if (bytes > q8_cap) {
        char * p = realloc(q8_buf, bytes);
        if (p == NULL) {
            return NULL;
        }
        q8_buf = p;
        q8_cap = bytes;
    }
    return q8_buf;
}

#ifdef Q41_SIMD
static inline float f16_to_f32(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return ggml_fp16_to_fp32(h);
#endif
}

// Rows `x[r]` (R of them, nb blocks each) against `NC` columns: the columns' q8_1 values
// `y[c]` with their scales `d[c]` and sums `s[c]` as f32; out[r][c * out_stride].
Q41_INLINE void rows_cols(
    const q41_block * const * x, int R, const q81_block * const * y, const float * const * d,
    const float * const * s, int nb, int NC, float * const * out, size_t out_stride) {
    __m256 acc[2][4];
    float summs[2][4];
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < NC; ++c) {
            acc[r][c] = _mm256_setzero_ps();
            summs[r][c] = 0.0f;
        }
    }
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < nb; ++i) {
        float d0[2], m0[2];
        __m256i qx[2];
        for (int r = 0; r < R; ++r) {
            d0[r] = f16_to_f32(x[r][i].d);
            m0[r] = f16_to_f32(x[r][i].m);
            // Elements 0..15 are the low nibbles, 16..31 the high ones.
            const __m128i packed = _mm_loadu_si128((const __m128i *) x[r][i].qs);
            qx[r] = _mm256_and_si256(
                low, _mm256_insertf128_si256(_mm256_castsi128_si256(packed),
                                             _mm_srli_epi16(packed, 4), 1));
        }
        for (int c = 0; c < NC; ++c) {
            const float d1 = d[c][i];
            const float s1 = s[c][i];
            const __m256i qy = _mm256_loadu_si256((const __m256i *) y[c][i].qs);
            for (int r = 0; r < R; ++r) {
                summs[r][c] += m0[r] * s1;
                const __m256 d0d1 = _mm256_set1_ps(d0[r] * d1);
                const __m256i pairs = _mm256_maddubs_epi16(qx[r], qy);
                const __m256 xy = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, pairs));
                acc[r][c] = _mm256_fmadd_ps(d0d1, xy, acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < NC; ++c) {
            out[r][c * out_stride] = ggml_sys_hsum8(acc[r][c]) + summs[r][c];
        }
    }
}
#endif

// dst[m, n] = sum_k a[k, m] * b[k, n]; a: q4_1 [K, M] (src 0), b: f32 [K, N] (src 1), dst: f32
// [M, N], all two-dimensional, K a multiple of 32, rows of b contiguous.
void ggml_sys_mul_mat_q4_1(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    const struct ggml_tensor * a = dst->src[0];
    const struct ggml_tensor * b = dst->src[1];
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    const int nb = (int) (K / QK);

    char * buf = q8_reserve((size_t) N * nb);
    if (buf == NULL) {
        // No memory for the columns: ggml's own dot product on freshly quantized columns
        // cannot run either; fill with NaN so that the failure is visible, not silent.
        for (int64_t n = 0; n < N; ++n) {
            for (int64_t m = ith; m < M; m += nth) {
                *(float *) ((char *) dst->data + m * dst->nb[0] + n * dst->nb[1]) = NAN;
            }
        }
        return;
    }
    q81_block * q8 = (q81_block *) buf;
    float * ds = (float *) (buf + (size_t) N * nb * sizeof(q81_block));
    float * ss = ds + (size_t) N * nb;
    const struct ggml_type_traits_cpu * q81 = ggml_get_type_traits_cpu(GGML_TYPE_Q8_1);
    for (int64_t n = 0; n < N; ++n) {
        q81->from_float((const float *) ((const char *) b->data + n * b->nb[1]), q8 + n * nb, K);
        for (int i = 0; i < nb; ++i) {
            ds[n * nb + i] = ggml_fp16_to_fp32(q8[n * nb + i].d);
            ss[n * nb + i] = ggml_fp16_to_fp32(q8[n * nb + i].s);
        }
    }

    // Rows split evenly between the threads.
    const int64_t per = (M + nth - 1) / nth;
    const int64_t m0 = per * ith;
    const int64_t m1 = m0 + per < M ? m0 + per : M;
    const size_t out_stride = dst->nb[1] / sizeof(float);
    // Columns in tiles that stay in the first-level cache with a few weight rows.
    const int64_t TILE = 16;
    for (int64_t n0 = 0; n0 < N; n0 += TILE) {
        const int64_t n1 = n0 + TILE < N ? n0 + TILE : N;
#ifdef Q41_SIMD
        for (int64_t m = m0; m < m1; m += 2) {
            const int R = m + 1 < m1 ? 2 : 1;
            const q41_block * x[2];
            for (int r = 0; r < 2; ++r) {
                x[r] = (const q41_block *) ((const char *) a->data + (m + (r < R ? r : 0)) * a->nb[1]);
            }
            for (int64_t n = n0; n < n1; n += 4) {
                const q81_block * y[4];
                const float * d[4];
                const float * s[4];
                for (int c = 0; c < 4; ++c) {
                    const int64_t col = n + c < n1 ? n + c : n;
                    y[c] = q8 + col * nb;
                    d[c] = ds + col * nb;
                    s[c] = ss + col * nb;
                }
                float * out[2];
                for (int r = 0; r < 2; ++r) {
                    out[r] = (float *) ((char *) dst->data + (m + (r < R ? r : 0)) * dst->nb[0]) + n * out_stride;
                }
                const int NC = n1 - n < 4 ? (int) (n1 - n) : 4;
                if (R == 2) {
                    switch (NC) {
                        case 1: rows_cols(x, 2, y, d, s, nb, 1, out, out_stride); break;
                        case 2: rows_cols(x, 2, y, d, s, nb, 2, out, out_stride); break;
                        case 3: rows_cols(x, 2, y, d, s, nb, 3, out, out_stride); break;
                        default: rows_cols(x, 2, y, d, s, nb, 4, out, out_stride); break;
                    }
                } else {
                    switch (NC) {
                        case 1: rows_cols(x, 1, y, d, s, nb, 1, out, out_stride); break;
                        case 2: rows_cols(x, 1, y, d, s, nb, 2, out, out_stride); break;
                        case 3: rows_cols(x, 1, y, d, s, nb, 3, out, out_stride); break;
                        default: rows_cols(x, 1, y, d, s, nb, 4, out, out_stride); break;
                    }
                }
            }
        }
#else
        for (int64_t m = m0; m < m1; ++m) {
            const q41_block * x = (const q41_block *) ((const char *) a->data + m * a->nb[1]);
            float * out = (float *) ((char *) dst->data + m * dst->nb[0]);
            const struct ggml_type_traits_cpu * q41 = ggml_get_type_traits_cpu(GGML_TYPE_Q4_1);
            for (int64_t n = n0; n < n1; ++n) {
                q41->vec_dot((int) K, out + n * out_stride, 0, x, 0, q8 + n * nb, 0, 1);
            }
        }
#endif
    }
}
