// Integer-sum products of k-quant weights (Q4_K, Q5_K, Q6_K) with f32 activations, for ggml's
// CPU backend, run as ggml custom ops (`ggml_custom_4d`), as the q4_1 kernel's integer-sum path
// (csrc/mul_mat_q4_1.c) does for q4_1.
//
// The activations are quantized by ggml's own q8_K routine: per super-block of 256 values a
// scale d8 (f32), 256 int8 values y and their exact sums over each 16 (`bsums`). Per weight
// super-block of 256 values, with the block layouts decoded below:
//
// Q4_K, Q5_K: a scale d and a minimum dmin (f16), eight sub-blocks j of 32 values q (0..15, or
// 0..31 for Q5_K), each with a six-bit scale sc_j and minimum m_j; weight = d*sc_j*q - dmin*m_j.
// For row r and column c, per super-block, exactly in int32:
//     dot_j = sum over sub-block j of q * y,  sumi = sum_j sc_j * dot_j,
//     summ = sum_j m_j * bsum_j  (bsum_j: the sum of sub-block j's y, two of q8_K's bsums),
// and over the super-blocks i in order, in f32 with fused multiply-adds,
//     acc = fma(d_i * d8_i, (float) sumi_i, acc),  acc = fma(-dmin_i * d8_i, (float) summ_i, acc).
// Q6_K: a scale d (f16), sixteen sub-blocks j of 16 values v = u - 32 (u: six bits, 0..63), each
// with an int8 scale sc_j; weight = d*sc_j*v. The unsigned u goes into the products and the 32
// comes back through the activations' sums, exactly:
//     sumi = sum_j sc_j * dot_j(u, y) + sum_j (-32 * sc_j) * bsum_j  (= sum_j sc_j * dot_j(v, y)),
//     acc = fma(d_i * d8_i, (float) sumi_i, acc).
// The output is acc. Every integer sum is exact (bounds below), so the result is the exact
// product of the dequantized weights and the q8_K activations up to f32 rounding of the
// per-super-block terms and of their sum. ggml's dot product computes the same integer sums
// but adds its float terms in another order (eight partial sums per vector lane, then a
// horizontal sum), so the results equal ggml_mul_mat's up to rounding, not bit for bit.
//
// Bounds (|y| <= 128 covers q8_K's -127..127): Q4_K |dot_j| <= 32*15*128 = 61,440, |sumi| <=
// 8*63*61,440 < 2^25, |summ| <= 8*63*32*128 < 2^21; Q5_K |dot_j| <= 32*31*128 = 126,976,
// |sumi| <= 8*63*126,976 < 2^26; Q6_K |dot_j(u)| <= 16*63*128 = 129,024, |sum_j sc_j dot_j| <=
// 16*128*129,024 < 2^28, |32 sc_j bsum_j| summed <= 16*32*128*2,048 < 2^28: all well inside int32.
//
// Two paths compute it, and every output gets the same integers and the same float operations in
// the same order from either, so a column's bits never depend on how many columns the node has,
// which group, lane or pass it lands in, or which path computes it, at every vector ISA level
// (the columns are quantized as ggml's q8_K reference code does, `kq_quantize_q8k` giving its
// bits at every level; the only float product,
// d * d8, is the multiplicand of a fused multiply-add, so no contraction can change the steps):
//
// - Wide (many columns): one vector lane holds one column: the columns are packed W to a group
//   (16 with AVX-512 VNNI, else 8), the four bytes of a super-block's element quad for all W
//   columns side by side, so one instruction multiplies-and-adds a broadcast weight quad into W
//   column sums; conversion and scaling come once per super-block for W columns. Columns past
//   N in a partial group are zero and never stored.
// - Few columns (decoding, short items; under kq_few_max columns, and the columns past a wide
//   product's last whole group when fewer than that): one vector lane holds one weight row.
//   Each row's super-block sums are computed within the row (64 or 32 values per instruction,
//   up to four columns per read of the weights), exactly, so in any order; the sums of eight
//   rows are then gathered into the lanes of one vector and the float steps above run lane by
//   lane, super-block by super-block from acc = 0.
//
// Without AVX2 and FMA the ops call ggml's own dot product on the same q8_K columns (ggml's
// result, whose order differs from the above; per output, so also the same bits at any N).
// ggml's q8_K routine leaves an all-zero super-block's sums unwritten: the buffers are zeroed
// first (d8 = 0 then, so those terms are zero either way).

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
#define KQ_SIMD 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define KQ_W16 1
#endif
#endif

#if defined(__GNUC__) || defined(__clang__)
#define KQ_INLINE static inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define KQ_INLINE static __forceinline
#else
#define KQ_INLINE static inline
#endif

// Values per super-block.
#define KQ_SB 256

// ggml's block layouts (ggml-common.h), for the fields this file reads.
typedef struct {
    uint16_t d;
    uint16_t dmin;
    // Bytes 0..3: scales 0..3 in their low six bits, the top two bits of scales 4..7 above them;
    // bytes 4..7 the same for the minimums; bytes 8..11: the low four bits of scale 4 + t in the
    // low nibble of byte 8 + t, of minimum 4 + t in its high nibble.
    uint8_t scales[12];
    // Values 64t .. 64t + 31 in the low nibbles of qs[32t ..], 64t + 32 .. 64t + 63 in the high.
    uint8_t qs[KQ_SB / 2];
} kq_block_q4k;

typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];  // as Q4_K's
    // The fifth bit: value 64t + l (l < 32) has bit 2t of qh[l], value 64t + 32 + l bit 2t + 1.
    uint8_t qh[KQ_SB / 8];
    uint8_t qs[KQ_SB / 2];  // the low four bits, as Q4_K's values
} kq_block_q5k;

typedef struct {
    // Half h (values 128h ..) reads ql[64h ..], qh[32h ..]; within it, for l < 32, value
    // 32t + l has low bits: t = 0 ql[l] & 15, t = 1 ql[32 + l] & 15, t = 2 ql[l] >> 4, t = 3
    // ql[32 + l] >> 4, and high bits (qh[l] >> 2t) & 3.
    uint8_t ql[KQ_SB / 2];
    uint8_t qh[KQ_SB / 4];
    int8_t scales[KQ_SB / 16];  // scale j: values 16j .. 16j + 15
    uint16_t d;
} kq_block_q6k;

typedef struct {
    float d;
    int8_t qs[KQ_SB];
    int16_t bsums[KQ_SB / 16];
} kq_block_q8k;

_Static_assert(sizeof(kq_block_q4k) == 144, "q4_K block is 144 bytes");
_Static_assert(sizeof(kq_block_q5k) == 176, "q5_K block is 176 bytes");
_Static_assert(sizeof(kq_block_q6k) == 210, "q6_K block is 210 bytes");
_Static_assert(sizeof(kq_block_q8k) == 292, "q8_K block is 292 bytes");

enum kq_kind { KQ_Q4K, KQ_Q5K, KQ_Q6K };

static inline float * kq_out(struct ggml_tensor * dst, int64_t m, int64_t n) {
    return (float *) ((char *) dst->data + m * dst->nb[0] + n * dst->nb[1]);
}

// Rows m0..m1-1 of columns n0..n1-1 set to NaN: a failure (no scratch memory, a wrong shape or
// type) is visible, never silent.
static void kq_fill_nan(struct ggml_tensor * dst, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
        for (int64_t m = m0; m < m1; ++m) {
            *kq_out(dst, m, n) = NAN;
        }
    }
}

static inline size_t kq_align64(size_t n) {
    return (n + 63) & ~(size_t) 63;
}

// A per-thread buffer of `bytes`, 64-byte aligned.
static _Thread_local char * kq_raw = NULL;
static _Thread_local size_t kq_cap = 0;

static char * kq_reserve(size_t bytes) {
    if (bytes + 64 > kq_cap) {
        char * p = realloc(kq_raw, bytes + 64);
        if (p == NULL) {
            return NULL;
        }
        kq_raw = p;
        kq_cap = bytes + 64;
    }
    return (char *) (((uintptr_t) kq_raw + 63) & ~(uintptr_t) 63);
}

#ifdef KQ_SIMD


// Columns per group (one per 32-bit lane) and weight rows per pass.
#ifdef KQ_W16
#define W 16
#define MR 8
typedef __m512i vint;
typedef __m512 vflt;
#define VI_ZERO() _mm512_setzero_si512()
#define VI_LOAD(p) _mm512_load_si512((const void *) (p))
#define VI_SET1(x) _mm512_set1_epi32(x)
#define VI_ADD(x, y) _mm512_add_epi32(x, y)
#define VI_MULLO(x, y) _mm512_mullo_epi32(x, y)
#define VI_MADD16(x, y) _mm512_madd_epi16(x, y)
#define VF_ZERO() _mm512_setzero_ps()
#define VF_LOAD(p) _mm512_load_ps(p)
#define VF_BCST(p) _mm512_set1_ps(*(p))
#define VF_MUL(x, y) _mm512_mul_ps(x, y)
#define VF_FMA(x, y, z) _mm512_fmadd_ps(x, y, z)
#define VF_CVT(x) _mm512_cvtepi32_ps(x)
#define VF_STORE(p, x) _mm512_store_ps(p, x)
#else
#define W 8
#define MR 4
typedef __m256i vint;
typedef __m256 vflt;
#define VI_ZERO() _mm256_setzero_si256()
#define VI_LOAD(p) _mm256_load_si256((const __m256i *) (p))
#define VI_SET1(x) _mm256_set1_epi32(x)
#define VI_ADD(x, y) _mm256_add_epi32(x, y)
#define VI_MULLO(x, y) _mm256_mullo_epi32(x, y)
#define VI_MADD16(x, y) _mm256_madd_epi16(x, y)
#define VF_ZERO() _mm256_setzero_ps()
#define VF_LOAD(p) _mm256_load_ps(p)
#define VF_BCST(p) _mm256_broadcast_ss(p)
#define VF_MUL(x, y) _mm256_mul_ps(x, y)
#define VF_FMA(x, y, z) _mm256_fmadd_ps(x, y, z)
#define VF_CVT(x) _mm256_cvtepi32_ps(x)
#define VF_STORE(p, x) _mm256_store_ps(p, x)
#endif

// A weight super-block unpacked: its values in element order (unsigned: Q4_K 0..15, Q5_K 0..31,
// Q6_K u = v + 32 in 0..63), its sub-block scales, and `mp`: pairs of int16 (even pair member
// low) that multiply the activations' pair sums (see `kq_group`): Q4_K and Q5_K the minimums
// (m_2p, m_2p+1), Q6_K (-32 sc_2p, -32 sc_2p+1). `d` and `dm`: d and -dmin (Q6_K: d only).
typedef struct {
    _Alignas(64) uint8_t q[KQ_SB];
    int32_t sc[16];
    int32_t mp[8];
    float d;
    float dm;
} kq_row;

// A group's super-block: quad k (values 4k .. 4k + 3) of its W columns at `(k * W + c) * 4`,
// then eight int32 lanes of W (`bp`: pairs of int16 sums of the column's values, low member
// first: per 16 values for Q6_K, bsums 2p and 2p + 1; per 32 for Q4_K and Q5_K, p < 4, the
// sums of values 64p .. 64p + 31 and 64p + 32 .. 64p + 63; |sum| <= 32 * 128 fits int16), then
// the W scales d8 as f32.
#define KQ_GROUP_SB (KQ_SB * W + 8 * W * 4 + W * 4)
#define KQ_BP_OFF (KQ_SB * W)
#define KQ_D8_OFF (KQ_SB * W + 8 * W * 4)

static inline int32_t kq_pair(int lo, int hi) {
    return (int32_t) ((uint32_t) (uint16_t) (int16_t) lo | ((uint32_t) (uint16_t) (int16_t) hi << 16));
}

// The six-bit scale and minimum of sub-block j of a Q4_K or Q5_K super-block.
static inline void kq_scale_min(const uint8_t * s, int j, int * sc, int * m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void kq_unpack_scales_min(const uint8_t * scales, uint16_t d, uint16_t dmin, kq_row * u) {
    int m[8];
    for (int j = 0; j < 8; ++j) {
        kq_scale_min(scales, j, &u->sc[j], &m[j]);
    }
    for (int p = 0; p < 4; ++p) {
        u->mp[p] = kq_pair(m[2 * p], m[2 * p + 1]);
    }
    u->d = ggml_sys_f16(d);
    u->dm = -ggml_sys_f16(dmin);
}

static void kq_unpack_q4k(const kq_block_q4k * x, int nb, kq_row * u) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < nb; ++i) {
        for (int t = 0; t < 4; ++t) {
            const __m256i v = _mm256_loadu_si256((const __m256i *) (x[i].qs + 32 * t));
            _mm256_store_si256((__m256i *) (u[i].q + 64 * t), _mm256_and_si256(v, low));
            _mm256_store_si256((__m256i *) (u[i].q + 64 * t + 32),
                               _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
        }
        kq_unpack_scales_min(x[i].scales, x[i].d, x[i].dmin, &u[i]);
    }
}

static void kq_unpack_q5k(const kq_block_q5k * x, int nb, kq_row * u) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i sixteen = _mm256_set1_epi8(16);
    for (int i = 0; i < nb; ++i) {
        const __m256i h = _mm256_loadu_si256((const __m256i *) x[i].qh);
        for (int t = 0; t < 4; ++t) {
            const __m256i v = _mm256_loadu_si256((const __m256i *) (x[i].qs + 32 * t));
            const __m256i b0 = _mm256_set1_epi8((char) (1 << (2 * t)));
            const __m256i b1 = _mm256_set1_epi8((char) (1 << (2 * t + 1)));
            const __m256i h0 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, b0), b0), sixteen);
            const __m256i h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, b1), b1), sixteen);
            _mm256_store_si256((__m256i *) (u[i].q + 64 * t),
                               _mm256_or_si256(_mm256_and_si256(v, low), h0));
            _mm256_store_si256((__m256i *) (u[i].q + 64 * t + 32),
                               _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), h1));
        }
        kq_unpack_scales_min(x[i].scales, x[i].d, x[i].dmin, &u[i]);
    }
}

static void kq_unpack_q6k(const kq_block_q6k * x, int nb, kq_row * u) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i two = _mm256_set1_epi8(0x30);
    for (int i = 0; i < nb; ++i) {
        for (int h = 0; h < 2; ++h) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *) (x[i].ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *) (x[i].ql + 64 * h + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *) (x[i].qh + 32 * h));
            // The shifts are 16-bit: the mask keeps bits 4 and 5 of each byte, which come
            // from that byte's own bits (2t, 2t + 1) of qh.
            const __m256i v0 = _mm256_or_si256(_mm256_and_si256(l0, low),
                                               _mm256_and_si256(_mm256_slli_epi16(hb, 4), two));
            const __m256i v1 = _mm256_or_si256(_mm256_and_si256(l1, low),
                                               _mm256_and_si256(_mm256_slli_epi16(hb, 2), two));
            const __m256i v2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                                               _mm256_and_si256(hb, two));
            const __m256i v3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                                               _mm256_and_si256(_mm256_srli_epi16(hb, 2), two));
            uint8_t * q = u[i].q + 128 * h;
            _mm256_store_si256((__m256i *) q, v0);
            _mm256_store_si256((__m256i *) (q + 32), v1);
            _mm256_store_si256((__m256i *) (q + 64), v2);
            _mm256_store_si256((__m256i *) (q + 96), v3);
        }
        for (int j = 0; j < 16; ++j) {
            u[i].sc[j] = x[i].scales[j];
        }
        for (int p = 0; p < 8; ++p) {
            u[i].mp[p] = kq_pair(-32 * x[i].scales[2 * p], -32 * x[i].scales[2 * p + 1]);
        }
        u[i].d = ggml_sys_f16(x[i].d);
        u[i].dm = 0.0f;
    }
}

// Adds sc_j * dot_j, sub-block j's products of rows x[r * nb] (R of them) and the W columns of
// `y` (the group's super-block), to sumi[r], exactly. SUB: values per sub-block (32 or 16); Q16:
// quads whose pair sums the AVX2 path adds in 16 bits before widening.
KQ_INLINE void kq_sub_sums(vint * sumi, int R, const kq_row * x, int nb, int j, const int8_t * y,
                           int SUB, int Q16) {
#if defined(KQ_W16) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
    // VNNI: four products of unsigned weights and signed activations per lane and instruction,
    // summed into 32 bits without saturation; the sums stay far below 2^31 (see the top).
    (void) Q16;
    vint dot[MR];
    for (int r = 0; r < R; ++r) {
        dot[r] = VI_ZERO();
    }
    for (int k = j * SUB / 4; k < (j + 1) * SUB / 4; ++k) {
        const vint yk = VI_LOAD(y + k * W * 4);
        for (int r = 0; r < R; ++r) {
            int32_t quad;
            memcpy(&quad, x[(size_t) r * nb].q + 4 * k, 4);
#if defined(KQ_W16)
            dot[r] = _mm512_dpbusd_epi32(dot[r], VI_SET1(quad), yk);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
            dot[r] = _mm256_dpbusd_epi32(dot[r], VI_SET1(quad), yk);
#else
            dot[r] = _mm256_dpbusd_avx_epi32(dot[r], VI_SET1(quad), yk);
#endif
        }
    }
    for (int r = 0; r < R; ++r) {
        sumi[r] = VI_ADD(sumi[r], VI_MULLO(dot[r], VI_SET1(x[(size_t) r * nb].sc[j])));
    }
#else
    // AVX2: maddubs multiplies unsigned weight bytes by signed activation bytes and adds each
    // pair into a 16-bit lane with saturation; the pairs of Q16 quads are then added in 16 bits
    // (wrapping) and widened by madd, which multiplies by the scale and adds the lane pairs into
    // 32 bits. Neither saturates nor overflows: a pair is at most 2 * 63 * 128 = 16,128 in
    // magnitude, and a 16-bit lane sums 2 * Q16 products: Q4_K 16 * 15 * 128 = 30,720 (Q16 = 8),
    // Q5_K 8 * 31 * 128 = 31,744 (Q16 = 4), Q6_K 4 * 63 * 128 = 32,256 (Q16 = 2), all below
    // 2^15 = 32,768; madd's products are at most 32,256 * 128 per lane, two per 32-bit sum.
    for (int k0 = j * SUB / 4; k0 < (j + 1) * SUB / 4; k0 += Q16) {
        __m256i s16[MR];
        for (int r = 0; r < R; ++r) {
            s16[r] = VI_ZERO();
        }
        for (int k = k0; k < k0 + Q16; ++k) {
            const vint yk = VI_LOAD(y + k * W * 4);
            for (int r = 0; r < R; ++r) {
                int32_t quad;
                memcpy(&quad, x[(size_t) r * nb].q + 4 * k, 4);
                s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(VI_SET1(quad), yk));
            }
        }
        for (int r = 0; r < R; ++r) {
            const __m256i sc = _mm256_set1_epi16((short) x[(size_t) r * nb].sc[j]);
            sumi[r] = VI_ADD(sumi[r], VI_MADD16(s16[r], sc));
        }
    }
#endif
}

// R unpacked rows (row r's super-block i at x[r * nb + i]) against one group: res[r * W + c].
KQ_INLINE void kq_rows_group(const kq_row * x, int nb, int R, const char * g, int kind, float * res) {
    const int SUB = kind == KQ_Q6K ? 16 : 32;
    const int Q16 = kind == KQ_Q4K ? 8 : kind == KQ_Q5K ? 4 : 2;
    const int NPAIR = kind == KQ_Q6K ? 8 : 4;
    vflt acc[MR];
    for (int r = 0; r < R; ++r) {
        acc[r] = VF_ZERO();
    }
    for (int i = 0; i < nb; ++i) {
        const char * gs = g + (size_t) i * KQ_GROUP_SB;
        const int8_t * y = (const int8_t *) gs;
        const int32_t * bp = (const int32_t *) (gs + KQ_BP_OFF);
        const float * d8 = (const float *) (gs + KQ_D8_OFF);
        const kq_row * xi = x + i;
        vint sumi[MR];
        for (int r = 0; r < R; ++r) {
            sumi[r] = VI_ZERO();
        }
        for (int j = 0; j < KQ_SB / SUB; ++j) {
            kq_sub_sums(sumi, R, xi, nb, j, y, SUB, Q16);
        }
        if (kind == KQ_Q6K) {
            // The -32 of every value, through the activations' sums per 16.
            for (int p = 0; p < NPAIR; ++p) {
                const vint b = VI_LOAD(bp + p * W);
                for (int r = 0; r < R; ++r) {
                    sumi[r] = VI_ADD(sumi[r], VI_MADD16(VI_SET1(xi[(size_t) r * nb].mp[p]), b));
                }
            }
        }
        const vflt dc = VF_LOAD(d8);
        for (int r = 0; r < R; ++r) {
            acc[r] = VF_FMA(VF_MUL(VF_BCST(&xi[(size_t) r * nb].d), dc), VF_CVT(sumi[r]), acc[r]);
        }
        if (kind != KQ_Q6K) {
            // The minimums, through the activations' sums per 32.
            vint summ[MR];
            for (int r = 0; r < R; ++r) {
                summ[r] = VI_ZERO();
            }
            for (int p = 0; p < NPAIR; ++p) {
                const vint b = VI_LOAD(bp + p * W);
                for (int r = 0; r < R; ++r) {
                    summ[r] = VI_ADD(summ[r], VI_MADD16(VI_SET1(xi[(size_t) r * nb].mp[p]), b));
                }
            }
            for (int r = 0; r < R; ++r) {
                acc[r] = VF_FMA(VF_MUL(VF_BCST(&xi[(size_t) r * nb].dm), dc), VF_CVT(summ[r]), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        VF_STORE(res + r * W, acc[r]);
    }
}

// A column of nb super-blocks into q8_K: the values, scale and sums of ggml's q8_K routine
// (its reference code, which every level of ggml runs), vectorized. Per super-block: amax, the
// largest |x| (a maximum: exact in any order), and `max`, the first x whose |x| is amax; an
// all-zero block is all zeros; else iscale = -127 / max, q = min(127, round-half-even(iscale *
// x)) (ggml rounds by adding 1.5 * 2^23, the same integer for these magnitudes as the vector
// conversion's round-half-even), the sums of each 16 q, and d = 1 / iscale. For finite x
// (a NaN is skipped by the maximum, as ggml's comparison skips it).
static void kq_quantize_q8k(const float * x, kq_block_q8k * y, int nb) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int i = 0; i < nb; ++i, x += KQ_SB, ++y) {
        __m256 vmax = _mm256_setzero_ps();
        for (int j = 0; j < KQ_SB; j += 8) {
            // |x| first: where it is NaN, max_ps keeps the running maximum.
            vmax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), vmax);
        }
        __m128 h = _mm_max_ps(_mm256_extractf128_ps(vmax, 1), _mm256_castps256_ps128(vmax));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        if (amax == 0.0f) {
            memset(y, 0, sizeof *y);
            continue;
        }
        float max = 0.0f;
        const __m256 va = _mm256_set1_ps(amax);
        for (int j = 0; j < KQ_SB; j += 8) {
            const __m256 v = _mm256_loadu_ps(x + j);
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v), va, _CMP_EQ_OQ));
            if (hit != 0) {
                max = x[j + __builtin_ctz((unsigned) hit)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i top = _mm256_set1_epi32(127);
        for (int j = 0; j < KQ_SB; j += 32) {
            __m256i q[4];
            for (int u = 0; u < 4; ++u) {
                const __m256 v = _mm256_mul_ps(vs, _mm256_loadu_ps(x + j + 8 * u));
                q[u] = _mm256_min_epi32(_mm256_cvtps_epi32(v), top);
            }
            // -128 .. 127: the packs do not saturate; the lanes' order put back.
            const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                                 _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *) (y->qs + j), _mm256_permutevar8x32_epi32(w, order));
        }
        for (int j = 0; j < KQ_SB / 16; ++j) {
            const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) (y->qs + 16 * j)));
            const __m256i s = _mm256_madd_epi16(w, _mm256_set1_epi16(1));
            __m128i t = _mm_add_epi32(_mm256_extracti128_si256(s, 1), _mm256_castsi256_si128(s));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
            y->bsums[j] = (int16_t) _mm_cvtsi128_si32(t);
        }
        y->d = 1.0f / iscale;
    }
}

// Quantizes columns n0 .. n0 + W - 1 of `b` (those below N; the rest zero) into group `g`,
// going through `tmp` (nb q8_K blocks). SUB: the values per sum in `bp` (16 or 32).
static void kq_pack_group(const struct ggml_tensor * b, int64_t n0, int64_t N, int nb, int SUB,
                          kq_block_q8k * tmp, char * g) {
    for (int c = 0; c < W; ++c) {
        const int real = n0 + c < N;
        if (real) {
            kq_quantize_q8k((const float *) ((const char *) b->data + (n0 + c) * b->nb[1]), tmp, nb);
        }
        for (int i = 0; i < nb; ++i) {
            char * gs = g + (size_t) i * KQ_GROUP_SB;
            int8_t * qs = (int8_t *) gs;
            int32_t * bp = (int32_t *) (gs + KQ_BP_OFF);
            float * d8 = (float *) (gs + KQ_D8_OFF);
            for (int k = 0; k < KQ_SB / 4; ++k) {
                if (real) {
                    memcpy(qs + ((size_t) k * W + c) * 4, tmp[i].qs + 4 * k, 4);
                } else {
                    memset(qs + ((size_t) k * W + c) * 4, 0, 4);
                }
            }
            const int16_t * s = tmp[i].bsums;
            for (int p = 0; p < 8; ++p) {
                int32_t v = 0;
                if (real && SUB == 16) {
                    v = kq_pair(s[2 * p], s[2 * p + 1]);
                } else if (real && p < 4) {
                    v = kq_pair(s[4 * p] + s[4 * p + 1], s[4 * p + 2] + s[4 * p + 3]);
                }
                bp[p * W + c] = v;
            }
            d8[c] = real ? tmp[i].d : 0.0f;
        }
    }
}

// R rows from m (unpacked in x) against groups g0 .. g1 - 1 (packed from `packed`).
KQ_INLINE void kq_rows_groups(struct ggml_tensor * dst, int64_t m, int R, const kq_row * x,
                              const char * packed, int64_t g0, int64_t g1, int nb, int64_t N,
                              int kind) {
    const size_t group_bytes = (size_t) nb * KQ_GROUP_SB;
    float res[MR * W] __attribute__((aligned(64))) = {0};
    for (int64_t g = g0; g < g1; ++g) {
        kq_rows_group(x, nb, R, packed + (size_t) (g - g0) * group_bytes, kind, res);
        const int64_t n0 = g * W;
        const int cols = N - n0 < W ? (int) (N - n0) : W;
        ggml_sys_store_columns(res, W, R, cols, kq_out(dst, m, n0), dst->nb[1] / sizeof(float));
    }
}

// The rows of one pass, R a constant in each case.
static void kq_pass(struct ggml_tensor * dst, int64_t m, int R, const kq_row * x,
                    const char * packed, int64_t g0, int64_t g1, int nb, int64_t N, int kind) {
#define KQ_CASE(n, k) \
    case n: kq_rows_groups(dst, m, n, x, packed, g0, g1, nb, N, k); break;
#define KQ_ROWS(k)               \
    switch (R) {                 \
        KQ_CASE(1, k)            \
        KQ_CASE(2, k)            \
        KQ_CASE(3, k)            \
        KQ_MORE_ROWS(k)          \
        default: kq_rows_groups(dst, m, MR, x, packed, g0, g1, nb, N, k); break; \
    }
#if MR > 4
#define KQ_MORE_ROWS(k) KQ_CASE(4, k) KQ_CASE(5, k) KQ_CASE(6, k) KQ_CASE(7, k)
#else
#define KQ_MORE_ROWS(k)
#endif
    switch (kind) {
        case KQ_Q4K: KQ_ROWS(KQ_Q4K) break;
        case KQ_Q5K: KQ_ROWS(KQ_Q5K) break;
        default: KQ_ROWS(KQ_Q6K) break;
    }
#undef KQ_MORE_ROWS
#undef KQ_ROWS
#undef KQ_CASE
}

// The work of thread ith of nth over `groups` column groups and M rows: with enough groups each
// thread packs its own groups and computes them for every row; otherwise each packs every
// group and computes its share of the rows. Returns 0 when the thread has nothing to do.
static int kq_split(int64_t groups, int64_t M, int ith, int nth, int64_t * g0, int64_t * g1,
                    int64_t * r0, int64_t * r1) {
    const int by_groups = groups >= 2 * nth;
    const int64_t g_per = (groups + nth - 1) / nth, r_per = (M + nth - 1) / nth;
    *g0 = by_groups ? g_per * ith : 0;
    *g1 = by_groups ? (*g0 + g_per < groups ? *g0 + g_per : groups) : groups;
    *r0 = by_groups ? 0 : r_per * ith;
    *r1 = by_groups ? M : (*r0 + r_per < M ? *r0 + r_per : M);
    return *g0 < *g1 && *r0 < *r1;
}

// Columns 0 .. N - 1.
static void kq_mul_mat(struct ggml_tensor * dst, int ith, int nth, int kind, int64_t N) {
    const struct ggml_tensor * a = dst->src[0];
    const struct ggml_tensor * b = dst->src[1];
    const int64_t M = a->ne[1];
    const int nb = (int) (a->ne[0] / KQ_SB);
    const int64_t groups = (N + W - 1) / W;
    int64_t g0, g1, r0, r1;
    if (!kq_split(groups, M, ith, nth, &g0, &g1, &r0, &r1)) {
        return;
    }
    const size_t packed_bytes = kq_align64((size_t) (g1 - g0) * nb * KQ_GROUP_SB);
    const size_t rows_bytes = (size_t) MR * nb * sizeof(kq_row);
    const size_t tmp_bytes = kq_align64((size_t) nb * sizeof(kq_block_q8k));
    char * buf = kq_reserve(packed_bytes + rows_bytes + tmp_bytes);
    if (buf == NULL) {
        kq_fill_nan(dst, r0, r1, g0 * W, g1 * W < N ? g1 * W : N);
        return;
    }
    kq_row * rows = (kq_row *) (buf + packed_bytes);
    kq_block_q8k * tmp = (kq_block_q8k *) (buf + packed_bytes + rows_bytes);
    for (int64_t g = g0; g < g1; ++g) {
        kq_pack_group(b, g * W, N, nb, kind == KQ_Q6K ? 16 : 32, tmp,
                      buf + (size_t) (g - g0) * nb * KQ_GROUP_SB);
    }
    for (int64_t m = r0; m < r1; m += MR) {
        const int R = r1 - m < MR ? (int) (r1 - m) : MR;
        for (int r = 0; r < R; ++r) {
            const void * row = (const char *) a->data + (m + r) * a->nb[1];
            kq_row * u = rows + (size_t) r * nb;
            switch (kind) {
                case KQ_Q4K: kq_unpack_q4k((const kq_block_q4k *) row, nb, u); break;
                case KQ_Q5K: kq_unpack_q5k((const kq_block_q5k *) row, nb, u); break;
                default: kq_unpack_q6k((const kq_block_q6k *) row, nb, u); break;
            }
        }
        kq_pass(dst, m, R, rows, buf, g0, g1, nb, N, kind);
    }
}

#include "mul_mat_qk_few.h"

#else

// Without AVX2 and FMA: ggml's own dot product on the columns quantized to q8_K, the rows split
// evenly between the threads (each thread quantizes every column).
static void kq_mul_mat_ggml(struct ggml_tensor * dst, int ith, int nth, enum ggml_type type) {
    const struct ggml_tensor * a = dst->src[0];
    const struct ggml_tensor * b = dst->src[1];
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    const int nb = (int) (K / KQ_SB);
    const int64_t per = (M + nth - 1) / nth;
    const int64_t m0 = per * ith;
    const int64_t m1 = m0 + per < M ? m0 + per : M;
    if (m0 >= m1) {
        return;
    }
    kq_block_q8k * q8 = (kq_block_q8k *) kq_reserve((size_t) N * nb * sizeof(kq_block_q8k));
    if (q8 == NULL) {
        kq_fill_nan(dst, m0, m1, 0, N);
        return;
    }
    const struct ggml_type_traits_cpu * q8k = ggml_get_type_traits_cpu(GGML_TYPE_Q8_K);
    for (int64_t n = 0; n < N; ++n) {
        q8k->from_float((const float *) ((const char *) b->data + n * b->nb[1]), q8 + n * nb, K);
    }
    const struct ggml_type_traits_cpu * traits = ggml_get_type_traits_cpu(type);
    for (int64_t n = 0; n < N; ++n) {
        for (int64_t m = m0; m < m1; ++m) {
            traits->vec_dot((int) K, kq_out(dst, m, n), 0, (const char *) a->data + m * a->nb[1], 0,
                            q8 + n * nb, 0, 1);
        }
    }
}

#endif

// Checks the node's shapes and types (anything else: NaN), then runs the product.
static void kq_run(struct ggml_tensor * dst, int ith, int nth, enum ggml_type type, int kind) {
    const struct ggml_tensor * a = dst->src[0];
    const struct ggml_tensor * b = dst->src[1];
    const int ok = a != NULL && b != NULL && a->type == type && b->type == GGML_TYPE_F32 &&
                   dst->type == GGML_TYPE_F32 && a->ne[0] % KQ_SB == 0 && a->ne[0] == b->ne[0] &&
                   b->nb[0] == sizeof(float) && dst->ne[0] == a->ne[1] && dst->ne[1] == b->ne[1];
    if (!ok) {
        // Only the first thread writes, so that the threads never race on the same outputs.
        if (ith == 0) {
            kq_fill_nan(dst, 0, dst->ne[0], 0, dst->ne[1]);
        }
        return;
    }
#ifdef KQ_SIMD
    (void) type;
    // Whole groups of W columns take the wide path, the rest (if fewer than kq_few_max) the
    // few-column path: the same bits either way.
    const int64_t N = b->ne[1], few = kq_few_max(kind);
    int64_t wide = N;
    if (a->nb[1] <= INT32_MAX / 8) {
        wide = N < few ? 0 : N % W < few ? N - N % W : N;
    }
    if (wide > 0) {
        kq_mul_mat(dst, ith, nth, kind, wide);
    }
    if (wide < N) {
        kq_mul_mat_few(dst, ith, nth, kind, wide, N);
    }
#else
    (void) kind;
    kq_mul_mat_ggml(dst, ith, nth, type);
#endif
}

int ggml_sys_mul_mat_qk_isum(void) {
#ifdef KQ_SIMD
    return 1;
#else
    return 0;
#endif
}

// dst[m, n] = sum_k a[k, m] * b[k, n]; a: q4_K [K, M] (src 0), b: f32 [K, N] (src 1), dst: f32
// [M, N], all two-dimensional, K a multiple of 256, rows of b contiguous. `userdata` unused.
void ggml_sys_mul_mat_q4_k(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    kq_run(dst, ith, nth, GGML_TYPE_Q4_K, KQ_Q4K);
}

// As ggml_sys_mul_mat_q4_k, for q5_K weights.
void ggml_sys_mul_mat_q5_k(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    kq_run(dst, ith, nth, GGML_TYPE_Q5_K, KQ_Q5K);
}

// As ggml_sys_mul_mat_q4_k, for q6_K weights.
void ggml_sys_mul_mat_q6_k(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    kq_run(dst, ith, nth, GGML_TYPE_Q6_K, KQ_Q6K);
}
