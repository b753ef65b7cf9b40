// The few-column path of the Q4_K, Q5_K and Q6_K integer-sum products (decoding, short items): one vector
// lane per weight row, with the same float steps as the wide path, so the same bits at every
// column count (the definition is at the top of mul_mat_qk.c). Not a header of its own: mul_mat_qk.c
// includes it where its types, macros and helpers are defined, in the same translation unit.

// ---- The few-column path ----
//
// The weights are read once per pass of up to KQ_FEW_COLS columns; per super-block each row of a
// block of eight gets its integer sums within the row, the eight rows' sums are gathered into
// the lanes of one 256-bit vector (kq_hsum8, exact) and the float steps are the definition's,
// lane by lane: acc = fma(d * d8, (float) sumi, acc), then for Q4_K and Q5_K acc = fma(-dmin *
// d8, (float) summ, acc), over the super-blocks in order from acc = 0: the wide path's
// operations on the same integers, so the same bits.

// Columns per read of the weights; super-blocks per row between the float steps.
#define KQ_FEW_COLS 4
#define KQ_FEW_SB 8

// Fewest columns the wide path takes (fewer, and a wide product's last partial group under this
// many, take the few-column path): where a group of W costs less, measured on Zen 4.
static inline int64_t kq_few_max(int kind) {
#ifdef KQ_W16
    return kind == KQ_Q6K ? 9 : 11;
#else
    return kind == KQ_Q6K ? 5 : 8;
#endif
}

#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define KQ_FEW_VNNI 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define KQ_DPBUSD(acc, w, y) _mm256_dpbusd_epi32(acc, w, y)
#else
#define KQ_DPBUSD(acc, w, y) _mm256_dpbusd_avx_epi32(acc, w, y)
#endif
#endif

// Eight f16 values (the low halves of the lanes' first eight 16-bit words) as f32.
static inline __m256 kq_f16x8(__m128i h) {
#if defined(__F16C__)
    return _mm256_cvtph_ps(h);
#else
    uint16_t v[8];
    _mm_storeu_si128((__m128i *) v, h);
    return _mm256_setr_ps(ggml_sys_f16(v[0]), ggml_sys_f16(v[1]), ggml_sys_f16(v[2]),
                          ggml_sys_f16(v[3]), ggml_sys_f16(v[4]), ggml_sys_f16(v[5]),
                          ggml_sys_f16(v[6]), ggml_sys_f16(v[7]));
#endif
}

// Lane r: the sum of v[r]'s eight lanes (exact: wrapping adds of values whose total fits).
static inline __m256i kq_hsum8(const __m256i * v) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// Lane r: the sum of u[r]'s four lanes.
static inline __m256i kq_hsum4(const __m128i * u) {
    const __m128i a = _mm_hadd_epi32(_mm_hadd_epi32(u[0], u[1]), _mm_hadd_epi32(u[2], u[3]));
    const __m128i b = _mm_hadd_epi32(_mm_hadd_epi32(u[4], u[5]), _mm_hadd_epi32(u[6], u[7]));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
}

// A pshufb control that makes 16-bit lanes of bytes: lane e gets byte idx, zero-extended.
#define KQ_U16(idx) ((short) (0x8000 | (idx)))

// One row's integer sums for one super-block against CN columns: the eight 32-value vectors w[k]
// (values 32k .. 32k + 31, unsigned), their scale patterns pat[] and the columns' int8 values y
// (column c's super-block at ycol[c]). Sets v[c] to lanes whose sum is sum_j sc_j * dot_j. With VNNI each vector's four-product lane sums (|sum| <= 4 * 63 * 128 =
// 32,256, in int16 range) are packed two vectors to one and multiplied by the scales with madd,
// pat[p] matching packs' lane order; without it maddubs makes 16-bit pair sums (|sum| <= 2 * 63
// * 128) and pat[k] holds each one's scale.
KQ_INLINE void kq_few_dots(const __m256i * w, const __m256i * pat, const int8_t * const * ycol,
                           int CN, __m256i * v) {
    for (int c = 0; c < CN; ++c) {
        const int8_t * y = ycol[c];
        __m256i s = _mm256_setzero_si256();
#ifdef KQ_FEW_VNNI
        for (int p = 0; p < 4; ++p) {
            const __m256i d0 = KQ_DPBUSD(_mm256_setzero_si256(), w[2 * p],
                                         _mm256_loadu_si256((const __m256i *) (y + 64 * p)));
            const __m256i d1 = KQ_DPBUSD(_mm256_setzero_si256(), w[2 * p + 1],
                                         _mm256_loadu_si256((const __m256i *) (y + 64 * p + 32)));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_packs_epi32(d0, d1), pat[p]));
        }
#else
        for (int k = 0; k < 8; ++k) {
            const __m256i p16 = _mm256_maddubs_epi16(w[k], _mm256_loadu_si256((const __m256i *) (y + 32 * k)));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p16, pat[k]));
        }
#endif
        v[c] = s;
    }
}

// Q4_K's and Q5_K's 12 scale bytes as 16: the eight scales, then the eight minimums. Read as
// four 32-bit lanes [w0, w1, w2, -] (the load's last four bytes, the first of qs, unused):
// scales 0..3 are w0's low six bits per byte, minimums 0..3 w1's; scales 4..7 w2's low nibbles
// with w0's top two bits above them, minimums 4..7 w2's high nibbles with w1's top two bits.
static inline __m128i kq_few_scales_mins(const uint8_t * s) {
    const __m128i x = _mm_loadu_si128((const __m128i *) s);
    const __m128i low6 = _mm_and_si128(x, _mm_set1_epi8(0x3F));
    const __m128i top2 = _mm_and_si128(_mm_srli_epi32(x, 2), _mm_set1_epi8(0x30));
    const __m128i nib = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(x, 0xAA), _mm_setr_epi32(0, 4, 0, 0)),
                                      _mm_set1_epi8(0x0F));
    return _mm_unpacklo_epi32(low6, _mm_or_si128(nib, top2));
}

#ifdef KQ_W16
// With AVX-512 VNNI the rows' sums take 512-bit vectors: 64 weight values per instruction. For
// Q4_K and Q5_K a 64-byte load of qs holds chunks t and t + 1, so its low nibbles are sub-blocks
// 2t and 2t + 2, its high nibbles 2t + 1 and 2t + 3: the columns' values are stored in that
// order (32-value pieces 0, 2, 1, 3, 4, 6, 5, 7; `kq_few_permute`). Q6_K's values come in order.

static inline __m512i kq_two(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// 16-bit lanes: `a` in the low 256 bits, `b` in the high.
static inline __m512i kq_halves16(short a, short b) {
    return kq_two(_mm256_set1_epi16(a), _mm256_set1_epi16(b));
}

// s's sixteen lanes added pairwise into eight (lane l + lane l + 8).
static inline __m256i kq_fold(__m512i s) {
    return _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
}

static void kq_few_permute(kq_block_q8k * y, int64_t n) {
    static const int order[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (int64_t i = 0; i < n; ++i) {
        int8_t v[KQ_SB];
        memcpy(v, y[i].qs, KQ_SB);
        for (int p = 0; p < 8; ++p) {
            memcpy(y[i].qs + 32 * p, v + 32 * order[p], 32);
        }
    }
}

KQ_INLINE void kq_few_row_q45(const void * blk, int kind, const int8_t * const * ycol,
                              const __m128i * bs32, int CN, __m256i * v, __m128i * u) {
    const uint8_t * scales;
    const uint8_t * qs;
    if (kind == KQ_Q4K) {
        scales = ((const kq_block_q4k *) blk)->scales;
        qs = ((const kq_block_q4k *) blk)->qs;
    } else {
        scales = ((const kq_block_q5k *) blk)->scales;
        qs = ((const kq_block_q5k *) blk)->qs;
    }
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512i w[4];
    for (int h = 0; h < 2; ++h) {
        const __m512i q = _mm512_loadu_si512((const void *) (qs + 64 * h));
        w[2 * h] = _mm512_and_si512(q, low);
        w[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
    }
    if (kind == KQ_Q5K) {
        // Sub-block j's fifth bits are bit j of qh's bytes: to bit 4 by 16-bit shifts per
        // half (the mask keeps each byte's own bit).
        const __m512i hb = _mm512_broadcast_i64x4(
            _mm256_loadu_si256((const __m256i *) ((const kq_block_q5k *) blk)->qh));
        const __m512i bit4 = _mm512_set1_epi8(0x10);
        w[0] = _mm512_or_si512(w[0], _mm512_and_si512(_mm512_sllv_epi16(hb, kq_halves16(4, 2)), bit4));
        w[1] = _mm512_or_si512(w[1], _mm512_and_si512(_mm512_sllv_epi16(hb, kq_halves16(3, 1)), bit4));
        w[2] = _mm512_or_si512(w[2], _mm512_and_si512(_mm512_srlv_epi16(hb, kq_halves16(0, 2)), bit4));
        w[3] = _mm512_or_si512(w[3], _mm512_and_si512(_mm512_srlv_epi16(hb, kq_halves16(1, 3)), bit4));
    }
    const __m128i sm = kq_few_scales_mins(scales);
    const __m512i sm4 = _mm512_broadcast_i32x4(sm);
    // packs(w[2p]'s, w[2p + 1]'s): 128-bit lanes 0, 1 sub-blocks 4p, 4p + 1; 2, 3 4p + 2, 4p + 3.
    __m512i pat[2];
    for (int p = 0; p < 2; ++p) {
        const short a = KQ_U16(4 * p), b = KQ_U16(4 * p + 1), c = KQ_U16(4 * p + 2), d = KQ_U16(4 * p + 3);
        pat[p] = _mm512_shuffle_epi8(
            sm4, kq_two(_mm256_setr_epi16(a, a, a, a, b, b, b, b, a, a, a, a, b, b, b, b),
                        _mm256_setr_epi16(c, c, c, c, d, d, d, d, c, c, c, c, d, d, d, d)));
    }
    for (int c = 0; c < CN; ++c) {
        const int8_t * y = ycol[c];
        __m512i d[4];
        for (int k = 0; k < 4; ++k) {
            d[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[k], _mm512_loadu_si512((const void *) (y + 64 * k)));
        }
        v[c] = kq_fold(_mm512_add_epi32(_mm512_madd_epi16(_mm512_packs_epi32(d[0], d[1]), pat[0]),
                                        _mm512_madd_epi16(_mm512_packs_epi32(d[2], d[3]), pat[1])));
    }
    const __m128i mins = _mm_shuffle_epi8(
        sm, _mm_setr_epi16(KQ_U16(8), KQ_U16(9), KQ_U16(10), KQ_U16(11), KQ_U16(12), KQ_U16(13),
                           KQ_U16(14), KQ_U16(15)));
    for (int c = 0; c < CN; ++c) {
        u[c] = _mm_madd_epi16(mins, bs32[c]);
    }
}

KQ_INLINE void kq_few_row_q6(const kq_block_q6k * x, const int8_t * const * ycol,
                             const __m256i * bs16, int CN, __m256i * v) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512i two = _mm512_set1_epi8(0x30);
    __m512i w[4];
    for (int h = 0; h < 2; ++h) {
        const __m512i l = _mm512_loadu_si512((const void *) (x->ql + 64 * h));
        const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) (x->qh + 32 * h)));
        w[2 * h] = _mm512_or_si512(_mm512_and_si512(l, low),
                                   _mm512_and_si512(_mm512_sllv_epi16(hb, kq_halves16(4, 2)), two));
        w[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low),
                                       _mm512_and_si512(_mm512_srlv_epi16(hb, kq_halves16(0, 2)), two));
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) x->scales));
    const __m512i sc32 = _mm512_castsi256_si512(sc16);
    // w[k]'s 128-bit lane L is sub-block 4k + L; packs(w[2p]'s, w[2p + 1]'s) lane L: sub-blocks
    // 8p + L and 8p + 4 + L.
    __m512i pat[2];
    for (int p = 0; p < 2; ++p) {
        const short a0 = (short) (8 * p), b0 = (short) (8 * p + 4), a1 = (short) (8 * p + 1),
                    b1 = (short) (8 * p + 5), a2 = (short) (8 * p + 2), b2 = (short) (8 * p + 6),
                    a3 = (short) (8 * p + 3), b3 = (short) (8 * p + 7);
        pat[p] = _mm512_permutexvar_epi16(
            kq_two(_mm256_setr_epi16(a0, a0, a0, a0, b0, b0, b0, b0, a1, a1, a1, a1, b1, b1, b1, b1),
                   _mm256_setr_epi16(a2, a2, a2, a2, b2, b2, b2, b2, a3, a3, a3, a3, b3, b3, b3, b3)),
            sc32);
    }
    for (int c = 0; c < CN; ++c) {
        const int8_t * y = ycol[c];
        __m512i d[4];
        for (int k = 0; k < 4; ++k) {
            d[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[k], _mm512_loadu_si512((const void *) (y + 64 * k)));
        }
        const __m256i s = kq_fold(_mm512_add_epi32(_mm512_madd_epi16(_mm512_packs_epi32(d[0], d[1]), pat[0]),
                                                   _mm512_madd_epi16(_mm512_packs_epi32(d[2], d[3]), pat[1])));
        v[c] = _mm256_sub_epi32(s, _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs16[c]), 5));
    }
}

#else

// One Q4_K or Q5_K row's super-block x against CN columns: v[c] (sum: sumi), u[c] (sum: summ).
// bs32[c]: column c's eight per-32 sums of the super-block as int16.
KQ_INLINE void kq_few_row_q45(const void * blk, int kind, const int8_t * const * ycol,
                              const __m128i * bs32, int CN, __m256i * v, __m128i * u) {
    const uint8_t * scales;
    const uint8_t * qs;
    const uint8_t * qh = NULL;
    if (kind == KQ_Q4K) {
        scales = ((const kq_block_q4k *) blk)->scales;
        qs = ((const kq_block_q4k *) blk)->qs;
    } else {
        scales = ((const kq_block_q5k *) blk)->scales;
        qs = ((const kq_block_q5k *) blk)->qs;
        qh = ((const kq_block_q5k *) blk)->qh;
    }
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i w[8];
    __m256i hb = _mm256_setzero_si256();
    if (kind == KQ_Q5K) {
        hb = _mm256_loadu_si256((const __m256i *) qh);
    }
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    for (int t = 0; t < 4; ++t) {
        const __m256i q = _mm256_loadu_si256((const __m256i *) (qs + 32 * t));
        w[2 * t] = _mm256_and_si256(q, low);
        w[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
        if (kind == KQ_Q5K) {
            // Bit 2t of each qh byte to bit 4 (a 16-bit shift: the mask keeps the byte's own
            // bit), then bit 2t + 1.
            __m256i h0, h1;
            switch (t) {
                case 0: h0 = _mm256_slli_epi16(hb, 4); h1 = _mm256_slli_epi16(hb, 3); break;
                case 1: h0 = _mm256_slli_epi16(hb, 2); h1 = _mm256_slli_epi16(hb, 1); break;
                case 2: h0 = hb; h1 = _mm256_srli_epi16(hb, 1); break;
                default: h0 = _mm256_srli_epi16(hb, 2); h1 = _mm256_srli_epi16(hb, 3); break;
            }
            w[2 * t] = _mm256_or_si256(w[2 * t], _mm256_and_si256(h0, bit4));
            w[2 * t + 1] = _mm256_or_si256(w[2 * t + 1], _mm256_and_si256(h1, bit4));
        }
    }
    const __m128i sm = kq_few_scales_mins(scales);
    const __m256i sm2 = _mm256_broadcastsi128_si256(sm);
    __m256i pat[8];
#ifdef KQ_FEW_VNNI
    for (int p = 0; p < 4; ++p) {
        const short a = KQ_U16(2 * p), b = KQ_U16(2 * p + 1);
        pat[p] = _mm256_shuffle_epi8(sm2, _mm256_setr_epi16(a, a, a, a, b, b, b, b, a, a, a, a, b, b, b, b));
    }
#else
    for (int k = 0; k < 8; ++k) {
        pat[k] = _mm256_shuffle_epi8(sm2, _mm256_set1_epi16(KQ_U16(k)));
    }
#endif
    kq_few_dots(w, pat, ycol, CN, v);
    const __m128i mins = _mm_shuffle_epi8(
        sm, _mm_setr_epi16(KQ_U16(8), KQ_U16(9), KQ_U16(10), KQ_U16(11), KQ_U16(12), KQ_U16(13),
                           KQ_U16(14), KQ_U16(15)));
    for (int c = 0; c < CN; ++c) {
        u[c] = _mm_madd_epi16(mins, bs32[c]);
    }
}

// One Q6_K row's super-block against CN columns: v[c] sums to sumi, the -32 included.
// bs16[c]: column c's sixteen per-16 sums.
KQ_INLINE void kq_few_row_q6(const kq_block_q6k * x, const int8_t * const * ycol,
                             const __m256i * bs16, int CN, __m256i * v) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i two = _mm256_set1_epi8(0x30);
    __m256i w[8];
    for (int h = 0; h < 2; ++h) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *) (x->ql + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *) (x->ql + 64 * h + 32));
        const __m256i hb = _mm256_loadu_si256((const __m256i *) (x->qh + 32 * h));
        w[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_and_si256(_mm256_slli_epi16(hb, 4), two));
        w[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, low), _mm256_and_si256(_mm256_slli_epi16(hb, 2), two));
        w[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low), _mm256_and_si256(hb, two));
        w[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                                       _mm256_and_si256(_mm256_srli_epi16(hb, 2), two));
    }
    // The scales as int16, sub-blocks 0..7 in both 128-bit lanes (lo), 8..15 (hi); pshufb
    // picks 16-bit lanes from them (KQ_P16: the two bytes of lane j).
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) x->scales));
    const __m256i lo = _mm256_permute2x128_si256(sc16, sc16, 0x00);
    const __m256i hi = _mm256_permute2x128_si256(sc16, sc16, 0x11);
#define KQ_P16(j) ((short) (((2 * (j) + 1) << 8) | (2 * (j))))
    __m256i pat[8];
#ifdef KQ_FEW_VNNI
    // packs of vectors 2p and 2p + 1: low lanes sub-blocks 4p and 4p + 2, high 4p + 1, 4p + 3.
    for (int p = 0; p < 4; ++p) {
        const int j = (4 * p) % 8;
        const short a = KQ_P16(j), b = KQ_P16(j + 2), e = KQ_P16(j + 1), f = KQ_P16(j + 3);
        pat[p] = _mm256_shuffle_epi8(p < 2 ? lo : hi,
                                     _mm256_setr_epi16(a, a, a, a, b, b, b, b, e, e, e, e, f, f, f, f));
    }
#else
    // Vector k: sub-block 2k in the low lanes, 2k + 1 in the high.
    for (int k = 0; k < 8; ++k) {
        const int j = (2 * k) % 8;
        const short a = KQ_P16(j), b = KQ_P16(j + 1);
        pat[k] = _mm256_shuffle_epi8(k < 4 ? lo : hi,
                                     _mm256_setr_epi16(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b));
    }
#endif
#undef KQ_P16
    kq_few_dots(w, pat, ycol, CN, v);
    for (int c = 0; c < CN; ++c) {
        v[c] = _mm256_sub_epi32(v[c], _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs16[c]), 5));
    }
}

#endif

// Rows m0 .. m0 + R - 1 (R <= 8) against the CN columns at q8 (column c's blocks at q8 + c * nb),
// written to columns n0 .. n0 + CN - 1 of dst. Lanes past R repeat the last row, unstored.
KQ_INLINE void kq_few_block(struct ggml_tensor * dst, const struct ggml_tensor * a, int64_t m0,
                            int R, const kq_block_q8k * q8, int nb, int64_t n0, int kind, int CN) {
    const size_t bsz = kind == KQ_Q4K ? sizeof(kq_block_q4k)
                       : kind == KQ_Q5K ? sizeof(kq_block_q5k)
                                        : sizeof(kq_block_q6k);
    const char * rowp[8];
    int32_t offs[8];
    for (int r = 0; r < 8; ++r) {
        rowp[r] = (const char *) a->data + (m0 + (r < R ? r : R - 1)) * a->nb[1];
        offs[r] = (int32_t) ((r < R ? r : R - 1) * a->nb[1]);
    }
    const char * rowp0 = rowp[0];
    const __m256i rowoff = _mm256_loadu_si256((const __m256i *) offs);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 acc[KQ_FEW_COLS];
    for (int c = 0; c < CN; ++c) {
        acc[c] = _mm256_setzero_ps();
    }
    for (int i0 = 0; i0 < nb; i0 += KQ_FEW_SB) {
        const int ni = nb - i0 < KQ_FEW_SB ? nb - i0 : KQ_FEW_SB;
        // The columns' per-16 and per-32 sums of these super-blocks.
        __m256i bs16[KQ_FEW_SB][KQ_FEW_COLS];
        __m128i bs32[KQ_FEW_SB][KQ_FEW_COLS];
        for (int ii = 0; ii < ni; ++ii) {
            for (int c = 0; c < CN; ++c) {
                const kq_block_q8k * y = q8 + (size_t) c * nb + i0 + ii;
                bs16[ii][c] = _mm256_loadu_si256((const __m256i *) y->bsums);
                bs32[ii][c] = _mm_hadd_epi16(_mm256_castsi256_si128(bs16[ii][c]),
                                             _mm256_extracti128_si256(bs16[ii][c], 1));
            }
        }
        // Each row's super-blocks in memory order, then the float steps super-block by
        // super-block over the eight rows.
        __m256i v[KQ_FEW_SB][KQ_FEW_COLS][8];
        __m128i u[KQ_FEW_SB][KQ_FEW_COLS][8];
        for (int r = 0; r < 8; ++r) {
            for (int ii = 0; ii < ni; ++ii) {
                const int i = i0 + ii;
                const int8_t * ycol[KQ_FEW_COLS];
                for (int c = 0; c < CN; ++c) {
                    ycol[c] = q8[(size_t) c * nb + i].qs;
                }
                const char * blk = rowp[r] + (size_t) i * bsz;
                __m256i vr[KQ_FEW_COLS];
                __m128i ur[KQ_FEW_COLS];
                if (kind == KQ_Q6K) {
                    kq_few_row_q6((const kq_block_q6k *) blk, ycol, bs16[ii], CN, vr);
                } else {
                    kq_few_row_q45(blk, kind, ycol, bs32[ii], CN, vr, ur);
                }
                for (int c = 0; c < CN; ++c) {
                    v[ii][c][r] = vr[c];
                    if (kind != KQ_Q6K) {
                        u[ii][c][r] = ur[c];
                    }
                }
            }
        }
        for (int ii = 0; ii < ni; ++ii) {
            const int i = i0 + ii;
            // The rows' d and dmin (Q6_K: d), gathered as 32-bit words: Q4_K's and Q5_K's
            // first (d low, dmin high), Q6_K's last (d high; it ends the block).
            const size_t off = kind == KQ_Q6K ? sizeof(kq_block_q6k) - 4 : 0;
            const __m256i g = _mm256_i32gather_epi32((const int *) (rowp0 + (size_t) i * bsz + off), rowoff, 1);
            const __m256i dd = _mm256_permute4x64_epi64(
                _mm256_packus_epi32(_mm256_and_si256(g, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(g, 16)),
                0xD8);
            const __m256 dv = kq_f16x8(kind == KQ_Q6K ? _mm256_extracti128_si256(dd, 1) : _mm256_castsi256_si128(dd));
            __m256 dmv = _mm256_setzero_ps();
            if (kind != KQ_Q6K) {
                dmv = _mm256_xor_ps(sign, kq_f16x8(_mm256_extracti128_si256(dd, 1)));
            }
            for (int c = 0; c < CN; ++c) {
                const __m256 d8 = _mm256_set1_ps(q8[(size_t) c * nb + i].d);
                const __m256i sumi = kq_hsum8(v[ii][c]);
                acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dv, d8), _mm256_cvtepi32_ps(sumi), acc[c]);
                if (kind != KQ_Q6K) {
                    const __m256i summ = kq_hsum4(u[ii][c]);
                    acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dmv, d8), _mm256_cvtepi32_ps(summ), acc[c]);
                }
            }
        }
    }
    for (int c = 0; c < CN; ++c) {
        float res[8];
        _mm256_storeu_ps(res, acc[c]);
        for (int r = 0; r < R; ++r) {
            *kq_out(dst, m0 + r, n0 + c) = res[r];
        }
    }
}

static void kq_few_pass(struct ggml_tensor * dst, const struct ggml_tensor * a, int64_t m0, int R,
                        const kq_block_q8k * q8, int nb, int64_t n0, int kind, int CN) {
#define KQ_FEW_CASE(k, n) \
    case n: kq_few_block(dst, a, m0, R, q8, nb, n0, k, n); break;
#define KQ_FEW_KIND(k) \
    switch (CN) { KQ_FEW_CASE(k, 1) KQ_FEW_CASE(k, 2) KQ_FEW_CASE(k, 3) default: KQ_FEW_CASE(k, 4) } break;
    switch (kind) {
        case KQ_Q4K: KQ_FEW_KIND(KQ_Q4K)
        case KQ_Q5K: KQ_FEW_KIND(KQ_Q5K)
        default: KQ_FEW_KIND(KQ_Q6K)
    }
#undef KQ_FEW_KIND
#undef KQ_FEW_CASE
}

// The few-column product: the rows split between the threads in blocks of eight, every thread
// quantizing every column.
static void kq_mul_mat_few(struct ggml_tensor * dst, int ith, int nth, int kind, int64_t n_lo,
                           int64_t n_hi) {
    const struct ggml_tensor * a = dst->src[0];
    const struct ggml_tensor * b = dst->src[1];
    const int64_t M = a->ne[1], N = n_hi - n_lo;
    const int nb = (int) (a->ne[0] / KQ_SB);
    const int64_t blocks = (M + 7) / 8, per = (blocks + nth - 1) / nth;
    const int64_t m0 = per * ith * 8;
    const int64_t m1 = m0 + per * 8 < M ? m0 + per * 8 : M;
    if (m0 >= m1) {
        return;
    }
    kq_block_q8k * q8 = (kq_block_q8k *) kq_reserve((size_t) N * nb * sizeof(kq_block_q8k));
    if (q8 == NULL) {
        kq_fill_nan(dst, m0, m1, n_lo, n_hi);
        return;
    }
    for (int64_t n = 0; n < N; ++n) {
        kq_quantize_q8k((const float *) ((const char *) b->data + (n_lo + n) * b->nb[1]), q8 + n * nb, nb);
    }
#ifdef KQ_W16
    if (kind != KQ_Q6K) {
        kq_few_permute(q8, N * nb);
    }
#endif
    for (int64_t m = m0; m < m1; m += 8) {
        const int R = m1 - m < 8 ? (int) (m1 - m) : 8;
        for (int64_t n = 0; n < N; n += KQ_FEW_COLS) {
            const int CN = N - n < KQ_FEW_COLS ? (int) (N - n) : KQ_FEW_COLS;
            kq_few_pass(dst, a, m, R, q8 + n * nb, nb, n_lo + n, kind, CN);
        }
    }
}
