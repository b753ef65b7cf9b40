// Attention over an f16 or q8_0 KV cache for ggml's CPU backend, run as a ggml custom op
// (`ggml_custom_4d`): for every query row, softmax(q k^T * scale + mask) v. A q8_0 row (blocks
// of 32: an f16 scale d, 32 int8 q) is taken as the f32 values d * q, which f32 holds exactly,
// so a q8_0 cache goes through the same definition as an f16 one.
//
// How it differs from ggml's own flash-attention kernel:
// - The query heads that share a KV head (grouped-query attention) are worked on together, in
//   blocks of rows (a row is one token of one head): each tile of K and V is converted from f16
//   once per block, for every head of the group, instead of once per head and query tile.
// - K tiles are transposed eight keys by eight dimensions at a time in registers.
// - Rows are independent: every row's result comes from the same operations in the same order
//   whatever block it falls in, how many rows the block has and what the other rows are. A
//   token's output therefore has the same bits whether it is evaluated alone or in a batch of
//   any size, beside any other rows (batch invariance).
//
// Definition. Per row, the window's keys are taken in tiles of BK = 64 from its first (the
// engine's pages: a window starts on a page, so a tile is always the same 64 positions of a
// sequence). Per tile: the scores as a chain of fused multiply-adds over the head dimension
// (the query scaled first), the mask added; the tile's own maximum; its exponentials, their
// sum and its output (sum over the tile's keys in order) from that maximum; a tile that masks
// every key for the row is nothing. Then the tiles are folded in window order (`fa_fold`: the
// smaller maximum's side rescaled by one exponential, one fused multiply-add per element) and
// the output divided by the sum. Since every tile starts from nothing, a row's bits depend only
// on the keys of its own tiles, never on where the window starts (on a page), on tiles of other
// sequences between them or on how the tiles are shared among threads: the split form
// (`ggml_sys_flash_attn_f16_part`, each tile's state, then `_merge`, the same fold) gives the
// same bits as the single node, so decoding may split a long window among the threads and
// still give a prompt's row its bits.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-cpu.h"
#include "half.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include "simd_x86.h"
#define FA_SIMD 1
#endif

#if defined(__GNUC__) || defined(__clang__)
#define FA_INLINE static inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define FA_INLINE static __forceinline
#else
#define FA_INLINE static inline
#endif

// Keys per tile.
#define BK 64
// Rows per block, at most: each block converts the tiles of its window once, so more rows
// per block convert less per row (the scratch of 128 rows stays within the second-level cache).
#define RB 128
// Rows of one pass of the score and output micro-kernels: 6 rows of 16 lanes keep 12
// accumulators, two loaded vectors and a broadcast in the 16 vector registers.
#define FA_R 6
// Blocks of at most this many rows prefetch the next tile.
#define FA_PREFETCH_ROWS 16
// Largest head dimension the kernel takes.
#define DMAX 256
// The f16 bits of minus infinity, which masks a key.
#define F16_NEG_INF 0xFC00u

int ggml_sys_flash_attn_f16_simd(void) {
#ifdef FA_SIMD
    return 1;
#else
    return 0;
#endif
}

// Per thread: Q block, transposed K tile, V tile, scores, output, running max and sum; `fa_raw`
// is the allocation, `fa_buf` its first 64-byte aligned float (for the vector loads and
// stores).
static _Thread_local void * fa_raw = NULL;
static _Thread_local float * fa_buf = NULL;
static _Thread_local size_t fa_cap = 0;

static float * fa_reserve(size_t floats) {
    if (floats > fa_cap) {
        void * raw = malloc(floats * sizeof(float) + 64);
        if (raw == NULL) {
            return NULL;
        }
        free(fa_raw);
        fa_raw = raw;
        fa_buf = (float *) (((uintptr_t) raw + 63) & ~(uintptr_t) 63);
        fa_cap = floats;
    }
    return fa_buf;
}

// Bytes of one q8_0 block of 32 elements: its f16 scale, then 32 int8.
#define FA_Q8_BLOCK 34

// Row `row` of D elements (a multiple of 32) of a q8_0 tensor as f32: element i is d * q[i] of
// its block, exact in f32 (an int8 times an f16's 11-bit significand).
static inline void fa_q8_0_row(const void * row, int D, float * out) {
    const uint8_t * b = (const uint8_t *) row;
    for (int i0 = 0; i0 < D; i0 += 32, b += FA_Q8_BLOCK) {
        uint16_t h;
        memcpy(&h, b, sizeof h);
        const float d = ggml_sys_f16(h);
        const int8_t * q = (const int8_t *) (b + 2);
#ifdef FA_SIMD
        const __m256 dv = _mm256_set1_ps(d);
        for (int i = 0; i < 32; i += 8) {
            const __m256i qi = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) (q + i)));
            _mm256_storeu_ps(out + i0 + i, _mm256_mul_ps(_mm256_cvtepi32_ps(qi), dv));
        }
#else
        for (int i = 0; i < 32; ++i) {
            out[i0 + i] = (float) q[i] * d;
        }
#endif
    }
}

// Row `row` of D elements of K or V (`t`'s type: f16 or q8_0) as f32.
static inline void fa_load_row(const struct ggml_tensor * t, const void * row, int D, float * out) {
    if (t->type == GGML_TYPE_Q8_0) {
        fa_q8_0_row(row, D, out);
        return;
    }
    const uint16_t * h = (const uint16_t *) row;
    for (int d = 0; d < D; ++d) {
        out[d] = ggml_sys_f16(h[d]);
    }
}

#include "flash_attn_simd.h"

// Rows of K and V per entry of a page table (the engine's page of positions).
#define FA_PAGE_ROWS 64

// The tensors of the node and what the kernel reads of them.
typedef struct {
    const struct ggml_tensor * q;    // f32 [D, m, n_head]
    const struct ggml_tensor * k;    // f16 [D, n_kv, n_head_kv]
    const struct ggml_tensor * v;    // f16 [D, n_kv, n_head_kv]
    const struct ggml_tensor * mask; // f16 [>= n_kv, >= m]
    struct ggml_tensor * dst;        // f32 [D, n_head, m]
    // With page tables (src 4 and 5), k's and v's data are not read: row i of K lives at
    // kpages[i / FA_PAGE_ROWS] + (i % FA_PAGE_ROWS) * k->nb[1], and V's likewise; the
    // strides are k's and v's.
    const int64_t * kpages;
    const int64_t * vpages;
    int D, m, n_kv, gqa;
    float scale;
} fa_args;

static inline const uint16_t * fa_row(const struct ggml_tensor * t, int64_t i1, int64_t i2) {
    return (const uint16_t *) ((const char *) t->data + i1 * t->nb[1] + i2 * t->nb[2]);
}

// Row i1, head i2 of K or V: from t's data, or through its page table.
static inline const uint16_t * fa_kv_row(const struct ggml_tensor * t, const int64_t * pages,
                                         int64_t i1, int64_t i2) {
    if (pages == NULL) {
        return fa_row(t, i1, i2);
    }
    const char * page = (const char *) (uintptr_t) pages[i1 / FA_PAGE_ROWS];
    return (const uint16_t *) (page + (i1 % FA_PAGE_ROWS) * t->nb[1] + i2 * t->nb[2]);
}

// Whether any token t_first..t_last leaves a key ic..ic+kv-1 unmasked.
static int fa_tile_open(const struct ggml_tensor * mask, int t_first, int t_last, int ic, int kv) {
    for (int t = t_first; t <= t_last; ++t) {
        const uint16_t * mrow = fa_row(mask, t, 0) + ic;
        int k = 0;
#ifdef FA_SIMD
        const __m256i neg_inf = _mm256_set1_epi16((short) F16_NEG_INF);
        for (; k + 16 <= kv; k += 16) {
            const __m256i m = _mm256_loadu_si256((const __m256i *) (mrow + k));
            if (_mm256_movemask_epi8(_mm256_cmpeq_epi16(m, neg_inf)) != -1) {
                return 1;
            }
        }
#endif
        for (; k < kv; ++k) {
            if (mrow[k] != F16_NEG_INF) {
                return 1;
            }
        }
    }
    return 0;
}

// Folds one tile's state (unnormalised output ot, maximum tm > -inf, sum ts) into a row's
// running state (O, M, S), the tiles taken in window order. Whichever maximum is smaller is
// rescaled, by one exponential: the other factor is exactly 1, so it is not multiplied. The
// single node and ggml_sys_flash_attn_f16_merge both call this, so a row's bits do not depend
// on which of them folds its tiles.
FA_INLINE void fa_fold(float * O, float * M, float * S, const float * ot, float tm, float ts, int D) {
    if (*M == -INFINITY) {
        memcpy(O, ot, (size_t) D * sizeof(float));
        *M = tm;
        *S = ts;
        return;
    }
    // O = O * a + ot (the running state rescaled) or O = ot * b + O (the tile rescaled).
    const int grow = tm > *M;
    const float f = grow ? expf(*M - tm) : expf(tm - *M);
    const float * x = grow ? O : ot;
    const float * y = grow ? ot : O;
    int d = 0;
#ifdef FA_SIMD
    const __m256 vf = _mm256_set1_ps(f);
    for (; d + 8 <= D; d += 8) {
        _mm256_storeu_ps(O + d, _mm256_fmadd_ps(_mm256_loadu_ps(x + d), vf, _mm256_loadu_ps(y + d)));
    }
#endif
    for (; d < D; ++d) {
        O[d] = fmaf(x[d], f, y[d]);
    }
    *S = grow ? fmaf(*S, f, ts) : fmaf(ts, f, *S);
    if (grow) {
        *M = tm;
    }
}

// One block: rows j0..j0+rows-1 of KV head g's group (row j is token j / gqa of query head
// g * gqa + j % gqa), over keys ic0 .. ic1 - 1 (ic0 a multiple of BK, ic1 one too or n_kv).
// Each tile's softmax is taken from the tile's own maximum, then folded (fa_fold). Without
// `part`, the folded rows, normalised, go to dst. With `part`, nothing is folded: tile ic's
// state for row r (unnormalised output, maximum, sum; maximum -inf where every key of the tile
// is masked for the row) goes to part + (ic / BK) * part_stride floats + r * (D + 2).
static void fa_block(const fa_args * a, int g, int j0, int rows, float * buf, int ic0, int ic1,
                     float * part, size_t part_stride) {
    const int D = a->D;
    float * q = buf;                      // RB x D
    float * kt = q + (size_t) RB * D;     // D x BK
    float * vt = kt + (size_t) D * BK;    // BK x D
    float * p = vt + (size_t) BK * D;     // RB x BK
    float * ot = p + (size_t) RB * BK;    // RB x D: the tile's output
    float * o = ot + (size_t) RB * D;     // RB x D: the folded output
    float * mx = o + (size_t) RB * D;     // RB
    float * sum = mx + RB;                // RB
    float * tmx = sum + RB;               // RB: the tile's maximum
    float * tsum = tmx + RB;              // RB: the tile's sum
#ifdef FA_R16
    const uint16_t * vrows[BK];           // the tile's f16 V rows where they lie
    // One pass of rows reads V's f16 rows where they lie; more passes share one f32 copy of
    // the tile rather than each converting it again (the conversion is exact: the same values
    // either way).
    const int v_direct = a->v->type != GGML_TYPE_Q8_0 && rows <= FA_R16;
#endif

    for (int r = 0; r < rows; ++r) {
        const int j = j0 + r, t = j / a->gqa, h = g * a->gqa + j % a->gqa;
        const float * src =
            (const float *) ((const char *) a->q->data + t * a->q->nb[1] + h * a->q->nb[2]);
        for (int d = 0; d < D; ++d) {
            q[(size_t) r * D + d] = src[d] * a->scale;
        }
        mx[r] = -INFINITY;
        sum[r] = 0.0f;
    }
    const int t_first = j0 / a->gqa, t_last = (j0 + rows - 1) / a->gqa;

    for (int ic = ic0; ic < ic1; ic += BK) {
        const int kv = a->n_kv - ic < BK ? a->n_kv - ic : BK;
        float * tile_part = part != NULL ? part + (size_t) (ic / BK) * part_stride : NULL;
        // A tile that every token of the block masks is skipped (in a server's window most
        // tiles can belong to other sequences).
        if (!fa_tile_open(a->mask, t_first, t_last, ic, kv)) {
            if (tile_part != NULL) {
                for (int r = 0; r < rows; ++r) {
                    tile_part[(size_t) r * (D + 2) + D] = -INFINITY;
                    tile_part[(size_t) r * (D + 2) + D + 1] = 0.0f;
                }
            }
            continue;
        }

        // K transposed and V, as f32; keys past the end are zeros (their scores are masked).
#ifdef FA_SIMD
        {
            static const uint16_t zeros[DMAX] = {0};
            static const float zerosf[DMAX] = {0};
            const int k_q8 = a->k->type == GGML_TYPE_Q8_0, v_q8 = a->v->type == GGML_TYPE_Q8_0;
            for (int k0 = 0; k0 < BK; k0 += 8) {
                if (k_q8) {
                    float kr[8][DMAX];
                    const float * rows8[8];
                    for (int j = 0; j < 8; ++j) {
                        rows8[j] = zerosf;
                        if (k0 + j < kv) {
                            fa_q8_0_row(fa_kv_row(a->k, a->kpages, ic + k0 + j, g), D, kr[j]);
                            rows8[j] = kr[j];
                        }
                    }
                    for (int d0 = 0; d0 < D; d0 += 8) {
                        fa_transpose8_f32(rows8, d0, kt, k0);
                    }
                    continue;
                }
                const uint16_t * rows8[8];
                for (int j = 0; j < 8; ++j) {
                    rows8[j] = k0 + j < kv ? fa_kv_row(a->k, a->kpages, ic + k0 + j, g) : zeros;
                }
                for (int d0 = 0; d0 < D; d0 += 8) {
                    fa_transpose8(rows8, d0, kt, k0);
                }
            }
            for (int k = 0; k < BK; ++k) {
#ifdef FA_R16
                if (v_direct) {
                    // Read where they lie by fa_pv16.
                    vrows[k] = k < kv ? fa_kv_row(a->v, a->vpages, ic + k, g) : zeros;
                    continue;
                }
#endif
                float * dstv = vt + (size_t) k * D;
                if (k < kv && v_q8) {
                    fa_q8_0_row(fa_kv_row(a->v, a->vpages, ic + k, g), D, dstv);
                } else if (k < kv) {
                    const uint16_t * src = fa_kv_row(a->v, a->vpages, ic + k, g);
                    for (int d = 0; d < D; d += 8) {
                        const __m128i h = _mm_loadu_si128((const __m128i *) (src + d));
                        _mm256_store_ps(dstv + d, _mm256_cvtph_ps(h));
                    }
                } else {
                    memset(dstv, 0, (size_t) D * sizeof(float));
                }
            }
            // Few rows (decoding): the next tile's rows of K and V are on their way while this
            // one is computed. Many rows compute long enough per tile for the hardware's own
            // prefetch, and the instructions would cost more than they save.
            if (rows <= FA_PREFETCH_ROWS && ic + BK < ic1) {
                const int next = a->n_kv - ic - BK < BK ? a->n_kv - ic - BK : BK;
                const int kbytes = (int) ggml_row_size(a->k->type, D);
                const int vbytes = (int) ggml_row_size(a->v->type, D);
                for (int k = 0; k < next; ++k) {
                    const char * kr = (const char *) fa_kv_row(a->k, a->kpages, ic + BK + k, g);
                    const char * vr = (const char *) fa_kv_row(a->v, a->vpages, ic + BK + k, g);
                    for (int off = 0; off < kbytes; off += 64) {
                        _mm_prefetch(kr + off, _MM_HINT_T0);
                    }
                    for (int off = 0; off < vbytes; off += 64) {
                        _mm_prefetch(vr + off, _MM_HINT_T0);
                    }
                }
            }
            // The next tile's mask rows, one per token of the block: read once per row after
            // the scores, they would otherwise stall the softmax on a cache miss per token
            // (rows lie n_kv apart, too far for the hardware's prefetch).
            if (ic + BK < a->n_kv) {
                for (int t = t_first; t <= t_last; ++t) {
                    const char * mr = (const char *) (fa_row(a->mask, t, 0) + ic + BK);
                    _mm_prefetch(mr, _MM_HINT_T0);
                    _mm_prefetch(mr + 64, _MM_HINT_T0);
                }
            }
            fa_qk_rows(q, D, kt, p, rows);
        }
#else
        for (int k = 0; k < BK; ++k) {
            float kf[DMAX] = {0};
            float * vs = vt + (size_t) k * D;
            if (k < kv) {
                fa_load_row(a->k, fa_kv_row(a->k, a->kpages, ic + k, g), D, kf);
                fa_load_row(a->v, fa_kv_row(a->v, a->vpages, ic + k, g), D, vs);
            } else {
                memset(vs, 0, (size_t) D * sizeof(float));
            }
            for (int d = 0; d < D; ++d) {
                kt[(size_t) d * BK + k] = kf[d];
            }
        }
        for (int r = 0; r < rows; ++r) {
            for (int k = 0; k < BK; ++k) {
                float acc = 0.0f;
                for (int d = 0; d < D; ++d) {
                    acc = fmaf(q[(size_t) r * D + d], kt[(size_t) d * BK + k], acc);
                }
                p[(size_t) r * BK + k] = acc;
            }
        }
#endif

        // Mask, the tile's own softmax.
        for (int r = 0; r < rows; ++r) {
            const int t = (j0 + r) / a->gqa;
            const uint16_t * mrow = fa_row(a->mask, t, 0) + ic;
            float * pr = p + (size_t) r * BK;
#ifdef FA_SIMD
            const float tmax = fa_mask_max(pr, mrow, kv);
#else
            float tmax = -INFINITY;
            for (int k = 0; k < BK; ++k) {
                pr[k] += k < kv ? ggml_sys_f16(mrow[k]) : -INFINITY;
                tmax = pr[k] > tmax ? pr[k] : tmax;
            }
#endif
            tmx[r] = tmax;
            if (tmax == -INFINITY) {
                // Every key of the tile masked for this row: it adds nothing.
                memset(pr, 0, BK * sizeof(float));
                tsum[r] = 0.0f;
                continue;
            }
#ifdef FA_SIMD
            tsum[r] = fa_exp_sum(pr, tmax);
#else
            float s = 0.0f;
            for (int k = 0; k < BK; ++k) {
                pr[k] = pr[k] == -INFINITY ? 0.0f : expf(pr[k] - tmax);
                s += pr[k];
            }
            tsum[r] = s;
#endif
        }

#if defined(FA_R16)
        // Written whole, not added to.
        if (v_direct) {
            fa_pv_rows_h(p, vrows, D, ot, rows);
        } else {
            fa_pv_rows(p, vt, D, ot, rows);
        }
#elif defined(FA_SIMD)
        memset(ot, 0, (size_t) rows * D * sizeof(float));
        fa_pv_rows(p, vt, D, ot, rows);
#else
        memset(ot, 0, (size_t) rows * D * sizeof(float));
        for (int r = 0; r < rows; ++r) {
            for (int k = 0; k < BK; ++k) {
                const float w = p[(size_t) r * BK + k];
                for (int d = 0; d < D; ++d) {
                    ot[(size_t) r * D + d] = fmaf(w, vt[(size_t) k * D + d], ot[(size_t) r * D + d]);
                }
            }
        }
#endif
        for (int r = 0; r < rows; ++r) {
            if (tile_part != NULL) {
                float * pr = tile_part + (size_t) r * (D + 2);
                memcpy(pr, ot + (size_t) r * D, (size_t) D * sizeof(float));
                pr[D] = tmx[r];
                pr[D + 1] = tsum[r];
            } else if (tmx[r] != -INFINITY) {
                fa_fold(o + (size_t) r * D, &mx[r], &sum[r], ot + (size_t) r * D, tmx[r], tsum[r], D);
            }
        }
    }

    if (part != NULL) {
        return;
    }
    for (int r = 0; r < rows; ++r) {
        const int j = j0 + r, t = j / a->gqa, h = g * a->gqa + j % a->gqa;
        float * out = (float *) ((char *) a->dst->data + h * a->dst->nb[1] + t * a->dst->nb[2]);
        if (mx[r] == -INFINITY) {
            // Every key masked: zeros, as ggml gives.
            memset(out, 0, (size_t) D * sizeof(float));
            continue;
        }
        const float inv = sum[r] == 0.0f ? 0.0f : 1.0f / sum[r];
        for (int d = 0; d < D; ++d) {
            out[d] = o[(size_t) r * D + d] * inv;
        }
    }
}

// Scratch floats of one thread.
static size_t fa_scratch_floats(int D) {
    return (size_t) RB * D * 3 + (size_t) D * BK * 2 + (size_t) RB * BK + 4 * RB;
}

// dst (f32 [D, n_head, m]) = attention of q (src 0, f32 [D, m, n_head]) over k and v (src 1
// and 2, f16 or q8_0 [D, n_kv, n_head_kv], rows contiguous) with mask (src 3, f16 [>= n_kv, >= m],
// shared by the heads). The scores' scale is the f32 whose bits are `userdata`'s low 32 bits.
// D a multiple of 16 (of 8 without SIMD), at most DMAX; n_head a multiple of n_head_kv.
// The node's tensors; the scale is the f32 whose bits are `userdata`'s low 32 bits.
static fa_args fa_args_of(struct ggml_tensor * dst, void * userdata) {
    fa_args a;
    a.q = dst->src[0];
    a.k = dst->src[1];
    a.v = dst->src[2];
    a.mask = dst->src[3];
    a.kpages = dst->src[4] != NULL && dst->src[5] != NULL ? (const int64_t *) dst->src[4]->data : NULL;
    a.vpages = a.kpages != NULL ? (const int64_t *) dst->src[5]->data : NULL;
    a.dst = dst;
    a.D = (int) a.q->ne[0];
    a.m = (int) a.q->ne[1];
    a.n_kv = (int) a.k->ne[1];
    a.gqa = (int) (a.q->ne[2] / a.k->ne[2]);
    const uint32_t bits = (uint32_t) (uintptr_t) userdata;
    memcpy(&a.scale, &bits, sizeof(float));
    return a;
}

void ggml_sys_flash_attn_f16(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    const fa_args a = fa_args_of(dst, userdata);

    const int n_head_kv = (int) a.k->ne[2];
    const int group_rows = a.gqa * a.m;
    // Blocks small enough that every thread gets two or more where the rows allow it, but
    // never smaller than one token's heads: each block converts its group's K and V tiles, so
    // splitting a token's rows (decoding) would convert the same tiles twice for no gain.
    int rb = RB;
    while (rb > 1 && (rb + 1) / 2 >= a.gqa && n_head_kv * ((group_rows + rb - 1) / rb) < 2 * nth) {
        rb = (rb + 1) / 2;
    }
    const int per_group = (group_rows + rb - 1) / rb;
    const int units = n_head_kv * per_group;

    float * buf = fa_reserve(fa_scratch_floats(a.D));
    // The units in rounds of nth, every other round in reverse: a causal block's work grows
    // with its rows' positions, and taking the first unit of one round and the last of the
    // next evens the threads' shares (which thread computes a row changes none of its bits).
    for (int base = 0, round = 0; base < units; base += nth, ++round) {
        const int u = base + (round % 2 == 0 ? ith : nth - 1 - ith);
        if (u >= units) {
            continue;
        }
        const int g = u / per_group, j0 = (u % per_group) * rb;
        const int rows = group_rows - j0 < rb ? group_rows - j0 : rb;
        if (buf == NULL) {
            // No scratch memory: NaN, so that the failure is visible, not silent.
            for (int r = 0; r < rows; ++r) {
                const int j = j0 + r, t = j / a.gqa, h = g * a.gqa + j % a.gqa;
                float * out = (float *) ((char *) dst->data + h * dst->nb[1] + t * dst->nb[2]);
                for (int d = 0; d < a.D; ++d) {
                    out[d] = NAN;
                }
            }
            continue;
        }
        fa_block(&a, g, j0, rows, buf, 0, a.n_kv, NULL, 0);
    }
}

// Per-tile attention states, for few rows over a long window: dst (f32 [D + 2, gqa * m,
// n_head_kv * n_tiles], n_tiles the window's tiles of BK keys) gets, for KV head g, tile i and
// row j of g's group (token j / gqa of head g * gqa + j % gqa), the unnormalised output,
// maximum and sum over tile i's keys, at slice g * n_tiles + i. The threads share the tiles
// in runs; how they are shared changes no bit. q, k, v, mask and the scale as for
// ggml_sys_flash_attn_f16; gqa * m <= RB.
void ggml_sys_flash_attn_f16_part(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    const fa_args a = fa_args_of(dst, userdata);
    const int n_head_kv = (int) a.k->ne[2];
    const int rows = a.gqa * a.m;
    const int tiles = (a.n_kv + BK - 1) / BK;
    // Runs of tiles: about four per thread, spread over the KV heads.
    int runs = (4 * nth + n_head_kv - 1) / n_head_kv;
    runs = runs < 1 ? 1 : (runs > tiles ? tiles : runs);
    const int per = (tiles + runs - 1) / runs;
    // Rows past one block's scratch, or a result of another shape: NaN, so that the misuse is
    // visible, not an overflow.
    const int ok = rows <= RB && dst->ne[2] == (int64_t) n_head_kv * tiles && dst->ne[1] == rows &&
                   dst->ne[0] == a.D + 2;
    float * buf = ok ? fa_reserve(fa_scratch_floats(a.D)) : NULL;
    if (buf == NULL) {
        const int64_t n = dst->ne[0] * dst->ne[1] * dst->ne[2];
        for (int64_t i = ith; i < n; i += nth) {
            ((float *) dst->data)[i] = NAN;
        }
        return;
    }
    const size_t stride = (size_t) (dst->nb[2] / sizeof(float));
    for (int u = ith; u < n_head_kv * runs; u += nth) {
        const int g = u / runs, c = u % runs;
        float * part = (float *) ((char *) dst->data + (size_t) g * tiles * dst->nb[2]);
        const int ic0 = c * per * BK < a.n_kv ? c * per * BK : a.n_kv;
        const int ic1 = (c + 1) * per * BK < a.n_kv ? (c + 1) * per * BK : a.n_kv;
        fa_block(&a, g, 0, rows, buf, ic0, ic1, part, stride);
    }
}

// dst (f32 [D, n_head, m]) from src 0, ggml_sys_flash_attn_f16_part's result with `userdata`
// tiles (at least 1; otherwise, or for another shape, dst is NaN): per row, the tiles folded in
// order (fa_fold) and divided by the sum: the same bits as ggml_sys_flash_attn_f16.
void ggml_sys_flash_attn_f16_merge(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    const struct ggml_tensor * part = dst->src[0];
    const uintptr_t tiles_u = (uintptr_t) userdata;
    const int D = (int) dst->ne[0], n_head = (int) dst->ne[1];
    const int ok = tiles_u >= 1 && tiles_u <= (uintptr_t) part->ne[2] && part->ne[0] == D + 2 &&
                   part->ne[2] % (int64_t) tiles_u == 0 && D <= DMAX &&
                   n_head % (int) (part->ne[2] / (int64_t) tiles_u) == 0 &&
                   part->ne[1] == (int64_t) (n_head / (part->ne[2] / (int64_t) tiles_u)) * dst->ne[2];
    if (!ok) {
        const int64_t n = dst->ne[0] * dst->ne[1] * dst->ne[2];
        for (int64_t i = ith; i < n; i += nth) {
            ((float *) dst->data)[i] = NAN;
        }
        return;
    }
    const int tiles = (int) tiles_u;
    const int rows = (int) part->ne[1];
    const int n_head_kv = (int) (part->ne[2] / tiles);
    const int gqa = n_head / n_head_kv;
    float o[DMAX];
    for (int u = ith; u < n_head_kv * rows; u += nth) {
        const int g = u / rows, j = u % rows, t = j / gqa, h = g * gqa + j % gqa;
        float m = -INFINITY, sum = 0.0f;
        for (int c = 0; c < tiles; ++c) {
            const float * pc = (const float *) ((const char *) part->data +
                                                (size_t) (g * tiles + c) * part->nb[2] +
                                                (size_t) j * part->nb[1]);
            if (pc[D] != -INFINITY) {
                fa_fold(o, &m, &sum, pc, pc[D], pc[D + 1], D);
            }
        }
        float * out = (float *) ((char *) dst->data + h * dst->nb[1] + t * dst->nb[2]);
        if (m == -INFINITY) {
            memset(out, 0, (size_t) D * sizeof(float));
            continue;
        }
        const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
        for (int d = 0; d < D; ++d) {
            out[d] = o[d] * inv;
        }
    }
}
