/* The `int8-exact` path's C parts: rows turned and rounded to int8, and int8 products summed in
 * int32, exactly.
 *
 * `rotate_quantize` takes float32 rows [rows, K] (K a multiple of 64) and, row by row, turns each
 * group of 64 values by the Walsh-Hadamard matrix (scaled by 1/8, so that it is orthonormal: a
 * power of two, exact), then rounds the row to int8 steps of its own scale (its greatest magnitude
 * / 127). The turn spreads a row's few large values over their group, so one scale a row loses
 * less of the small ones; the weights are turned by the same matrix (int8.py), which leaves
 * x @ W^T unchanged. Each row is computed by the same code whatever the other rows hold.
 *
 * `linear` multiplies float32 rows [rows, K] by int8 weights [N, K] packed by int8.py (four weight
 * rows a group, their 32 steps at each k side by side: [N / 4, K / 32, 4, 32], so that a group is
 * one stream of memory), each row turned and rounded first, into float32 [rows, N]: each int32 sum
 * times the row's scale, rounded, times the weight row's, rounded (as PyTorch's two elementwise
 * products round them, int8.py's path for more rows), or with `add` each added to what y holds (a
 * residual connection, rounded as y + the product). The sums are integers, exact whatever the
 * order the CPU adds them in (K * 127 * 127 fits in int32 for K up to MAX_K), so a row's values are
 * the same alone, beside any rows, and equal to any other exact product's (PyTorch's `_int_mm`
 * where it is exact): batch-invariant by construction. Two kernels make the same sums:
 *
 * - KERNEL_AVX2, 32 products at a time: |x| as unsigned bytes times w with x's sign (AVX2's
 *   vpmaddubsw: two products of at most 127 x 127 added in 16 bits, which cannot saturate), pairs of
 *   those added into 32 bits (vpmaddwd by ones); two input rows at a time.
 * - KERNEL_AVX512_VNNI, 64 products at a time: x + 128 as unsigned bytes times w, four products
 *   added straight into 32 bits (vpdpbusd, which has no 16-bit step to saturate), two weight rows in
 *   each 512-bit register and up to eight input rows at a time; 128 times the weight row's sum of
 *   steps is taken off after (all integers, so the sum is the same one).
 *
 * Each group is read from memory once for every input row (a decode step's few rows); rows after
 * the first tile read it again from the core's cache.
 *
 * `kernels()` names the kernels this CPU runs; on another architecture the sums are plain C loops.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GROUP 64
#define MAX_K 16384
#define WEIGHT_ROWS 4
#define CHUNK 32
/* Bytes ahead of a group's stream to prefetch: 256 took the decode step's products at one row from
 * 11.7 ms to 6.2 ms on a 2-core AMD EPYC (512 and 1024 were slower). Non-temporal prefetches
 * (`prefetchnta`) took a step's products alone, run back to back, from 7.4-9.1 to 5.6-6.7 ms at one
 * row on the Zen 4 host, but not whole decode steps (the two builds alternating step by step in one
 * process: 9.93 ms against these prefetches' 9.45 at one row, 15.6 against 16.0 at 8 rows). */
#define AHEAD 256
/* The distance where a product has more rows than one tile (the VNNI kernel's 8, the AVX2 kernel's
 * pair): each group's weights then serve several tiles from the L1 cache, and the prefetches reach
 * into the next group's instead. With the VNNI kernel 2048 took a decode step's products at 32 rows
 * from 40.7 to 35.4 ms on the Zen 4 host (16 rows: 21.7 to 19.6; 48: 55.8 to 49.7; 1024 gained half
 * that; 4096 the same as 2048), with the AVX2 kernel from 85 to 80 ms (8 rows: 3-4 % less); at one
 * tile the longer distance was slower (one row: 8.0 against 9.7 ms). */
#define AHEAD_TILES 2048

#if defined(__x86_64__) && defined(__GNUC__)
#define INT8_ROWS_X86 1
#include <immintrin.h>
#define TARGET __attribute__((target("avx2")))
#define TARGET_VNNI __attribute__((target("avx2,avx512f,avx512bw,avx512vnni")))
#else
#define TARGET
#endif

/* One group of 64 values turned in place by the Walsh-Hadamard matrix, times 1/8: butterflies of
 * distance 1, 2, 4, ..., 32, each pair (a, b) becoming (a + b, a - b). */
static void hadamard64(float *v) {
    for (int half = 1; half < GROUP; half <<= 1) {
        for (int start = 0; start < GROUP; start += 2 * half) {
            for (int i = start; i < start + half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a + b;
                v[i + half] = a - b;
            }
        }
    }
    for (int i = 0; i < GROUP; i++) v[i] *= 0.125f;
}

#ifdef INT8_ROWS_X86
/* A butterfly within each vector's lanes at distance 1, 2 or 4: v * signs + v's lanes swapped gives
 * a + b in the lower lane of each pair and -b + a, which is a - b, in the upper one: the same sums
 * as `hadamard64` (a product by +-1 is exact). */
TARGET static inline __m256 within(__m256 v, __m256 swapped, __m256 signs) {
    return _mm256_add_ps(_mm256_mul_ps(v, signs), swapped);
}

/* Row x [K] turned and rounded into q [K], as `turn_round_plain` does it, eight lanes at a time,
 * through `turned` (K floats, 32-byte aligned: `scratch`); returns its scale. */
TARGET static float turn_round(int8_t *q, const float *x, Py_ssize_t K, float *turned) {
    const __m256 one_two = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const __m256 two_two = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const __m256 four_four = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    const __m256 eighth = _mm256_set1_ps(0.125f);
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 greatest = _mm256_setzero_ps();
    for (Py_ssize_t g = 0; g < K; g += GROUP) {
        __m256 v[8];
        for (int i = 0; i < 8; i++) {
            __m256 a = _mm256_loadu_ps(x + g + 8 * i);
            a = within(a, _mm256_permute_ps(a, 0xb1), one_two);
            a = within(a, _mm256_permute_ps(a, 0x4e), two_two);
            v[i] = within(a, _mm256_permute2f128_ps(a, a, 0x01), four_four);
        }
        for (int half = 1; half < 8; half <<= 1) {
            for (int start = 0; start < 8; start += 2 * half) {
                for (int i = start; i < start + half; i++) {
                    __m256 a = v[i], b = v[i + half];
                    v[i] = _mm256_add_ps(a, b);
                    v[i + half] = _mm256_sub_ps(a, b);
                }
            }
        }
        for (int i = 0; i < 8; i++) {
            __m256 a = _mm256_mul_ps(v[i], eighth);
            _mm256_store_ps(turned + g + 8 * i, a);
            greatest = _mm256_max_ps(greatest, _mm256_and_ps(a, magnitude));
        }
    }
    float lanes_max[8];
    _mm256_storeu_ps(lanes_max, greatest);
    float top = 0.0f;
    for (int i = 0; i < 8; i++) top = fmaxf(top, lanes_max[i]);
    const __m256 inverse = _mm256_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
    const __m256 high = _mm256_set1_ps(127.0f), low = _mm256_set1_ps(-127.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (Py_ssize_t k = 0; k < K; k += 32) {
        __m256i w[4];
        for (int i = 0; i < 4; i++) {
            __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_load_ps(turned + k + 8 * i), inverse),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            w[i] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(r, high), low));
        }
        __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(w[0], w[1]), _mm256_packs_epi32(w[2], w[3]));
        _mm256_storeu_si256((__m256i *)(q + k), _mm256_permutevar8x32_epi32(packed, order));
    }
    return top / 127.0f;
}
#else
#define turn_round turn_round_plain
#endif

/* Row x [K] turned and rounded into q [K] through `turned` (K floats); returns its scale (on x86
 * `turn_round` gives the same bytes with AVX2, which a test checks). */
static float turn_round_plain(int8_t *q, const float *x, Py_ssize_t K, float *turned) {
    memcpy(turned, x, (size_t)K * sizeof(float));
    for (Py_ssize_t g = 0; g < K; g += GROUP) hadamard64(turned + g);
    float greatest = 0.0f;
    for (Py_ssize_t k = 0; k < K; k++) greatest = fmaxf(greatest, fabsf(turned[k]));
    float inverse = greatest > 0.0f ? 127.0f / greatest : 0.0f;
    for (Py_ssize_t k = 0; k < K; k++) {
        float v = nearbyintf(turned[k] * inverse);
        q[k] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
    }
    return greatest / 127.0f;
}

#ifdef INT8_ROWS_X86
/* The eight int32 lanes of v added (integers: any order gives the same sum). */
TARGET static inline int32_t lanes(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
#endif

/* sums[j] = row . (weight row j of the packed group `w`), j < WEIGHT_ROWS, exactly. */
TARGET static inline void group_sums(int32_t *sums, const int8_t *row, const int8_t *w, Py_ssize_t K,
                                     Py_ssize_t ahead) {
#ifdef INT8_ROWS_X86
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[WEIGHT_ROWS];
    for (int j = 0; j < WEIGHT_ROWS; j++) acc[j] = _mm256_setzero_si256();
    for (Py_ssize_t k = 0; k < K; k += CHUNK) {
        const int8_t *chunk = w + k * WEIGHT_ROWS;
        __builtin_prefetch(chunk + ahead);
        __builtin_prefetch(chunk + ahead + 64);
        __m256i x = _mm256_loadu_si256((const __m256i *)(row + k));
        __m256i magnitude = _mm256_abs_epi8(x);
        for (int j = 0; j < WEIGHT_ROWS; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(chunk + CHUNK * j));
            __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(v, x));
            acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(pairs, ones));
        }
    }
    for (int j = 0; j < WEIGHT_ROWS; j++) sums[j] = lanes(acc[j]);
#else
    for (int j = 0; j < WEIGHT_ROWS; j++) sums[j] = 0;
    for (Py_ssize_t k = 0; k < K; k += CHUNK) {
        const int8_t *chunk = w + k * WEIGHT_ROWS;
        for (int j = 0; j < WEIGHT_ROWS; j++)
            for (int t = 0; t < CHUNK; t++) sums[j] += (int32_t)row[k + t] * (int32_t)chunk[CHUNK * j + t];
    }
#endif
}

/* `group_sums` for two rows at once, each weight vector loaded once for both. */
TARGET static inline void group_sums2(int32_t *sums0, int32_t *sums1, const int8_t *row0, const int8_t *row1,
                                      const int8_t *w, Py_ssize_t K, Py_ssize_t ahead) {
#ifdef INT8_ROWS_X86
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc0[WEIGHT_ROWS], acc1[WEIGHT_ROWS];
    for (int j = 0; j < WEIGHT_ROWS; j++) acc0[j] = acc1[j] = _mm256_setzero_si256();
    for (Py_ssize_t k = 0; k < K; k += CHUNK) {
        const int8_t *chunk = w + k * WEIGHT_ROWS;
        __builtin_prefetch(chunk + ahead);
        __builtin_prefetch(chunk + ahead + 64);
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(row0 + k));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(row1 + k));
        __m256i m0 = _mm256_abs_epi8(x0), m1 = _mm256_abs_epi8(x1);
        for (int j = 0; j < WEIGHT_ROWS; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(chunk + CHUNK * j));
            acc0[j] = _mm256_add_epi32(acc0[j], _mm256_madd_epi16(_mm256_maddubs_epi16(m0, _mm256_sign_epi8(v, x0)), ones));
            acc1[j] = _mm256_add_epi32(acc1[j], _mm256_madd_epi16(_mm256_maddubs_epi16(m1, _mm256_sign_epi8(v, x1)), ones));
        }
    }
    for (int j = 0; j < WEIGHT_ROWS; j++) {
        sums0[j] = lanes(acc0[j]);
        sums1[j] = lanes(acc1[j]);
    }
#else
    group_sums(sums0, row0, w, K, ahead);
    group_sums(sums1, row1, w, K, ahead);
#endif
}


enum { KERNEL_AVX2 = 0, KERNEL_AVX512_VNNI = 1 };

/* Input rows a VNNI tile multiplies together: two accumulators each, 16 registers in all. */
#define VNNI_TILE 8

#ifdef INT8_ROWS_X86
/* The four int32 sums of weight rows 0..3 for one input row, from its accumulators: `a` holding rows
 * 0 and 1 (eight lanes each), `b` rows 2 and 3. */
TARGET_VNNI static inline __m128i four_sums(__m512i a, __m512i b) {
    const __m256i row0 = _mm512_castsi512_si256(a), row1 = _mm512_extracti64x4_epi64(a, 1);
    const __m256i row2 = _mm512_castsi512_si256(b), row3 = _mm512_extracti64x4_epi64(b, 1);
    /* Pairwise sums: lanes of [row0 row1 | row0 row1] then [0 1 2 3 | 0 1 2 3] within each half. */
    const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(row0, row1), _mm256_hadd_epi32(row2, row3));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

/* out[r][n + j] for r < R rows of `shifted` (each row's steps + 128, as unsigned bytes, K apart)
 * and j < `count` weight rows of the packed group `w`: each exact int32 sum (128 times the weight
 * row's sum of steps `wsums` taken off, which each vpdpbusd sum holds too many) times the row's
 * scale, rounded, times the weight row's `ws`, rounded, four lanes at a time (each lane rounded
 * as the scalar products are). Inlined with constant R, so that the accumulators stay in
 * registers. */
TARGET_VNNI static inline __attribute__((always_inline)) void group_vnni(float *out, Py_ssize_t N,
                                                                         const uint8_t *shifted,
                                                                         const float *row_scales, const int8_t *w,
                                                                         const float *ws, const int32_t *wsums,
                                                                         Py_ssize_t count, Py_ssize_t K,
                                                                         Py_ssize_t ahead, int add, const int R) {
    __m512i acc[VNNI_TILE][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    for (Py_ssize_t k = 0; k < K; k += CHUNK) {
        const int8_t *chunk = w + k * WEIGHT_ROWS;
        __builtin_prefetch(chunk + ahead);
        __builtin_prefetch(chunk + ahead + 64);
        /* Weight rows 0 and 1 in one register, 2 and 3 in the other: 32 steps each. */
        const __m512i w01 = _mm512_loadu_si512((const void *)chunk);
        const __m512i w23 = _mm512_loadu_si512((const void *)(chunk + 2 * CHUNK));
        for (int r = 0; r < R; r++) {
            const __m512i x =
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(shifted + r * K + k)));
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], x, w01);
            acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], x, w23);
        }
    }
    const __m128i offset = _mm_slli_epi32(_mm_loadu_si128((const __m128i *)wsums), 7);
    float scales[4] = {0};
    for (Py_ssize_t j = 0; j < count; j++) scales[j] = ws[j];
    const __m128 weight_scales = _mm_loadu_ps(scales);
    for (int r = 0; r < R; r++) {
        const __m128i sums = _mm_sub_epi32(four_sums(acc[r][0], acc[r][1]), offset);
        const __m128 scaled = _mm_mul_ps(_mm_cvtepi32_ps(sums), _mm_set1_ps(row_scales[r]));
        const __m128 y = _mm_mul_ps(scaled, weight_scales);
        if (count == WEIGHT_ROWS) {
            _mm_storeu_ps(out + r * N, add ? _mm_add_ps(_mm_loadu_ps(out + r * N), y) : y);
        } else {
            float lanes4[4];
            _mm_storeu_ps(lanes4, y);
            for (Py_ssize_t j = 0; j < count; j++) out[r * N + j] = add ? out[r * N + j] + lanes4[j] : lanes4[j];
        }
    }
}

/* group_vnni for a tile of `R` rows (1..VNNI_TILE), each size with its own constant bounds. */
TARGET_VNNI static void tile_vnni(float *out, Py_ssize_t N, const uint8_t *shifted, const float *row_scales,
                                  const int8_t *w, const float *ws, const int32_t *wsums, Py_ssize_t count,
                                  Py_ssize_t K, Py_ssize_t ahead, int add, Py_ssize_t R) {
#define TILE(rows) group_vnni(out, N, shifted, row_scales, w, ws, wsums, count, K, ahead, add, rows)
    switch (R) {
    case 1: TILE(1); break;
    case 2: TILE(2); break;
    case 3: TILE(3); break;
    case 4: TILE(4); break;
    case 5: TILE(5); break;
    case 6: TILE(6); break;
    case 7: TILE(7); break;
    default: TILE(8); break;
    }
#undef TILE
}

/* Whether this CPU (and its operating system) runs KERNEL_AVX512_VNNI. */
static int vnni_here(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}
#endif

static PyObject *available(PyObject *self, PyObject *unused) {
#ifdef INT8_ROWS_X86
    __builtin_cpu_init();
    return PyBool_FromLong(__builtin_cpu_supports("avx2"));
#else
    Py_RETURN_TRUE;
#endif
}

/* The kernels this CPU runs, by name, in the order of their numbers (KERNEL_*). */
static PyObject *kernels(PyObject *self, PyObject *unused) {
#ifdef INT8_ROWS_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2")) return Py_BuildValue("()");
    if (vnni_here()) return Py_BuildValue("(ss)", "avx2", "avx512-vnni");
    return Py_BuildValue("(s)", "avx2");
#else
    return Py_BuildValue("(s)", "portable");
#endif
}

/* K floats, 32-byte aligned, for a row being turned (on the heap: threads' stacks may be small). */
static float *scratch(Py_ssize_t K) { return aligned_alloc(32, (size_t)K * sizeof(float)); }

static int check_k(Py_ssize_t K, Py_ssize_t rows) {
    if (K % GROUP || K > MAX_K || K <= 0 || rows < 0) {
        PyErr_Format(PyExc_ValueError, "rows of %zd values are not whole groups of %d (up to %d)", K, GROUP, MAX_K);
        return 0;
    }
    return 1;
}

static PyObject *rotate_quantize(PyObject *self, PyObject *args) {
    unsigned long long q, scales, x;
    Py_ssize_t rows, K;
    int plain = 0;
    if (!PyArg_ParseTuple(args, "KKKnn|p", &q, &scales, &x, &rows, &K, &plain)) return NULL;
    if (!check_k(K, rows)) return NULL;
    float *turned = scratch(K);
    if (!turned) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t r = 0; r < rows; r++) {
        int8_t *row_q = (int8_t *)q + r * K;
        const float *row_x = (const float *)x + r * K;
        ((float *)scales)[r] = plain ? turn_round_plain(row_q, row_x, K, turned) : turn_round(row_q, row_x, K, turned);
    }
    Py_END_ALLOW_THREADS;
    free(turned);
    Py_RETURN_NONE;
}

/* y [rows, N] from rows x with the AVX2 kernel (or the plain loops): two rows at a time. */
static void linear_pairs(float *out, const int8_t *q, const float *row_scales, const int8_t *w, const float *ws,
                         Py_ssize_t rows, Py_ssize_t N, Py_ssize_t K, int add) {
    const Py_ssize_t ahead = rows > 2 ? AHEAD_TILES : AHEAD;
    for (Py_ssize_t n = 0; n < N; n += WEIGHT_ROWS) {
        const int8_t *group = w + n * K;
        Py_ssize_t count = N - n < WEIGHT_ROWS ? N - n : WEIGHT_ROWS;
        for (Py_ssize_t r = 0; r < rows; r += 2) {
            int32_t sums[2][WEIGHT_ROWS];
            if (r + 1 < rows)
                group_sums2(sums[0], sums[1], q + r * K, q + (r + 1) * K, group, K, ahead);
            else
                group_sums(sums[0], q + r * K, group, K, ahead);
            for (Py_ssize_t t = 0; t < 2 && r + t < rows; t++) {
                for (Py_ssize_t j = 0; j < count; j++) {
                    float scaled = (float)sums[t][j] * row_scales[r + t];
                    float *y = out + (r + t) * N + n + j;
                    *y = add ? *y + scaled * ws[n + j] : scaled * ws[n + j];
                }
            }
        }
    }
}

#ifdef INT8_ROWS_X86
/* y [rows, N] with the AVX-512 VNNI kernel: tiles of up to VNNI_TILE rows, from `q` shifted to
 * unsigned bytes (in place: q is this call's own buffer). */
TARGET_VNNI static void linear_vnni(float *out, int8_t *q, const float *row_scales, const int8_t *w,
                                    const float *ws, const int32_t *wsums, Py_ssize_t rows, Py_ssize_t N,
                                    Py_ssize_t K, int add) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (Py_ssize_t i = 0; i < rows * K; i += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(q + i));
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_xor_si256(v, flip)); /* x + 128, as a byte */
    }
    const uint8_t *shifted = (const uint8_t *)q;
    const Py_ssize_t ahead = rows > VNNI_TILE ? AHEAD_TILES : AHEAD;
    for (Py_ssize_t n = 0; n < N; n += WEIGHT_ROWS) {
        const Py_ssize_t count = N - n < WEIGHT_ROWS ? N - n : WEIGHT_ROWS;
        for (Py_ssize_t r = 0; r < rows; r += VNNI_TILE) {
            const Py_ssize_t tile = rows - r < VNNI_TILE ? rows - r : VNNI_TILE;
            tile_vnni(out + r * N + n, N, shifted + r * K, row_scales + r, w + n * K, ws + n, wsums + n, count, K,
                      ahead, add, tile);
        }
    }
}
#endif

static PyObject *linear(PyObject *self, PyObject *args) {
    unsigned long long y, x, w, weight_scales, weight_sums;
    Py_ssize_t rows, N, K;
    int kernel, add;
    if (!PyArg_ParseTuple(args, "KKKKKnnnip", &y, &x, &w, &weight_scales, &weight_sums, &rows, &N, &K, &kernel,
                          &add))
        return NULL;
    if (!check_k(K, rows) || N < 0) return NULL;
    if (kernel != KERNEL_AVX2 && kernel != KERNEL_AVX512_VNNI) {
        PyErr_Format(PyExc_ValueError, "no int8 kernel numbered %d", kernel);
        return NULL;
    }
#ifdef INT8_ROWS_X86
    if (kernel == KERNEL_AVX512_VNNI && !vnni_here()) {
        PyErr_SetString(PyExc_RuntimeError, "this CPU lacks AVX-512 VNNI for the int8 kernel asked for");
        return NULL;
    }
#else
    kernel = KERNEL_AVX2; /* the plain loops */
#endif
    int8_t *q = malloc((size_t)(rows ? rows : 1) * (size_t)K);
    float *row_scales = malloc((size_t)(rows ? rows : 1) * sizeof(float));
    float *turned = scratch(K);
    if (!q || !row_scales || !turned) {
        free(q);
        free(row_scales);
        free(turned);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t r = 0; r < rows; r++) row_scales[r] = turn_round(q + r * K, (const float *)x + r * K, K, turned);
#ifdef INT8_ROWS_X86
    if (kernel == KERNEL_AVX512_VNNI)
        linear_vnni((float *)y, q, row_scales, (const int8_t *)w, (const float *)weight_scales,
                    (const int32_t *)weight_sums, rows, N, K, add);
    else
#endif
        linear_pairs((float *)y, q, row_scales, (const int8_t *)w, (const float *)weight_scales, rows, N, K, add);
    Py_END_ALLOW_THREADS;
    free(q);
    free(row_scales);
    free(turned);
    Py_RETURN_NONE;
}

/* y[r, n] = sums[r, n] as float32, times row_scales[r], rounded, times weight_scales[n], rounded:
 * `linear`'s scaling, for sums made elsewhere (`torch._int_mm`). */
TARGET static void scale_rows(float *y, const int32_t *sums, const float *row_scales, const float *weight_scales,
                              Py_ssize_t rows, Py_ssize_t N) {
    for (Py_ssize_t r = 0; r < rows; r++) {
        float row_scale = row_scales[r];
        for (Py_ssize_t n = 0; n < N; n++) {
            float scaled = (float)sums[r * N + n] * row_scale;
            y[r * N + n] = scaled * weight_scales[n];
        }
    }
}

static PyObject *scale(PyObject *self, PyObject *args) {
    unsigned long long y, sums, row_scales, weight_scales;
    Py_ssize_t rows, N;
    if (!PyArg_ParseTuple(args, "KKKKnn", &y, &sums, &row_scales, &weight_scales, &rows, &N)) return NULL;
    Py_BEGIN_ALLOW_THREADS;
    scale_rows((float *)y, (const int32_t *)sums, (const float *)row_scales, (const float *)weight_scales, rows, N);
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

/* Weights' int8 steps [N, K] (K a multiple of CHUNK) packed as `linear` reads them: [N / 4 rounded
 * up, K / CHUNK, WEIGHT_ROWS, CHUNK], the rows past N zero; and each packed row's sum of steps into
 * int32 [N rounded up to 4] (the VNNI kernel's correction). One pass over the steps: done in
 * PyTorch (a permuted copy, a sum of int8 into int32) it took 0.15 s for the probe's weights on a
 * 2-core AMD EPYC Zen 1, most of it the sum. */
static PyObject *pack(PyObject *self, PyObject *args) {
    unsigned long long packed, sums, steps;
    Py_ssize_t N, K;
    if (!PyArg_ParseTuple(args, "KKKnn", &packed, &sums, &steps, &N, &K)) return NULL;
    if (K % CHUNK || K <= 0 || K > MAX_K || N < 0) {
        PyErr_Format(PyExc_ValueError, "weight rows of %zd steps are not whole chunks of %d (up to %d)", K, CHUNK,
                     MAX_K);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS;
    const Py_ssize_t chunks = K / CHUNK, groups = (N + WEIGHT_ROWS - 1) / WEIGHT_ROWS;
    for (Py_ssize_t g = 0; g < groups; g++) {
        for (Py_ssize_t j = 0; j < WEIGHT_ROWS; j++) {
            const Py_ssize_t row = g * WEIGHT_ROWS + j;
            const int8_t *from = (const int8_t *)steps + row * K;
            int32_t sum = 0;
            for (Py_ssize_t c = 0; c < chunks; c++) {
                int8_t *to = (int8_t *)packed + ((g * chunks + c) * WEIGHT_ROWS + j) * CHUNK;
                if (row >= N) {
                    memset(to, 0, CHUNK);
                    continue;
                }
                memcpy(to, from + c * CHUNK, CHUNK);
                for (int i = 0; i < CHUNK; i++) sum += from[c * CHUNK + i];
            }
            ((int32_t *)sums)[row] = sum;
        }
    }
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS, "Whether this CPU runs the build (on x86: has AVX2)."},
    {"rotate_quantize", rotate_quantize, METH_VARARGS,
     "rotate_quantize(q, scales, x, rows, K, plain=False): int8 [rows, K] and float32 [rows] from float32 "
     "[rows, K], by address (`plain`: the portable C, for tests)."},
    {"kernels", kernels, METH_NOARGS, "The names of the product kernels this CPU runs, by their numbers."},
    {"linear", linear, METH_VARARGS,
     "linear(y, x, packed, scales, sums, rows, N, K, kernel, add): float32 [rows, N] from float32 [rows, K] "
     "and packed int8 weights [N, K] with float32 scales [N] and int32 sums of steps [N rounded up to 4], by "
     "address, with kernel number `kernel` (an index into kernels()); with `add`, added to y (y + the "
     "product, each rounded once) rather than written."},
    {"pack", pack, METH_VARARGS,
     "pack(packed, sums, steps, N, K): int8 steps [N, K] packed for `linear`, and int32 sums of each "
     "packed row's steps [N rounded up to 4], by address."},
    {"scale", scale, METH_VARARGS,
     "scale(y, sums, row_scales, weight_scales, rows, N): float32 [rows, N] from int32 sums, by address."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_int8_rows", "The int8-exact path's C parts.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__int8_rows(void) { return PyModule_Create(&module); }
