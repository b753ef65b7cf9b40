// The few-column path of the Q4_0, Q5_0 and Q8_0 integer-sum products (decoding, short items):
// one vector lane per weight row, with the same float steps as the wide path, so the same bits
// at every column count (the definition is at the top of mul_mat_q8_0.c). Not a header of its
// own: mul_mat_q8_0.c includes it where its types, macros and helpers are defined, in the same
// translation unit.

#if defined(Q80_SIMD) && defined(__F16C__)
// The few-column path (see the top): one vector lane per weight row, FEW_ROWS rows per tile,
// the columns FEW_CHUNK at a time.
#define Q80_FEW 1
#define FEW_CHUNK 4
// How far ahead of the tile computed its weights are prefetched, in rows (whole tiles).
#define FEW_PREFETCH_ROWS 48
// Most columns the few-column path takes; more go to the column groups (which cost the same
// for 1 to W columns; measured on Zen 4, the few-column path is the faster up to about 12 of
// 16 for Q8_0, 24 for Q4_0, whose weights it unpacks in fewer instructions; Q5_0 as Q4_0).
#if defined(Q80_W16)
#define FEW_MAX_COLS(kind) ((kind) != KIND_Q8_0 ? 24 : 12)
#else
#define FEW_MAX_COLS(kind) ((kind) != KIND_Q8_0 ? 16 : 8)
#endif

// Bytes of a weight block of `kind`.
#define FEW_BLOCK_BYTES(kind)                                                                \
    ((kind) == KIND_Q4_0   ? sizeof(q40_block)                                                 \
     : (kind) == KIND_Q5_0 ? sizeof(q50_block)                                                 \
                           : sizeof(q80_block))
// 32-bit words copied from the head of each row's block: its first 4 bytes (the scale), and
// for Q5_0 then bytes 2..5 (qh).
#define FEW_HW(kind) ((kind) == KIND_Q5_0 ? 2 : 1)

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
#define FI_SHUFFLE8(x, c) _mm512_shuffle_epi8(x, c)
// Per 32-bit lane of each 128-bit part, the index of the lane's first byte, in all 4 bytes.
#define FI_LANE_FIRST() _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0)
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
#define FI_SHUFFLE8(x, c) _mm256_shuffle_epi8(x, c)
#define FI_LANE_FIRST() \
    _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808, 0x0C0C0C0C)
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

// x (quad q of each lane's row: nibbles) with 16 added to byte e where bit 4q + e of the
// lane's qh is set: Q5_0's five-bit q.
Q80_INLINE fvi few_high(fvi x, fvi qh, int q) {
    // Byte q / 2 of the lane's qh in each of its 4 bytes; byte e tested for bit 4 (q % 2) + e.
    const fvi spread = FI_SHUFFLE8(qh, FI_ADD32(FI_LANE_FIRST(), FI_SET1_32(0x01010101 * (q / 2))));
    const fvi bit = FI_SET1_32(q % 2 ? (int) 0x80402010u : 0x08040201);
#ifdef FEW_W16
    return _mm512_mask_add_epi8(x, _mm512_test_epi8_mask(spread, bit), x, _mm512_set1_epi8(0x10));
#else
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(x, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
#endif
}

// Block i of the tile's rows rp[0 .. FEW_ROWS - 1] transposed: lane r of X[k] holds quad k
// (elements 4k .. 4k + 3) of row r: the unsigned u of the top comment, except Q8_0's signed w
// where `maddubs` takes them through their signs; lane r of d0 its scale, from the blocks'
// first 4 bytes copied to hd[i * FEW_HW(kind) * FEW_ROWS + r] (Q5_0's qh a row of FEW_ROWS
// after them).
Q80_INLINE void few_unpack(int kind, const char * const * rp, const uint32_t * hd, int i, fvi * X,
                           fvf * d0) {
    const size_t at = (size_t) i * FEW_BLOCK_BYTES(kind);
    const uint32_t * heads = hd + (size_t) i * FEW_HW(kind) * FEW_ROWS;
    fvi Z[4];
    if (kind == KIND_Q5_0) {
        for (int j = 0; j < 4; ++j) {
            Z[j] = rows_side(rp, j, at + offsetof(q50_block, qs));
        }
        fvi P[4];
        transpose4(Z, P);
        // As Q4_0's nibbles, each with its high bit: bits 0..15 of qh for elements 0..15
        // (quads 0-3), bits 16..31 for 16..31 (quads 4-7).
        const fvi low = FI_SET1_8(0x0F);
        const fvi qh = FI_LOAD(heads + FEW_ROWS);
        for (int k = 0; k < 4; ++k) {
            X[k] = few_high(FI_AND(P[k], low), qh, k);
            X[k + 4] = few_high(FI_AND(FI_SRLI16(P[k], 4), low), qh, k + 4);
        }
    } else if (kind == KIND_Q4_0) {
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
    *d0 = few_f16_low(FI_LOAD(heads));
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
    if (kind == KIND_Q5_0) {
        // u up to 31: quads 0-3 and quads 4-7 each summed in 16 bits, |sum| <= 4 * 2 * 31 *
        // 128 = 31744 < 2^15, then widened and added.
        __m256i s[2];
        for (int h = 0; h < 2; ++h) {
            s[h] = _mm256_setzero_si256();
            for (int k = 0; k < 4; ++k) {
                const int q = 4 * h + k;
                const __m256i yk = _mm256_set1_epi32(load_quad((const uint8_t *) y + 4 * q));
                s[h] = _mm256_add_epi16(s[h], _mm256_maddubs_epi16(X[q], yk));
            }
        }
        return _mm256_add_epi32(
            _mm256_add_epi32(_mm256_madd_epi16(s[0], ones), _mm256_madd_epi16(s[1], ones)),
            _mm256_set1_epi32(start));
    }
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

// The first 4 bytes of block i of rows rp[0 .. FEW_ROWS - 1] to hd[i * FEW_HW * FEW_ROWS + r]
// (for Q5_0 then its qh to the FEW_ROWS words after them): plain copies, a tile ahead of their
// use (not a shuffle of vector registers, the path's bottleneck).
Q80_INLINE void few_heads(int kind, const char * const * rp, int i, uint32_t * hd) {
    const size_t at = (size_t) i * FEW_BLOCK_BYTES(kind);
    uint32_t * heads = hd + (size_t) i * FEW_HW(kind) * FEW_ROWS;
    for (int r = 0; r < FEW_ROWS; ++r) {
        memcpy(heads + r, rp[r] + at, 4);
    }
    if (kind == KIND_Q5_0) {
        for (int r = 0; r < FEW_ROWS; ++r) {
            memcpy(heads + FEW_ROWS + r, rp[r] + at + offsetof(q50_block, qh), 4);
        }
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
    const size_t heads = (size_t) nb * FEW_HW(kind) * FEW_ROWS;
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
    const int32_t bias = unsigned_bias(kind);
#else
    // Q8_0's w are taken signed there.
    const int32_t bias = kind == KIND_Q8_0 ? 0 : unsigned_bias(kind);
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
            ds[n * nb + i] = ggml_sys_f16(blk->d);
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
