/* A linear layer for a few rows at a time, float32: y[M, N] = x[M, K] @ w[N, K]^T.
 *
 * The embedded engine's decode step multiplies a handful of rows (one per running sample) by every
 * weight matrix of the model. A general matrix product is tuned for many rows; for a few, PyTorch's
 * CPU build (MKL) ran at 2-6 GB/s of weights on an AVX2 core, well under what the memory delivers.
 * This kernel reads each weight once: it takes four weight rows at a time (at most 24 KB at
 * K = 1536, so they stay in the L1 cache) and multiplies every input row by them with AVX2 fused
 * multiply-adds, two input rows at a time. Each output is a dot product over K, summed in eight
 * lanes then added across, so results match `torch.nn.functional.linear` to float32 rounding
 * (the order of the additions differs), not bit for bit.
 *
 * `linear_blocks` does the same from weights kept as a GGUF's quantized blocks (Q4_1: 32 weights in
 * 20 bytes, a float16 scale d and minimum m and 4-bit q, each weight d * q + m; Q8_0: 32 weights in
 * 34 bytes, d and 8-bit q, each d * q). It dequantizes six weight rows at a time into a buffer
 * (L1 at K = 576) and multiplies them by every input row, two at a time with 12 accumulators (each
 * input row read from L2 once per six weight rows, not four: the linear layers of a decode step
 * took 3-5% less time at n = 1 / 8 / 32 than with four, timed against each other in one process
 * on the AVX2 development machine, with the same sums). A decode step then reads 0.625 (Q4_1) or
 * 1.06 (Q8_0) bytes a weight from memory instead of 4. The dequantized values are the ones gguf-py computes (d * q rounded to
 * float32, then + m rounded): this file is built with -ffp-contract=off, so that no compiler fuses
 * the two into one FMA, and `dequantize` gives the same float32 weights the dense path holds.
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

#if defined(__x86_64__) && defined(__GNUC__)
#define ROWS_LINEAR_X86 1
#include <immintrin.h>

#include "lane_sum.h"

#define TARGET __attribute__((target("avx2,fma,f16c")))

/* The dot product of a[0:K] and b[0:K], K a multiple of 8. */
TARGET static float dot(const float *a, const float *b, Py_ssize_t K) {
    __m256 c = _mm256_setzero_ps();
    for (Py_ssize_t k = 0; k < K; k += 8)
        c = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), c);
    return hsum(c);
}

/* y = v, or y += v where `add` (a residual connection summed into y, rounded as y + v). */
static inline void put(float *y, float v, int add) { *y = add ? *y + v : v; }

/* y[m, n..n+count-1] for every input row m (added to y where `add`): the products of x[M, K] with
 * `count` weight rows at w, K apart, two input rows at a time (2 x count accumulators). Each output
 * is summed over k in eight lanes, then across: the same sums whatever `count`. Inlined where called
 * with a constant count (4 or 6), so that the accumulators stay in registers. */
TARGET static inline __attribute__((always_inline)) void rows_of(const float *x, const float *w, float *y,
                                                                 Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
                                                                 Py_ssize_t n, int add, const int count) {
    Py_ssize_t m = 0;
    for (; m + 2 <= M; m += 2) {
        const float *a0 = x + m * K, *a1 = a0 + K;
        __m256 c0[6], c1[6];
        for (int j = 0; j < count; j++)
            c0[j] = c1[j] = _mm256_setzero_ps();
        for (Py_ssize_t k = 0; k < K; k += 8) {
            const __m256 x0 = _mm256_loadu_ps(a0 + k), x1 = _mm256_loadu_ps(a1 + k);
            for (int j = 0; j < count; j++) {
                const __m256 b = _mm256_loadu_ps(w + j * K + k);
                c0[j] = _mm256_fmadd_ps(x0, b, c0[j]);
                c1[j] = _mm256_fmadd_ps(x1, b, c1[j]);
            }
        }
        float *y0 = y + m * N + n, *y1 = y0 + N;
        for (int j = 0; j < count; j++)
            put(y0 + j, hsum(c0[j]), add), put(y1 + j, hsum(c1[j]), add);
    }
    for (; m < M; m++) {
        const float *a0 = x + m * K;
        __m256 c0[6];
        for (int j = 0; j < count; j++)
            c0[j] = _mm256_setzero_ps();
        for (Py_ssize_t k = 0; k < K; k += 8) {
            const __m256 x0 = _mm256_loadu_ps(a0 + k);
            for (int j = 0; j < count; j++)
                c0[j] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + j * K + k), c0[j]);
        }
        float *y0 = y + m * N + n;
        for (int j = 0; j < count; j++)
            put(y0 + j, hsum(c0[j]), add);
    }
}

TARGET static void linear_nt(const float *x, const float *w, float *y, Py_ssize_t M, Py_ssize_t N,
                             Py_ssize_t K, int add) {
    Py_ssize_t n = 0;
    for (; n + 4 <= N; n += 4) {
        rows_of(x, w + n * K, y, M, N, K, n, add, 4);
    }
    for (; n < N; n++)
        for (Py_ssize_t m = 0; m < M; m++)
            put(y + m * N + n, dot(x + m * K, w + n * K, K), add);
}


static Py_ssize_t block_bytes(int kind) { return kind == KIND_Q4_1 ? 20 : kind == KIND_Q8_0 ? 34 : 0; }

TARGET static inline float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* One row of K weights (K / 32 blocks at src) as float32 at dst. */
TARGET static void dequantize_row(const uint8_t *src, int kind, float *dst, Py_ssize_t K) {
    if (kind == KIND_Q4_1) {
        const __m128i low = _mm_set1_epi8(0x0F);
        for (Py_ssize_t b = 0; b < K; b += BLOCK_WEIGHTS, src += 20, dst += BLOCK_WEIGHTS) {
            const __m256 d = _mm256_set1_ps(half(src)), m = _mm256_set1_ps(half(src + 2));
            const __m128i raw = _mm_loadu_si128((const __m128i *)(src + 4));
            const __m128i lo = _mm_and_si128(raw, low), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
            /* Elements 0-15 are the low nibbles, 16-31 the high ones (ggml's layout). */
            const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
            for (int i = 0; i < 4; i++) {
                __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[i]));
                _mm256_storeu_ps(dst + 8 * i, _mm256_add_ps(_mm256_mul_ps(d, q), m));
            }
        }
    } else {
        for (Py_ssize_t b = 0; b < K; b += BLOCK_WEIGHTS, src += 34, dst += BLOCK_WEIGHTS) {
            const __m256 d = _mm256_set1_ps(half(src));
            for (int i = 0; i < 4; i++) {
                __m128i raw = _mm_loadl_epi64((const __m128i *)(src + 2 + 8 * i));
                __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
                _mm256_storeu_ps(dst + 8 * i, _mm256_mul_ps(d, q));
            }
        }
    }
}

/* y[M, N] = x[M, K] @ W^T (or y +=, where `add`), W's N rows as blocks of `kind`, six rows at a time
 * dequantized into `scratch` (6 * K floats); the last N % 6 four and one at a time. */
TARGET static void linear_blocks_nt(const float *x, const uint8_t *w, int kind, float *y, float *scratch,
                                    Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, int add) {
    const Py_ssize_t row = K / BLOCK_WEIGHTS * block_bytes(kind);
    Py_ssize_t n = 0;
    for (; n + 6 <= N; n += 6) {
        for (int j = 0; j < 6; j++)
            dequantize_row(w + (n + j) * row, kind, scratch + j * K, K);
        rows_of(x, scratch, y, M, N, K, n, add, 6);
    }
    for (; n + 4 <= N; n += 4) {
        const uint8_t *r = w + n * row;
        for (int j = 0; j < 4; j++)
            dequantize_row(r + j * row, kind, scratch + j * K, K);
        rows_of(x, scratch, y, M, N, K, n, add, 4);
    }
    for (; n < N; n++) {
        dequantize_row(w + n * row, kind, scratch, K);
        for (Py_ssize_t m = 0; m < M; m++)
            put(y + m * N + n, dot(x + m * K, scratch, K), add);
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
    PyErr_SetString(PyExc_RuntimeError, "rows_linear: built without AVX2 support");
    return NULL;
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

/* dequantize(dst, src, kind, rows, K): rows rows of K weights, each K / 32 blocks of `kind` (1: Q4_1,
 * 2: Q8_0) at address src, as float32 at dst[rows, K]. Runs without the GIL. */
static PyObject *dequantize(PyObject *self, PyObject *args) {
    unsigned long long dst, src;
    int kind;
    Py_ssize_t rows, K;
    if (!PyArg_ParseTuple(args, "KKinn", &dst, &src, &kind, &rows, &K))
        return NULL;
    if (rows < 0 || !blocks_valid(kind, K))
        return NULL;
#ifdef ROWS_LINEAR_X86
    Py_BEGIN_ALLOW_THREADS
    const Py_ssize_t row = K / BLOCK_WEIGHTS * block_bytes(kind);
    for (Py_ssize_t r = 0; r < rows; r++)
        dequantize_row((const uint8_t *)(uintptr_t)src + r * row, kind, (float *)(uintptr_t)dst + r * K, K);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "rows_linear: built without AVX2 support");
    return NULL;
#endif
}

/* linear_blocks(y, x, w, kind, M, N, K, add=0): y[M, N] = x[M, K] @ W^T (or y += it, where `add`)
 * with W's N rows as blocks of `kind` at address w (K / 32 blocks a row), float32 y and x. Runs
 * without the GIL. */
static PyObject *linear_blocks(PyObject *self, PyObject *args) {
    unsigned long long y, x, w;
    int kind, add = 0;
    Py_ssize_t M, N, K;
    if (!PyArg_ParseTuple(args, "KKKinnn|p", &y, &x, &w, &kind, &M, &N, &K, &add))
        return NULL;
    if (M < 0 || N < 0 || !blocks_valid(kind, K))
        return NULL;
#ifdef ROWS_LINEAR_X86
    float *scratch = aligned_alloc(64, (size_t)(6 * K * sizeof(float) + 63) / 64 * 64);
    if (scratch == NULL)
        return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    linear_blocks_nt((const float *)(uintptr_t)x, (const uint8_t *)(uintptr_t)w, kind, (float *)(uintptr_t)y,
                     scratch, M, N, K, add);
    Py_END_ALLOW_THREADS
    free(scratch);
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "rows_linear: built without AVX2 support");
    return NULL;
#endif
}

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS, "Whether this CPU has AVX2 and FMA (and the build uses them)."},
    {"linear", linear, METH_VARARGS, "linear(y, x, w, M, N, K, add=0): y = x @ w^T (y += where add), float32 buffers by address."},
    {"linear_blocks", linear_blocks, METH_VARARGS,
     "linear_blocks(y, x, w, kind, M, N, K, add=0): y = x @ W^T (y += where add), W as GGUF blocks "
     "(1: Q4_1, 2: Q8_0), by address."},
    {"dequantize", dequantize, METH_VARARGS,
     "dequantize(dst, src, kind, rows, K): GGUF blocks (1: Q4_1, 2: Q8_0) as float32, by address."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows_linear",
                                    "A float32 linear layer for a few rows (AVX2, FMA).", -1, methods};

PyMODINIT_FUNC PyInit__rows_linear(void) { return PyModule_Create(&module); }
