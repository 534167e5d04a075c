/* The horizontal sum of eight float lanes, as both C parts of the embedded engine (rows_linear.c,
 * decode_ops.c) finish their dot products: the upper half added to the lower, then pairs, then the
 * last two. One definition, so that both sum in the same order. x86-64 with GCC or Clang only. */
#ifndef EMBEDDED_LANE_SUM_H
#define EMBEDDED_LANE_SUM_H

#include <immintrin.h>

__attribute__((target("avx"))) static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    lo = _mm_add_ps(lo, _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
    return _mm_cvtss_f32(lo);
}

#endif
