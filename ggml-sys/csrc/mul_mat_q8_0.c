// Q4_0 and Q8_0 matrix products for ggml's CPU backend, run as ggml custom ops
// (`ggml_custom_4d`): the integer-sum product that mul_mat_q4_1.c runs for q4_1, for the two
// other common weight types. Every column of the node takes it, whatever their number; the
// engine gives these ops the columns that take integer sums and ggml_mul_mat the others.
//
// Definition. The activation columns are quantized by ggml's own q8_0 routine (the type that
// ggml's Q4_0 and Q8_0 dot products quantize them to, so the same int8 values y and scales d1).
// A weight block holds a scale d0 and 32 integers w: q - 8 for Q4_0 (q the stored nibble,
// 0..15), the stored int8 for Q8_0. For row r and column c, over the blocks i in order,
//     dot_i = sum_{j < 32} w_j * y_j                    (exactly, in 32-bit integers)
//     acc   = fma(d0_i * d1_i, (float) dot_i, acc)       (from acc = 0; d0 * d1 rounded to f32)
//     out   = acc.
// ggml computes the same exact block sums (for each block ggml's d0 * d1 is the same f32 product)
// but accumulates them in eight float lanes and adds the lanes at the end: the two results
// differ by float rounding only, never in the integers. |dot_i| <= 32 * 128 * 128 = 2^19 <
// 2^24, so the conversion to float is exact.
//
// Column c's bits depend on column c and the weights only, never on the number of columns or
// on where c lands (group, lane, tile, thread), whichever path below computes it.
//
// How the integers are summed. Two vector paths, and a plain C one; the same integers (exact)
// and the same float operations in the same order in each, so the same bits.
// - Up to FEW_MAX_COLS columns (decoding, short items; `mul_mat_few`): one vector lane per
//   weight row, FEW_ROWS rows to a tile (16 in 512 bits with AVX-512 VNNI, else 8 in 256).
//   The tile's blocks are loaded side by side and transposed in registers (4x4 transposes of
//   32-bit elements in each 128-bit part) so that lane r of vector k holds element quad k of
//   row r; their scales (the blocks' first bytes) are copied to a buffer a tile ahead and read
//   as one vector per block. One multiply-add of a broadcast column quad into the rows' sums
//   per quad, then one product d0 * d1, one conversion and one fused multiply-add per block;
//   the columns four at a time. The tiles ahead are prefetched into L2 (a decoding step
//   streams the weights once). With VNNI, as below: u = w + b and the column block's
//   -b * sum(y) as the starting sum; Q8_0's 32-byte blocks are loaded whole and each half of
//   the rows transposed on its own, so a vector holds quads k and k + 4 of its rows, met by a
//   column vector of quad k and quad k + 4 laid out to match, the two parts added after.
//   AVX2 without VNNI: Q4_0's nibbles as below; Q8_0's w through their signs, `maddubs(|w|,
//   sign(w) * y)`: |w| <= 128 and |y| <= 127 (q8_0 rounds to -127 .. 127), so a pair's sum is
//   at most 2 * 128 * 127 < 2^15, exact, then widened per quad.
// - More columns: one vector lane holds one column: the columns are packed W to a group (16
//   with AVX-512 VNNI, else 8), the four bytes of a block's element quad for all W columns
//   side by side, so one multiply-add of a broadcast weight quad serves W columns, and the
//   conversion and scale come once per block for W columns. The multiply-add instructions take
//   one unsigned operand: the weights are unpacked unsigned, u = w + b with b = 8 (Q4_0: u is
//   the stored nibble q) or b = 128 (Q8_0: u = w xor 0x80, 0..255), and the block's sum starts
//   at -b * sum_j y_j, computed exactly in integers when the columns are packed (never from
//   q8_1's rounded f16 sum): sum_j u_j y_j - b * sum_j y_j = sum_j w_j y_j.
//   - AVX-512 VNNI / AVX-VNNI: `dpbusd` sums four u8 * s8 products into a 32-bit lane without
//     saturation: |partial sums| <= 32 * 255 * 128 < 2^31, exact.
//   - AVX2 without VNNI: `maddubs` adds pairs of u8 * s8 products into 16 bits and saturates,
//     so the unsigned bytes are kept to 0..15: Q4_0's nibbles as they are, Q8_0's u split into
//     u = 16 * h + l (h, l in 0..15), two sums. A 16-bit lane adds a block's 8 quads' pairs:
//     |sum| <= 8 * 2 * 15 * 128 = 30720 < 2^15, exact; then widened to 32 bits (`madd` by 1),
//     and for Q8_0 16 * H + L.
// - Neither: a plain C loop over the column groups' layout with the same integer sums and the
//   same float operations (fmaf), so the same bits, only slower; `ggml_sys_mul_mat_q4_0_isum`
//   and `ggml_sys_mul_mat_q8_0_isum` then return 0 and the engine keeps ggml's product.
// The float step is the same instructions in every path (a product, a conversion, a fused
// multiply-add per block and column), so the result is the same bits at every ISA level.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-cpu.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define Q80_SIMD 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define Q80_W16 1
#elif (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define Q80_VNNI256 1
#endif
#endif

#define QK 32

#if defined(__GNUC__) || defined(__clang__)
#define Q80_INLINE static inline __attribute__((always_inline))
#define Q80_ALIGN64 __attribute__((aligned(64)))
#elif defined(_MSC_VER)
#define Q80_INLINE static __forceinline
#define Q80_ALIGN64 __declspec(align(64))
#else
#define Q80_INLINE static inline
#define Q80_ALIGN64
#endif

typedef struct {
    uint16_t d;
    uint8_t qs[QK / 2];
} q40_block;

typedef struct {
    uint16_t d;
    int8_t qs[QK];
} q80_block;

_Static_assert(sizeof(q40_block) == 18, "q4_0 block is 18 bytes");
_Static_assert(sizeof(q80_block) == 34, "q8_0 block is 34 bytes");

// The weight types.
enum { KIND_Q4_0 = 0, KIND_Q8_0 = 1 };

// Columns per group and weight rows per pass.
#if defined(Q80_W16)
#define W 16
#define MR 8
#else
#define W 8
#define MR 4
#endif

// Bytes of one unpacked weight block: 32 unsigned values, or for Q8_0 on AVX2 without VNNI
// their low nibbles then their high nibbles.
#if defined(Q80_SIMD) && !defined(Q80_W16) && !defined(Q80_VNNI256)
#define Q80_SPLIT 1
#define XB(kind) ((kind) == KIND_Q8_0 ? 2 * QK : QK)
#else
#define XB(kind) QK
#endif

// A group's block i: quad k (elements 4k .. 4k+3) of its W columns at `qs + ((i * 8 + k) * W
// + c) * 4`, then the scales d1[i * W + c] as f32, then the starting sums -b * sum(y) as int32.
#define GROUP_BYTES (8 * W * 4 + W * sizeof(float) + W * sizeof(int32_t))

static _Thread_local char * buf_raw = NULL;
static _Thread_local size_t buf_cap = 0;

// A per-thread buffer of `bytes`, 64-byte aligned.
static char * reserve(size_t bytes) {
    if (bytes + 64 > buf_cap) {
        char * p = realloc(buf_raw, bytes + 64);
        if (p == NULL) {
            return NULL;
        }
        buf_raw = p;
        buf_cap = bytes + 64;
    }
    return (char *) (((uintptr_t) buf_raw + 63) & ~(uintptr_t) 63);
}

static inline size_t align64(size_t n) {
    return (n + 63) & ~(size_t) 63;
}

static inline float * out_at(struct ggml_tensor * dst, int64_t m, int64_t n) {
    return (float *) ((char *) dst->data + m * dst->nb[0] + n * dst->nb[1]);
}

// Rows m0..m1-1 of columns n0..n1-1 set to NaN: a kernel without scratch memory fails visibly.
static void fill_nan(struct ggml_tensor * dst, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
        for (int64_t m = m0; m < m1; ++m) {
            *out_at(dst, m, n) = NAN;
        }
    }
}

// Quantizes columns n0 .. n0 + W - 1 of `b` (those below N; the rest zero) into group `g`,
// going through `tmp` (nb q8_0 blocks); `bias` is b of the top comment.
static void pack_group(const struct ggml_tensor * b, int64_t n0, int64_t N, int nb, int32_t bias,
                       q80_block * tmp, char * g) {
    const struct ggml_type_traits_cpu * q80 = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0);
    int8_t * qs = (int8_t *) g;
    float * d1 = (float *) (g + (size_t) nb * 8 * W * 4);
    int32_t * start = (int32_t *) (d1 + (size_t) nb * W);
    for (int c = 0; c < W; ++c) {
        const int real = n0 + c < N;
        if (real) {
            q80->from_float((const float *) ((const char *) b->data + (n0 + c) * b->nb[1]), tmp,
                            (int64_t) nb * QK);
        }
        for (int i = 0; i < nb; ++i) {
            int32_t sum = 0;
            for (int k = 0; k < 8; ++k) {
                int8_t * quad = qs + (((size_t) i * 8 + k) * W + c) * 4;
                if (real) {
                    memcpy(quad, tmp[i].qs + 4 * k, 4);
                    sum += quad[0] + quad[1] + quad[2] + quad[3];
                } else {
                    memset(quad, 0, 4);
                }
            }
            d1[i * W + c] = real ? ggml_fp16_to_fp32(tmp[i].d) : 0.0f;
            start[i * W + c] = -bias * sum;
        }
    }
}

// Unpacks weight row `row` (nb blocks of `kind`) into `x` (XB(kind) bytes per block, the
// unsigned u of the top comment) and its scales as f32 into `d0`.
static void unpack_row(int kind, const void * row, int nb, uint8_t * x, float * d0) {
    for (int i = 0; i < nb; ++i) {
        uint8_t u[QK];
        if (kind == KIND_Q4_0) {
            const q40_block * blk = (const q40_block *) row + i;
            // Elements 0..15 are the low nibbles, 16..31 the high ones.
#ifdef Q80_SIMD
            const __m128i packed = _mm_loadu_si128((const __m128i *) blk->qs);
            const __m128i low = _mm_set1_epi8(0x0F);
            _mm_storeu_si128((__m128i *) u, _mm_and_si128(packed, low));
            _mm_storeu_si128((__m128i *) (u + QK / 2), _mm_and_si128(_mm_srli_epi16(packed, 4), low));
#else
            for (int j = 0; j < QK / 2; ++j) {
                u[j] = blk->qs[j] & 0x0F;
                u[j + QK / 2] = blk->qs[j] >> 4;
            }
#endif
            d0[i] = ggml_fp16_to_fp32(blk->d);
        } else {
            const q80_block * blk = (const q80_block *) row + i;
            for (int j = 0; j < QK; ++j) {
                u[j] = (uint8_t) blk->qs[j] ^ 0x80;
            }
            d0[i] = ggml_fp16_to_fp32(blk->d);
        }
        uint8_t * out = x + (size_t) i * XB(kind);
#ifdef Q80_SPLIT
        if (kind == KIND_Q8_0) {
            for (int j = 0; j < QK; ++j) {
                out[j] = u[j] & 0x0F;
                out[QK + j] = u[j] >> 4;
            }
            continue;
        }
#endif
        memcpy(out, u, QK);
    }
}

#ifdef Q80_SIMD
#if defined(Q80_W16)
typedef __m512i vint;
typedef __m512 vflt;
#define VI_LOAD(p) _mm512_load_si512((const void *) (p))
#define VF_ZERO() _mm512_setzero_ps()
#define VF_LOAD(p) _mm512_load_ps(p)
#define VF_BCST(p) _mm512_set1_ps(*(p))
#define VF_MUL(x, y) _mm512_mul_ps(x, y)
#define VF_FMA(x, y, z) _mm512_fmadd_ps(x, y, z)
#define VF_CVT(x) _mm512_cvtepi32_ps(x)
#define VF_STORE(p, x) _mm512_store_ps(p, x)
#define VI_BCST32(v) _mm512_set1_epi32(v)
#else
typedef __m256i vint;
typedef __m256 vflt;
#define VI_LOAD(p) _mm256_load_si256((const __m256i *) (p))
#define VF_ZERO() _mm256_setzero_ps()
#define VF_LOAD(p) _mm256_load_ps(p)
#define VF_BCST(p) _mm256_broadcast_ss(p)
#define VF_MUL(x, y) _mm256_mul_ps(x, y)
#define VF_FMA(x, y, z) _mm256_fmadd_ps(x, y, z)
#define VF_CVT(x) _mm256_cvtepi32_ps(x)
#define VF_STORE(p, x) _mm256_store_ps(p, x)
#define VI_BCST32(v) _mm256_set1_epi32(v)
#endif

static inline int32_t load_quad(const uint8_t * p) {
    int32_t q;
    memcpy(&q, p, 4);
    return q;
}

// Block sums of R rows against a group's block: dot[r] lane c = the exact sum of the block's
// products w * y of row r (x + r * rs) and column c (y: the block's 8 quads of W columns,
// `start`: the W starting sums).
Q80_INLINE void block_dots(int kind, vint * dot, int R, const uint8_t * x, size_t rs,
                           const int8_t * y, const int32_t * start) {
    const vint s = VI_LOAD(start);
#if defined(Q80_W16) || defined(Q80_VNNI256)
    (void) kind;
    for (int r = 0; r < R; ++r) {
        dot[r] = s;
    }
    for (int k = 0; k < 8; ++k) {
        const vint yk = VI_LOAD(y + k * W * 4);
        for (int r = 0; r < R; ++r) {
            const vint xq = VI_BCST32(load_quad(x + r * rs + 4 * k));
#if defined(Q80_W16)
            dot[r] = _mm512_dpbusd_epi32(dot[r], xq, yk);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
            dot[r] = _mm256_dpbusd_epi32(dot[r], xq, yk);
#else
            dot[r] = _mm256_dpbusd_avx_epi32(dot[r], xq, yk);
#endif
        }
    }
#else
    // maddubs: pairs of products of unsigned 0..15 and int8 in 16 bits, a block's 8 quads
    // summed there: |sum| <= 30720 < 2^15 (see the top), then widened.
    const __m256i ones = _mm256_set1_epi16(1);
    const int parts = kind == KIND_Q8_0 ? 2 : 1;
    __m256i s16[2][MR];
    for (int p = 0; p < parts; ++p) {
        for (int r = 0; r < R; ++r) {
            s16[p][r] = _mm256_setzero_si256();
        }
    }
    for (int k = 0; k < 8; ++k) {
        const vint yk = VI_LOAD(y + k * W * 4);
        for (int p = 0; p < parts; ++p) {
            for (int r = 0; r < R; ++r) {
                const __m256i xq = _mm256_set1_epi32(load_quad(x + r * rs + p * QK + 4 * k));
                s16[p][r] = _mm256_add_epi16(s16[p][r], _mm256_maddubs_epi16(xq, yk));
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        __m256i d = _mm256_madd_epi16(s16[0][r], ones);
        if (kind == KIND_Q8_0) {
            // u = l + 16 h: the low nibbles' sum plus 16 times the high nibbles'.
            d = _mm256_add_epi32(d, _mm256_slli_epi32(_mm256_madd_epi16(s16[1][r], ones), 4));
        }
        dot[r] = _mm256_add_epi32(d, s);
    }
#endif
}

// R unpacked rows (x + r * rs; scales d0[r * nb + i]) against one group: res[r * W + c].
Q80_INLINE void rows_group(int kind, const uint8_t * x, size_t rs, const float * d0,
                           const char * g, int nb, int R, float * res) {
    const int8_t * qs = (const int8_t *) g;
    const float * d1 = (const float *) (g + (size_t) nb * 8 * W * 4);
    const int32_t * start = (const int32_t *) (d1 + (size_t) nb * W);
    vflt acc[MR];
    for (int r = 0; r < R; ++r) {
        acc[r] = VF_ZERO();
    }
    for (int i = 0; i < nb; ++i) {
        vint dot[MR];
        block_dots(kind, dot, R, x + (size_t) i * XB(kind), rs, qs + (size_t) i * 8 * W * 4,
                   start + (size_t) i * W);
        const vflt dc = VF_LOAD(d1 + (size_t) i * W);
        for (int r = 0; r < R; ++r) {
            acc[r] = VF_FMA(VF_MUL(VF_BCST(d0 + (size_t) r * nb + i), dc), VF_CVT(dot[r]), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) {
        VF_STORE(res + r * W, acc[r]);
    }
}
#else
// The same sums and float operations as the vector paths, one lane at a time.
static void rows_group(int kind, const uint8_t * x, size_t rs, const float * d0, const char * g,
                       int nb, int R, float * res) {
    (void) kind;
    const int8_t * qs = (const int8_t *) g;
    const float * d1 = (const float *) (g + (size_t) nb * 8 * W * 4);
    const int32_t * start = (const int32_t *) (d1 + (size_t) nb * W);
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < W; ++c) {
            float acc = 0.0f;
            for (int i = 0; i < nb; ++i) {
                const uint8_t * xb = x + r * rs + (size_t) i * QK;
                const int8_t * yb = qs + (size_t) i * 8 * W * 4;
                int32_t dot = start[(size_t) i * W + c];
                for (int k = 0; k < 8; ++k) {
                    for (int j = 0; j < 4; ++j) {
                        dot += (int32_t) xb[4 * k + j] * yb[(k * W + c) * 4 + j];
                    }
                }
                const float d = d0[(size_t) r * nb + i] * d1[(size_t) i * W + c];
                acc = fmaf(d, (float) dot, acc);
            }
            res[r * W + c] = acc;
        }
    }
}
#endif

// R rows from m (unpacked in x, d0) against groups g0 .. g1 - 1 (packed from `packed`).
Q80_INLINE void rows_groups(int kind, struct ggml_tensor * dst, int64_t m, int R,
                            const uint8_t * x, const float * d0, const char * packed, int64_t g0,
                            int64_t g1, int nb, int64_t N) {
    const size_t group_bytes = (size_t) nb * GROUP_BYTES;
    Q80_ALIGN64 float res[MR * W] = {0};
    for (int64_t g = g0; g < g1; ++g) {
        rows_group(kind, x, (size_t) nb * XB(kind), d0, packed + (size_t) (g - g0) * group_bytes,
                   nb, R, res);
        const int64_t n0 = g * W;
        const int cols = N - n0 < W ? (int) (N - n0) : W;
        for (int c = 0; c < cols; ++c) {
            float * out = out_at(dst, m, n0 + c);
            for (int r = 0; r < R; ++r) {
                out[r] = res[r * W + c];
            }
        }
    }
}

// The work of thread ith of nth over `groups` column groups and M rows: enough groups, and
// each thread packs and computes its own groups for every row; otherwise each packs every
// group and computes its share of the rows. Returns 0 when the thread has nothing to do.
static int split_work(int64_t groups, int64_t M, int ith, int nth, int64_t * g0, int64_t * g1,
                      int64_t * r0, int64_t * r1) {
    const int by_groups = groups >= 2 * nth;
    const int64_t g_per = (groups + nth - 1) / nth, r_per = (M + nth - 1) / nth;
    *g0 = by_groups ? g_per * ith : 0;
    *g1 = by_groups ? (*g0 + g_per < groups ? *g0 + g_per : groups) : groups;
    *r0 = by_groups ? 0 : r_per * ith;
    *r1 = by_groups ? M : (*r0 + r_per < M ? *r0 + r_per : M);
    return *g0 < *g1 && *r0 < *r1;
}

#if defined(Q80_SIMD) && defined(__F16C__)
// The few-column path (see the top): one vector lane per weight row, FEW_ROWS rows per tile,
// the columns FEW_CHUNK at a time.
#define Q80_FEW 1
#define FEW_CHUNK 4
// How far ahead of the tile computed its weights are prefetched, in rows (whole tiles).
#define FEW_PREFETCH_ROWS 48
// Most columns the few-column path takes; more go to the column groups (which cost the same
// for 1 to W columns; measured on Zen 4, the few-column path is the faster up to about 12 of
// 16 for Q8_0, 24 for Q4_0, whose weights it unpacks in fewer instructions).
#if defined(Q80_W16)
#define FEW_MAX_COLS(kind) ((kind) == KIND_Q4_0 ? 24 : 12)
#else
#define FEW_MAX_COLS(kind) ((kind) == KIND_Q4_0 ? 16 : 8)
#endif

// The few-column path's vectors: FEW_ROWS rows, 16 with AVX-512 VNNI (512 bits), else 8.
#ifdef Q80_W16
#define FEW_W16 1
#endif
#ifdef FEW_W16
#define FEW_ROWS 16
typedef __m512i fvi;
typedef __m512 fvf;
#define FI_ZERO() _mm512_setzero_si512()
#define FI_LOAD(p) _mm512_load_si512((const void *) (p))
#define FI_SET1_8(v) _mm512_set1_epi8(v)
#define FI_SET1_32(v) _mm512_set1_epi32(v)
#define FI_AND(x, y) _mm512_and_si512(x, y)
#define FI_XOR(x, y) _mm512_xor_si512(x, y)
#define FI_SRLI16(x, n) _mm512_srli_epi16(x, n)
#define FI_ADD32(x, y) _mm512_add_epi32(x, y)
#define FI_UNPACKLO32(x, y) _mm512_unpacklo_epi32(x, y)
#define FI_UNPACKHI32(x, y) _mm512_unpackhi_epi32(x, y)
#define FI_UNPACKLO64(x, y) _mm512_unpacklo_epi64(x, y)
#define FI_UNPACKHI64(x, y) _mm512_unpackhi_epi64(x, y)
#define FEW_DPBUSD(acc, x, y) _mm512_dpbusd_epi32(acc, x, y)
#define FF_ZERO() _mm512_setzero_ps()
#define FF_BCST(p) _mm512_set1_ps(*(p))
#define FF_MUL(x, y) _mm512_mul_ps(x, y)
#define FF_FMA(x, y, z) _mm512_fmadd_ps(x, y, z)
#define FF_CVT(x) _mm512_cvtepi32_ps(x)
#else
#define FEW_ROWS 8
typedef __m256i fvi;
typedef __m256 fvf;
#define FI_ZERO() _mm256_setzero_si256()
#define FI_LOAD(p) _mm256_load_si256((const __m256i *) (p))
#define FI_SET1_8(v) _mm256_set1_epi8(v)
#define FI_SET1_32(v) _mm256_set1_epi32(v)
#define FI_AND(x, y) _mm256_and_si256(x, y)
#define FI_XOR(x, y) _mm256_xor_si256(x, y)
#define FI_SRLI16(x, n) _mm256_srli_epi16(x, n)
#define FI_ADD32(x, y) _mm256_add_epi32(x, y)
#define FI_UNPACKLO32(x, y) _mm256_unpacklo_epi32(x, y)
#define FI_UNPACKHI32(x, y) _mm256_unpackhi_epi32(x, y)
#define FI_UNPACKLO64(x, y) _mm256_unpacklo_epi64(x, y)
#define FI_UNPACKHI64(x, y) _mm256_unpackhi_epi64(x, y)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define FEW_DPBUSD(acc, x, y) _mm256_dpbusd_epi32(acc, x, y)
#elif defined(__AVXVNNI__)
#define FEW_DPBUSD(acc, x, y) _mm256_dpbusd_avx_epi32(acc, x, y)
#endif
#define FF_ZERO() _mm256_setzero_ps()
#define FF_BCST(p) _mm256_broadcast_ss(p)
#define FF_MUL(x, y) _mm256_mul_ps(x, y)
#define FF_FMA(x, y, z) _mm256_fmadd_ps(x, y, z)
#define FF_CVT(x) _mm256_cvtepi32_ps(x)
#endif

// A 4x4 transpose of 32-bit elements in each 128-bit part of Z[0..3]: lane j of P[k] in a
// part is element k of Z[j] in that part.
Q80_INLINE void transpose4(const fvi * Z, fvi * P) {
    const fvi t0 = FI_UNPACKLO32(Z[0], Z[1]), t1 = FI_UNPACKHI32(Z[0], Z[1]);
    const fvi t2 = FI_UNPACKLO32(Z[2], Z[3]), t3 = FI_UNPACKHI32(Z[2], Z[3]);
    P[0] = FI_UNPACKLO64(t0, t2);
    P[1] = FI_UNPACKHI64(t0, t2);
    P[2] = FI_UNPACKLO64(t1, t3);
    P[3] = FI_UNPACKHI64(t1, t3);
}

static inline __m128i load16(const char * p) {
    return _mm_loadu_si128((const __m128i *) p);
}

// Rows j, j + 4 (, j + 8, j + 12) of the tile, 16 bytes from byte `off`, side by side:
// 128-bit part p holds row j + 4p, so that after `transpose4` lane r is row r.
Q80_INLINE fvi rows_side(const char * const * rp, int j, size_t off) {
#ifdef FEW_W16
    __m512i z = _mm512_castsi128_si512(load16(rp[j] + off));
    z = _mm512_inserti32x4(z, load16(rp[j + 4] + off), 1);
    z = _mm512_inserti32x4(z, load16(rp[j + 8] + off), 2);
    return _mm512_inserti32x4(z, load16(rp[j + 12] + off), 3);
#else
    return _mm256_inserti128_si256(_mm256_castsi128_si256(load16(rp[j] + off)),
                                   load16(rp[j + 4] + off), 1);
#endif
}

// Row r's 32 bytes from byte `off` (with 512 bits, then row r + 4's): 128-bit parts hold
// quads 0-3 and 4-7 of row r (then of row r + 4).
Q80_INLINE fvi rows_whole(const char * const * rp, int r, size_t off) {
#ifdef FEW_W16
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) (rp[r] + off))),
        _mm256_loadu_si256((const __m256i *) (rp[r + 4] + off)), 1);
#else
    return _mm256_loadu_si256((const __m256i *) (rp[r] + off));
#endif
}

// The low 16 bits of each 32-bit lane of `v` (f16 values) as f32.
Q80_INLINE fvf few_f16_low(fvi v) {
#ifdef FEW_W16
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
#else
    const __m256i p = _mm256_packus_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)),
                                          _mm256_setzero_si256());
    return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08)));
#endif
}

// Block i of the tile's rows rp[0 .. FEW_ROWS - 1] transposed: lane r of X[k] holds quad k
// (elements 4k .. 4k + 3) of row r: the unsigned u of the top comment, except Q8_0's signed w
// where `maddubs` takes them through their signs; lane r of d0 its scale, from the blocks'
// first 4 bytes copied to hd[i * FEW_ROWS + r].
Q80_INLINE void few_unpack(int kind, const char * const * rp, const uint32_t * hd, int i, fvi * X,
                           fvf * d0) {
    const size_t bb = kind == KIND_Q4_0 ? sizeof(q40_block) : sizeof(q80_block);
    const size_t at = (size_t) i * bb;
    fvi Z[4];
    if (kind == KIND_Q4_0) {
        for (int j = 0; j < 4; ++j) {
            Z[j] = rows_side(rp, j, at + 2);
        }
        fvi P[4];
        transpose4(Z, P);
        // Byte j's low nibble is element j, its high nibble element j + 16.
        const fvi low = FI_SET1_8(0x0F);
        for (int k = 0; k < 4; ++k) {
            X[k] = FI_AND(P[k], low);
            X[k + 4] = FI_AND(FI_SRLI16(P[k], 4), low);
        }
    } else {
#ifdef FEW_DPBUSD
        // Whole blocks side by side, u = w xor 0x80, each half of the rows transposed on its
        // own: X[4h + k] holds quads k and k + 4 of rows h * FEW_ROWS / 2 on (see few_dots).
        for (int h = 0; h < 2; ++h) {
            for (int j = 0; j < 4; ++j) {
                Z[j] = FI_XOR(rows_whole(rp, h * (FEW_ROWS / 2) + j, at + 2),
                              FI_SET1_8((char) 0x80));
            }
            transpose4(Z, X + 4 * h);
        }
#else
        for (int h = 0; h < 2; ++h) {
            for (int j = 0; j < 4; ++j) {
                Z[j] = rows_side(rp, j, at + 2 + 16 * h);
            }
            transpose4(Z, X + 4 * h);
        }
#endif
    }
    // The scale is the low 16 bits of the block's first 4.
    *d0 = few_f16_low(FI_LOAD(hd + (size_t) i * FEW_ROWS));
}

// Lane r: the exact sum of the products w * y of row r's block (X) and the column's block y
// (32 int8); `start` is the column block's -b * sum(y) where X holds u = w + b (else unused).
// Q8_0 with VNNI reads `pat` instead of y: for each k < 4, 16 int32 (64 bytes), y's quad k
// four times, quad k + 4 four times, and again, matching X's halves.
Q80_INLINE fvi few_dots(int kind, const fvi * X, const int8_t * y, const int32_t * pat,
                        int32_t start) {
#ifdef FEW_DPBUSD
    if (kind == KIND_Q8_0) {
        fvi D[2];
        for (int h = 0; h < 2; ++h) {
            fvi e = FEW_DPBUSD(FI_ZERO(), X[4 * h], FI_LOAD(pat));
            fvi o = FEW_DPBUSD(FI_ZERO(), X[4 * h + 1], FI_LOAD(pat + 16));
            e = FEW_DPBUSD(e, X[4 * h + 2], FI_LOAD(pat + 32));
            o = FEW_DPBUSD(o, X[4 * h + 3], FI_LOAD(pat + 48));
            D[h] = FI_ADD32(e, o);
        }
        // D[h]'s 128-bit parts: its rows' sums over quads 0-3, then over quads 4-7 (and again
        // for the next four rows): the two added, the halves' rows in order.
#ifdef FEW_W16
        const fvi lo = _mm512_shuffle_i32x4(D[0], D[1], _MM_SHUFFLE(2, 0, 2, 0));
        const fvi hi = _mm512_shuffle_i32x4(D[0], D[1], _MM_SHUFFLE(3, 1, 3, 1));
#else
        const fvi lo = _mm256_permute2x128_si256(D[0], D[1], 0x20);
        const fvi hi = _mm256_permute2x128_si256(D[0], D[1], 0x31);
#endif
        return FI_ADD32(FI_ADD32(lo, hi), FI_SET1_32(start));
    }
    // Four short chains (the sums are exact in any order).
    fvi s[4];
    for (int k = 0; k < 4; ++k) {
        s[k] = FEW_DPBUSD(k == 0 ? FI_SET1_32(start) : FI_ZERO(), X[k],
                          FI_SET1_32(load_quad((const uint8_t *) y + 4 * k)));
    }
    for (int k = 0; k < 4; ++k) {
        s[k] = FEW_DPBUSD(s[k], X[k + 4],
                          FI_SET1_32(load_quad((const uint8_t *) y + 4 * k + 16)));
    }
    return FI_ADD32(FI_ADD32(s[0], s[1]), FI_ADD32(s[2], s[3]));
#else
    (void) pat;
    const __m256i ones = _mm256_set1_epi16(1);
    if (kind == KIND_Q4_0) {
        // Pairs of nibble-by-int8 products in 16 bits: |sum| <= 8 * 2 * 15 * 128 < 2^15.
        __m256i s = _mm256_setzero_si256();
        for (int k = 0; k < 8; ++k) {
            const __m256i yk = _mm256_set1_epi32(load_quad((const uint8_t *) y + 4 * k));
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(X[k], yk));
        }
        return _mm256_add_epi32(_mm256_madd_epi16(s, ones), _mm256_set1_epi32(start));
    }
    // |w| times y with w's sign: |w| <= 128 and |y| <= 127 (q8_0 rounds to -127 .. 127), so a
    // pair's sum, at most 2 * 128 * 127 < 2^15, is exact; each quad widened to 32 bits.
    (void) start;
    __m256i d = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
        const __m256i yk = _mm256_set1_epi32(load_quad((const uint8_t *) y + 4 * k));
        const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(X[k]), _mm256_sign_epi8(yk, X[k]));
        d = _mm256_add_epi32(d, _mm256_madd_epi16(p, ones));
    }
    return d;
#endif
}

// The first 4 bytes of block i of rows rp[0 .. FEW_ROWS - 1] to hd[i * FEW_ROWS + r]: plain
// copies, a tile ahead of their use (not a shuffle of vector registers, the path's bottleneck).
Q80_INLINE void few_heads(int kind, const char * const * rp, int i, uint32_t * hd) {
    const size_t at = (size_t) i * (kind == KIND_Q4_0 ? sizeof(q40_block) : sizeof(q80_block));
    for (int r = 0; r < FEW_ROWS; ++r) {
        memcpy(hd + (size_t) i * FEW_ROWS + r, rp[r] + at, 4);
    }
}

// One tile (rows rp[0 .. FEW_ROWS - 1], the first `rows` of them real; their blocks' first
// bytes in hd) against NC columns (q8_0 blocks y[c], scales d1[c][i] as f32, starting sums
// st[c][i]): out[c][r]. With `rn`, the next tile's rows, their blocks' first bytes go to hn.
Q80_INLINE void few_tile(int kind, const char * const * rp, const uint32_t * hd,
                         const char * const * rn, uint32_t * hn, int nb, const char * pf,
                         int pf_lines, const q80_block * const * y, const int32_t * const * pt,
                         const float * const * d1,
                         const int32_t * const * st, int NC, float * const * out, int rows) {
    fvf acc[FEW_CHUNK];
    for (int c = 0; c < NC; ++c) {
        acc[c] = FF_ZERO();
    }
    for (int i = 0; i < nb; ++i) {
        // The next tile's weights, a share of its cache lines per block.
        for (int l = 0; l < pf_lines; ++l) {
            _mm_prefetch(pf + ((size_t) i * pf_lines + l) * 64, _MM_HINT_T1);
        }
        if (rn != NULL) {
            few_heads(kind, rn, i, hn);
        }
        fvi X[8];
        fvf d0;
        few_unpack(kind, rp, hd, i, X, &d0);
        for (int c = 0; c < NC; ++c) {
            const fvf xy = FF_CVT(few_dots(kind, X, y[c][i].qs, pt[c] + (size_t) i * 64, st[c][i]));
            acc[c] = FF_FMA(FF_MUL(d0, FF_BCST(d1[c] + i)), xy, acc[c]);
        }
    }
    for (int c = 0; c < NC; ++c) {
#ifdef FEW_W16
        _mm512_mask_storeu_ps(out[c], (__mmask16) ((1u << rows) - 1), acc[c]);
#else
        if (rows == FEW_ROWS) {
            _mm256_storeu_ps(out[c], acc[c]);
        } else {
            Q80_ALIGN64 float tmp[FEW_ROWS];
            _mm256_store_ps(tmp, acc[c]);
            memcpy(out[c], tmp, (size_t) rows * sizeof(float));
        }
#endif
    }
}

// The few-column path: every column quantized by each thread, the tiles of rows split between
// the threads.
Q80_INLINE void mul_mat_few(int kind, struct ggml_tensor * dst, int ith, int nth) {
    const struct ggml_tensor * a = dst->src[0];
    const struct ggml_tensor * b = dst->src[1];
    const int64_t M = a->ne[1], N = b->ne[1];
    const int nb = (int) (a->ne[0] / QK);
    const int64_t tiles = (M + FEW_ROWS - 1) / FEW_ROWS;
    const int64_t per = (tiles + nth - 1) / nth;
    const int64_t t0 = per * ith, t1 = t0 + per < tiles ? t0 + per : tiles;
    if (t0 >= t1) {
        return;
    }
    const int64_t r0 = t0 * FEW_ROWS, r1 = t1 * FEW_ROWS < M ? t1 * FEW_ROWS : M;
    const size_t cells = (size_t) N * nb;
    const size_t q_bytes = align64(cells * sizeof(q80_block));
    const size_t f_bytes = align64(cells * sizeof(float));
    const size_t heads = (size_t) nb * FEW_ROWS;
    const size_t h_bytes = align64(2 * heads * sizeof(uint32_t));
#ifdef FEW_DPBUSD
    const size_t p_bytes = kind == KIND_Q8_0 ? cells * 64 * sizeof(int32_t) : 0;
#else
    const size_t p_bytes = 0;
#endif
    char * buf = reserve(q_bytes + 2 * f_bytes + h_bytes + p_bytes);
    if (buf == NULL) {
        fill_nan(dst, r0, r1, 0, N);
        return;
    }
    q80_block * q8 = (q80_block *) buf;
    float * ds = (float *) (buf + q_bytes);
    int32_t * starts = (int32_t *) (buf + q_bytes + f_bytes);
    // The blocks' first bytes of this tile and of the next, swapped after each tile.
    uint32_t * hd = (uint32_t *) (buf + q_bytes + 2 * f_bytes);
    uint32_t * hn = hd + heads;
    // Q8_0 with VNNI: each column block's quads as few_dots reads them.
    int32_t * pats = (int32_t *) (buf + q_bytes + 2 * f_bytes + h_bytes);
#ifdef FEW_DPBUSD
    const int32_t bias = kind == KIND_Q4_0 ? 8 : 128;
#else
    const int32_t bias = kind == KIND_Q4_0 ? 8 : 0;
#endif
    const struct ggml_type_traits_cpu * q80 = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0);
    for (int64_t n = 0; n < N; ++n) {
        q80->from_float((const float *) ((const char *) b->data + n * b->nb[1]), q8 + n * nb,
                        (int64_t) nb * QK);
        for (int i = 0; i < nb; ++i) {
            const q80_block * blk = q8 + n * nb + i;
            int32_t sum = 0;
            for (int j = 0; j < QK; ++j) {
                sum += blk->qs[j];
            }
            ds[n * nb + i] = ggml_fp16_to_fp32(blk->d);
            starts[n * nb + i] = -bias * sum;
            if (p_bytes != 0) {
                int32_t * pat = pats + (n * nb + i) * 64;
                for (int k = 0; k < 4; ++k) {
                    for (int e = 0; e < 16; ++e) {
                        pat[k * 16 + e] = load_quad((const uint8_t *) blk->qs + 4 * k + 16 * ((e / 4) % 2));
                    }
                }
            }
        }
    }
    const size_t row_bytes = a->nb[1];
    // Rows past the end repeat the last one; their lanes are never stored.
    const char * rn[FEW_ROWS];
    for (int r = 0; r < FEW_ROWS; ++r) {
        rn[r] = (const char *) a->data + (r0 + r < r1 ? r0 + r : r1 - 1) * row_bytes;
    }
    for (int i = 0; i < nb; ++i) {
        few_heads(kind, rn, i, hd);
    }
    for (int64_t m = r0; m < r1; m += FEW_ROWS) {
        const int rows = r1 - m < FEW_ROWS ? (int) (r1 - m) : FEW_ROWS;
        const char * rp[FEW_ROWS];
        const int next = m + FEW_ROWS < r1;
        for (int r = 0; r < FEW_ROWS; ++r) {
            rp[r] = rn[r];
            const int64_t n_row = m + FEW_ROWS + r;
            rn[r] = (const char *) a->data + (next ? (n_row < r1 ? n_row : r1 - 1) : m) * row_bytes;
        }
        // The weights stream from memory in tiles of rows, too short for the hardware to
        // see: the tile FEW_PREFETCH_ROWS ahead is fetched a share per block, with the first
        // columns (the rows of a tensor follow one another).
        const int64_t ahead = m + FEW_PREFETCH_ROWS;
        const char * pf = (const char *) a->data + (ahead < r1 ? ahead : 0) * (int64_t) a->nb[1];
        const int pf_all = ahead < r1 ? (int) ((FEW_ROWS * a->nb[1] + 63) / 64) : 0;
        for (int64_t n = 0; n < N; n += FEW_CHUNK) {
            const int NC = N - n < FEW_CHUNK ? (int) (N - n) : FEW_CHUNK;
            const int pf_lines = n == 0 ? (pf_all + nb - 1) / nb : 0;
            const q80_block * y[FEW_CHUNK];
            const float * d1[FEW_CHUNK];
            const int32_t * st[FEW_CHUNK];
            const int32_t * pt[FEW_CHUNK];
            float * out[FEW_CHUNK];
            for (int c = 0; c < NC; ++c) {
                y[c] = q8 + (n + c) * nb;
                d1[c] = ds + (n + c) * nb;
                st[c] = starts + (n + c) * nb;
                pt[c] = pats + (n + c) * nb * 64;
                out[c] = out_at(dst, m, n + c);
            }
            // The next tile's first bytes with the first columns.
            const char * const * rq = next && n == 0 ? rn : NULL;
            switch (NC) {
#define FEW_TILE(nc) few_tile(kind, rp, hd, rq, hn, nb, pf, pf_lines, y, pt, d1, st, nc, out, rows)
                case 1: FEW_TILE(1); break;
                case 2: FEW_TILE(2); break;
                case 3: FEW_TILE(3); break;
                default: FEW_TILE(FEW_CHUNK); break;
#undef FEW_TILE
            }
        }
        uint32_t * t = hd;
        hd = hn;
        hn = t;
    }
}
#endif

Q80_INLINE void mul_mat(int kind, struct ggml_tensor * dst, int ith, int nth) {
    const struct ggml_tensor * a = dst->src[0];
    const struct ggml_tensor * b = dst->src[1];
    const int64_t M = a->ne[1], N = b->ne[1];
#ifdef Q80_FEW
    if (N <= FEW_MAX_COLS(kind)) {
        if (kind == KIND_Q4_0) {
            mul_mat_few(KIND_Q4_0, dst, ith, nth);
        } else {
            mul_mat_few(KIND_Q8_0, dst, ith, nth);
        }
        return;
    }
#endif
    const int nb = (int) (a->ne[0] / QK);
    const int64_t groups = (N + W - 1) / W;
    int64_t g0, g1, r0, r1;
    if (!split_work(groups, M, ith, nth, &g0, &g1, &r0, &r1)) {
        return;
    }
    const size_t packed_bytes = align64((size_t) (g1 - g0) * nb * GROUP_BYTES);
    const size_t x_bytes = align64((size_t) MR * nb * XB(kind));
    const size_t d0_bytes = align64((size_t) MR * nb * sizeof(float));
    const size_t tmp_bytes = align64((size_t) nb * sizeof(q80_block));
    char * buf = reserve(packed_bytes + x_bytes + d0_bytes + tmp_bytes);
    if (buf == NULL) {
        fill_nan(dst, r0, r1, g0 * W, g1 * W < N ? g1 * W : N);
        return;
    }
    uint8_t * x = (uint8_t *) (buf + packed_bytes);
    float * d0 = (float *) (buf + packed_bytes + x_bytes);
    q80_block * tmp = (q80_block *) (buf + packed_bytes + x_bytes + d0_bytes);
    const int32_t bias = kind == KIND_Q4_0 ? 8 : 128;
    for (int64_t g = g0; g < g1; ++g) {
        pack_group(b, g * W, N, nb, bias, tmp, buf + (size_t) (g - g0) * nb * GROUP_BYTES);
    }
    for (int64_t m = r0; m < r1; m += MR) {
        const int R = r1 - m < MR ? (int) (r1 - m) : MR;
        for (int r = 0; r < R; ++r) {
            unpack_row(kind, (const char *) a->data + (m + r) * a->nb[1], nb,
                       x + (size_t) r * nb * XB(kind), d0 + (size_t) r * nb);
        }
        // A constant row count per call, so that the vector path keeps its sums in registers.
        switch (R) {
#define Q80_ROWS(n) \
    case n: rows_groups(kind, dst, m, n, x, d0, buf, g0, g1, nb, N); break;
            Q80_ROWS(1)
            Q80_ROWS(2)
            Q80_ROWS(3)
#if MR > 4
            Q80_ROWS(4)
            Q80_ROWS(5)
            Q80_ROWS(6)
            Q80_ROWS(7)
#endif
#undef Q80_ROWS
            default: rows_groups(kind, dst, m, MR, x, d0, buf, g0, g1, nb, N); break;
        }
    }
}

// dst[m, n] = sum_k a[k, m] * b[k, n] by the definition at the top, every column; a: q4_0
// [K, M] (src 0), b: f32 [K, N] (src 1), dst: f32 [M, N], all two-dimensional, K a multiple of
// 32. `userdata` is not used.
void ggml_sys_mul_mat_q4_0(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    mul_mat(KIND_Q4_0, dst, ith, nth);
}

// As ggml_sys_mul_mat_q4_0, for q8_0 weights.
void ggml_sys_mul_mat_q8_0(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    mul_mat(KIND_Q8_0, dst, ith, nth);
}

// 1 when the products above run vector instructions, 0 for the plain C loop (same bits).
int ggml_sys_mul_mat_q4_0_isum(void) {
#ifdef Q80_SIMD
    return 1;
#else
    return 0;
#endif
}

int ggml_sys_mul_mat_q8_0_isum(void) {
    return ggml_sys_mul_mat_q4_0_isum();
}
