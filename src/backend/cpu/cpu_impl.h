/* cpu_impl.h - internals shared inside backend/cpu/: work splitting, activation quantisation,
 * small SIMD helpers (AVX-512 when compiled, scalar otherwise). */
#ifndef HM_BACKEND_CPU_IMPL_H
#define HM_BACKEND_CPU_IMPL_H

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "cpu_ops.h"
#include "quant/quant.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define HM_CPU_AVX512 1
#endif

/* [*lo, *hi) = the ith of nth near-equal parts of [0, n). */
static inline void hm_split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * ith / nth;
    *hi = n * (ith + 1) / nth;
}

/* Bump allocator over an hm_scratch: 64-byte aligned pieces; asserts on overflow (a sizing bug). */
typedef struct hm_bump {
    char *p;
    size_t left;
} hm_bump;

static inline hm_bump hm_bump_init(hm_scratch *s) {
    hm_bump b = {s ? (char *)s->data : NULL, s ? s->size : 0};
    uintptr_t mis = (uintptr_t)b.p % HM_ALIGN;
    if (mis) {
        size_t pad = HM_ALIGN - mis;
        HM_ASSERT(b.left >= pad);
        b.p += pad;
        b.left -= pad;
    }
    return b;
}

static inline void *hm_bump_take(hm_bump *b, size_t bytes) {
    size_t n = (size_t)hm_align_up(bytes, HM_ALIGN);
    HM_ASSERT(n <= b->left);
    void *r = b->p;
    b->p += n;
    b->left -= n;
    return r;
}

/* Bytes of one activation row of ne0 elements quantised to any partner type, rounded to 64:
 * the largest partner is F32 (4 bytes/element). */
static inline size_t hm_act_row_bound(int64_t ne0) { return (size_t)hm_align_up((uint64_t)ne0 * 4, HM_ALIGN); }

static inline float hm_dot_f32(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
#ifdef HM_CPU_AVX512
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#else
    float s = 0.0f;
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline float hm_silu(float x) { return x / (1.0f + expf(-x)); }
/* GELU, tanh form (PyTorch's gelu approximate="tanh"), scalar in every build: Gemma's experts */
static inline float hm_gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

#ifdef HM_CPU_AVX512
/* e^x for 16 lanes, relative error < 2e-7 (range reduction by ln 2, degree-6 Taylor on
 * |r| <= ln2/2, 2^n by scalef so underflow goes smoothly to 0). Inputs below -104 give 0,
 * above 88.7 give ~3.4e38; NaN stays NaN. */
static inline __m512 hm_exp_ps(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static inline __m512 hm_silu_ps(__m512 x) {
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), hm_exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}
#endif

/* o[i] = silu(g[i]) * u[i] */
static inline void hm_swiglu_vec(const float *g, const float *u, float *o, int64_t n) {
    int64_t i = 0;
#ifdef HM_CPU_AVX512
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(o + i, _mm512_mul_ps(hm_silu_ps(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
#endif
    for (; i < n; i++) o[i] = hm_silu(g[i]) * u[i];
}

/* max of x[0..n), -inf for n = 0 */
static inline float hm_max_f32(const float *x, int64_t n) {
    int64_t i = 0;
    float m = -INFINITY;
#ifdef HM_CPU_AVX512
    if (n >= 16) {
        __m512 mv = _mm512_loadu_ps(x);
        for (i = 16; i + 16 <= n; i += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + i));
        m = _mm512_reduce_max_ps(mv);
    }
#endif
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* x[i] = e^(x[i] - m), returns the sum (in lane order, then the tail). */
static inline float hm_exp_sub_sum(float *x, int64_t n, float m) {
    int64_t i = 0;
    float s = 0.0f;
#ifdef HM_CPU_AVX512
    __m512 acc = _mm512_setzero_ps();
    const __m512 mv = _mm512_set1_ps(m);
    for (; i + 16 <= n; i += 16) {
        __m512 e = hm_exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
        _mm512_storeu_ps(x + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    s = _mm512_reduce_add_ps(acc);
#endif
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    return s;
}

#endif
