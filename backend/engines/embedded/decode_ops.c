/* The embedded engine's decode step between its linear layers, float32, one call per op for all rows
 * (AVX2, FMA): RMSNorm, rotary embedding with the write of the new keys and values into the cache,
 * attention of each row over its own positions, and the SiLU-gated product of the MLP; and after the
 * output layer, the draw of each row's next token from its logits (`draw`, sampler.py).
 *
 * In PyTorch each of these is several small ops (a decode layer about 40), each a dispatch of a few
 * microseconds on tensors of a few kilobytes, and attention goes through a masked
 * scaled_dot_product_attention that computes every row up to the longest one. Here every row is
 * computed on its own (its result does not depend on the other rows) and attention reads a row's
 * positions 0..length-1 only.
 *
 * The values are PyTorch's to float32 rounding: rotary embedding is bit for bit the same (this file
 * is built with -ffp-contract=off, so x * cos - y * sin is two rounded products and a rounded
 * difference, as in PyTorch); sums (the mean of squares, dot products, softmax) add in another
 * order, and exp is Cephes' single-precision polynomial (within 2 ulp), as PyTorch's vectorized exp
 * is a polynomial of its own.
 *
 * The row cache's keys and values are float32 or float16 (`half`): float16 halves what attention
 * reads, which grows with every position; F16C rounds on the write (to nearest even, as PyTorch
 * rounds a float32 to float16) and widens exactly on the read, and the sums are float32 either way.
 *
 * Every function takes the addresses of contiguous buffers; the caller (decode_ops.py) checks
 * shapes, types and layout. `available()` says whether this CPU has AVX2, FMA and F16C.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define DECODE_OPS_X86 1
#include <immintrin.h>

#include "lane_sum.h"

#define TARGET __attribute__((target("avx2,fma,f16c")))

/* exp(x) for 8 floats (Cephes' expf): x = n ln 2 + r, |r| <= ln 2 / 2, exp(r) by a degree-6
 * polynomial, times 2^n. Inputs are clamped to [-87, 88], where 2^n stays a normal float. */
TARGET static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

/* Lanes i < count set, the others clear: a mask for the last, partial group of 8. */
TARGET static inline __m256 first_lanes(Py_ssize_t count) {
    const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)count), index));
}

/* out[r] = weight * (x[r] / sqrt(mean(x[r]^2) + eps)) for R rows of D floats, D a multiple of 8. */
TARGET static void rms_norm_rows(float *out, const float *x, const float *weight, Py_ssize_t R, Py_ssize_t D,
                                 float eps) {
    for (Py_ssize_t r = 0; r < R; r++) {
        const float *row = x + r * D;
        float *dst = out + r * D;
        __m256 s0 = _mm256_setzero_ps(), s1 = s0;
        Py_ssize_t i = 0;
        for (; i + 16 <= D; i += 16) {
            __m256 a = _mm256_loadu_ps(row + i), b = _mm256_loadu_ps(row + i + 8);
            s0 = _mm256_fmadd_ps(a, a, s0);
            s1 = _mm256_fmadd_ps(b, b, s1);
        }
        for (; i < D; i += 8) {
            __m256 a = _mm256_loadu_ps(row + i);
            s0 = _mm256_fmadd_ps(a, a, s0);
        }
        const __m256 inv = _mm256_set1_ps(1.0f / sqrtf(hsum(_mm256_add_ps(s0, s1)) / (float)D + eps));
        for (i = 0; i < D; i += 8) {
            __m256 normed = _mm256_mul_ps(_mm256_loadu_ps(row + i), inv);
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(weight + i), normed));
        }
    }
}

/* dst = x * cos + rotate_half(x) * sin for one head of D floats (D / 2 a multiple of 8). */
TARGET static void rotate_head(float *dst, const float *x, const float *cos, const float *sin, Py_ssize_t D) {
    const Py_ssize_t half = D / 2;
    for (Py_ssize_t i = 0; i < half; i += 8) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + half + i);
        _mm256_storeu_ps(dst + i, _mm256_sub_ps(_mm256_mul_ps(a, _mm256_loadu_ps(cos + i)),
                                                _mm256_mul_ps(b, _mm256_loadu_ps(sin + i))));
        _mm256_storeu_ps(dst + half + i, _mm256_add_ps(_mm256_mul_ps(b, _mm256_loadu_ps(cos + half + i)),
                                                       _mm256_mul_ps(a, _mm256_loadu_ps(sin + half + i))));
    }
}

/* Eight of the cache's values at element `i` of p, as floats: the cache holds float32, or float16
 * where `half` (widened exactly by F16C's vcvtph2ps). */
TARGET static inline __attribute__((always_inline)) __m256 load_kv(const void *p, Py_ssize_t i, const int half) {
    if (half)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_loadu_ps((const float *)p + i);
}

/* The address of element `i` of the cache at p (float32, or float16 where `half`). */
static inline __attribute__((always_inline)) const void *kv_at(const void *p, Py_ssize_t i, const int half) {
    return (const char *)p + i * (half ? 2 : 4);
}

/* q . k for one key k of the cache (D values). */
TARGET static inline __attribute__((always_inline)) float dot(const float *a, const void *b, Py_ssize_t D,
                                                              const int half) {
    __m256 c0 = _mm256_setzero_ps(), c1 = c0;
    Py_ssize_t i = 0;
    for (; i + 16 <= D; i += 16) {
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_kv(b, i, half), c0);
        c1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load_kv(b, i + 8, half), c1);
    }
    for (; i < D; i += 8)
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_kv(b, i, half), c0);
    return hsum(_mm256_add_ps(c0, c1));
}

/* scores[h * stride + c] = scale * (q[h] . key c) for `heads` <= 3 query heads q + h * D and the four
 * keys k[0..3] (D of the cache's values each): each key chunk loaded once for all the heads, twelve
 * accumulators, so that a product costs fewer loads than one (the loads bounded the one-head-at-a-
 * time products). Inlined with constant `heads` and `half`. */
TARGET static inline __attribute__((always_inline)) void scores4(float *scores, Py_ssize_t stride, const float *q,
                                                                 const void *const k[4], Py_ssize_t D,
                                                                 float scale, const int heads, const int half) {
    __m256 acc[3][4];
    for (int h = 0; h < 3; h++)
        for (int c = 0; c < 4; c++)
            acc[h][c] = _mm256_setzero_ps();
    for (Py_ssize_t i = 0; i < D; i += 8) {
        __m256 qs[3];
        for (int h = 0; h < heads; h++)
            qs[h] = _mm256_loadu_ps(q + h * D + i);
        for (int c = 0; c < 4; c++) {
            const __m256 key = load_kv(k[c], i, half);
            for (int h = 0; h < heads; h++)
                acc[h][c] = _mm256_fmadd_ps(qs[h], key, acc[h][c]);
        }
    }
    for (int h = 0; h < heads; h++) {
        /* lane c of the four sums: pairs, then quads, within each half; then the halves added */
        const __m256 pairs = _mm256_hadd_ps(_mm256_hadd_ps(acc[h][0], acc[h][1]), _mm256_hadd_ps(acc[h][2], acc[h][3]));
        const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1));
        _mm_storeu_ps(scores + h * stride, _mm_mul_ps(sums, _mm_set1_ps(scale)));
    }
}

/* The most query heads that share one kv head (`attention` refuses more). */
#define MAX_GROUP 64

/* The largest head the ops take (`rope_store` rotates a key head on the stack). */
#define MAX_D 1024

/* softmax in place over scores[0:length]; returns 1 / the sum of the exponentials. The buffer holds
 * length rounded up to 8 floats. */
TARGET static float softmax_unscaled(float *scores, Py_ssize_t length) {
    float top = scores[0];
    for (Py_ssize_t t = 1; t < length; t++)
        top = scores[t] > top ? scores[t] : top;
    const __m256 vtop = _mm256_set1_ps(top);
    __m256 total = _mm256_setzero_ps();
    for (Py_ssize_t t = 0; t < length; t += 8) {
        const __m256 keep = first_lanes(length - t);
        const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + t), vtop)), keep);
        _mm256_storeu_ps(scores + t, e);
        total = _mm256_add_ps(total, e);
    }
    return 1.0f / hsum(total);
}

/* Positions whose keys and values are asked for ahead of the one attended, and those of the next
 * (row, kv head) before it starts: each pair's positions lie in their own part of the cache, far from
 * the last pair's, and a row's positions cross a 4 KB page every 16 (D = 64), where the hardware's
 * prefetcher stops. Attention of 32 rows over 16-160 positions, 30 layers' caches (cold), took
 * 0.74-0.85x the time of the same code without these requests, timed against it in one process on
 * the AVX2 development machine. */
#define AHEAD 16

/* Ask for `count` of the cache's values at p (float32, or float16 where `half`; whole cache lines)
 * to be brought into the cache. A prefetch is a hint: one past the end of the cache's memory is
 * harmless. */
static inline __attribute__((always_inline)) void ahead(const void *p, Py_ssize_t count, const int half) {
    const Py_ssize_t bytes = count * (half ? 2 : 4);
    for (Py_ssize_t i = 0; i < bytes; i += 64)
        __builtin_prefetch((const char *)p + i);
}

/* out[h, 0:8 parts] = inv[h] * sum over t < length of p[h * stride + t] * value t [0:8 parts], value t
 * being values + t * D for t < shared (the prompt, read from the row that holds it for all rows of
 * its request) and own_values + t * D after (the cache's values: float16 where `half`); for `heads`
 * <= 3 heads and `parts` <= 4 vectors of 8 floats. Inlined where called with constants, so that the
 * accumulators stay in registers. */
TARGET static inline __attribute__((always_inline)) void weigh_values(float *out, const void *values,
                                                                      const void *own_values,
                                                                      Py_ssize_t shared, const float *p,
                                                                      Py_ssize_t stride, const float *inv,
                                                                      Py_ssize_t length, Py_ssize_t D,
                                                                      const int heads, const int parts,
                                                                      const int half) {
    __m256 acc[3][4];
    for (int h = 0; h < 3; h++)
        for (int c = 0; c < 4; c++)
            acc[h][c] = _mm256_setzero_ps();
    for (Py_ssize_t t = 0; t < length; t++) {
        const void *v = kv_at(t < shared ? values : own_values, t * D, half);
        if (t + AHEAD < length)
            ahead(kv_at(t + AHEAD < shared ? values : own_values, (t + AHEAD) * D, half), 32, half);
        /* the heads' weights, then each vector of the value once for all of them: 12 accumulators,
         * 3 weights and 1 vector in AVX2's 16 registers (a value's 4 vectors at once spilled one to
         * the stack: attention of 32 rows over 102 positions, 30 layers, caches warm, took 5.2 ms
         * that way and 4.2 this, the same sums in the same order; read from memory, 9-10 ms both) */
        __m256 weight[3];
        for (int h = 0; h < heads; h++)
            weight[h] = _mm256_set1_ps(p[h * stride + t]);
        for (int c = 0; c < parts; c++) {
            const __m256 part = load_kv(v, 8 * c, half);
            for (int h = 0; h < heads; h++)
                acc[h][c] = _mm256_fmadd_ps(weight[h], part, acc[h][c]);
        }
    }
    for (int h = 0; h < heads; h++)
        for (int c = 0; c < parts; c++)
            _mm256_storeu_ps(out + h * D + 8 * c, _mm256_mul_ps(acc[h][c], _mm256_set1_ps(inv[h])));
}

/* The `group` query heads q[group, D] of one kv head over its first `length` positions:
 * out[j] = softmax_t(scale * q[j] . key t) . value t, where key and value t are keys/values + t * D
 * for t < shared (the request's prompt, the same in each of its rows, read from one row for all of
 * them) and own_keys/own_values + t * D after. Keys and values are read once for all the group's
 * heads (four keys at a time, each chunk loaded once for three heads: `scores4`; the values in
 * slices of 32, three heads weighed at a time). Each score is
 * summed the same way wherever `shared` falls. `scores` holds group * stride floats, stride >=
 * length rounded up to 8; D is a multiple of 8. */
TARGET static inline __attribute__((always_inline)) void attend_group(
    float *out, const float *q, const void *keys, const void *values, const void *own_keys, const void *own_values,
    Py_ssize_t shared, Py_ssize_t length, Py_ssize_t group, Py_ssize_t D, float scale, float *scores,
    Py_ssize_t stride, const int half) {
    Py_ssize_t t = 0;
    for (; t + 4 <= length; t += 4) {
        const void *k[4];
        for (int j = 0; j < 4; j++)
            k[j] = kv_at(t + j < shared ? keys : own_keys, (t + j) * D, half);
        if (t + AHEAD + 4 <= length)
            ahead(kv_at(t + AHEAD < shared ? keys : own_keys, (t + AHEAD) * D, half), 4 * D, half);
        for (Py_ssize_t first = 0; first < group; first += 3) {
            float *at = scores + first * stride + t;
            if (group - first >= 3) /* the common case, with constant bounds: accumulators in registers */
                scores4(at, stride, q + first * D, k, D, scale, 3, half);
            else if (group - first == 2)
                scores4(at, stride, q + first * D, k, D, scale, 2, half);
            else
                scores4(at, stride, q + first * D, k, D, scale, 1, half);
        }
    }
    for (; t < length; t++)
        for (Py_ssize_t j = 0; j < group; j++)
            scores[j * stride + t] = dot(q + j * D, kv_at(t < shared ? keys : own_keys, t * D, half), D, half) * scale;
    float inv[MAX_GROUP];
    for (Py_ssize_t j = 0; j < group; j++)
        inv[j] = softmax_unscaled(scores + j * stride, length);
    for (Py_ssize_t i = 0; i < D; i += 32) {
        const int parts = D - i < 32 ? (int)((D - i) / 8) : 4;
        const void *v = kv_at(values, i, half), *own_v = kv_at(own_values, i, half);
        for (Py_ssize_t first = 0; first < group; first += 3) {
            const int heads = group - first < 3 ? (int)(group - first) : 3;
            float *o = out + first * D + i;
            const float *p = scores + first * stride;
            if (heads == 3 && parts == 4) /* the common case, with constant bounds: accumulators in registers */
                weigh_values(o, v, own_v, shared, p, stride, inv + first, length, D, 3, 4, half);
            else
                weigh_values(o, v, own_v, shared, p, stride, inv + first, length, D, heads, parts, half);
        }
    }
}

/* attend_group on a float32 cache and on a float16 one, each compiled with its loads inlined. */
TARGET static void attend_group_f32(float *out, const float *q, const void *keys, const void *values,
                                    const void *own_keys, const void *own_values, Py_ssize_t shared,
                                    Py_ssize_t length, Py_ssize_t group, Py_ssize_t D, float scale, float *scores,
                                    Py_ssize_t stride) {
    attend_group(out, q, keys, values, own_keys, own_values, shared, length, group, D, scale, scores, stride, 0);
}

TARGET static void attend_group_f16(float *out, const float *q, const void *keys, const void *values,
                                    const void *own_keys, const void *own_values, Py_ssize_t shared,
                                    Py_ssize_t length, Py_ssize_t group, Py_ssize_t D, float scale, float *scores,
                                    Py_ssize_t stride) {
    attend_group(out, q, keys, values, own_keys, own_values, shared, length, group, D, scale, scores, stride, 1);
}

/* D floats from `from` into the cache at `to`: copied (float32), or rounded to float16 where `half`
 * (F16C's vcvtps2ph, to nearest even: as PyTorch rounds float32 to float16). */
TARGET static void store_kv(void *to, const float *from, Py_ssize_t D, int half) {
    if (!half) {
        memcpy(to, from, (size_t)D * sizeof(float));
        return;
    }
    for (Py_ssize_t i = 0; i < D; i += 8)
        _mm_storeu_si128((__m128i *)((uint16_t *)to + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(from + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* out[R, 2I] -> out[R, I]: silu(gate) * up, each row of gate_up being [gate (I), up (I)]. */
TARGET static void silu_mul_rows(float *out, const float *gate_up, Py_ssize_t R, Py_ssize_t I) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (Py_ssize_t r = 0; r < R; r++) {
        const float *gate = gate_up + r * 2 * I, *up = gate + I;
        float *dst = out + r * I;
        for (Py_ssize_t i = 0; i < I; i += 8) {
            const __m256 g = _mm256_loadu_ps(gate + i);
            const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, g))));
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
        }
    }
}

/* Floats of the draw's blocks: a plain row's total is summed a block at a time, and its draw finds
 * its block from the blocks' sums before it walks the block's tokens one by one. */
#define DRAW_BLOCK 256

/* A weight's bucket: its float bits above the lowest 20 (the exponent and the mantissa's top three
 * bits, eight buckets an octave). Weights are in [0, 1], so buckets run 0..BUCKETS - 1, heavier
 * weights in higher buckets. */
#define BUCKET_SHIFT 20
#define BUCKETS ((0x3F800000 >> BUCKET_SHIFT) + 1)

/* A gathered token as one sortable integer: its weight's bits (a float >= 0 orders as its bits do)
 * above its id counted down, so that larger integers are heavier, equal weights lower ids first. */
static inline uint64_t packed(float weight, int64_t id) {
    uint32_t bits;
    memcpy(&bits, &weight, sizeof bits);
    return ((uint64_t)bits << 32) | (uint32_t)(UINT32_MAX - (uint32_t)id);
}

static inline float packed_weight(uint64_t key) {
    const uint32_t bits = (uint32_t)(key >> 32);
    float weight;
    memcpy(&weight, &bits, sizeof weight);
    return weight;
}

static inline int64_t packed_id(uint64_t key) { return (int64_t)(UINT32_MAX - (uint32_t)key); }

static int larger_first(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

/* The first index of the largest of V logits (as torch.argmax, NaN aside). */
static int64_t first_largest(const float *x, Py_ssize_t V) {
    int64_t best = 0;
    for (Py_ssize_t i = 1; i < V; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* e[i] = exp((x[i] - top) * (1 / T)) for V logits, top their largest (so that the largest weighs 1,
 * and a temperature near 0 leaves the largest alone rather than overflowing),
 * 0 where that exponent is below -87 (whose float exp would be subnormal); blocks[b] = the sum of
 * block b's weights (DRAW_BLOCK of them, in eight lanes, then `hsum`). Returns the blocks' sum, added
 * in order. */
TARGET static float weigh_logits(float *e, float *blocks, const float *x, Py_ssize_t V, float T) {
    float top = x[0];
    Py_ssize_t i = 0;
    if (V >= 8) { /* eight lanes' largest (a NaN lane keeps the lane's value), then across them */
        __m256 most = _mm256_loadu_ps(x);
        for (i = 8; i + 8 <= V; i += 8)
            most = _mm256_max_ps(_mm256_loadu_ps(x + i), most);
        float lanes[8];
        _mm256_storeu_ps(lanes, most);
        top = lanes[0];
        for (int lane = 1; lane < 8; lane++)
            top = lanes[lane] > top ? lanes[lane] : top;
    }
    for (; i < V; i++)
        top = x[i] > top ? x[i] : top;
    const float inverse = 1.0f / T;
    const __m256 vinverse = _mm256_set1_ps(inverse), vtop = _mm256_set1_ps(top), floor = _mm256_set1_ps(-87.0f);
    float total = 0.0f;
    for (Py_ssize_t start = 0, b = 0; start < V; start += DRAW_BLOCK, b++) {
        const Py_ssize_t end = start + DRAW_BLOCK < V ? start + DRAW_BLOCK : V;
        __m256 sum = _mm256_setzero_ps();
        for (i = start; i + 8 <= end; i += 8) {
            const __m256 s = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vtop), vinverse);
            const __m256 w = _mm256_and_ps(exp8(s), _mm256_cmp_ps(s, floor, _CMP_GE_OQ));
            _mm256_storeu_ps(e + i, w);
            sum = _mm256_add_ps(sum, w);
        }
        float block = hsum(sum);
        for (; i < end; i++) { /* V not a multiple of 8: the last few one at a time, the same exp */
            const float s = (x[i] - top) * inverse;
            e[i] = s >= -87.0f ? _mm256_cvtss_f32(exp8(_mm256_set1_ps(s))) : 0.0f;
            block += e[i];
        }
        blocks[b] = block;
        total += block;
    }
    return total;
}

/* The token of a row drawn in proportion to its weights e[V] (blocks' sums `blocks`, adding up to
 * `total`) at uniform u in [0, 1): the first token whose running sum exceeds u * total, the blocks
 * summed in order, then the tokens of the block reached one by one. Where rounding leaves the walk
 * short of the target, the last token of weight > 0 in the block it ends in. */
static int64_t walk_weights(const float *e, const float *blocks, Py_ssize_t V, float total, float u) {
    const float target = u * total;
    float before = 0.0f;
    const Py_ssize_t count = (V + DRAW_BLOCK - 1) / DRAW_BLOCK;
    Py_ssize_t b = 0;
    while (b + 1 < count && before + blocks[b] <= target)
        before += blocks[b++];
    const Py_ssize_t start = b * DRAW_BLOCK, end = start + DRAW_BLOCK < V ? start + DRAW_BLOCK : V;
    int64_t last = -1;
    for (Py_ssize_t i = start; i < end; i++) {
        if (e[i] > 0.0f)
            last = i;
        before += e[i];
        if (before > target && e[i] > 0.0f)
            return i;
    }
    return last >= 0 ? last : first_largest(e, V);
}

/* First gathered at or above this share of the heaviest weight (which is 1), then at its square, its
 * cube, ..., then every token: where the first hold every token a truncated row keeps, as they mostly
 * do, the rest of its work is on a few hundred tokens. */
#define FIRST_THRESHOLD 0x1p-12f

/* keys[0:count] = the tokens of weight >= threshold (and > 0) among e[V], packed, in id order;
 * *mass = their mass. Eight weights compared at a time. */
TARGET static Py_ssize_t gather(uint64_t *keys, double *mass, const float *e, Py_ssize_t V, float threshold) {
    Py_ssize_t count = 0, i = 0;
    double sum = 0.0;
    const __m256 at_least = _mm256_set1_ps(threshold), zero = _mm256_setzero_ps();
    for (; i + 8 <= V; i += 8) {
        const __m256 w = _mm256_loadu_ps(e + i);
        unsigned lanes = (unsigned)_mm256_movemask_ps(
            _mm256_and_ps(_mm256_cmp_ps(w, at_least, _CMP_GE_OQ), _mm256_cmp_ps(w, zero, _CMP_GT_OQ)));
        while (lanes) {
            const int lane = __builtin_ctz(lanes);
            lanes &= lanes - 1;
            keys[count++] = packed(e[i + lane], i + lane);
            sum += e[i + lane];
        }
    }
    for (; i < V; i++)
        if (e[i] >= threshold && e[i] > 0.0f) {
            keys[count++] = packed(e[i], i);
            sum += e[i];
        }
    *mass = sum;
    return count;
}

/* The token of a truncated row (HF's order: its k heaviest tokens, then the smallest prefix of those
 * whose mass reaches top_p of theirs) drawn at u from its weights e[V] (`weigh_logits`, adding up to
 * `total`). The tokens of weight >= FIRST_THRESHOLD are gathered (at a lower threshold, down to every
 * token > 0, where those are fewer than k, or, without k, hold less than top_p of the whole mass);
 * their count and mass in each
 * weight bucket, from the heaviest bucket down, give the first bucket by which at least k tokens
 * (where 0 < k < V) or else top_p of the whole mass are reached. The gathered tokens at or above it
 * (each outweighs every token below) are sorted heaviest first, equal weights by id; a token is kept
 * while the mass before it is below top_p times the mass of the k heaviest (the whole mass where k
 * is 0 or >= V); the draw is the first kept token whose running sum exceeds u times the kept mass.
 * `keys` holds V, `counts` and `masses` BUCKETS. */
TARGET static int64_t draw_truncated(const float *e, Py_ssize_t V, float total, int64_t k, float top_p, float u,
                                     uint64_t *keys, int64_t *counts, double *masses) {
    const int by_k = k > 0 && k < V;
    const double wanted = (double)top_p * total;
    double mass;
    Py_ssize_t gathered = 0;
    for (float threshold = FIRST_THRESHOLD;; threshold *= FIRST_THRESHOLD) {
        if (threshold < 0x1p-100f) /* the last: every weight above 0 */
            threshold = 0.0f;
        gathered = gather(keys, &mass, e, V, threshold);
        if (threshold == 0.0f || (by_k ? gathered >= k : mass >= wanted))
            break;
    }
    if (gathered == 0) /* no weight above 0 (every logit NaN) */
        return 0;
    memset(counts, 0, BUCKETS * sizeof *counts);
    memset(masses, 0, BUCKETS * sizeof *masses);
    for (Py_ssize_t j = 0; j < gathered; j++) {
        const uint32_t bucket = (uint32_t)(keys[j] >> 32) >> BUCKET_SHIFT;
        counts[bucket]++;
        masses[bucket] += packed_weight(keys[j]);
    }
    int64_t count = 0;
    mass = 0.0;
    int bucket = BUCKETS - 1;
    for (; bucket > 0; bucket--) {
        count += counts[bucket];
        mass += masses[bucket];
        if (by_k ? count >= k : mass >= wanted)
            break;
    }
    const uint64_t lowest = (uint64_t)((uint32_t)bucket << BUCKET_SHIFT) << 32;
    Py_ssize_t kept = 0;
    for (Py_ssize_t j = 0; j < gathered; j++)
        if (keys[j] >= lowest)
            keys[kept++] = keys[j];
    gathered = kept;
    qsort(keys, (size_t)gathered, sizeof *keys, larger_first);
    Py_ssize_t limit = by_k && k < gathered ? (Py_ssize_t)k : gathered;
    float whole = total;
    if (by_k) {
        whole = 0.0f;
        for (Py_ssize_t j = 0; j < limit; j++)
            whole += packed_weight(keys[j]);
    }
    float before = 0.0f;
    Py_ssize_t j = 0;
    if (top_p < 1.0f) {
        const float reach = top_p * whole;
        while (j < limit && before < reach)
            before += packed_weight(keys[j++]);
        limit = j;
    } else {
        for (; j < limit; j++)
            before += packed_weight(keys[j]);
    }
    const float target = u * before;
    float running = 0.0f;
    for (j = 0; j < limit; j++) {
        running += packed_weight(keys[j]);
        if (running > target)
            return packed_id(keys[j]);
    }
    return packed_id(keys[limit - 1]);
}
#endif

static PyObject *available(PyObject *self, PyObject *unused) {
#ifdef DECODE_OPS_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

#define PTR(type, address) ((type *)(uintptr_t)(address))

#ifndef DECODE_OPS_X86
static PyObject *unbuilt(void) {
    PyErr_SetString(PyExc_RuntimeError, "decode_ops: built without AVX2 support");
    return NULL;
}
#endif

/* rms_norm(out, x, weight, rows, D, eps): D a multiple of 8. Runs without the GIL. */
static PyObject *rms_norm(PyObject *self, PyObject *args) {
    unsigned long long out, x, weight;
    Py_ssize_t R, D;
    float eps;
    if (!PyArg_ParseTuple(args, "KKKnnf", &out, &x, &weight, &R, &D, &eps))
        return NULL;
    if (R < 0 || D <= 0 || D % 8) {
        PyErr_SetString(PyExc_ValueError, "decode_ops.rms_norm: rows >= 0, D > 0 and a multiple of 8");
        return NULL;
    }
#ifdef DECODE_OPS_X86
    Py_BEGIN_ALLOW_THREADS
    rms_norm_rows(PTR(float, out), PTR(const float, x), PTR(const float, weight), R, D, eps);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    return unbuilt();
#endif
}

/* rope_store(q, qkv, cos, sin, table_rows, positions, keys, values, rows, heads, kv_heads, D,
 * capacity): row r of qkv[rows, (heads + 2 kv_heads) D] holds q, k, v at position positions[r]
 * (int64); q and k are rotated by cos/sin[positions[r]] (tables [table_rows, D]); q goes to
 * q[rows, heads, D], k and v to keys/values[r, kv, positions[r]] of caches [*, kv_heads, capacity,
 * D]. Runs without the GIL. */
static PyObject *rope_store(PyObject *self, PyObject *args) {
    unsigned long long q, qkv, cos, sin, positions, keys, values;
    Py_ssize_t table_rows, R, H, KV, D, capacity;
    int half = 0;
    if (!PyArg_ParseTuple(args, "KKKKnKKKnnnnn|p", &q, &qkv, &cos, &sin, &table_rows, &positions, &keys, &values, &R,
                          &H, &KV, &D, &capacity, &half))
        return NULL;
    if (R < 0 || H <= 0 || KV <= 0 || D <= 0 || D % 16 || D > MAX_D || capacity <= 0) {
        PyErr_SetString(PyExc_ValueError, "decode_ops.rope_store: sizes > 0 and D a multiple of 16, at most 1024");
        return NULL;
    }
#ifdef DECODE_OPS_X86
    const int64_t *at = PTR(const int64_t, positions);
    for (Py_ssize_t r = 0; r < R; r++)
        if (at[r] < 0 || at[r] >= capacity || at[r] >= table_rows) {
            PyErr_SetString(PyExc_ValueError, "decode_ops.rope_store: a position outside the cache or the tables");
            return NULL;
        }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < R; r++) {
        const Py_ssize_t p = (Py_ssize_t)at[r];
        const float *c = PTR(const float, cos) + p * D, *s = PTR(const float, sin) + p * D;
        const float *row = PTR(const float, qkv) + r * (H + 2 * KV) * D;
        for (Py_ssize_t h = 0; h < H; h++)
            rotate_head(PTR(float, q) + (r * H + h) * D, row + h * D, c, s, D);
        for (Py_ssize_t h = 0; h < KV; h++) {
            const Py_ssize_t slot = ((r * KV + h) * capacity + p) * D;
            float rotated[MAX_D];
            rotate_head(rotated, row + (H + h) * D, c, s, D);
            store_kv((char *)PTR(void, keys) + slot * (half ? 2 : 4), rotated, D, half);
            store_kv((char *)PTR(void, values) + slot * (half ? 2 : 4), row + (H + KV + h) * D, D, half);
        }
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    return unbuilt();
#endif
}

/* attention(out, q, keys, values, lengths, sources, shared, rows, kv_heads, group, D, capacity,
 * scale): for row r and query head h = kv * group + j of q[rows, kv_heads * group, D], out[r, h] =
 * softmax over t < lengths[r] of scale * q[r, h] . keys[r, kv, t], times values[r, kv, t]; caches
 * [*, kv_heads, capacity, D]. Positions t < shared[r] are read from row sources[r] instead, which
 * holds the same keys and values there (the rows of one request share its prompt): rows read their
 * prompt from one place, which stays in cache from one row to the next. int64 lengths, sources and
 * shared. Runs without the GIL. */
static PyObject *attention(PyObject *self, PyObject *args) {
    unsigned long long out, q, keys, values, lengths, sources, shared;
    Py_ssize_t R, KV, group, D, capacity;
    float scale;
    int half = 0;
    if (!PyArg_ParseTuple(args, "KKKKKKKnnnnnf|p", &out, &q, &keys, &values, &lengths, &sources, &shared, &R, &KV,
                          &group, &D, &capacity, &scale, &half))
        return NULL;
    if (R < 0 || KV <= 0 || group <= 0 || group > MAX_GROUP || D <= 0 || D % 8 || capacity <= 0) {
        PyErr_SetString(PyExc_ValueError, "decode_ops.attention: sizes > 0, D a multiple of 8, group <= 64");
        return NULL;
    }
#ifdef DECODE_OPS_X86
    const int64_t *length = PTR(const int64_t, lengths), *source = PTR(const int64_t, sources);
    const int64_t *prefix = PTR(const int64_t, shared);
    for (Py_ssize_t r = 0; r < R; r++) {
        if (length[r] < 1 || length[r] > capacity) {
            PyErr_SetString(PyExc_ValueError, "decode_ops.attention: a length outside 1..capacity");
            return NULL;
        }
        if (source[r] < 0 || source[r] >= R || prefix[r] < 0) {
            PyErr_SetString(PyExc_ValueError, "decode_ops.attention: a source row outside the rows");
            return NULL;
        }
    }
    const Py_ssize_t stride = (capacity + 7) / 8 * 8;
    float *scores = malloc((size_t)(group * stride) * sizeof(float));
    if (scores == NULL)
        return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < R; r++)
        for (Py_ssize_t kv = 0; kv < KV; kv++) {
            const Py_ssize_t own = (r * KV + kv) * capacity * D, from = (source[r] * KV + kv) * capacity * D;
            const Py_ssize_t head = (r * KV + kv) * group * D;
            const void *k = PTR(const void, keys), *v = PTR(const void, values);
            if (r + 1 < R || kv + 1 < KV) { /* the next pair's first own positions */
                const Py_ssize_t next = r * KV + kv + 1, row = next / KV;
                const Py_ssize_t first = prefix[row] < length[row] ? prefix[row] : length[row];
                const Py_ssize_t count = (length[row] - first < AHEAD ? length[row] - first : AHEAD) * D;
                ahead(kv_at(k, (next * capacity + first) * D, half), count, half);
                ahead(kv_at(v, (next * capacity + first) * D, half), count, half);
            }
            (half ? attend_group_f16 : attend_group_f32)(
                PTR(float, out) + head, PTR(const float, q) + head, kv_at(k, from, half), kv_at(v, from, half),
                kv_at(k, own, half), kv_at(v, own, half), (Py_ssize_t)prefix[r], (Py_ssize_t)length[r], group, D,
                scale, scores, stride);
        }
    Py_END_ALLOW_THREADS
    free(scores);
    Py_RETURN_NONE;
#else
    return unbuilt();
#endif
}

/* silu_mul(out, gate_up, rows, I): out[rows, I] = silu(gate) * up, I a multiple of 8. Runs without
 * the GIL. */
static PyObject *silu_mul(PyObject *self, PyObject *args) {
    unsigned long long out, gate_up;
    Py_ssize_t R, I;
    if (!PyArg_ParseTuple(args, "KKnn", &out, &gate_up, &R, &I))
        return NULL;
    if (R < 0 || I <= 0 || I % 8) {
        PyErr_SetString(PyExc_ValueError, "decode_ops.silu_mul: rows >= 0, I > 0 and a multiple of 8");
        return NULL;
    }
#ifdef DECODE_OPS_X86
    Py_BEGIN_ALLOW_THREADS
    silu_mul_rows(PTR(float, out), PTR(const float, gate_up), R, I);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    return unbuilt();
#endif
}

/* draw(tokens, logits, temperatures, top_p, top_k, uniforms, rows, V): the next token of each row
 * of logits[rows, V] (float32) into tokens[rows] (int64): the first largest logit where its
 * temperature <= 0, else drawn at its uniform in [0, 1) from the softmax of logits / temperature,
 * restricted to its top_k tokens (0 or >= V: all) and then its top_p nucleus (>= 1: all). Each row
 * on its own. Runs without the GIL. */
static PyObject *draw(PyObject *self, PyObject *args) {
    unsigned long long tokens, logits, temperatures, top_ps, top_ks, uniforms;
    Py_ssize_t R, V;
    if (!PyArg_ParseTuple(args, "KKKKKKnn", &tokens, &logits, &temperatures, &top_ps, &top_ks, &uniforms, &R, &V))
        return NULL;
    if (R < 0 || V <= 0) {
        PyErr_SetString(PyExc_ValueError, "decode_ops.draw: rows >= 0, V > 0");
        return NULL;
    }
#ifdef DECODE_OPS_X86
    if (V > (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "decode_ops.draw: a vocabulary of at most 2^32 tokens");
        return NULL;
    }
    const Py_ssize_t blocks = (V + DRAW_BLOCK - 1) / DRAW_BLOCK;
    float *e = malloc((size_t)(V + blocks) * sizeof(float));
    uint64_t *keys = malloc((size_t)V * sizeof(uint64_t));
    int64_t *counts = malloc(BUCKETS * sizeof(int64_t));
    double *masses = malloc(BUCKETS * sizeof(double));
    if (e == NULL || keys == NULL || counts == NULL || masses == NULL) {
        free(e);
        free(keys);
        free(counts);
        free(masses);
        return PyErr_NoMemory();
    }
    int64_t *out = PTR(int64_t, tokens);
    const float *T = PTR(const float, temperatures), *p = PTR(const float, top_ps), *u = PTR(const float, uniforms);
    const int64_t *k = PTR(const int64_t, top_ks);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < R; r++) {
        const float *x = PTR(const float, logits) + r * V;
        if (T[r] <= 0.0f) {
            out[r] = first_largest(x, V);
            continue;
        }
        const float total = weigh_logits(e, e + V, x, V, T[r]);
        if ((k[r] <= 0 || k[r] >= V) && p[r] >= 1.0f)
            out[r] = walk_weights(e, e + V, V, total, u[r]);
        else
            out[r] = draw_truncated(e, V, total, k[r], p[r], u[r], keys, counts, masses);
    }
    Py_END_ALLOW_THREADS
    free(e);
    free(keys);
    free(counts);
    free(masses);
    Py_RETURN_NONE;
#else
    return unbuilt();
#endif
}

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS, "Whether this CPU has AVX2 and FMA (and the build uses them)."},
    {"rms_norm", rms_norm, METH_VARARGS, "rms_norm(out, x, weight, rows, D, eps), float32 by address."},
    {"rope_store", rope_store, METH_VARARGS,
     "rope_store(q, qkv, cos, sin, table_rows, positions, keys, values, rows, heads, kv_heads, D, capacity)."},
    {"attention", attention, METH_VARARGS,
     "attention(out, q, keys, values, lengths, sources, shared, rows, kv_heads, group, D, capacity, scale)."},
    {"silu_mul", silu_mul, METH_VARARGS, "silu_mul(out, gate_up, rows, I), float32 by address."},
    {"draw", draw, METH_VARARGS, "draw(tokens, logits, temperatures, top_p, top_k, uniforms, rows, V), by address."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decode_ops",
                                    "The decode step's small ops, float32, for few rows (AVX2, FMA).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__decode_ops(void) { return PyModule_Create(&module); }
