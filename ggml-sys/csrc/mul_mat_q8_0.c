// Q4_0, Q5_0 and Q8_0 matrix products for ggml's CPU backend, run as ggml custom ops
// (`ggml_custom_4d`): the integer-sum product that mul_mat_q4_1.c runs for q4_1, for the three
// other common 32-element block types (Q5_0: what Q4_K_M files keep for the matrices whose
// rows are not whole 256-element super-blocks). Every column of the node takes it, whatever
// their number; the engine gives these ops the columns that take integer sums and
// ggml_mul_mat the others.
//
// Definition. The activation columns are quantized by ggml's own q8_0 routine (the type that
// ggml's Q4_0, Q5_0 and Q8_0 dot products quantize them to, so the same int8 values y and
// scales d1).
// A weight block holds a scale d0 and 32 integers w: q - 8 for Q4_0 (q the stored nibble,
// 0..15), q - 16 for Q5_0 (q = the stored nibble | the block's matching high bit << 4, 0..31:
// element j < 16 takes byte j's low nibble and bit j of qh, element j + 16 byte j's high
// nibble and bit j + 16, qh read as a little-endian u32), the stored int8 for Q8_0. For row r
// and column c, over the blocks i in order,
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
//   streams the weights once). Q5_0's high bits are copied with the scales (a vector per
//   block, lane r the u32 qh of row r) and set onto the transposed nibbles (bit 4k + e of qh
//   onto byte e of quad k, bit 16 + 4k + e onto byte e of quad k + 4). With VNNI, as below:
//   u = w + b and the column block's -b * sum(y) as the starting sum; Q8_0's 32-byte blocks
//   are loaded whole and each half of the rows transposed on its own, so a vector holds quads
//   k and k + 4 of its rows, met by a column vector of quad k and quad k + 4 laid out to
//   match, the two parts added after. AVX2 without VNNI: Q4_0's nibbles as below; Q5_0's u
//   (0..31) by `maddubs` too, but quads 0-3 and quads 4-7 summed in 16 bits apart (|sum| <=
//   4 * 2 * 31 * 128 = 31744 < 2^15, exact), each widened to 32 bits, the two added; Q8_0's
//   w through their signs, `maddubs(|w|, sign(w) * y)`: |w| <= 128 and |y| <= 127 (q8_0
//   rounds to -127 .. 127), so a pair's sum is at most 2 * 128 * 127 < 2^15, exact, then
//   widened per quad.
// - More columns: one vector lane holds one column: the columns are packed W to a group (16
//   with AVX-512 VNNI, else 8), the four bytes of a block's element quad for all W columns
//   side by side, so one multiply-add of a broadcast weight quad serves W columns, and the
//   conversion and scale come once per block for W columns. The multiply-add instructions take
//   one unsigned operand: the weights are unpacked unsigned, u = w + b with b = 8 (Q4_0: u is
//   the stored nibble q), b = 16 (Q5_0: u is the five-bit q, 0..31) or b = 128 (Q8_0: u = w
//   xor 0x80, 0..255), 32 bytes a block, and the block's sum starts at -b * sum_j y_j,
//   computed exactly in integers when the columns are packed (never from q8_1's rounded f16
//   sum): sum_j u_j y_j - b * sum_j y_j = sum_j w_j y_j.
//   - AVX-512 VNNI / AVX-VNNI: `dpbusd` sums four u8 * s8 products into a 32-bit lane without
//     saturation: |partial sums| <= 32 * 255 * 128 < 2^31, exact.
//   - AVX2 without VNNI: `maddubs` adds pairs of u8 * s8 products into 16 bits and saturates,
//     so the unsigned bytes are kept to 0..15: Q4_0's nibbles as they are, Q5_0's and Q8_0's u
//     split into u = 16 * h + l (l in 0..15; h in 0..1 for Q5_0, 0..15 for Q8_0), two sums,
//     64 bytes a block. A 16-bit lane adds a block's 8 quads' pairs: |sum| <= 8 * 2 * 15 *
//     128 = 30720 < 2^15, exact; then widened to 32 bits (`madd` by 1), and for Q5_0 and Q8_0
//     16 * H + L.
// - Neither: a plain C loop over the column groups' layout with the same integer sums and the
//   same float operations (fmaf), so the same bits, only slower; `ggml_sys_mul_mat_q4_0_isum`
//   and its Q5_0 and Q8_0 kin then return 0 and the engine keeps ggml's product.
// The float step is the same instructions in every path (a product, a conversion, a fused
// multiply-add per block and column), so the result is the same bits at every ISA level.

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-cpu.h"
#include "half.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include "simd_x86.h"
#define Q80_SIMD 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define Q80_W16 1
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define Q80_AMX 1
#endif
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
    uint8_t qh[4];
    uint8_t qs[QK / 2];
} q50_block;

typedef struct {
    uint16_t d;
    int8_t qs[QK];
} q80_block;

_Static_assert(sizeof(q40_block) == 18, "q4_0 block is 18 bytes");
_Static_assert(sizeof(q50_block) == 22, "q5_0 block is 22 bytes");
_Static_assert(sizeof(q80_block) == 34, "q8_0 block is 34 bytes");

// The weight types.
enum { KIND_Q4_0 = 0, KIND_Q8_0 = 1, KIND_Q5_0 = 2 };

// b of the top comment: what the unsigned u add to the weights' integers w.
static inline int32_t unsigned_bias(int kind) {
    return kind == KIND_Q4_0 ? 8 : kind == KIND_Q5_0 ? 16 : 128;
}

// Columns per group and weight rows per pass.
#if defined(Q80_AMX)
#define W 16
#define MR 16
#elif defined(Q80_W16)
#define W 16
#define MR 8
#else
#define W 8
#define MR 4
#endif

// Bytes of one unpacked weight block: 32 unsigned values, or for Q5_0 and Q8_0 on AVX2
// without VNNI their low nibbles then their high nibbles (bits for Q5_0).
#if defined(Q80_SIMD) && !defined(Q80_W16) && !defined(Q80_VNNI256)
#define Q80_SPLIT 1
#define XB(kind) ((kind) != KIND_Q4_0 ? 2 * QK : QK)
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
// going through `tmp` (W * nb q8_0 blocks, column c's from tmp + c * nb); `bias` is b of the
// top comment.
static void pack_group(const struct ggml_tensor * b, int64_t n0, int64_t N, int nb, int32_t bias,
                       q80_block * tmp, char * g) {
    const struct ggml_type_traits_cpu * q80 = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0);
    int8_t * qs = (int8_t *) g;
    float * d1 = (float *) (g + (size_t) nb * 8 * W * 4);
    int32_t * start = (int32_t *) (d1 + (size_t) nb * W);
    for (int c = 0; c < W; ++c) {
        q80_block * col = tmp + (size_t) c * nb;
        if (n0 + c < N) {
            q80->from_float((const float *) ((const char *) b->data + (n0 + c) * b->nb[1]), col,
                            (int64_t) nb * QK);
        } else {
            memset(col, 0, (size_t) nb * sizeof(q80_block));
        }
    }
    for (int i = 0; i < nb; ++i) {
        int8_t * out = qs + (size_t) i * 8 * W * 4;
#ifdef Q80_SIMD
        // Column c's 32 bytes are eight quads: an 8 x 8 transpose of 32-bit elements per eight
        // columns puts quad k of the columns side by side. The sums of y come from the same
        // vectors, exactly in 32-bit lanes.
        for (int h = 0; h < W / 8; ++h) {
            __m256 r[8], t[8];
            for (int c = 0; c < 8; ++c) {
                r[c] = _mm256_castsi256_ps(
                    _mm256_loadu_si256((const __m256i *) tmp[(size_t) (8 * h + c) * nb + i].qs));
            }
            ggml_sys_transpose8(r, t);
            __m256i sum = _mm256_setzero_si256();
            for (int k = 0; k < 8; ++k) {
                const __m256i y = _mm256_castps_si256(t[k]);
                _mm256_storeu_si256((__m256i *) (out + ((size_t) k * W + 8 * h) * 4), y);
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(
                                                                  _mm256_set1_epi8(1), y),
                                                              _mm256_set1_epi16(1)));
            }
            _mm256_storeu_si256((__m256i *) (start + (size_t) i * W + 8 * h),
                                _mm256_mullo_epi32(sum, _mm256_set1_epi32(-bias)));
        }
#else
        for (int c = 0; c < W; ++c) {
            int32_t sum = 0;
            for (int k = 0; k < 8; ++k) {
                int8_t * quad = out + ((size_t) k * W + c) * 4;
                memcpy(quad, tmp[(size_t) c * nb + i].qs + 4 * k, 4);
                sum += quad[0] + quad[1] + quad[2] + quad[3];
            }
            start[i * W + c] = -bias * sum;
        }
#endif
        for (int c = 0; c < W; ++c) {
            d1[i * W + c] = ggml_sys_f16(tmp[(size_t) c * nb + i].d);
        }
    }
}

#ifdef Q80_SIMD
// A Q5_0 block's 32 five-bit q in element order (the top comment's u).
static inline __m256i unpack_q5_0(const q50_block * blk) {
    uint32_t qh;
    memcpy(&qh, blk->qh, 4);
    // Byte j of `high`: 0x10 where bit j of qh is set (byte j / 8 of qh spread over 8 bytes,
    // each tested for its bit).
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int) qh),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x((long long) 0x8040201008040201ULL);
    const __m256i high = _mm256_and_si256(
        _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
    const __m128i packed = _mm_loadu_si128((const __m128i *) blk->qs);
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m256i nibbles = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_and_si128(packed, low)),
        _mm_and_si128(_mm_srli_epi16(packed, 4), low), 1);
    return _mm256_or_si256(nibbles, high);
}

// A block's 32 unsigned u (the top comment's) in element order, in one register: built there
// and stored once (two 16-byte stores read back as one 32-byte load cannot be forwarded, a
// stall per block).
static inline __m256i unpack_block(int kind, const void * row, int i) {
    if (kind == KIND_Q4_0) {
        // Elements 0..15 are the low nibbles, 16..31 the high ones.
        const q40_block * blk = (const q40_block *) row + i;
        const __m128i packed = _mm_loadu_si128((const __m128i *) blk->qs);
        const __m128i low = _mm_set1_epi8(0x0F);
        return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(packed, low)),
                                       _mm_and_si128(_mm_srli_epi16(packed, 4), low), 1);
    }
    if (kind == KIND_Q5_0) {
        return unpack_q5_0((const q50_block *) row + i);
    }
    const q80_block * blk = (const q80_block *) row + i;
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *) blk->qs),
                            _mm256_set1_epi8((char) 0x80));
}
#else
// A block's 32 unsigned u (the top comment's) in element order.
static void unpack_block(int kind, const void * row, int i, uint8_t * u) {
    if (kind == KIND_Q4_0) {
        const q40_block * blk = (const q40_block *) row + i;
        for (int j = 0; j < QK / 2; ++j) {
            u[j] = blk->qs[j] & 0x0F;
            u[j + QK / 2] = blk->qs[j] >> 4;
        }
    } else if (kind == KIND_Q5_0) {
        const q50_block * blk = (const q50_block *) row + i;
        uint32_t qh;
        memcpy(&qh, blk->qh, 4);
        for (int j = 0; j < QK / 2; ++j) {
            u[j] = (uint8_t) ((blk->qs[j] & 0x0F) | ((qh >> j) & 1) << 4);
            u[j + QK / 2] = (uint8_t) ((blk->qs[j] >> 4) | ((qh >> (j + QK / 2)) & 1) << 4);
        }
    } else {
        const q80_block * blk = (const q80_block *) row + i;
        for (int j = 0; j < QK; ++j) {
            u[j] = (uint8_t) blk->qs[j] ^ 0x80;
        }
    }
}
#endif

// The scale of block i of a row of `kind`, as f32.
static inline float block_scale(int kind, const void * row, int i) {
    const uint16_t d = kind == KIND_Q4_0   ? ((const q40_block *) row)[i].d
                       : kind == KIND_Q5_0 ? ((const q50_block *) row)[i].d
                                           : ((const q80_block *) row)[i].d;
    return ggml_sys_f16(d);
}

// Unpacks weight row `row` (nb blocks of `kind`) into `x` (XB(kind) bytes per block, the
// unsigned u of the top comment) and its scales as f32 into `d0`.
static void unpack_row(int kind, const void * row, int nb, uint8_t * x, float * d0) {
    for (int i = 0; i < nb; ++i) {
        d0[i] = block_scale(kind, row, i);
        uint8_t * out = x + (size_t) i * XB(kind);
#ifdef Q80_SIMD
        const __m256i u = unpack_block(kind, row, i);
#ifdef Q80_SPLIT
        if (kind != KIND_Q4_0) {
            // Low nibbles, then high nibbles (bits for Q5_0).
            const __m256i low = _mm256_set1_epi8(0x0F);
            _mm256_storeu_si256((__m256i *) out, _mm256_and_si256(u, low));
            _mm256_storeu_si256((__m256i *) (out + QK),
                                _mm256_and_si256(_mm256_srli_epi16(u, 4), low));
            continue;
        }
#endif
        _mm256_storeu_si256((__m256i *) out, u);
#else
        unpack_block(kind, row, i, out);
#endif
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
    const int parts = kind == KIND_Q4_0 ? 1 : 2;
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
        if (kind != KIND_Q4_0) {
            // u = l + 16 h: the low nibbles' sum plus 16 times the high nibbles' (bits).
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

#ifdef Q80_AMX
// AMX tiles (AMX-INT8, on CPUs that have it and a kernel that grants it: the build's `amx`
// path). The unpacked rows go back to the signed w (u - b), and one `tdpbssd` (int8 x int8)
// multiplies A, the 16 rows' 32 bytes of a block, by B, the group's block as packed (8 quads x
// W columns x 4 bytes: already the layout the tile product reads), into a zeroed tile of 16 x W
// exact 32-bit sums: |sum| <= 32 * 128 * 128 = 2^19. So each sum is the integer of the vector
// paths, and each row then takes the same float step (one product d0 * d1, one conversion, one
// fused multiply-add per block and column, the blocks in order): the same bits.
#include "amx_tiles.h"

// The unpacked rows' unsigned u = w + b back to the signed w, as `tdpbssd` multiplies them.
static void amx_signed(uint8_t * x, size_t n, uint8_t b) {
    const __m512i vb = _mm512_set1_epi8((char) b);
    for (size_t j = 0; j < n; j += 64) {
        _mm512_store_si512(x + j, _mm512_sub_epi8(_mm512_load_si512(x + j), vb));
    }
}

// The float step of block i for 16 rows: acc[r] = fma(d0[r, i] * d1[i], (float) sum, acc[r]).
Q80_INLINE void amx_scale(vflt * acc, const int32_t * sums, const float * d0, int nb, int i,
                          const float * d1) {
    const vflt dc = VF_LOAD(d1 + (size_t) i * W);
    for (int r = 0; r < 16; ++r) {
        const vflt d = VF_MUL(VF_BCST(d0 + (size_t) r * nb + i), dc);
        acc[r] = VF_FMA(d, VF_CVT(VI_LOAD(sums + r * W)), acc[r]);
    }
}

// 16 unpacked rows (x + r * rs, signed; scales d0[r * nb + i]) against one group; the first R
// rows' results of the group's first `cols` columns go to dst (rows from m, columns from n0).
static void rows_group_amx(const uint8_t * x, size_t rs, const float * d0, const char * g, int nb,
                           struct ggml_tensor * dst, int64_t m, int R, int64_t n0, int cols) {
    const int8_t * qs = (const int8_t *) g;
    const float * d1 = (const float *) (g + (size_t) nb * 8 * W * 4);
    Q80_ALIGN64 int32_t sums[4][16 * W];
    vflt acc[16];
    for (int r = 0; r < 16; ++r) {
        acc[r] = VF_ZERO();
    }
#define Q80_AMX_SCALE(i, s) amx_scale(acc, s, d0, nb, i, d1)
    AMX_BLOCKS(_tile_dpbssd, nb, x, rs, qs, sums, Q80_AMX_SCALE)
#undef Q80_AMX_SCALE
    amx_store_columns(acc, dst, m, R, n0, cols);
}
#endif
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
#ifdef Q80_AMX
    (void) kind;
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t n0 = g * W;
        const int cols = N - n0 < W ? (int) (N - n0) : W;
        rows_group_amx(x, (size_t) nb * QK, d0, packed + (size_t) (g - g0) * group_bytes, nb, dst,
                       m, R, n0, cols);
    }
#else
    Q80_ALIGN64 float res[MR * W] = {0};
    for (int64_t g = g0; g < g1; ++g) {
        rows_group(kind, x, (size_t) nb * XB(kind), d0, packed + (size_t) (g - g0) * group_bytes,
                   nb, R, res);
        const int64_t n0 = g * W;
        const int cols = N - n0 < W ? (int) (N - n0) : W;
#ifdef Q80_SIMD
        ggml_sys_store_columns(res, W, R, cols, out_at(dst, m, n0), dst->nb[1] / sizeof(float));
#else
        for (int c = 0; c < cols; ++c) {
            float * out = out_at(dst, m, n0 + c);
            for (int r = 0; r < R; ++r) {
                out[r] = res[r * W + c];
            }
        }
#endif
    }
#endif
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

#include "mul_mat_q8_0_few.h"

// The packed groups of ggml_sys_pack_q80's result `t`: its data from the first 64-byte boundary.
static char * packed_groups(const struct ggml_tensor * t) {
    return (char *) (((uintptr_t) t->data + 63) & ~(uintptr_t) 63);
}

// Bytes of ggml_sys_pack_q80's result for N columns of K: the groups, and room to align them.
static int64_t packed_size(int64_t K, int64_t N) {
    return 64 + (N + W - 1) / W * (K / QK) * (int64_t) GROUP_BYTES;
}

// `packed`: 0 when dst->src[1] is the f32 activations, else their column count, dst->src[1]
// being ggml_sys_pack_q80's result for them.
Q80_INLINE void mul_mat(int kind, struct ggml_tensor * dst, int ith, int nth, int64_t packed) {
    const struct ggml_tensor * a = dst->src[0];
    const struct ggml_tensor * b = dst->src[1];
    const int64_t M = a->ne[1], N = packed != 0 ? packed : b->ne[1];
#ifdef Q80_FEW
    if (packed == 0 && N <= FEW_MAX_COLS(kind)) {
        if (kind == KIND_Q4_0) {
            mul_mat_few(KIND_Q4_0, dst, ith, nth);
        } else if (kind == KIND_Q5_0) {
            mul_mat_few(KIND_Q5_0, dst, ith, nth);
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
    if (packed != 0 && (int64_t) ggml_nbytes(b) < packed_size(a->ne[0], N)) {
        // Packed columns too short for N columns: NaN, never a read past them.
        fill_nan(dst, r0, r1, g0 * W, g1 * W < N ? g1 * W : N);
        return;
    }
    const size_t packed_bytes = packed != 0 ? 0 : align64((size_t) (g1 - g0) * nb * GROUP_BYTES);
    const size_t x_bytes = align64((size_t) MR * nb * XB(kind));
    const size_t d0_bytes = align64((size_t) MR * nb * sizeof(float));
    const size_t tmp_bytes = packed != 0 ? 0 : align64((size_t) W * nb * sizeof(q80_block));
    char * buf = reserve(packed_bytes + x_bytes + d0_bytes + tmp_bytes);
    if (buf == NULL) {
        fill_nan(dst, r0, r1, g0 * W, g1 * W < N ? g1 * W : N);
        return;
    }
    uint8_t * x = (uint8_t *) (buf + packed_bytes);
    float * d0 = (float *) (buf + packed_bytes + x_bytes);
    q80_block * tmp = (q80_block *) (buf + packed_bytes + x_bytes + d0_bytes);
    const int32_t bias = unsigned_bias(kind);
    const char * groups_at = buf;
    if (packed != 0) {
        groups_at = packed_groups(b) + (size_t) g0 * nb * GROUP_BYTES;
    } else {
        for (int64_t g = g0; g < g1; ++g) {
            pack_group(b, g * W, N, nb, bias, tmp, buf + (size_t) (g - g0) * nb * GROUP_BYTES);
        }
    }
#ifdef Q80_AMX
    amx_configure();
#endif
    for (int64_t m = r0; m < r1; m += MR) {
        const int R = r1 - m < MR ? (int) (r1 - m) : MR;
        for (int r = 0; r < R; ++r) {
            unpack_row(kind, (const char *) a->data + (m + r) * a->nb[1], nb,
                       x + (size_t) r * nb * XB(kind), d0 + (size_t) r * nb);
        }
#ifdef Q80_AMX
        // The tiles always take 16 rows: the ones past R are zero and their results dropped.
        if (R < MR) {
            memset(x + (size_t) R * nb * QK, 0, (size_t) (MR - R) * nb * QK);
            memset(d0 + (size_t) R * nb, 0, (size_t) (MR - R) * nb * sizeof(float));
        }
        amx_signed(x, (size_t) MR * nb * QK, (uint8_t) bias);
        rows_groups(kind, dst, m, R, x, d0, groups_at, g0, g1, nb, N);
#else
        // A constant row count per call, so that the vector path keeps its sums in registers.
        switch (R) {
#define Q80_ROWS(n) \
    case n: rows_groups(kind, dst, m, n, x, d0, groups_at, g0, g1, nb, N); break;
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
            default: rows_groups(kind, dst, m, MR, x, d0, groups_at, g0, g1, nb, N); break;
        }
#endif
    }
#ifdef Q80_AMX
    _tile_release();
#endif
}

// dst[m, n] = sum_k a[k, m] * b[k, n] by the definition at the top, every column; a: q4_0
// [K, M] (src 0), b: f32 [K, N] (src 1), dst: f32 [M, N], all two-dimensional, K a multiple of
// 32. With `userdata` not null, src 1 is instead ggml_sys_pack_q80's result for b (for q4_0
// weights) and `userdata`, read as an integer, is N.
void ggml_sys_mul_mat_q4_0(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    mul_mat(KIND_Q4_0, dst, ith, nth, (int64_t) (intptr_t) userdata);
}

// As ggml_sys_mul_mat_q4_0, for q5_0 weights.
void ggml_sys_mul_mat_q5_0(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    mul_mat(KIND_Q5_0, dst, ith, nth, (int64_t) (intptr_t) userdata);
}

// As ggml_sys_mul_mat_q4_0, for q8_0 weights.
void ggml_sys_mul_mat_q8_0(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    mul_mat(KIND_Q8_0, dst, ith, nth, (int64_t) (intptr_t) userdata);
}

// The kind of weights of ggml type `type`, or -1 for another type.
static int kind_of(int type) {
    return type == GGML_TYPE_Q4_0   ? KIND_Q4_0
           : type == GGML_TYPE_Q5_0 ? KIND_Q5_0
           : type == GGML_TYPE_Q8_0 ? KIND_Q8_0
                                    : -1;
}

// Bytes of ggml_sys_pack_q80's result for N columns of K (a multiple of 32) for weights of ggml
// type `type`: 0 when the products take those columns unpacked (few columns, which another
// layout serves; a plain C build; another type).
int64_t ggml_sys_q80_packed_bytes(int type, int64_t K, int64_t N) {
    const int kind = kind_of(type);
    if (kind < 0 || K % QK != 0 || N <= 0) {
        return 0;
    }
#ifndef Q80_SIMD
    return 0;
#else
#ifdef Q80_FEW
    if (N <= FEW_MAX_COLS(kind)) {
        return 0;
    }
#endif
    return packed_size(K, N);
#endif
}

// dst (ggml_sys_q80_packed_bytes(type, K, N) bytes or more) = src 0 (f32 [K, N], rows
// contiguous) quantized and packed in column groups as the products above read them, for
// weights of the ggml type `userdata` (read as an integer): the bytes every thread of those
// products would make for itself, made once for every product over the same columns.
void ggml_sys_pack_q80(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    const struct ggml_tensor * b = dst->src[0];
    const int type = (int) (intptr_t) userdata;
    const int64_t N = b->ne[1];
    const int nb = (int) (b->ne[0] / QK);
    // 0 for a type these products do not take, as for columns they take unpacked.
    const int64_t bytes = ggml_sys_q80_packed_bytes(type, b->ne[0], N);
    if (bytes == 0 || (int64_t) ggml_nbytes(dst) < bytes) {
        // Nothing the products read packed (or no room for it): they check the size too.
        return;
    }
    // The products' own split of the groups, so that each thread packs what it reads.
    const int64_t groups = (N + W - 1) / W, per = (groups + nth - 1) / nth;
    const int64_t g0 = per * ith, g1 = g0 + per < groups ? g0 + per : groups;
    if (g0 >= g1) {
        return;
    }
    char * out = packed_groups(dst);
    q80_block * tmp = (q80_block *) reserve((size_t) W * nb * sizeof(q80_block));
    if (tmp == NULL) {
        // No scratch memory: NaN scales, so that the products' results are visibly wrong.
        for (int64_t g = g0; g < g1; ++g) {
            float * d1 = (float *) (out + (size_t) g * nb * GROUP_BYTES + (size_t) nb * 8 * W * 4);
            for (int i = 0; i < nb * W; ++i) {
                d1[i] = NAN;
            }
        }
        return;
    }
    for (int64_t g = g0; g < g1; ++g) {
        pack_group(b, g * W, N, nb, unsigned_bias(kind_of(type)), tmp,
                   out + (size_t) g * nb * GROUP_BYTES);
    }
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

int ggml_sys_mul_mat_q5_0_isum(void) {
    return ggml_sys_mul_mat_q4_0_isum();
}

// 1 when the wide path runs AMX tiles (the `amx` CPU path), else 0: the same bits either way.
int ggml_sys_mul_mat_amx(void) {
#ifdef Q80_AMX
    return 1;
#else
    return 0;
#endif
}
