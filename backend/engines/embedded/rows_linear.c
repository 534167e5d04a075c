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
 * `available()` says whether this CPU has AVX2 and FMA; `linear` is only called where it has.
 * Built without AVX2 support in the compiler (or on another architecture), `available()` is False.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define ROWS_LINEAR_X86 1
#include <immintrin.h>

#define TARGET __attribute__((target("avx2,fma")))

TARGET static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    lo = _mm_add_ps(lo, _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
    return _mm_cvtss_f32(lo);
}

/* The dot product of a[0:K] and b[0:K], K a multiple of 8. */
TARGET static float dot(const float *a, const float *b, Py_ssize_t K) {
    __m256 c = _mm256_setzero_ps();
    for (Py_ssize_t k = 0; k < K; k += 8)
        c = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), c);
    return hsum(c);
}

TARGET static void linear_nt(const float *x, const float *w, float *y, Py_ssize_t M, Py_ssize_t N,
                             Py_ssize_t K) {
    Py_ssize_t n = 0;
    for (; n + 4 <= N; n += 4) {
        const float *w0 = w + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        Py_ssize_t m = 0;
        for (; m + 2 <= M; m += 2) {
            const float *a0 = x + m * K, *a1 = a0 + K;
            __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c03 = c00;
            __m256 c10 = c00, c11 = c00, c12 = c00, c13 = c00;
            for (Py_ssize_t k = 0; k < K; k += 8) {
                __m256 b0 = _mm256_loadu_ps(w0 + k), b1 = _mm256_loadu_ps(w1 + k);
                __m256 b2 = _mm256_loadu_ps(w2 + k), b3 = _mm256_loadu_ps(w3 + k);
                __m256 x0 = _mm256_loadu_ps(a0 + k), x1 = _mm256_loadu_ps(a1 + k);
                c00 = _mm256_fmadd_ps(x0, b0, c00);
                c01 = _mm256_fmadd_ps(x0, b1, c01);
                c02 = _mm256_fmadd_ps(x0, b2, c02);
                c03 = _mm256_fmadd_ps(x0, b3, c03);
                c10 = _mm256_fmadd_ps(x1, b0, c10);
                c11 = _mm256_fmadd_ps(x1, b1, c11);
                c12 = _mm256_fmadd_ps(x1, b2, c12);
                c13 = _mm256_fmadd_ps(x1, b3, c13);
            }
            float *y0 = y + m * N + n, *y1 = y0 + N;
            y0[0] = hsum(c00), y0[1] = hsum(c01), y0[2] = hsum(c02), y0[3] = hsum(c03);
            y1[0] = hsum(c10), y1[1] = hsum(c11), y1[2] = hsum(c12), y1[3] = hsum(c13);
        }
        for (; m < M; m++) {
            const float *a0 = x + m * K;
            __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
            for (Py_ssize_t k = 0; k < K; k += 8) {
                __m256 x0 = _mm256_loadu_ps(a0 + k);
                c0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w0 + k), c0);
                c1 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w1 + k), c1);
                c2 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w2 + k), c2);
                c3 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w3 + k), c3);
            }
            float *y0 = y + m * N + n;
            y0[0] = hsum(c0), y0[1] = hsum(c1), y0[2] = hsum(c2), y0[3] = hsum(c3);
        }
    }
    for (; n < N; n++)
        for (Py_ssize_t m = 0; m < M; m++)
            y[m * N + n] = dot(x + m * K, w + n * K, K);
}
#endif

static PyObject *available(PyObject *self, PyObject *unused) {
#ifdef ROWS_LINEAR_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

/* linear(y, x, w, M, N, K): the addresses of contiguous float32 buffers y[M, N], x[M, K], w[N, K]
 * (the caller checks shapes, types and layout), K a multiple of 8. Runs without the GIL. */
static PyObject *linear(PyObject *self, PyObject *args) {
    unsigned long long y, x, w;
    Py_ssize_t M, N, K;
    if (!PyArg_ParseTuple(args, "KKKnnn", &y, &x, &w, &M, &N, &K))
        return NULL;
    if (M < 0 || N < 0 || K < 0 || K % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "rows_linear: M, N, K must be >= 0 and K a multiple of 8");
        return NULL;
    }
#ifdef ROWS_LINEAR_X86
    Py_BEGIN_ALLOW_THREADS
    linear_nt((const float *)(uintptr_t)x, (const float *)(uintptr_t)w, (float *)(uintptr_t)y, M, N, K);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "rows_linear: built without AVX2 support");
    return NULL;
#endif
}

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS, "Whether this CPU has AVX2 and FMA (and the build uses them)."},
    {"linear", linear, METH_VARARGS, "linear(y, x, w, M, N, K): y = x @ w^T on float32 buffers by address."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows_linear",
                                    "A float32 linear layer for a few rows (AVX2, FMA).", -1, methods};

PyMODINIT_FUNC PyInit__rows_linear(void) { return PyModule_Create(&module); }
