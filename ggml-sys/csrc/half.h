// f16 to f32 for this crate's kernels, inlined: one F16C instruction where the level has it,
// ggml's conversion otherwise. Both are exact, so every level gets the same value. (ggml's own
// function is out of line: called once per weight block, it cost a tenth of a product's time.)
#ifndef GGML_SYS_HALF_H
#define GGML_SYS_HALF_H

#include <stdint.h>

#include "ggml.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline float ggml_sys_f16(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return ggml_fp16_to_fp32(h);
#endif
}

#endif
