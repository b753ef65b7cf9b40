// AMX-INT8 tiles for the wide paths of the integer-sum products (mul_mat_q8_0.c: q4_0, q8_0),
// built at the `amx` level only (`-mamx-tile -mamx-int8`). Not a header of its own: a file
// includes it where its types and helpers are defined. (q4_1's wide path took it too and was
// measured 2% slower than its VNNI path on a Sapphire-Rapids-class Xeon, so it keeps VNNI: see
// docs/BENCHMARKS.md, "AMX tiles".)
//
// A group of W = 16 packed columns holds, per block of 32, its 8 quads of 16 columns x 4 bytes:
// the layout a tile product reads as B (8 rows of 64 bytes). A is 16 unpacked weight rows' 32
// bytes of the block (stride: the unpacked row's length). One tile product gives the 16 x 16
// exact 32-bit block sums that the vector paths compute lane by lane, so a file's float step,
// applied to them in the same order, gives the same bits. The tile instructions run in order,
// so a block's sums are stored two products after its own (by then done) and taken through the
// float step one block later (by then in memory): four blocks are in flight.

typedef struct {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tile_config;

// Tiles 0 to 3 hold the sums of four blocks in flight, 4 and 5 weights, 6 and 7 columns.
static void amx_configure(void) {
    amx_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 4; ++t) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    for (int t = 4; t < 6; ++t) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 32;
        cfg.rows[t + 2] = 8;
        cfg.colsb[t + 2] = 64;
    }
    _tile_loadconfig(&cfg);
}

// Block i's sums of 16 rows (x, stride rs) and a group's columns (qs) into tile C, through
// tiles A and B; DP is the tile product (`_tile_dpbssd` for signed weights, `_tile_dpbusd`
// for unsigned).
#define AMX_PRODUCT(DP, C, A, B, x, rs, qs, i)                           \
    do {                                                                 \
        _tile_zero(C);                                                   \
        _tile_loadd(A, (x) + (size_t) (i) * 32, (long) (rs));            \
        _tile_loadd(B, (qs) + (size_t) (i) * 512, 64);                   \
        DP(C, A, B);                                                     \
    } while (0)

// Every block 0 .. nb - 1 of 16 rows against a group, in order: SCALE(i, s) runs for block i
// once its sums are at `s` (16 rows of 16 int32, 64-byte aligned; `sums` is 4 such buffers).
#define AMX_BLOCKS(DP, nb, x, rs, qs, sums, SCALE)                                         \
    for (int i_ = 0; i_ < (nb) + 3; ++i_) {                                                \
        if (i_ < (nb)) {                                                                   \
            switch (i_ & 3) {                                                              \
                case 0: AMX_PRODUCT(DP, 0, 4, 6, x, rs, qs, i_); break;                    \
                case 1: AMX_PRODUCT(DP, 1, 5, 7, x, rs, qs, i_); break;                    \
                case 2: AMX_PRODUCT(DP, 2, 4, 6, x, rs, qs, i_); break;                    \
                default: AMX_PRODUCT(DP, 3, 5, 7, x, rs, qs, i_); break;                   \
            }                                                                              \
        }                                                                                  \
        const int st_ = i_ - 2;                                                            \
        if (st_ >= 0 && st_ < (nb)) {                                                      \
            switch (st_ & 3) {                                                             \
                case 0: _tile_stored(0, (sums)[0], 64); break;                             \
                case 1: _tile_stored(1, (sums)[1], 64); break;                             \
                case 2: _tile_stored(2, (sums)[2], 64); break;                             \
                default: _tile_stored(3, (sums)[3], 64); break;                            \
            }                                                                              \
        }                                                                                  \
        const int sc_ = i_ - 3;                                                            \
        if (sc_ >= 0) {                                                                    \
            SCALE(sc_, (sums)[sc_ & 3]);                                                   \
        }                                                                                  \
    }

// A 16 x 16 block of f32 transposed in registers: r[i] holds row i before, column i after.
static inline __attribute__((always_inline)) void amx_transpose16(__m512 * r) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_shuffle_f32x4(u[i], u[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(u[i], u[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_f32x4(u[i + 8], u[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(u[i + 8], u[i + 12], 0xDD);
    }
    for (int i = 0; i < 8; ++i) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
    }
}

// The results of 16 rows (acc[r]: row r over 16 columns) into dst: rows m .. m + R - 1 of
// columns n0 .. n0 + cols - 1, a column's rows side by side where dst's rows are contiguous.
static inline __attribute__((always_inline)) void amx_store_columns(
    __m512 * acc, struct ggml_tensor * dst, int64_t m, int R, int64_t n0, int cols) {
    amx_transpose16(acc);
    const __mmask16 rows = (__mmask16) ((1u << R) - 1);
    for (int c = 0; c < cols; ++c) {
        char * out = (char *) dst->data + m * dst->nb[0] + (n0 + c) * dst->nb[1];
        if (dst->nb[0] == sizeof(float)) {
            _mm512_mask_storeu_ps(out, rows, acc[c]);
        } else {
            float col[16] __attribute__((aligned(64)));
            _mm512_store_ps(col, acc[c]);
            for (int r = 0; r < R; ++r) {
                *(float *) (out + r * dst->nb[0]) = col[r];
            }
        }
    }
}
