// The vector helpers and micro-kernels of flash_attn_f16.c: the exponential, the K tile's
// transposes, and the score and output loops (256 bits, and 512 bits where the level has
// AVX-512, with the same chain per lane, so the same bits). Not a header of its own:
// flash_attn_f16.c includes it where its macros (BK, DMAX, FA_R, FA_INLINE) are defined, in
// the same translation unit.

#ifdef FA_SIMD
static inline float fa_hmax(__m256 x) {
    __m128 r = _mm_max_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

// e^x for x <= 0 (minus infinity included): 2^n times a degree-6 polynomial on the remainder
// r = x - n ln 2, |r| <= ln 2 / 2 (about one unit in the last place). Below -86 the result is 0.
static inline __m256 fa_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-86.0f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // ln 2 in two parts, the first exact in few bits, so that n * hi is exact.
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    const __m256 y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
    return _mm256_andnot_ps(under, y);
}

// A row's BK scores plus its mask row (keys kv.. masked), stored back; returns their maximum.
static inline float fa_mask_max8(float * pr, const uint16_t * mrow, int kv) {
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int k = 0; k < BK; k += 8) {
        __m256 mk;
        if (k + 8 <= kv) {
            mk = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (mrow + k)));
        } else {
            float tmp[8];
            for (int i = 0; i < 8; ++i) {
                tmp[i] = k + i < kv ? ggml_sys_f16(mrow[k + i]) : -INFINITY;
            }
            mk = _mm256_loadu_ps(tmp);
        }
        const __m256 s = _mm256_add_ps(_mm256_load_ps(pr + k), mk);
        _mm256_store_ps(pr + k, s);
        vmax = _mm256_max_ps(vmax, s);
    }
    return fa_hmax(vmax);
}

// The row's exponentials e^(s - tmax), stored back; returns their sum, taken as eight lane sums
// (lane i: keys i, i + 8, ... in order) then ggml_sys_hsum8.
static inline float fa_exp_sum8(float * pr, float tmax) {
    const __m256 m = _mm256_set1_ps(tmax);
    __m256 vs = _mm256_setzero_ps();
    for (int k = 0; k < BK; k += 8) {
        const __m256 e = fa_exp8(_mm256_sub_ps(_mm256_load_ps(pr + k), m));
        _mm256_store_ps(pr + k, e);
        vs = _mm256_add_ps(vs, e);
    }
    return ggml_sys_hsum8(vs);
}

// Eight keys' f16 rows (dims d0..d0+7 of each) into kt[(d0 + i) * BK + k0 + j], transposed in
// registers.
static inline void fa_store_transposed8(const __m256 * r, int d0, float * kt, int k0);

static inline void fa_transpose8(const uint16_t * const * rows, int d0, float * kt, int k0) {
    __m256 r[8];
    for (int j = 0; j < 8; ++j) {
        r[j] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (rows[j] + d0)));
    }
    fa_store_transposed8(r, d0, kt, k0);
}

// As fa_transpose8, from f32 rows.
static inline void fa_transpose8_f32(const float * const * rows, int d0, float * kt, int k0) {
    __m256 r[8];
    for (int j = 0; j < 8; ++j) {
        r[j] = _mm256_loadu_ps(rows[j] + d0);
    }
    fa_store_transposed8(r, d0, kt, k0);
}

// Eight keys' dims d0..d0+7 (r[j]: key j) into kt[(d0 + i) * BK + k0 + j].
static inline void fa_store_transposed8(const __m256 * r, int d0, float * kt, int k0) {
    // Dimension d0 + i of the eight keys.
    __m256 c[8];
    ggml_sys_transpose8(r, c);
    for (int i = 0; i < 8; ++i) {
        _mm256_store_ps(kt + (size_t) (d0 + i) * BK + k0, c[i]);
    }
}

// Scores of R rows (R <= FA_R) against the tile's BK keys: p[r][k] = sum_d q[r][d] kt[d][k], one
// fused multiply-add chain per score over d in order.
FA_INLINE void fa_qk(const float * q, int D, const float * kt, float * p, int R) {
    for (int k0 = 0; k0 < BK; k0 += 16) {
        __m256 acc[FA_R][2];
        for (int r = 0; r < R; ++r) {
            acc[r][0] = _mm256_setzero_ps();
            acc[r][1] = _mm256_setzero_ps();
        }
        for (int d = 0; d < D; ++d) {
            const __m256 k0v = _mm256_load_ps(kt + (size_t) d * BK + k0);
            const __m256 k1v = _mm256_load_ps(kt + (size_t) d * BK + k0 + 8);
            for (int r = 0; r < R; ++r) {
                const __m256 qb = _mm256_broadcast_ss(q + (size_t) r * D + d);
                acc[r][0] = _mm256_fmadd_ps(qb, k0v, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(qb, k1v, acc[r][1]);
            }
        }
        for (int r = 0; r < R; ++r) {
            _mm256_store_ps(p + (size_t) r * BK + k0, acc[r][0]);
            _mm256_store_ps(p + (size_t) r * BK + k0 + 8, acc[r][1]);
        }
    }
}

// o[r][d] += sum_k p[r][k] vt[k][d] for R rows (R <= FA_R), over k in order.
FA_INLINE void fa_pv(const float * p, const float * vt, int D, float * o, int R) {
    for (int d0 = 0; d0 < D; d0 += 16) {
        __m256 acc[FA_R][2];
        for (int r = 0; r < R; ++r) {
            acc[r][0] = _mm256_load_ps(o + (size_t) r * D + d0);
            acc[r][1] = _mm256_load_ps(o + (size_t) r * D + d0 + 8);
        }
        for (int k = 0; k < BK; ++k) {
            const __m256 v0 = _mm256_load_ps(vt + (size_t) k * D + d0);
            const __m256 v1 = _mm256_load_ps(vt + (size_t) k * D + d0 + 8);
            for (int r = 0; r < R; ++r) {
                const __m256 pb = _mm256_broadcast_ss(p + (size_t) r * BK + k);
                acc[r][0] = _mm256_fmadd_ps(pb, v0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(pb, v1, acc[r][1]);
            }
        }
        for (int r = 0; r < R; ++r) {
            _mm256_store_ps(o + (size_t) r * D + d0, acc[r][0]);
            _mm256_store_ps(o + (size_t) r * D + d0 + 8, acc[r][1]);
        }
    }
}

#if defined(__AVX512F__)
// The 512-bit micro-kernels: the same chains as fa_qk and fa_pv (one fused multiply-add per
// element and step, in the same order, lanes independent), 16 lanes a vector, FA_R16 rows and
// up to four vectors a pass, so the same bits.
#define FA_R16 6

// As fa_exp8, 16 lanes: the same operations per lane (the underflow's lanes zeroed by a mask),
// so the same bits.
static inline __m512 fa_exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-86.0f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(x, lo);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
    const __m512 y = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e));
    return _mm512_maskz_mov_ps((__mmask16) ~under, y);
}

// As fa_mask_max8, 16 keys a vector (a maximum does not depend on the order).
static inline float fa_mask_max16(float * pr, const uint16_t * mrow, int kv) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int k = 0; k < BK; k += 16) {
        __m512 mk;
        if (k + 16 <= kv) {
            mk = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (mrow + k)));
        } else {
            float tmp[16];
            for (int i = 0; i < 16; ++i) {
                tmp[i] = k + i < kv ? ggml_sys_f16(mrow[k + i]) : -INFINITY;
            }
            mk = _mm512_loadu_ps(tmp);
        }
        const __m512 s = _mm512_add_ps(_mm512_loadu_ps(pr + k), mk);
        _mm512_storeu_ps(pr + k, s);
        vmax = _mm512_max_ps(vmax, s);
    }
    return _mm512_reduce_max_ps(vmax);
}

// As fa_exp_sum8, 16 exponentials a vector, summed into the same eight lanes in the same order
// (keys k..k+7, then k+8..k+15).
static inline float fa_exp_sum16(float * pr, float tmax) {
    const __m512 m = _mm512_set1_ps(tmax);
    __m256 vs = _mm256_setzero_ps();
    for (int k = 0; k < BK; k += 16) {
        const __m512 e = fa_exp16(_mm512_sub_ps(_mm512_loadu_ps(pr + k), m));
        _mm512_storeu_ps(pr + k, e);
        vs = _mm256_add_ps(vs, _mm512_castps512_ps256(e));
        vs = _mm256_add_ps(vs, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    }
    return ggml_sys_hsum8(vs);
}

// As fa_qk, 16 keys a vector, the tile's 64 keys (four vectors) a row at once: each row's
// broadcast serves four vectors and each K load six rows (fewer loads per multiply-add).
FA_INLINE void fa_qk16(const float * q, int D, const float * kt, float * p, int R) {
    __m512 acc[FA_R16][4];
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < 4; ++c) {
            acc[r][c] = _mm512_setzero_ps();
        }
    }
    for (int d = 0; d < D; ++d) {
        __m512 kv[4];
        for (int c = 0; c < 4; ++c) {
            kv[c] = _mm512_loadu_ps(kt + (size_t) d * BK + 16 * c);
        }
        for (int r = 0; r < R; ++r) {
            const __m512 qb = _mm512_set1_ps(q[(size_t) r * D + d]);
            for (int c = 0; c < 4; ++c) {
                acc[r][c] = _mm512_fmadd_ps(qb, kv[c], acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < 4; ++c) {
            _mm512_storeu_ps(p + (size_t) r * BK + 16 * c, acc[r][c]);
        }
    }
}

// As fa_pv, 16 dimensions a vector, C vectors (dimensions d0 .. d0 + 16C - 1) a row at once,
// but writing o = p V (the sums start from zero in registers: the same values as adding to a
// zeroed o, without zeroing and reading it). With `vrows`, V's f16 rows are read where they
// lie (vrows[k]: key k's row) and widened in registers (f16 to f32 is exact: the same values
// as the f32 copy `vt`).
FA_INLINE void fa_pv16(const float * p, const float * vt, const uint16_t * const * vrows, int half,
                       int D, float * o, int R, int C, int d0) {
    __m512 acc[FA_R16][4];
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) {
            acc[r][c] = _mm512_setzero_ps();
        }
    }
    for (int k = 0; k < BK; ++k) {
        __m512 v[4];
        for (int c = 0; c < C; ++c) {
            v[c] = half
                       ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (vrows[k] + d0 + 16 * c)))
                       : _mm512_loadu_ps(vt + (size_t) k * D + d0 + 16 * c);
        }
        for (int r = 0; r < R; ++r) {
            const __m512 pb = _mm512_set1_ps(p[(size_t) r * BK + k]);
            for (int c = 0; c < C; ++c) {
                acc[r][c] = _mm512_fmadd_ps(pb, v[c], acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) {
            _mm512_storeu_ps(o + (size_t) r * D + d0 + 16 * c, acc[r][c]);
        }
    }
}

static void fa_qk_rows(const float * q, int D, const float * kt, float * p, int rows) {
    _Static_assert(BK == 64, "fa_qk16 takes a tile as four vectors of 16 keys");
    for (int r = 0; r < rows; r += FA_R16) {
        const int R = rows - r < FA_R16 ? rows - r : FA_R16;
        const float * qr = q + (size_t) r * D;
        float * pr = p + (size_t) r * BK;
        // A constant row count each, so that the sums stay in registers.
        switch (R) {
            case 1: fa_qk16(qr, D, kt, pr, 1); break;
            case 2: fa_qk16(qr, D, kt, pr, 2); break;
            case 3: fa_qk16(qr, D, kt, pr, 3); break;
            case 4: fa_qk16(qr, D, kt, pr, 4); break;
            case 5: fa_qk16(qr, D, kt, pr, 5); break;
            default: fa_qk16(qr, D, kt, pr, FA_R16); break;
        }
    }
}

// One pass of fa_pv16 with constant R (rows) and C (vectors).
#define FA_PV_C(R, C) fa_pv16(pr, vt, vrows, half, D, orow, R, C, d0)
#define FA_PV_R(R)                          \
    switch (C) {                             \
        case 1: FA_PV_C(R, 1); break;        \
        case 2: FA_PV_C(R, 2); break;        \
        case 3: FA_PV_C(R, 3); break;        \
        default: FA_PV_C(R, 4); break;       \
    }

// o[r] = p[r] V over the tile for `rows` rows (every dimension written: D is a multiple of
// 16): V as f32 rows (`vt`) or, with `half` (a constant at each call), as f16 rows where they
// lie (`vrows`).
FA_INLINE void fa_pv_any(const float * p, const float * vt, const uint16_t * const * vrows,
                         int half, int D, float * o, int rows) {
    for (int r = 0; r < rows; r += FA_R16) {
        const int R = rows - r < FA_R16 ? rows - r : FA_R16;
        const float * pr = p + (size_t) r * BK;
        float * orow = o + (size_t) r * D;
        for (int d0 = 0; d0 < D; d0 += 64) {
            const int C = (D - d0) / 16 < 4 ? (D - d0) / 16 : 4;
            switch (R) {
                case 1: FA_PV_R(1); break;
                case 2: FA_PV_R(2); break;
                case 3: FA_PV_R(3); break;
                case 4: FA_PV_R(4); break;
                case 5: FA_PV_R(5); break;
                default: FA_PV_R(FA_R16); break;
            }
        }
    }
}
#undef FA_PV_R
#undef FA_PV_C

static void fa_pv_rows(const float * p, const float * vt, int D, float * o, int rows) {
    fa_pv_any(p, vt, NULL, 0, D, o, rows);
}

static void fa_pv_rows_h(const float * p, const uint16_t * const * vrows, int D, float * o,
                         int rows) {
    fa_pv_any(p, NULL, vrows, 1, D, o, rows);
}


#define fa_mask_max fa_mask_max16
#define fa_exp_sum fa_exp_sum16
#else
#define fa_mask_max fa_mask_max8
#define fa_exp_sum fa_exp_sum8

static void fa_qk_rows(const float * q, int D, const float * kt, float * p, int rows) {
    int r = 0;
    for (; r + FA_R <= rows; r += FA_R) {
        fa_qk(q + (size_t) r * D, D, kt, p + (size_t) r * BK, FA_R);
    }
    switch (rows - r) {
        case 5: fa_qk(q + (size_t) r * D, D, kt, p + (size_t) r * BK, 5); break;
        case 4: fa_qk(q + (size_t) r * D, D, kt, p + (size_t) r * BK, 4); break;
        case 3: fa_qk(q + (size_t) r * D, D, kt, p + (size_t) r * BK, 3); break;
        case 2: fa_qk(q + (size_t) r * D, D, kt, p + (size_t) r * BK, 2); break;
        case 1: fa_qk(q + (size_t) r * D, D, kt, p + (size_t) r * BK, 1); break;
        default: break;
    }
}

static void fa_pv_rows(const float * p, const float * vt, int D, float * o, int rows) {
    int r = 0;
    for (; r + FA_R <= rows; r += FA_R) {
        fa_pv(p + (size_t) r * BK, vt, D, o + (size_t) r * D, FA_R);
    }
    switch (rows - r) {
        case 5: fa_pv(p + (size_t) r * BK, vt, D, o + (size_t) r * D, 5); break;
        case 4: fa_pv(p + (size_t) r * BK, vt, D, o + (size_t) r * D, 4); break;
        case 3: fa_pv(p + (size_t) r * BK, vt, D, o + (size_t) r * D, 3); break;
        case 2: fa_pv(p + (size_t) r * BK, vt, D, o + (size_t) r * D, 2); break;
        case 1: fa_pv(p + (size_t) r * BK, vt, D, o + (size_t) r * D, 1); break;
        default: break;
    }
}
#endif
#endif
