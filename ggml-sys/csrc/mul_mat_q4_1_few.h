// The few-column path of the q4_1 integer-sum products (decoding, short items): one vector
// lane per weight row, with the same float steps as the wide path, so the same bits at every
// column count (the definition is at the top of mul_mat_q4_1.c). Not a header of its own: mul_mat_q4_1.c
// includes it where its types, macros and helpers are defined, in the same translation unit.


#if defined(__F16C__)
// The few-column path (see the top): one vector lane per weight row, FEW_ROWS rows per tile,
// the columns FEW_CHUNK at a time.
#define Q41_FEW 1
#define FEW_CHUNK 4
// How far ahead of the tile computed its weights are prefetched, in rows (whole tiles).
#define FEW_PREFETCH_ROWS 48
// Most columns the few-column path takes; more go to the wide path (which costs the same for
// 1 to W columns: measured on Zen 4, the few-column path is the faster up to about 12 of 16).
#ifdef Q41_W16
#define FEW_MAX_COLS 12
#else
#define FEW_MAX_COLS 8
#endif

// The few-column path's vectors: FEW_ROWS rows, 16 with AVX-512 VNNI (512 bits), else 8.
#ifdef Q41_W16
#define FEW_ROWS 16
typedef __m512i fvi;
typedef __m512 fvf;
#define FI_ZERO() _mm512_setzero_si512()
#define FI_LOAD(p) _mm512_load_si512((const void *) (p))
#define FI_SET1_8(v) _mm512_set1_epi8(v)
#define FI_SET1_32(v) _mm512_set1_epi32(v)
#define FI_AND(x, y) _mm512_and_si512(x, y)
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
#define FF_ADD(x, y) _mm512_add_ps(x, y)
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
#define FF_ADD(x, y) _mm256_add_ps(x, y)
#define FF_CVT(x) _mm256_cvtepi32_ps(x)
#endif

static inline int32_t load_i32(const void * p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

// The scales (low 16 bits) and minimums (high 16 bits) of the f16 pairs in the lanes of `v`,
// as f32.
Q41_INLINE void few_f16_pairs(fvi v, fvf * lo, fvf * hi) {
#ifdef Q41_W16
    *lo = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
    *hi = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
#else
    // Lane-wise [lo 0..3, hi 0..3 | lo 4..7, hi 4..7] (packus: every value fits), then the
    // quarters in order.
    const __m256i p = _mm256_packus_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)),
                                          _mm256_srli_epi32(v, 16));
    const __m256i q = _mm256_permute4x64_epi64(p, 0xD8);
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(q));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(q, 1));
#endif
}

// A 4x4 transpose of 32-bit elements in each 128-bit part of Z[0..3]: lane j of P[k] in a
// part is element k of Z[j] in that part.
Q41_INLINE void transpose4(const fvi * Z, fvi * P) {
    const fvi t0 = FI_UNPACKLO32(Z[0], Z[1]), t1 = FI_UNPACKHI32(Z[0], Z[1]);
    const fvi t2 = FI_UNPACKLO32(Z[2], Z[3]), t3 = FI_UNPACKHI32(Z[2], Z[3]);
    P[0] = FI_UNPACKLO64(t0, t2);
    P[1] = FI_UNPACKHI64(t0, t2);
    P[2] = FI_UNPACKLO64(t1, t3);
    P[3] = FI_UNPACKHI64(t1, t3);
}

static inline __m128i load16(const q41_block * row, int i, size_t off) {
    return _mm_loadu_si128((const __m128i *) ((const char *) (row + i) + off));
}

// Rows j, j + 4 (, j + 8, j + 12) of the tile, 16 bytes from byte `off` of their block i, side
// by side: 128-bit part p holds row j + 4p, so that after `transpose4` lane r is row r.
Q41_INLINE fvi rows_side(const q41_block * const * rp, int j, int i, size_t off) {
#ifdef Q41_W16
    __m512i z = _mm512_castsi128_si512(load16(rp[j], i, off));
    z = _mm512_inserti32x4(z, load16(rp[j + 4], i, off), 1);
    z = _mm512_inserti32x4(z, load16(rp[j + 8], i, off), 2);
    return _mm512_inserti32x4(z, load16(rp[j + 12], i, off), 3);
#else
    return _mm256_inserti128_si256(_mm256_castsi128_si256(load16(rp[j], i, off)),
                                   load16(rp[j + 4], i, off), 1);
#endif
}

// Block i of the tile's rows rp[0 .. FEW_ROWS - 1] transposed: lane r of X[k] holds quad k
// (elements 4k .. 4k + 3, values 0..15) of row r; lane r of d0 and m0 its scale and minimum,
// from the blocks' first 4 bytes copied to hd[i * FEW_ROWS + r].
Q41_INLINE void few_unpack(const q41_block * const * rp, const uint32_t * hd, int i, fvi * X,
                           fvf * d0, fvf * m0) {
    fvi Z[4], P[4];
    for (int j = 0; j < 4; ++j) {
        Z[j] = rows_side(rp, j, i, 4);
    }
    // P[k] lane r: bytes 4k .. 4k + 3 of row r's packed values.
    transpose4(Z, P);
    // Byte j's low nibble is element j, its high nibble element j + 16.
    const fvi low = FI_SET1_8(0x0F);
    for (int k = 0; k < 4; ++k) {
        X[k] = FI_AND(P[k], low);
        X[k + 4] = FI_AND(FI_SRLI16(P[k], 4), low);
    }
    few_f16_pairs(FI_LOAD(hd + (size_t) i * FEW_ROWS), d0, m0);
}

// Lane r: the exact sum of row r's block (X) times the column's block y (32 int8).
Q41_INLINE fvi few_dots(const fvi * X, const int8_t * y) {
#ifdef FEW_DPBUSD
    // Four short chains (the sums are exact in any order).
    fvi s[4];
    for (int k = 0; k < 4; ++k) {
        s[k] = FEW_DPBUSD(FI_ZERO(), X[k], FI_SET1_32(load_i32(y + 4 * k)));
    }
    for (int k = 0; k < 4; ++k) {
        s[k] = FEW_DPBUSD(s[k], X[k + 4], FI_SET1_32(load_i32(y + 4 * k + 16)));
    }
    return FI_ADD32(FI_ADD32(s[0], s[1]), FI_ADD32(s[2], s[3]));
#else
    // Pairs in 16 bits, a block's 8 quads summed there: |sum| <= 8 * 2 * 15 * 127 < 2^15.
    __m256i s = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(X[k], _mm256_set1_epi32(load_i32(y + 4 * k))));
    }
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
#endif
}

// The first 4 bytes of block i of rows rp[0 .. FEW_ROWS - 1] to hd[i * FEW_ROWS + r]: plain
// copies, a tile ahead of their use (not a shuffle of vector registers, the path's bottleneck).
Q41_INLINE void few_heads(const q41_block * const * rp, int i, uint32_t * hd) {
    for (int r = 0; r < FEW_ROWS; ++r) {
        memcpy(hd + (size_t) i * FEW_ROWS + r, rp[r] + i, 4);
    }
}

// One tile (rows rp[0 .. FEW_ROWS - 1], the first `rows` of them real; their blocks' first
// bytes in hd) against NC columns (q8_1 blocks y[c], scales d1[c][i] and sums s1[c][i] as
// f32): out[c][r]. With `rn`, the next tile's rows, their blocks' first bytes go to hn.
Q41_INLINE void few_tile(const q41_block * const * rp, const uint32_t * hd,
                         const q41_block * const * rn, uint32_t * hn, int nb, const char * pf,
                         int pf_lines,
                         const q81_block * const * y, const float * const * d1,
                         const float * const * s1, int NC, float * const * out, int rows) {
    fvf acc[FEW_CHUNK], sm[FEW_CHUNK];
    for (int c = 0; c < NC; ++c) {
        acc[c] = FF_ZERO();
        sm[c] = FF_ZERO();
    }
    for (int i = 0; i < nb; ++i) {
        // The next tile's weights, a share of its cache lines per block.
        for (int l = 0; l < pf_lines; ++l) {
            _mm_prefetch(pf + ((size_t) i * pf_lines + l) * 64, _MM_HINT_T1);
        }
        if (rn != NULL) {
            few_heads(rn, i, hn);
        }
        fvi X[8];
        fvf d0, m0;
        few_unpack(rp, hd, i, X, &d0, &m0);
        for (int c = 0; c < NC; ++c) {
            const fvf xy = FF_CVT(few_dots(X, y[c][i].qs));
            acc[c] = FF_FMA(FF_MUL(d0, FF_BCST(d1[c] + i)), xy, acc[c]);
            sm[c] = FF_FMA(m0, FF_BCST(s1[c] + i), sm[c]);
        }
    }
    for (int c = 0; c < NC; ++c) {
        const fvf v = FF_ADD(acc[c], sm[c]);
#ifdef Q41_W16
        _mm512_mask_storeu_ps(out[c], (__mmask16) ((1u << rows) - 1), v);
#else
        if (rows == FEW_ROWS) {
            _mm256_storeu_ps(out[c], v);
        } else {
            float tmp[FEW_ROWS] __attribute__((aligned(32)));
            _mm256_store_ps(tmp, v);
            memcpy(out[c], tmp, (size_t) rows * sizeof(float));
        }
#endif
    }
}

// The few-column path: every column quantized by each thread, the tiles of rows split between
// the threads.
static void mul_mat_few(struct ggml_tensor * dst, int ith, int nth) {
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
    const size_t heads = (size_t) nb * FEW_ROWS;
    const size_t q_bytes = align64((size_t) N * nb * (sizeof(q81_block) + 2 * sizeof(float)));
    char * buf = wide_reserve(q_bytes + 2 * heads * sizeof(uint32_t));
    if (buf == NULL) {
        fill_nan(dst, r0, r1, 0, N);
        return;
    }
    q81_block * q8 = (q81_block *) buf;
    float * ds = (float *) (buf + (size_t) N * nb * sizeof(q81_block));
    float * ss = ds + (size_t) N * nb;
    // The blocks' first bytes of this tile and of the next, swapped after each tile.
    uint32_t * hd = (uint32_t *) (buf + q_bytes);
    uint32_t * hn = hd + heads;
    for (int64_t n = 0; n < N; ++n) {
        quantize_col(b, n, nb, q8 + n * nb);
        for (int i = 0; i < nb; ++i) {
            ds[n * nb + i] = ggml_sys_f16(q8[n * nb + i].d);
            ss[n * nb + i] = ggml_sys_f16(q8[n * nb + i].s);
        }
    }
    // Rows past the end repeat the last one; their lanes are never stored.
    const q41_block * rn[FEW_ROWS];
    for (int r = 0; r < FEW_ROWS; ++r) {
        rn[r] = weight_row(a, r0 + r < r1 ? r0 + r : r1 - 1);
    }
    for (int i = 0; i < nb; ++i) {
        few_heads(rn, i, hd);
    }
    for (int64_t m = r0; m < r1; m += FEW_ROWS) {
        const int rows = r1 - m < FEW_ROWS ? (int) (r1 - m) : FEW_ROWS;
        const q41_block * rp[FEW_ROWS];
        const int next = m + FEW_ROWS < r1;
        for (int r = 0; r < FEW_ROWS; ++r) {
            rp[r] = rn[r];
            const int64_t n_row = m + FEW_ROWS + r;
            rn[r] = weight_row(a, next ? (n_row < r1 ? n_row : r1 - 1) : m);
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
            const q81_block * y[FEW_CHUNK];
            const float * d1[FEW_CHUNK];
            const float * s1[FEW_CHUNK];
            float * out[FEW_CHUNK];
            for (int c = 0; c < NC; ++c) {
                y[c] = q8 + (n + c) * nb;
                d1[c] = ds + (n + c) * nb;
                s1[c] = ss + (n + c) * nb;
                out[c] = out_at(dst, m, n + c);
            }
            // The next tile's first bytes with the first columns.
            const q41_block * const * rq = next && n == 0 ? rn : NULL;
            switch (NC) {
#define FEW_TILE(nc) few_tile(rp, hd, rq, hn, nb, pf, pf_lines, y, d1, s1, nc, out, rows)
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
