/* cpu_gemma.c - the Gemma ops of cpu_gemma.h. Plain loops split over rows / (token, pair) items.
 * Not tuned: correctness first. */
#include "cpu_gemma.h"
#include "cpu_impl.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fp16.h"
#include "core/status.h"

static void split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * ith / nth;
    *hi = n * (ith + 1) / nth;
}

/* ---- elementwise ---- */

typedef struct {
    const float *a, *b;
    float *o;
    int64_t n;
    float c;
} ew_ctx;

static void gelu_mul_task(void *p, int ith, int nth) {
    const ew_ctx *c = p;
    int64_t lo, hi;
    split(c->n, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) c->o[i] = hm_gelu_tanh(c->a[i]) * c->b[i];
}

void hm_gemma_gelu_mul(hm_pool *pool, const float *g, const float *u, float *out, int64_t n) {
    ew_ctx c = {.a = g, .b = u, .o = out, .n = n};
    hm_pool_run(pool, gelu_mul_task, &c);
}

static void softcap_task(void *p, int ith, int nth) {
    const ew_ctx *c = p;
    int64_t lo, hi;
    split(c->n, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) c->o[i] = c->c * tanhf(c->o[i] / c->c);
}

void hm_gemma_softcap(hm_pool *pool, float *x, int64_t n, float cap) {
    HM_ASSERT(cap > 0);
    ew_ctx c = {.o = x, .n = n, .c = cap};
    hm_pool_run(pool, softcap_task, &c);
}

/* ---- RoPE ---- */

typedef struct {
    float *x;
    const int32_t *pos;
    const float *ff;
    int64_t n_tok;
    int n_head, head_dim, n_rot;
    float theta;
} rope_ctx;

static void rope_task(void *p, int ith, int nth) {
    const rope_ctx *c = p;
    const int half = c->n_rot / 2;
    int64_t lo, hi;
    split(c->n_tok * c->n_head, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        float *v = c->x + (size_t)r * (size_t)c->head_dim;
        const double ps = (double)c->pos[r / c->n_head];
        for (int i = 0; i < half; i++) {
            double a = ps * pow((double)c->theta, -2.0 * i / c->n_rot);
            if (c->ff) a /= (double)c->ff[i];
            const float cs = (float)cos(a), sn = (float)sin(a);
            const float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * cs - x1 * sn;
            v[i + half] = x0 * sn + x1 * cs;
        }
    }
}

void hm_gemma_rope_neox(hm_pool *pool, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot,
                        const int32_t *pos, float theta_base, const float *ff) {
    HM_ASSERT(n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim);
    rope_ctx c = {.x = x, .pos = pos, .ff = ff, .n_tok = n_tok, .n_head = n_head, .head_dim = head_dim,
                  .n_rot = n_rot, .theta = theta_base};
    hm_pool_run(pool, rope_task, &c);
}
