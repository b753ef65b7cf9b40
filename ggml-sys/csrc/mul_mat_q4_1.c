// A q4_1 matrix product for ggml's CPU backend, run as a ggml custom op (`ggml_custom_4d`).
//
// ggml multiplies a q4_1 weight row with one q8_1 activation column at a time, so a batch of N
// columns unpacks every weight block N times. The columns are quantized by ggml's own q8_1
// routine, and each output comes from one of two definitions:
//
// ggml's (the columns past the count that `userdata` holds, all of them when it is 0): the same
// operations in the same order as ggml's x86 q4_1 x q8_1 dot product (integer products summed
// per 32-bit lane, one fused multiply-add per block into eight float lanes, the same
// horizontal sum, the scalar `m * s` sum added last), so ggml_mul_mat's bits whatever the
// number of columns. The lane sums are one VNNI instruction where the target has it, as in
// ggml. Without AVX2 the op calls ggml's dot product. Two paths, with the same bits:
// - few columns: two weight rows unpacked once per block for up to four columns
//   (`rows_cols`);
// - 16 columns or more: the columns packed eight to a group, their int8 values aligned and
//   their scales and sums laid out as vectors, and one unpacked weight row run against a group
//   at a time (`row_group`); the loop is left with the integer products, their conversion and
//   the fused multiply-adds, one of each per block and column.
//
// Integer sums (the leading min(userdata, N) columns, any count from 1; AVX2): each block's 32
// products summed exactly in integers first, then, for row r and column c over blocks i,
//     dot_i = sum_j q_j * y_j                   (exactly, in 32-bit integers: q 0..15, y int8)
//     acc   = fma(d0_i * d1_i, (float) dot_i, acc),  sm = fma(m0_i, s1_i, sm),  out = acc + sm
// from acc = sm = 0, d0 * d1 rounded to f32, |dot_i| <= 32 * 15 * 127 < 2^24 (so the conversion
// is exact). ggml's sum in another order: the results differ from ggml_mul_mat's by rounding.
// Column c's bits depend on column c and the weights only, never on the number of columns or
// where c lands, and are the same at every vector ISA level: the integers are exact whatever
// the instructions, and the float operations are the same f32 product, conversion and fused
// multiply-adds in the same order in every path. Two paths:
// - up to FEW_MAX_COLS columns (decoding, short items; `mul_mat_few`): one vector lane per
//   weight row, FEW_ROWS rows to a tile (16 in 512 bits with AVX-512 VNNI, else 8 in 256).
//   The tile's blocks are loaded 16 bytes a row side by side and transposed in registers (a
//   4x4 transpose of 32-bit elements in each 128-bit part) so that lane r of vector k holds
//   element quad k of row r; their scales and minimums (the blocks' first 4 bytes) are copied
//   to a buffer a tile ahead and read as one vector per block. One multiply-add of a broadcast
//   column quad into the rows' sums per quad (`dpbusd` with VNNI, else `maddubs` pairs summed
//   in 16 bits, |sum| <= 8 * 2 * 15 * 127 < 2^15, then widened) gives the exact block sums of
//   the tile's rows, then one product d0 * d1, one conversion and one fused multiply-add per
//   block as above; the columns four at a time. The tiles ahead are prefetched into L2 (a
//   decoding step streams the weights once).
// - more columns (`is_rows_group`): one vector lane per column: the columns are packed W to a
//   group (16 with AVX-512 VNNI, else 8), the four bytes of a block's element quad for all W
//   columns side by side, so one instruction multiplies-and-adds a broadcast weight quad into W
//   column sums, and the conversion and scale multiply come once per block for W columns:
//   about twice the speed of ggml's.
// Both quantize the columns with ggml's q8_1 routine (`quantize_col`), so the same int8 values,
// scales and sums.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-cpu.h"
#include "half.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include "simd_x86.h"
#define Q41_SIMD 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define Q41_W16 1
#endif
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

static inline size_t align64(size_t n) {
    return (n + 63) & ~(size_t) 63;
}


static inline const q41_block * weight_row(const struct ggml_tensor * a, int64_t m) {
    return (const q41_block *) ((const char *) a->data + m * a->nb[1]);
}

static inline float * out_at(struct ggml_tensor * dst, int64_t m, int64_t n) {
    return (float *) ((char *) dst->data + m * dst->nb[0] + n * dst->nb[1]);
}

// Rows m0..m1-1 of every column set to NaN: a kernel without scratch memory fails visibly.
static void fill_nan(struct ggml_tensor * dst, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
        for (int64_t m = m0; m < m1; ++m) {
            *out_at(dst, m, n) = NAN;
        }
    }
}

#ifdef Q41_SIMD
// The eight 32-bit lane sums of a block's products: lane j sums the products of bytes 4j to
// 4j + 3 of `x` (values 0..15) and `y` (int8), exactly, as ggml's `mul_sum_us8_pairs` does.
// With VNNI that is one instruction; otherwise pairs summed to 16 bits, then to 32.
Q41_INLINE __m256i lane_dots(__m256i x, __m256i y) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), x, y);
#else
    return _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(x, y));
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
    for (int i = 0; i < nb; ++i) {
        float d0[2], m0[2];
        __m256i qx[2];
        for (int r = 0; r < R; ++r) {
            d0[r] = ggml_sys_f16(x[r][i].d);
            m0[r] = ggml_sys_f16(x[r][i].m);
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
                const __m256 xy = _mm256_cvtepi32_ps(lane_dots(qx[r], qy));
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

#ifdef Q41_SIMD
// Columns per group of the wide path, the fewest columns it takes, and the groups that one
// unpacked weight row meets before the next row is unpacked.
#define GROUP 8
#define WIDE_MIN_COLS 16
#define TILE_GROUPS 8

// A group's block `i`: the int8 values of its eight columns at `qs + (i * 8 + c) * 32`, their
// scales at `d[i * 8 + c]` and their sums at `s[i * 8 + c]`, as f32. Bytes per block: 320.
#define GROUP_BLOCK_BYTES (GROUP * QK + 2 * GROUP * sizeof(float))

static _Thread_local char * wide_raw = NULL;
static _Thread_local size_t wide_cap = 0;

// A per-thread buffer of `bytes`, 64-byte aligned.
static char * wide_reserve(size_t bytes) {
    if (bytes + 64 > wide_cap) {
        char * p = realloc(wide_raw, bytes + 64);
        if (p == NULL) {
            return NULL;
        }
        wide_raw = p;
        wide_cap = bytes + 64;
    }
    return (char *) (((uintptr_t) wide_raw + 63) & ~(uintptr_t) 63);
}

// Quantizes columns `n0 .. n0 + 8` of `b` (those below N; the rest zero) into the group at `g`,
// going through `tmp` (nb q8_1 blocks).
static void pack_group(const struct ggml_tensor * b, int64_t n0, int64_t N, int nb,
                       const struct ggml_type_traits_cpu * q81, q81_block * tmp, char * g) {
    int8_t * qs = (int8_t *) g;
    float * d = (float *) (g + (size_t) nb * GROUP * QK);
    float * s = d + (size_t) nb * GROUP;
    for (int c = 0; c < GROUP; ++c) {
        if (n0 + c >= N) {
            for (int i = 0; i < nb; ++i) {
                memset(qs + ((size_t) i * GROUP + c) * QK, 0, QK);
                d[i * GROUP + c] = 0.0f;
                s[i * GROUP + c] = 0.0f;
            }
            continue;
        }
        const int64_t K = (int64_t) nb * QK;
        q81->from_float((const float *) ((const char *) b->data + (n0 + c) * b->nb[1]), tmp, K);
        for (int i = 0; i < nb; ++i) {
            memcpy(qs + ((size_t) i * GROUP + c) * QK, tmp[i].qs, QK);
            d[i * GROUP + c] = ggml_sys_f16(tmp[i].d);
            s[i * GROUP + c] = ggml_sys_f16(tmp[i].s);
        }
    }
}

// Unpacks weight row `x` into `qx` (32 bytes per block, values 0..15) and its scales and
// minimums as f32.
static void unpack_row(const q41_block * x, int nb, uint8_t * qx, float * d0, float * m0) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < nb; ++i) {
        const __m128i packed = _mm_loadu_si128((const __m128i *) x[i].qs);
        const __m256i v = _mm256_and_si256(
            low, _mm256_insertf128_si256(_mm256_castsi128_si256(packed), _mm_srli_epi16(packed, 4), 1));
        _mm256_store_si256((__m256i *) (qx + (size_t) i * QK), v);
        d0[i] = ggml_sys_f16(x[i].d);
        m0[i] = ggml_sys_f16(x[i].m);
    }
}

// Eight horizontal sums at once, each with ggml_sys_hsum8's operations in its order (high half
// onto low, lanes 2 and 3 onto 0 and 1, lane 1 onto lane 0). Lane k of the result is the sum
// of a[j] with j = 0, 2, 4, 6, 1, 3, 5, 7 for k = 0 .. 7.
Q41_INLINE __m256 hsum8_x8(const __m256 * a) {
    __m256 h[4];
    for (int k = 0; k < 4; ++k) {
        h[k] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * k], a[2 * k + 1], 0x31),
                             _mm256_permute2f128_ps(a[2 * k], a[2 * k + 1], 0x20));
    }
    __m256 q[2];
    for (int k = 0; k < 2; ++k) {
        q[k] = _mm256_add_ps(_mm256_shuffle_ps(h[2 * k], h[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(h[2 * k], h[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    return _mm256_add_ps(_mm256_shuffle_ps(q[0], q[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm256_shuffle_ps(q[0], q[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// One unpacked weight row against one group: out[c * out_stride] for the first `cols` columns.
// `dd` is scratch for nb * GROUP floats, 32-byte aligned.
static void row_group(const uint8_t * qx, const float * d0, const float * m0, const char * g,
                      int nb, float * dd, float * out, size_t out_stride, int cols) {
    const int8_t * qs = (const int8_t *) g;
    const float * d1 = (const float *) (g + (size_t) nb * GROUP * QK);
    const float * s1 = d1 + (size_t) nb * GROUP;
    __m256 acc[GROUP];
    for (int c = 0; c < GROUP; ++c) {
        acc[c] = _mm256_setzero_ps();
    }
    // The products `d0 * d1` first: stored and read back within one block, they cost a
    // store-to-load forwarding delay in every block (1.3x on Zen 4). The `m * s` sums stay in
    // the main loop, where their chain of fused multiply-adds hides behind the products.
    for (int i = 0; i < nb; ++i) {
        _mm256_store_ps(dd + i * GROUP,
                        _mm256_mul_ps(_mm256_broadcast_ss(&d0[i]), _mm256_load_ps(d1 + i * GROUP)));
    }
    __m256 summs = _mm256_setzero_ps();
    for (int i = 0; i < nb; ++i) {
        const __m256i x = _mm256_load_si256((const __m256i *) (qx + (size_t) i * QK));
        summs = _mm256_fmadd_ps(_mm256_broadcast_ss(&m0[i]), _mm256_load_ps(s1 + i * GROUP), summs);
        for (int c = 0; c < GROUP; ++c) {
            const __m256i y = _mm256_load_si256((const __m256i *) (qs + ((size_t) i * GROUP + c) * QK));
            const __m256 xy = _mm256_cvtepi32_ps(lane_dots(x, y));
            acc[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(dd + i * GROUP + c), xy, acc[c]);
        }
    }
    // Fed in this order, hsum8_x8's lane c is column c's sum.
    const __m256 in[GROUP] = {acc[0], acc[4], acc[1], acc[5], acc[2], acc[6], acc[3], acc[7]};
    float sums[GROUP] __attribute__((aligned(32)));
    _mm256_store_ps(sums, _mm256_add_ps(hsum8_x8(in), summs));
    for (int c = 0; c < cols; ++c) {
        out[c * out_stride] = sums[c];
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

// The wide path (N >= WIDE_MIN_COLS).
static void mul_mat_wide(struct ggml_tensor * dst, int ith, int nth) {
    const struct ggml_tensor * a = dst->src[0];
    const struct ggml_tensor * b = dst->src[1];
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    const int nb = (int) (K / QK);
    const int64_t groups = (N + GROUP - 1) / GROUP;
    int64_t g0, g1, r0, r1;
    if (!split_work(groups, M, ith, nth, &g0, &g1, &r0, &r1)) {
        return;
    }
    const size_t group_bytes = (size_t) nb * GROUP_BLOCK_BYTES;
    const size_t row_bytes = (size_t) nb * (QK + 2 * sizeof(float));
    const size_t tmp_bytes = (size_t) nb * sizeof(q81_block);
    const size_t dd_bytes = (size_t) nb * GROUP * sizeof(float);
    char * buf = wide_reserve((size_t) (g1 - g0) * group_bytes + align64(row_bytes) +
                              align64(tmp_bytes) + dd_bytes);
    if (buf == NULL) {
        // As in the narrow path: this thread's share of the output becomes NaN, visibly.
        fill_nan(dst, r0, r1, g0 * GROUP, g1 * GROUP < N ? g1 * GROUP : N);
        return;
    }
    uint8_t * qx = (uint8_t *) (buf + (size_t) (g1 - g0) * group_bytes);
    float * d0 = (float *) (qx + (size_t) nb * QK);
    float * m0 = d0 + nb;
    q81_block * tmp = (q81_block *) ((char *) qx + align64(row_bytes));
    float * dd = (float *) ((char *) tmp + align64(tmp_bytes));
    const struct ggml_type_traits_cpu * q81 = ggml_get_type_traits_cpu(GGML_TYPE_Q8_1);
    for (int64_t g = g0; g < g1; ++g) {
        pack_group(b, g * GROUP, N, nb, q81, tmp, buf + (size_t) (g - g0) * group_bytes);
    }
    const size_t out_stride = dst->nb[1] / sizeof(float);
    for (int64_t t0 = g0; t0 < g1; t0 += TILE_GROUPS) {
        const int64_t t1 = t0 + TILE_GROUPS < g1 ? t0 + TILE_GROUPS : g1;
        for (int64_t m = r0; m < r1; ++m) {
            unpack_row(weight_row(a, m), nb, qx, d0, m0);
            float * row_out = out_at(dst, m, 0);
            for (int64_t g = t0; g < t1; ++g) {
                const int64_t n0 = g * GROUP;
                const int cols = N - n0 < GROUP ? (int) (N - n0) : GROUP;
                row_group(qx, d0, m0, buf + (size_t) (g - g0) * group_bytes, nb, dd,
                          row_out + n0 * out_stride, out_stride, cols);
            }
        }
    }
}
#endif

#ifdef Q41_SIMD
// Column n of `b` quantized into `q` (nb blocks).
static void quantize_col(const struct ggml_tensor * b, int64_t n, int nb, q81_block * q) {
    const struct ggml_type_traits_cpu * q81 = ggml_get_type_traits_cpu(GGML_TYPE_Q8_1);
    q81->from_float((const float *) ((const char *) b->data + n * b->nb[1]), q, (int64_t) nb * QK);
}

// The integer-sum path's vectors: W columns per group, MR weight rows per pass.
#ifdef Q41_W16
#define W 16
#define MR 8
typedef __m512i vint;
typedef __m512 vflt;
#define VI_ZERO() _mm512_setzero_si512()
#define VI_LOAD(p) _mm512_load_si512((const void *) (p))
#define VF_ZERO() _mm512_setzero_ps()
#define VF_LOAD(p) _mm512_load_ps(p)
#define VF_BCST(p) _mm512_set1_ps(*(p))
#define VF_MUL(x, y) _mm512_mul_ps(x, y)
#define VF_FMA(x, y, z) _mm512_fmadd_ps(x, y, z)
#define VF_ADD(x, y) _mm512_add_ps(x, y)
#define VF_CVT(x) _mm512_cvtepi32_ps(x)
#define VF_STORE(p, x) _mm512_store_ps(p, x)
#else
#define W 8
#define MR 4
typedef __m256i vint;
typedef __m256 vflt;
#define VI_ZERO() _mm256_setzero_si256()
#define VI_LOAD(p) _mm256_load_si256((const __m256i *) (p))
#define VF_ZERO() _mm256_setzero_ps()
#define VF_LOAD(p) _mm256_load_ps(p)
#define VF_BCST(p) _mm256_broadcast_ss(p)
#define VF_MUL(x, y) _mm256_mul_ps(x, y)
#define VF_FMA(x, y, z) _mm256_fmadd_ps(x, y, z)
#define VF_ADD(x, y) _mm256_add_ps(x, y)
#define VF_CVT(x) _mm256_cvtepi32_ps(x)
#define VF_STORE(p, x) _mm256_store_ps(p, x)
#endif

// A group's block i: quad k (elements 4k .. 4k+3) of its W columns at `qs + ((i * 8 + k) * W
// + c) * 4`, then the scales d1[i * W + c] and sums s1[i * W + c] as f32.
#define IS_GROUP_BYTES (8 * W * 4 + 2 * W * sizeof(float))

// Block sums of R rows against a group's block: dot[r] lane c = the block's products of row r
// (x + r * rs, 32 bytes) and column c (y, the block's 8 quads of W columns), exactly.
Q41_INLINE void is_block_dots(vint * dot, int R, const uint8_t * x, size_t rs, const int8_t * y) {
#if defined(Q41_W16)
    for (int r = 0; r < R; ++r) {
        dot[r] = VI_ZERO();
    }
    for (int k = 0; k < 8; ++k) {
        const vint yk = VI_LOAD(y + k * W * 4);
        for (int r = 0; r < R; ++r) {
            int32_t quad;
            memcpy(&quad, x + r * rs + 4 * k, 4);
            dot[r] = _mm512_dpbusd_epi32(dot[r], _mm512_set1_epi32(quad), yk);
        }
    }
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
    for (int r = 0; r < R; ++r) {
        dot[r] = VI_ZERO();
    }
    for (int k = 0; k < 8; ++k) {
        const vint yk = VI_LOAD(y + k * W * 4);
        for (int r = 0; r < R; ++r) {
            int32_t quad;
            memcpy(&quad, x + r * rs + 4 * k, 4);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
            dot[r] = _mm256_dpbusd_epi32(dot[r], _mm256_set1_epi32(quad), yk);
#else
            dot[r] = _mm256_dpbusd_avx_epi32(dot[r], _mm256_set1_epi32(quad), yk);
#endif
        }
    }
#else
    // Pairs of products in 16 bits: |sum| <= 8 * 2 * 15 * 127 < 2^15 over a block, so the
    // sixteen-bit sums are exact before the widening.
    __m256i s16[MR];
    for (int r = 0; r < R; ++r) {
        s16[r] = VI_ZERO();
    }
    for (int k = 0; k < 8; ++k) {
        const vint yk = VI_LOAD(y + k * W * 4);
        for (int r = 0; r < R; ++r) {
            int32_t quad;
            memcpy(&quad, x + r * rs + 4 * k, 4);
            s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(_mm256_set1_epi32(quad), yk));
        }
    }
    for (int r = 0; r < R; ++r) {
        dot[r] = _mm256_madd_epi16(s16[r], _mm256_set1_epi16(1));
    }
#endif
}

// R unpacked rows (qx + r * rs; scales and minimums at d0[r * nb + i], m0[...]) against one
// group: res[r * W + c].
Q41_INLINE void is_rows_group(const uint8_t * qx, size_t rs, const float * d0, const float * m0,
                           const char * g, int nb, int R, float * res) {
    const int8_t * qs = (const int8_t *) g;
    const float * d1 = (const float *) (g + (size_t) nb * 8 * W * 4);
    const float * s1 = d1 + (size_t) nb * W;
    vflt acc[MR], sm[MR];
    for (int r = 0; r < R; ++r) {
        acc[r] = VF_ZERO();
        sm[r] = VF_ZERO();
    }
    for (int i = 0; i < nb; ++i) {
        vint dot[MR];
        is_block_dots(dot, R, qx + (size_t) i * QK, rs, qs + (size_t) i * 8 * W * 4);
        const vflt dc = VF_LOAD(d1 + (size_t) i * W);
        for (int r = 0; r < R; ++r) {
            acc[r] = VF_FMA(VF_MUL(VF_BCST(d0 + (size_t) r * nb + i), dc), VF_CVT(dot[r]), acc[r]);
        }
    }
    for (int i = 0; i < nb; ++i) {
        const vflt sc = VF_LOAD(s1 + (size_t) i * W);
        for (int r = 0; r < R; ++r) {
            sm[r] = VF_FMA(VF_BCST(m0 + (size_t) r * nb + i), sc, sm[r]);
        }
    }
    for (int r = 0; r < R; ++r) {
        VF_STORE(res + r * W, VF_ADD(acc[r], sm[r]));
    }
}

// Quantizes columns n0 .. n0 + W - 1 of `b` (those below N; the rest zero) into group `g`,
// going through `tmp` (nb q8_1 blocks).
static void is_pack_group(const struct ggml_tensor * b, int64_t n0, int64_t N, int nb, q81_block * tmp,
                       char * g) {
    int8_t * qs = (int8_t *) g;
    float * d1 = (float *) (g + (size_t) nb * 8 * W * 4);
    float * s1 = d1 + (size_t) nb * W;
    for (int c = 0; c < W; ++c) {
        const int real = n0 + c < N;
        if (real) {
            quantize_col(b, n0 + c, nb, tmp);
        }
        for (int i = 0; i < nb; ++i) {
            for (int k = 0; k < 8; ++k) {
                int8_t * quad = qs + (((size_t) i * 8 + k) * W + c) * 4;
                if (real) {
                    memcpy(quad, tmp[i].qs + 4 * k, 4);
                } else {
                    memset(quad, 0, 4);
                }
            }
            d1[i * W + c] = real ? ggml_sys_f16(tmp[i].d) : 0.0f;
            s1[i * W + c] = real ? ggml_sys_f16(tmp[i].s) : 0.0f;
        }
    }
}

// R rows from m (unpacked in qx, d0, m0) against groups g0 .. g1 - 1 (packed from `packed`).
Q41_INLINE void is_rows_groups(struct ggml_tensor * dst, int64_t m, int R, const uint8_t * qx,
                            const float * d0, const float * m0, const char * packed, int64_t g0,
                            int64_t g1, int nb, int64_t N) {
    const size_t group_bytes = (size_t) nb * IS_GROUP_BYTES;
    float res[MR * W] __attribute__((aligned(64))) = {0};
    for (int64_t g = g0; g < g1; ++g) {
        is_rows_group(qx, (size_t) nb * QK, d0, m0, packed + (size_t) (g - g0) * group_bytes, nb, R, res);
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
#include "mul_mat_q4_1_few.h"

// The integer-sum path (see the top).
static void mul_mat_isum(struct ggml_tensor * dst, int ith, int nth) {
    const struct ggml_tensor * a = dst->src[0];
    const struct ggml_tensor * b = dst->src[1];
    const int64_t M = a->ne[1], N = b->ne[1];
#ifdef Q41_FEW
    if (N <= FEW_MAX_COLS) {
        mul_mat_few(dst, ith, nth);
        return;
    }
#endif
    const int nb = (int) (a->ne[0] / QK);
    const int64_t groups = (N + W - 1) / W;
    int64_t g0, g1, r0, r1;
    if (!split_work(groups, M, ith, nth, &g0, &g1, &r0, &r1)) {
        return;
    }
    const size_t packed_bytes = align64((size_t) (g1 - g0) * nb * IS_GROUP_BYTES);
    const size_t qx_bytes = align64((size_t) MR * nb * QK);
    const size_t dm_bytes = align64((size_t) MR * nb * sizeof(float));
    const size_t tmp_bytes = align64((size_t) nb * sizeof(q81_block));
    char * buf = wide_reserve(packed_bytes + qx_bytes + 2 * dm_bytes + tmp_bytes);
    if (buf == NULL) {
        fill_nan(dst, r0, r1, g0 * W, g1 * W < N ? g1 * W : N);
        return;
    }
    uint8_t * qx = (uint8_t *) (buf + packed_bytes);
    float * d0 = (float *) (buf + packed_bytes + qx_bytes);
    float * m0 = (float *) (buf + packed_bytes + qx_bytes + dm_bytes);
    q81_block * tmp = (q81_block *) (buf + packed_bytes + qx_bytes + 2 * dm_bytes);
    for (int64_t g = g0; g < g1; ++g) {
        is_pack_group(b, g * W, N, nb, tmp, buf + (size_t) (g - g0) * nb * IS_GROUP_BYTES);
    }
    for (int64_t m = r0; m < r1; m += MR) {
        const int R = r1 - m < MR ? (int) (r1 - m) : MR;
        for (int r = 0; r < R; ++r) {
            unpack_row(weight_row(a, m + r), nb, qx + (size_t) r * nb * QK, d0 + (size_t) r * nb,
                       m0 + (size_t) r * nb);
        }
        switch (R) {
#define Q41_ROWS(n) \
    case n: is_rows_groups(dst, m, n, qx, d0, m0, buf, g0, g1, nb, N); break;
            Q41_ROWS(1)
            Q41_ROWS(2)
            Q41_ROWS(3)
#if MR > 4
            Q41_ROWS(4)
            Q41_ROWS(5)
            Q41_ROWS(6)
            Q41_ROWS(7)
#endif
#undef Q41_ROWS
            default: is_rows_groups(dst, m, MR, qx, d0, m0, buf, g0, g1, nb, N); break;
        }
    }
}
#endif

int ggml_sys_mul_mat_q4_1_isum(void) {
#ifdef Q41_SIMD
    return 1;
#else
    return 0;
#endif
}

// ggml's bits, every column of dst.
static void mul_mat_exact(struct ggml_tensor * dst, int ith, int nth) {
    const struct ggml_tensor * a = dst->src[0];
    const struct ggml_tensor * b = dst->src[1];
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    const int nb = (int) (K / QK);
#ifdef Q41_SIMD
    if (N >= WIDE_MIN_COLS) {
        mul_mat_wide(dst, ith, nth);
        return;
    }
#endif

    // Rows split evenly between the threads.
    const int64_t per = (M + nth - 1) / nth;
    const int64_t m0 = per * ith;
    const int64_t m1 = m0 + per < M ? m0 + per : M;
    char * buf = q8_reserve((size_t) N * nb);
    if (buf == NULL) {
        // No memory for the columns: ggml's own dot product on freshly quantized columns
        // cannot run either; fill with NaN so that the failure is visible, not silent.
        fill_nan(dst, m0, m1, 0, N);
        return;
    }
    q81_block * q8 = (q81_block *) buf;
    float * ds = (float *) (buf + (size_t) N * nb * sizeof(q81_block));
    float * ss = ds + (size_t) N * nb;
    const struct ggml_type_traits_cpu * q81 = ggml_get_type_traits_cpu(GGML_TYPE_Q8_1);
    for (int64_t n = 0; n < N; ++n) {
        q81->from_float((const float *) ((const char *) b->data + n * b->nb[1]), q8 + n * nb, K);
        for (int i = 0; i < nb; ++i) {
            ds[n * nb + i] = ggml_sys_f16(q8[n * nb + i].d);
            ss[n * nb + i] = ggml_sys_f16(q8[n * nb + i].s);
        }
    }

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
                x[r] = weight_row(a, m + (r < R ? r : 0));
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
                    out[r] = out_at(dst, m + (r < R ? r : 0), n);
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
            const q41_block * x = weight_row(a, m);
            float * out = out_at(dst, m, 0);
            const struct ggml_type_traits_cpu * q41 = ggml_get_type_traits_cpu(GGML_TYPE_Q4_1);
            for (int64_t n = n0; n < n1; ++n) {
                q41->vec_dot((int) K, out + n * out_stride, 0, x, 0, q8 + n * nb, 0, 1);
            }
        }
#endif
    }
}

// dst[m, n] = sum_k a[k, m] * b[k, n]; a: q4_1 [K, M] (src 0), b: f32 [K, N] (src 1), dst: f32
// [M, N], all two-dimensional, K a multiple of 32, rows of b contiguous. `userdata`, read as an
// integer: how many leading columns take the integer sums (any count; at most N); the other
// columns get ggml's bits. Without AVX2 every column gets ggml's bits.
void ggml_sys_mul_mat_q4_1(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    const int64_t N = dst->src[1]->ne[1];
    const int64_t n_isum = (int64_t) ((uintptr_t) userdata < (uint64_t) N ? (uintptr_t) userdata : (uint64_t) N);
#ifdef Q41_SIMD
    if (n_isum >= 1) {
        if (n_isum == N) {
            mul_mat_isum(dst, ith, nth);
            return;
        }
        // Two products over column views: the node's own tensors stay untouched (other
        // threads read them).
        const struct ggml_tensor * b = dst->src[1];
        struct ggml_tensor b_head = *b, b_tail = *b, d_head = *dst, d_tail = *dst;
        b_head.ne[1] = n_isum;
        d_head.ne[1] = n_isum;
        d_head.src[1] = &b_head;
        b_tail.data = (char *) b->data + n_isum * b->nb[1];
        b_tail.ne[1] = N - n_isum;
        d_tail.data = (char *) dst->data + n_isum * dst->nb[1];
        d_tail.ne[1] = N - n_isum;
        d_tail.src[1] = &b_tail;
        mul_mat_isum(&d_head, ith, nth);
        mul_mat_exact(&d_tail, ith, nth);
        return;
    }
#else
    (void) n_isum;
#endif
    mul_mat_exact(dst, ith, nth);
}
