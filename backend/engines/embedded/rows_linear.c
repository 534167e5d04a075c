/* A linear layer for a few rows at a time, float32: y[M, N] = x[M, K] @ w[N, K]^T.
 *
 * The embedded engine's decode step multiplies a handful of rows (one per running sample) by every
 * weight matrix of the model. A general matrix product is tuned for many rows; for a few, PyTorch's
 * CPU build (MKL) ran at 2-6 GB/s of weights on an AVX2 core, well under what the memory delivers.
 *
 * `linear` multiplies float32 weights as stored: four weight rows at a time (at most 24 KB at
 * K = 1536, so they stay in the L1 cache) by every input row, two input rows at a time, with AVX2
 * fused multiply-adds. Each output is a dot product over K, summed in eight lanes then added across
 * (`hsum`), so results match `torch.nn.functional.linear` to float32 rounding, not bit for bit.
 *
 * `linear_packed` multiplies from a GGUF's quantized blocks (Q4_1: 32 weights in 20 bytes, a
 * float16 scale d and minimum m and 4-bit q, each weight d * q + m; Q8_0: 32 weights in 34 bytes, d
 * and 8-bit q, each d * q), regrouped once by `pack`: PANEL (24) weight rows a group, a group's 24
 * weights of one column side by side (Q4_1: eight columns of a row in one 32-bit word, so that
 * eight rows' words are one vector and a column comes out of it with a shift and a mask). A group
 * is dequantized with a few vector operations a column into a panel, panel[k][j] = w[n + j][k], and
 * each tile of four input rows is multiplied by it as a broadcast outer product: per column, three
 * vectors of the panel, four broadcast inputs, twelve fused multiply-adds into twelve accumulators
 * that stay in registers (no horizontal sums, and a column of weights loaded once for four rows).
 * One or two input rows skip the panel: each column's weights are dequantized in registers and used
 * at once. Every output is one accumulator summed over k = 0, 1, ..., K - 1 in order, whatever the
 * tile, so a row's outputs do not depend on the rows beside it (the sums differ from `linear`'s,
 * within float32 rounding). Against the dot-product alternative (six dequantized rows, 2 x 6
 * accumulators, a horizontal sum per output) the linear layers of a decode step took 0.72-0.81x the
 * time at n = 1 / 2 / 8 / 32 and 0.96x at n = 4, timed against each other in one process on the AVX2
 * development machine. A decode step reads 0.625 (Q4_1) or 1.06 (Q8_0) bytes a weight from memory
 * instead of 4.
 *
 * The dequantized values are the ones gguf-py computes (d * q rounded to float32, then + m
 * rounded): this file is built with -ffp-contract=off, so that no compiler fuses the two into one
 * FMA; `dequantize` gives them through the same code (`fill_panel`), the float32 weights the dense
 * path holds.
 *
 * `available()` says whether this CPU has AVX2, FMA and F16C; the others are only called where it has.
 * Built without AVX2 support in the compiler (or on another architecture), `available()` is False.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A quantized block: 32 weights; kinds as the Python side numbers them. */
#define BLOCK_WEIGHTS 32
enum { KIND_Q4_1 = 1, KIND_Q8_0 = 2 };
/* Weight rows multiplied together (three vectors of 8), and input rows a tile takes at most. */
#define PANEL 24
#define TILE_ROWS 4

#if defined(__x86_64__) && defined(__GNUC__)
#define ROWS_LINEAR_X86 1
#include <immintrin.h>

#include "lane_sum.h"

#define TARGET __attribute__((target("avx2,fma,f16c")))

static Py_ssize_t block_bytes(int kind) { return kind == KIND_Q4_1 ? 20 : kind == KIND_Q8_0 ? 34 : 0; }

/* y = v, or y += v where `add` (a residual connection summed into y, rounded as y + v). */
static inline void put(float *y, float v, int add) { *y = add ? *y + v : v; }

/* The bytes of one block row of a panel group (PANEL rows, 32 weights each) of `kind`: Q4_1 keeps
 * PANEL float16 scales, PANEL float16 minimums, then four chunks of PANEL 32-bit words, word j of
 * chunk c holding weight row j's q at k = 8c + t in its nibble t (bits 4t .. 4t + 3); Q8_0 keeps
 * PANEL scales, then 32 x PANEL signed bytes, byte k * PANEL + j row j's q at k. Eight rows' words
 * are one vector, and each of its eight columns comes out with an immediate shift and a mask. With
 * a byte of two columns a row instead (each widened to 32 bits a column), the Q4_1 matrices took
 * 1.45-1.6x the time at one row, 1.3-1.4x at two and 1.1-1.2x at four and eight, on the AVX2
 * development machine (`python -m bench.kernel_ab` against that build). */
static Py_ssize_t group_block_bytes(int kind) { return PANEL * block_bytes(kind); }

TARGET static inline __m256 halves(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* Chunk c's words of rows 8g..8g+7 of a packed block row `src` (Q4_1; zero for Q8_0, which reads
 * its bytes a column at a time). */
TARGET static inline __attribute__((always_inline)) __m256i chunk_words(const uint8_t *src, int kind, int g, int c) {
    if (kind != KIND_Q4_1)
        return _mm256_setzero_si256();
    return _mm256_loadu_si256((const __m256i *)(src + 4 * PANEL + c * 4 * PANEL + 32 * g));
}

/* Weights of 8 weight rows (lanes) at column k = 8c + t of a packed block row `src`, rows 8g..8g+7
 * of its panel, given those rows' chunk c words (`chunk_words`), scales d and minimums m: d * q + m
 * (Q4_1) or d * q (Q8_0), each product and sum rounded to float32 as gguf-py computes them (no FMA:
 * built with -ffp-contract=off). Called with a constant t, so that the shift is an immediate. */
TARGET static inline __attribute__((always_inline)) __m256 weight(const uint8_t *src, int kind, int g, int c, int t,
                                                                  __m256i words, __m256 d, __m256 m) {
    if (kind == KIND_Q4_1) {
        __m256i q = _mm256_srli_epi32(words, 4 * t);
        if (t != 7)
            q = _mm256_and_si256(q, _mm256_set1_epi32(0x0F));
        return _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(q)), m);
    }
    const __m128i q = _mm_loadl_epi64((const __m128i *)(src + 2 * PANEL + (8 * c + t) * PANEL + 8 * g));
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
}

/* The scales (and minimums, Q4_1) of rows 8g..8g+7 of a packed block row. */
TARGET static inline __attribute__((always_inline)) void scales(const uint8_t *src, int kind, int g, __m256 *d, __m256 *m) {
    *d = halves(src + 16 * g);
    *m = kind == KIND_Q4_1 ? halves(src + 2 * PANEL + 16 * g) : _mm256_setzero_ps();
}

/* A panel group's K weights as float32, k-major: panel[k * PANEL + j] = w[j][k]. */
TARGET static void fill_panel(const uint8_t *src, int kind, float *panel, Py_ssize_t K) {
    for (Py_ssize_t b = 0; b < K; b += BLOCK_WEIGHTS, src += group_block_bytes(kind)) {
        for (int g = 0; g < PANEL / 8; g++) {
            __m256 d, m;
            scales(src, kind, g, &d, &m);
            for (int c = 0; c < BLOCK_WEIGHTS / 8; c++) {
                const __m256i words = chunk_words(src, kind, g, c);
#pragma GCC unroll 8
                for (int t = 0; t < 8; t++)
                    _mm256_storeu_ps(panel + (b + 8 * c + t) * PANEL + 8 * g, weight(src, kind, g, c, t, words, d, m));
            }
        }
    }
}

/* out[8][8] = the transpose of in's 8 x 8 block (rows `stride` floats apart), out rows `out_stride` apart. */
TARGET static void transpose8(const float *in, Py_ssize_t stride, float *out, Py_ssize_t out_stride) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(in + i * stride);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4)
        for (int j = 0; j < 2; j++) {
            r[i + j] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], _MM_SHUFFLE(1, 0, 1, 0));
            r[i + j + 2] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], _MM_SHUFFLE(3, 2, 3, 2));
        }
    /* r[0..3] hold columns 0|4, 2|6, 1|5, 3|7 of rows 0-3 (a column in each half), r[4..7] of rows 4-7. */
    static const int order[4] = {0, 2, 1, 3};
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(out + i * out_stride, _mm256_permute2f128_ps(r[order[i]], r[order[i] + 4], 0x20));
        _mm256_storeu_ps(out + (i + 4) * out_stride, _mm256_permute2f128_ps(r[order[i]], r[order[i] + 4], 0x31));
    }
}

/* Rows of a tile's outputs (`out`, PANEL apart) into y's columns 0 .. width, rows N apart. */
static void put_tile(const float *out, int rows, float *y, Py_ssize_t N, Py_ssize_t width, int add) {
    for (int i = 0; i < rows; i++)
        for (Py_ssize_t j = 0; j < width; j++)
            put(y + i * N + j, out[i * PANEL + j], add);
}

/* y rows [rows, width of a panel] = x[rows, K] @ panel: each output one accumulator, fused
 * multiply-adds over k = 0, 1, ..., K - 1 in order (4 x 3 accumulators in registers at rows = 4). */
TARGET static inline __attribute__((always_inline)) void tile(const float *x, const float *panel, float *y, Py_ssize_t N,
                                                              Py_ssize_t K, Py_ssize_t width, int add, const int rows) {
    __m256 c[TILE_ROWS][PANEL / 8];
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < PANEL / 8; j++)
            c[i][j] = _mm256_setzero_ps();
    for (Py_ssize_t k = 0; k < K; k++) {
        const float *p = panel + k * PANEL;
        const __m256 b0 = _mm256_loadu_ps(p), b1 = _mm256_loadu_ps(p + 8), b2 = _mm256_loadu_ps(p + 16);
        for (int i = 0; i < rows; i++) {
            const __m256 a = _mm256_broadcast_ss(x + i * K + k);
            c[i][0] = _mm256_fmadd_ps(a, b0, c[i][0]);
            c[i][1] = _mm256_fmadd_ps(a, b1, c[i][1]);
            c[i][2] = _mm256_fmadd_ps(a, b2, c[i][2]);
        }
    }
    /* Stored here, not handed on: an array whose address is taken is kept in memory, not registers. */
    float out[TILE_ROWS * PANEL];
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < PANEL / 8; j++)
            _mm256_storeu_ps(out + i * PANEL + 8 * j, c[i][j]);
    put_tile(out, rows, y, N, width, add);
}

/* Every input row by one panel, TILE_ROWS rows at a time. */
TARGET static void rows_by_panel(const float *x, const float *panel, float *y, Py_ssize_t M, Py_ssize_t N,
                                 Py_ssize_t K, Py_ssize_t width, int add) {
    Py_ssize_t m = 0;
    for (; m + TILE_ROWS <= M; m += TILE_ROWS)
        tile(x + m * K, panel, y + m * N, N, K, width, add, TILE_ROWS);
    switch (M - m) {
    case 3: tile(x + m * K, panel, y + m * N, N, K, width, add, 3); break;
    case 2: tile(x + m * K, panel, y + m * N, N, K, width, add, 2); break;
    case 1: tile(x + m * K, panel, y + m * N, N, K, width, add, 1); break;
    }
}

/* `tile` for one or two input rows straight from a packed group, each weight dequantized in
 * registers and used at once (no panel written and read back): the same weights, the same
 * multiply-adds in the same order, so the same sums as `tile`. */
TARGET static inline __attribute__((always_inline)) void tile_packed(const float *x, const uint8_t *src, int kind,
                                                                     float *y, Py_ssize_t N, Py_ssize_t K,
                                                                     Py_ssize_t width, int add, const int rows) {
    __m256 c[2][PANEL / 8];
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < PANEL / 8; j++)
            c[i][j] = _mm256_setzero_ps();
    for (Py_ssize_t b = 0; b < K; b += BLOCK_WEIGHTS, src += group_block_bytes(kind)) {
        __m256 d[PANEL / 8], m[PANEL / 8];
        for (int g = 0; g < PANEL / 8; g++)
            scales(src, kind, g, &d[g], &m[g]);
        for (int h = 0; h < BLOCK_WEIGHTS / 8; h++) {
            __m256i words[PANEL / 8];
            for (int g = 0; g < PANEL / 8; g++)
                words[g] = chunk_words(src, kind, g, h);
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                __m256 a[2];
                for (int i = 0; i < rows; i++)
                    a[i] = _mm256_broadcast_ss(x + i * K + b + 8 * h + t);
                for (int g = 0; g < PANEL / 8; g++) {
                    const __m256 w = weight(src, kind, g, h, t, words[g], d[g], m[g]);
                    for (int i = 0; i < rows; i++)
                        c[i][g] = _mm256_fmadd_ps(a[i], w, c[i][g]);
                }
            }
        }
    }
    /* Stored here, not handed on: an array whose address is taken is kept in memory, not registers. */
    float out[TILE_ROWS * PANEL];
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < PANEL / 8; j++)
            _mm256_storeu_ps(out + i * PANEL + 8 * j, c[i][j]);
    put_tile(out, rows, y, N, width, add);
}

static Py_ssize_t min_size(Py_ssize_t a, Py_ssize_t b) { return a < b ? a : b; }

/* The dot product of a[0:K] and b[0:K], K a multiple of 8: eight lanes, then across (`hsum`). */
TARGET static float dot(const float *a, const float *b, Py_ssize_t K) {
    __m256 c = _mm256_setzero_ps();
    for (Py_ssize_t k = 0; k < K; k += 8)
        c = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), c);
    return hsum(c);
}

/* y[m, n..n+3] for every input row m (added to y where `add`): the products of x[M, K] with the four
 * float32 weight rows at w, K apart, two input rows at a time (8 accumulators). Each output is
 * summed as `dot` sums it, whatever M. */
TARGET static void rows4(const float *x, const float *w, float *y, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
                         Py_ssize_t n, int add) {
    Py_ssize_t m = 0;
    for (; m + 2 <= M; m += 2) {
        const float *a0 = x + m * K, *a1 = a0 + K;
        __m256 c0[4], c1[4];
        for (int j = 0; j < 4; j++)
            c0[j] = c1[j] = _mm256_setzero_ps();
        for (Py_ssize_t k = 0; k < K; k += 8) {
            const __m256 x0 = _mm256_loadu_ps(a0 + k), x1 = _mm256_loadu_ps(a1 + k);
            for (int j = 0; j < 4; j++) {
                const __m256 b = _mm256_loadu_ps(w + j * K + k);
                c0[j] = _mm256_fmadd_ps(x0, b, c0[j]);
                c1[j] = _mm256_fmadd_ps(x1, b, c1[j]);
            }
        }
        float *y0 = y + m * N + n, *y1 = y0 + N;
        for (int j = 0; j < 4; j++)
            put(y0 + j, hsum(c0[j]), add), put(y1 + j, hsum(c1[j]), add);
    }
    for (; m < M; m++) {
        const float *a0 = x + m * K;
        __m256 c0[4];
        for (int j = 0; j < 4; j++)
            c0[j] = _mm256_setzero_ps();
        for (Py_ssize_t k = 0; k < K; k += 8) {
            const __m256 x0 = _mm256_loadu_ps(a0 + k);
            for (int j = 0; j < 4; j++)
                c0[j] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + j * K + k), c0[j]);
        }
        for (int j = 0; j < 4; j++)
            put(y + m * N + n + j, hsum(c0[j]), add);
    }
}

/* y[M, N] = x[M, K] @ w[N, K]^T (or y +=, where `add`), w float32 as stored: four weight rows at a
 * time (24 KB at K = 1536: they stay in L1) by every input row. */
TARGET static void linear_nt(const float *x, const float *w, float *y, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
                             int add) {
    Py_ssize_t n = 0;
    for (; n + 4 <= N; n += 4)
        rows4(x, w + n * K, y, M, N, K, n, add);
    for (; n < N; n++)
        for (Py_ssize_t m = 0; m < M; m++)
            put(y + m * N + n, dot(x + m * K, w + n * K, K), add);
}

/* y[M, N] = x[M, K] @ W^T (or y +=, where `add`), W packed (`pack`) as blocks of `kind`: for one or
 * two input rows each group straight from its blocks, for more dequantized into `panel` first. */
TARGET static void linear_packed_nt(const float *x, const uint8_t *w, int kind, float *y, float *panel,
                                    Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, int add) {
    const Py_ssize_t group = K / BLOCK_WEIGHTS * group_block_bytes(kind);
    for (Py_ssize_t n = 0; n < N; n += PANEL, w += group) {
        const Py_ssize_t width = min_size(PANEL, N - n);
        if (M == 1)
            tile_packed(x, w, kind, y + n, N, K, width, add, 1);
        else if (M == 2)
            tile_packed(x, w, kind, y + n, N, K, width, add, 2);
        else {
            fill_panel(w, kind, panel, K);
            rows_by_panel(x, panel, y + n, M, N, K, width, add);
        }
    }
}

/* GGUF rows of blocks (`src`, N rows of K / 32 blocks) regrouped as `linear_packed_nt` reads them,
 * PANEL rows a group, the rows past N zero (weights 0). */
static void pack_nt(const uint8_t *src, int kind, uint8_t *dst, Py_ssize_t N, Py_ssize_t K) {
    const Py_ssize_t bytes = block_bytes(kind), row = K / BLOCK_WEIGHTS * bytes, head = kind == KIND_Q4_1 ? 4 : 2;
    for (Py_ssize_t n = 0; n < N; n += PANEL)
        for (Py_ssize_t b = 0; b < K / BLOCK_WEIGHTS; b++, dst += PANEL * bytes) {
            memset(dst, 0, PANEL * bytes);
            for (Py_ssize_t j = 0; j < PANEL && n + j < N; j++) {
                const uint8_t *s = src + (n + j) * row + b * bytes;
                memcpy(dst + 2 * j, s, 2); /* the scale d */
                if (kind == KIND_Q4_1) {
                    memcpy(dst + 2 * PANEL + 2 * j, s + 2, 2); /* the minimum m */
                    /* Block weight k's q: k < 16 the low nibble of byte k, else the high one of byte k - 16;
                     * chunk c's word for row j gathers k = 8c .. 8c + 7, little-endian. */
                    for (int c = 0; c < BLOCK_WEIGHTS / 8; c++) {
                        uint32_t word = 0;
                        for (int t = 0; t < 8; t++) {
                            const int k = 8 * c + t;
                            const uint32_t q = k < 16 ? s[head + k] & 15 : s[head + k - 16] >> 4;
                            word |= q << (4 * t);
                        }
                        for (int byte = 0; byte < 4; byte++)
                            dst[4 * PANEL + c * 4 * PANEL + 4 * j + byte] = (uint8_t)(word >> (8 * byte));
                    }
                } else {
                    for (int k = 0; k < BLOCK_WEIGHTS; k++)
                        dst[2 * PANEL + k * PANEL + j] = s[head + k];
                }
            }
        }
}

/* Packed weights (N rows, as `pack_nt` writes them) as float32 rows dst[N, K]. */
TARGET static void unpack_nt(const uint8_t *w, int kind, float *dst, float *panel, Py_ssize_t N, Py_ssize_t K) {
    const Py_ssize_t group = K / BLOCK_WEIGHTS * group_block_bytes(kind);
    for (Py_ssize_t n = 0; n < N; n += PANEL, w += group) {
        fill_panel(w, kind, panel, K);
        for (int g = 0; g < PANEL / 8 && n + 8 * g < N; g++) {
            if (n + 8 * g + 8 <= N) {
                for (Py_ssize_t k = 0; k < K; k += 8)
                    transpose8(panel + k * PANEL + 8 * g, PANEL, dst + (n + 8 * g) * K + k, K);
            } else {
                for (Py_ssize_t j = 0; n + 8 * g + j < N; j++)
                    for (Py_ssize_t k = 0; k < K; k++)
                        dst[(n + 8 * g + j) * K + k] = panel[k * PANEL + 8 * g + j];
            }
        }
    }
}
#endif

static PyObject *available(PyObject *self, PyObject *unused) {
#ifdef ROWS_LINEAR_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

#ifdef ROWS_LINEAR_X86
/* A float32 panel of PANEL rows of K weights (64-byte aligned), or NULL with a MemoryError set. */
static float *new_panel(Py_ssize_t K) {
    float *panel = aligned_alloc(64, ((size_t)PANEL * K * sizeof(float) + 63) / 64 * 64);
    if (panel == NULL)
        PyErr_NoMemory();
    return panel;
}
#endif

#define NOT_BUILT()                                                                                    \
    do {                                                                                               \
        PyErr_SetString(PyExc_RuntimeError, "rows_linear: built without AVX2 support");                \
        return NULL;                                                                                   \
    } while (0)

/* linear(y, x, w, M, N, K, add=0): the addresses of contiguous float32 buffers y[M, N], x[M, K],
 * w[N, K] (the caller checks shapes, types and layout), K a multiple of 8; y = x @ w^T, or y += it
 * where `add`. Runs without the GIL. */
static PyObject *linear(PyObject *self, PyObject *args) {
    unsigned long long y, x, w;
    Py_ssize_t M, N, K;
    int add = 0;
    if (!PyArg_ParseTuple(args, "KKKnnn|p", &y, &x, &w, &M, &N, &K, &add))
        return NULL;
    if (M < 0 || N < 0 || K < 0 || K % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "rows_linear: M, N, K must be >= 0 and K a multiple of 8");
        return NULL;
    }
#ifdef ROWS_LINEAR_X86
    Py_BEGIN_ALLOW_THREADS
    linear_nt((const float *)(uintptr_t)x, (const float *)(uintptr_t)w, (float *)(uintptr_t)y, M, N, K, add);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    NOT_BUILT();
#endif
}

/* Whether `kind` is a block kind and K a whole number of its blocks; sets a ValueError if not. */
static int blocks_valid(int kind, Py_ssize_t K) {
    if (K < 0 || K % BLOCK_WEIGHTS != 0 || (kind != KIND_Q4_1 && kind != KIND_Q8_0)) {
        PyErr_SetString(PyExc_ValueError, "rows_linear: kind must be 1 or 2 and K a multiple of 32");
        return 0;
    }
    return 1;
}

/* The arguments (dst, src, kind, N, K) of `pack` and `dequantize`: two addresses, N >= 0 rows of K
 * weights as blocks of `kind`. 1 if they parse and are valid, else 0 with an exception set. */
static int parse_rows_of_blocks(PyObject *args, unsigned long long *dst, unsigned long long *src, int *kind,
                                Py_ssize_t *N, Py_ssize_t *K) {
    if (!PyArg_ParseTuple(args, "KKinn", dst, src, kind, N, K))
        return 0;
    if (*N < 0) {
        PyErr_SetString(PyExc_ValueError, "rows_linear: N must be >= 0");
        return 0;
    }
    return blocks_valid(*kind, *K);
}

/* pack(dst, src, kind, N, K): N rows of K / 32 GGUF blocks of `kind` (1: Q4_1, 2: Q8_0) at src,
 * regrouped at dst as `linear_packed` reads them: ceil(N / PANEL_ROWS) groups of K / 32 *
 * PANEL_ROWS blocks' bytes (the rows past N zero). Runs without the GIL. */
static PyObject *pack(PyObject *self, PyObject *args) {
    unsigned long long dst, src;
    int kind;
    Py_ssize_t N, K;
    if (!parse_rows_of_blocks(args, &dst, &src, &kind, &N, &K))
        return NULL;
#ifdef ROWS_LINEAR_X86
    Py_BEGIN_ALLOW_THREADS
    pack_nt((const uint8_t *)(uintptr_t)src, kind, (uint8_t *)(uintptr_t)dst, N, K);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    NOT_BUILT();
#endif
}

/* dequantize(dst, src, kind, N, K): N rows of K weights, each K / 32 GGUF blocks of `kind` at src,
 * as float32 at dst[N, K]: packed a group at a time and dequantized by the code `linear_packed`
 * multiplies with. Runs without the GIL. */
static PyObject *dequantize(PyObject *self, PyObject *args) {
    unsigned long long dst, src;
    int kind;
    Py_ssize_t N, K;
    if (!parse_rows_of_blocks(args, &dst, &src, &kind, &N, &K))
        return NULL;
#ifdef ROWS_LINEAR_X86
    const Py_ssize_t row = K / BLOCK_WEIGHTS * block_bytes(kind);
    float *panel = new_panel(K);
    uint8_t *group = malloc((size_t)(PANEL * row) + 1);
    if (panel == NULL || group == NULL) {
        free(panel);
        free(group);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t n = 0; n < N; n += PANEL) {
        const Py_ssize_t rows = min_size(PANEL, N - n);
        pack_nt((const uint8_t *)(uintptr_t)src + n * row, kind, group, rows, K);
        unpack_nt(group, kind, (float *)(uintptr_t)dst + n * K, panel, rows, K);
    }
    Py_END_ALLOW_THREADS
    free(group);
    free(panel);
    Py_RETURN_NONE;
#else
    NOT_BUILT();
#endif
}

/* linear_packed(y, x, w, kind, M, N, K, add=0): y[M, N] = x[M, K] @ W^T (or y += it, where `add`)
 * with W's N rows as `pack` wrote them from blocks of `kind` at address w, float32 y and x. Runs
 * without the GIL. */
static PyObject *linear_packed(PyObject *self, PyObject *args) {
    unsigned long long y, x, w;
    int kind, add = 0;
    Py_ssize_t M, N, K;
    if (!PyArg_ParseTuple(args, "KKKinnn|p", &y, &x, &w, &kind, &M, &N, &K, &add))
        return NULL;
    if (M < 0 || N < 0) {
        PyErr_SetString(PyExc_ValueError, "rows_linear: M and N must be >= 0");
        return NULL;
    }
    if (!blocks_valid(kind, K))
        return NULL;
#ifdef ROWS_LINEAR_X86
    float *panel = new_panel(K);
    if (panel == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    linear_packed_nt((const float *)(uintptr_t)x, (const uint8_t *)(uintptr_t)w, kind, (float *)(uintptr_t)y,
                     panel, M, N, K, add);
    Py_END_ALLOW_THREADS
    free(panel);
    Py_RETURN_NONE;
#else
    NOT_BUILT();
#endif
}

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS, "Whether this CPU has AVX2, FMA and F16C (and the build uses them)."},
    {"linear", linear, METH_VARARGS, "linear(y, x, w, M, N, K, add=0): y = x @ w^T (y += where add), float32 buffers by address."},
    {"pack", pack, METH_VARARGS,
     "pack(dst, src, kind, N, K): GGUF blocks (1: Q4_1, 2: Q8_0) regrouped for linear_packed, by address."},
    {"linear_packed", linear_packed, METH_VARARGS,
     "linear_packed(y, x, w, kind, M, N, K, add=0): y = x @ W^T (y += where add), W as pack wrote it, by address."},
    {"dequantize", dequantize, METH_VARARGS,
     "dequantize(dst, src, kind, N, K): GGUF blocks (1: Q4_1, 2: Q8_0) as float32, by address."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows_linear",
                                    "A float32 linear layer for a few rows (AVX2, FMA).", -1, methods};

PyMODINIT_FUNC PyInit__rows_linear(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "PANEL_ROWS", PANEL) < 0)
        Py_CLEAR(m);
    return m;
}
