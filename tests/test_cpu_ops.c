/* test_cpu_ops.c - every CPU op and the thread pool against naive double-precision references
 * written here (independent of the backend's code paths).
 *
 * Weights of each supported type are built by quantising random floats with the type's reference
 * from_float and dequantising them with to_float_ref: the reference multiplies those exact weights
 * by the exact f32 activations, so the only error left is the backend's activation quantisation
 * (bounded by the partner type's precision) and float accumulation. */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "core/alloc.h"
#include "core/fp16.h"
#include "core/threadpool.h"
#include "quant/quant.h"
#include "test.h"

/* ---- helpers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double rnd_u(void) { /* [0, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
static float rnd_n(void) { /* ~N(0,1) via sum of uniforms */
    double s = 0;
    for (int i = 0; i < 4; i++) s += rnd_u();
    return (float)((s - 2.0) * 1.7320508);
}
static void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = rnd_n() * scale;
}

static double nmse(const float *y, const double *ref, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)y[i] - ref[i];
        e += d * d;
        s += ref[i] * ref[i];
    }
    return s > 0 ? e / s : e;
}

/* NMSE bound of a dot product whose activation side was rounded to partner type pt. */
static double partner_bound(int pt) {
    switch (pt) {
    case HM_TYPE_F32: return 1e-10;
    case HM_TYPE_F16: return 1e-6;
    case HM_TYPE_BF16: return 1e-4;
    default: return 2e-3; /* 8-bit block formats: step amax/127, uniform rounding */
    }
}

static const int test_types[] = {HM_TYPE_F32, HM_TYPE_F16, HM_TYPE_BF16, HM_TYPE_Q8_0, HM_TYPE_Q4_0,
                                 HM_TYPE_MXFP4, HM_TYPE_Q4_K, HM_TYPE_Q5_K, HM_TYPE_Q6_K, HM_TYPE_IQ4_XS,
                                 HM_TYPE_IQ2_XXS, HM_TYPE_IQ2_XS, HM_TYPE_IQ2_S, HM_TYPE_IQ3_XXS, HM_TYPE_IQ3_S,
                                 HM_TYPE_IQ1_S, HM_TYPE_IQ1_M};
#define N_TEST_TYPES (int)(sizeof test_types / sizeof test_types[0])

/* A random weight matrix of type t: quantised bytes + its exact dequantised values. */
typedef struct {
    hm_mat m;
    void *q;
    float *deq; /* [ne1, ne0] */
} test_mat;

static void mat_make(test_mat *tm, int type, int64_t ne0, int64_t ne1) {
    const hm_type_traits *tr = hm_type_get(type);
    size_t rs = hm_row_size(type, ne0);
    float *src = malloc((size_t)(ne0 * ne1) * sizeof(float));
    fill(src, ne0 * ne1, 0.5f);
    tm->q = hm_malloc_aligned(rs * (size_t)ne1);
    tm->deq = malloc((size_t)(ne0 * ne1) * sizeof(float));
    for (int64_t r = 0; r < ne1; r++) {
        tr->from_float_ref(src + r * ne0, (char *)tm->q + (size_t)r * rs, ne0);
        tr->to_float_ref((char *)tm->q + (size_t)r * rs, tm->deq + r * ne0, ne0);
    }
    tm->m = hm_mat_make(tm->q, type, ne0, ne1, rs);
    free(src);
}
static void mat_free(test_mat *tm) {
    hm_free_aligned(tm->q);
    free(tm->deq);
}

static hm_scratch scratch_make(size_t n) {
    hm_scratch s = {hm_malloc_aligned(n), n};
    return s;
}

/* ---- thread pool ---- */

typedef struct {
    _Atomic int64_t sum;
    int64_t slots[64];
    hm_pool *pool;
    int rounds;
} pool_ctx;

static void pool_fn(void *vctx, int ith, int nth) {
    pool_ctx *c = vctx;
    atomic_fetch_add(&c->sum, ith + 1);
    c->slots[ith] += nth;
}

static void pool_barrier_fn(void *vctx, int ith, int nth) {
    pool_ctx *c = vctx;
    for (int r = 0; r < c->rounds; r++) {
        c->slots[ith] = r;
        hm_pool_barrier(c->pool);
        for (int j = 0; j < nth; j++)
            if (c->slots[j] != r) atomic_fetch_add(&c->sum, 1000000); /* someone ran ahead */
        hm_pool_barrier(c->pool);
    }
}

static void test_pool(void) {
    for (int n = 1; n <= 4; n++) {
        hm_pool *pool = NULL;
        hm_err err;
        CHECK(hm_pool_open(&pool, n, &err) == HM_OK);
        CHECK(hm_pool_size(pool) == n);
        pool_ctx c;
        memset(&c, 0, sizeof c);
        atomic_init(&c.sum, 0);
        const int runs = 20000;
        for (int i = 0; i < runs; i++) hm_pool_run(pool, pool_fn, &c);
        CHECK(atomic_load(&c.sum) == (int64_t)runs * n * (n + 1) / 2);
        for (int i = 0; i < n; i++) CHECK(c.slots[i] == (int64_t)runs * n);
        memset(c.slots, 0, sizeof c.slots);
        atomic_store(&c.sum, 0);
        c.pool = pool;
        c.rounds = 500;
        hm_pool_run(pool, pool_barrier_fn, &c);
        CHECKF(atomic_load(&c.sum) == 0, "barrier let a thread run ahead (n=%d)", n);
        hm_pool_close(pool);
    }
    hm_pool *bad = NULL;
    CHECK(hm_pool_open(&bad, 0, NULL) == HM_ERR_ARG && bad == NULL);
    hm_pool_close(NULL);
    CHECK(hm_pool_size(NULL) == 1);
}

/* ---- matmul ---- */

static void ref_matmul(const float *deq, int64_t ne0, int64_t ne1, const float *x, int64_t n_tok,
                       double *y) {
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < ne1; r++) {
            double s = 0;
            for (int64_t c = 0; c < ne0; c++) s += (double)deq[r * ne0 + c] * (double)x[t * ne0 + c];
            y[t * ne1 + r] = s;
        }
}

static void test_matmul(hm_pool **pools) {
    static const int64_t toks[] = {1, 3, 8, 33, 128};
    const int64_t ne0 = 512, ne1 = 72;
    for (int ti = 0; ti < N_TEST_TYPES; ti++) {
        int type = test_types[ti];
        if (!hm_cpu_type_ok(type)) {
            fprintf(stderr, "matmul: %s not registered yet, skipped\n", hm_type_name(type));
            continue;
        }
        test_mat w;
        mat_make(&w, type, ne0, ne1);
        const double bound = partner_bound((int)hm_type_get(type)->vec_dot_type);
        for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
            int64_t n_tok = toks[k];
            float *x = malloc((size_t)(n_tok * ne0) * sizeof(float));
            fill(x, n_tok * ne0, 1.0f);
            double *ref = malloc((size_t)(n_tok * ne1) * sizeof(double));
            ref_matmul(w.deq, ne0, ne1, x, n_tok, ref);
            float *y[3];
            for (int p = 0; p < 3; p++) {
                y[p] = malloc((size_t)(n_tok * ne1) * sizeof(float));
                hm_scratch s = scratch_make(hm_cpu_matmul_scratch_size(ne0, n_tok, p + 1));
                hm_cpu_matmul(pools[p], &w.m, x, n_tok, y[p], &s);
                hm_free_aligned(s.data);
                double e = nmse(y[p], ref, n_tok * ne1);
                CHECKF(e < bound, "matmul %s n_tok=%lld threads=%d: nmse %.3g > %.3g",
                       hm_type_name(type), (long long)n_tok, p + 1, e, bound);
            }
            CHECKF(memcmp(y[0], y[1], (size_t)(n_tok * ne1) * sizeof(float)) == 0 &&
                       memcmp(y[0], y[2], (size_t)(n_tok * ne1) * sizeof(float)) == 0,
                   "matmul %s n_tok=%lld: results differ across thread counts", hm_type_name(type),
                   (long long)n_tok);
            for (int p = 0; p < 3; p++) free(y[p]);
            free(x);
            free(ref);
        }
        mat_free(&w);
    }
    /* matmul_n: three mats sharing x, mixed types where available */
    int types3[3] = {HM_TYPE_F32, HM_TYPE_F32, HM_TYPE_F32};
    if (hm_cpu_type_ok(HM_TYPE_Q8_0)) types3[1] = HM_TYPE_Q8_0;
    if (hm_cpu_type_ok(HM_TYPE_Q4_K)) types3[2] = HM_TYPE_Q4_K;
    const int64_t rows3[3] = {64, 16, 40}, n_tok = 5;
    test_mat w3[3];
    const hm_mat *ws[3];
    float *ys[3];
    float *x = malloc((size_t)(n_tok * ne0) * sizeof(float));
    fill(x, n_tok * ne0, 1.0f);
    for (int i = 0; i < 3; i++) {
        mat_make(&w3[i], types3[i], ne0, rows3[i]);
        ws[i] = &w3[i].m;
        ys[i] = malloc((size_t)(n_tok * rows3[i]) * sizeof(float));
    }
    hm_scratch s = scratch_make(hm_cpu_matmul_scratch_size(ne0, n_tok, 2));
    hm_cpu_matmul_n(pools[1], ws, 3, x, n_tok, ys, &s);
    for (int i = 0; i < 3; i++) {
        double *ref = malloc((size_t)(n_tok * rows3[i]) * sizeof(double));
        ref_matmul(w3[i].deq, ne0, rows3[i], x, n_tok, ref);
        double bound = partner_bound((int)hm_type_get(types3[i])->vec_dot_type);
        double e = nmse(ys[i], ref, n_tok * rows3[i]);
        CHECKF(e < bound, "matmul_n mat %d (%s): nmse %.3g", i, hm_type_name(types3[i]), e);
        free(ref);
        free(ys[i]);
        mat_free(&w3[i]);
    }
    hm_free_aligned(s.data);
    free(x);
}

/* ---- moe ---- */

static double silu_d(double v) { return v / (1.0 + exp(-v)); }

/* gpt-oss's clamped SwiGLU, in double */
static double swiglu_oai_d(double g, double u) {
    const double lim = HM_SWIGLU_OAI_LIMIT, a = g < lim ? g : lim, b = u < -lim ? -lim : u > lim ? lim : u;
    return a / (1.0 + exp(-(double)HM_SWIGLU_OAI_ALPHA * a)) * (b + 1.0);
}

/* oai: gpt-oss's experts (HM_CPU_ACT_SWIGLU_OAI, gate/up/down biases per job; the gate/up biases
 * wide enough that the clamps take some rows) in place of plain SiLU ones. */
static void test_moe_type(hm_pool **pools, int type_gu, int type_down, bool oai) {
    const int64_t n_embd = 512, n_ff = 256;
    const int n_expert = 6, k = 3;
    static const int64_t batches[] = {1, 5, 40};
    test_mat gate[6], up[6], down[6];
    for (int e = 0; e < n_expert; e++) {
        mat_make(&gate[e], type_gu, n_embd, n_ff);
        mat_make(&up[e], type_gu, n_embd, n_ff);
        mat_make(&down[e], type_down, n_ff, n_embd);
    }
    const double bound = 2 * partner_bound((int)hm_type_get(type_gu)->vec_dot_type) +
                         2 * partner_bound((int)hm_type_get(type_down)->vec_dot_type);
    const hm_cpu_act act = oai ? HM_CPU_ACT_SWIGLU_OAI : HM_CPU_ACT_SILU;
    for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
        const int64_t nb = batches[bi];
        float *x = malloc((size_t)(nb * n_embd) * sizeof(float));
        fill(x, nb * n_embd, 1.0f);
        /* random routing: k distinct experts per token, random weights */
        int32_t *sel = malloc((size_t)(nb * k) * sizeof(int32_t));
        float *wsel = malloc((size_t)(nb * k) * sizeof(float));
        for (int64_t t = 0; t < nb; t++)
            for (int j = 0; j < k; j++) {
                int e;
                bool dup;
                do {
                    e = (int)(rnd_u() * n_expert);
                    dup = false;
                    for (int i = 0; i < j; i++) dup |= sel[t * k + i] == e;
                } while (dup);
                sel[t * k + j] = e;
                wsel[t * k + j] = (float)(0.1 + rnd_u());
            }
        /* jobs: one per expert (some may be empty), pairs in token order */
        hm_moe_job jobs[6];
        memset(jobs, 0, sizeof jobs);
        float *bias = malloc((size_t)n_expert * (size_t)(2 * n_ff + n_embd) * sizeof(float));
        fill(bias, (int64_t)n_expert * (2 * n_ff + n_embd), 1.0f);
        for (int64_t i = 0; i < (int64_t)n_expert * 2 * n_ff; i++) bias[i] *= 4.0f; /* |g|, |u| past 7 at times */
        int32_t *jt = malloc((size_t)(nb * k) * sizeof(int32_t));
        float *jw = malloc((size_t)(nb * k) * sizeof(float));
        int32_t at = 0;
        for (int e = 0; e < n_expert; e++) {
            jobs[e].gate = gate[e].m;
            jobs[e].up = up[e].m;
            jobs[e].down = down[e].m;
            jobs[e].tok = jt + at;
            jobs[e].w = jw + at;
            jobs[e].n_tok = 0;
            if (oai) {
                jobs[e].gate_b = bias + (size_t)e * (size_t)(2 * n_ff + n_embd);
                jobs[e].up_b = jobs[e].gate_b + n_ff;
                jobs[e].down_b = jobs[e].up_b + n_ff;
            }
            for (int64_t t = 0; t < nb; t++)
                for (int j = 0; j < k; j++)
                    if (sel[t * k + j] == e) {
                        jt[at] = (int32_t)t;
                        jw[at++] = wsel[t * k + j];
                        jobs[e].n_tok++;
                    }
        }
        /* naive reference: per token, per selected expert */
        double *ref = calloc((size_t)(nb * n_embd), sizeof(double));
        double *h = malloc((size_t)n_ff * sizeof(double));
        float *base = malloc((size_t)(nb * n_embd) * sizeof(float));
        fill(base, nb * n_embd, 0.1f);
        for (int64_t t = 0; t < nb; t++) {
            for (int64_t i = 0; i < n_embd; i++) ref[t * n_embd + i] = base[t * n_embd + i];
            for (int j = 0; j < k; j++) {
                int e = sel[t * k + j];
                for (int64_t r = 0; r < n_ff; r++) {
                    double g = 0, u = 0;
                    for (int64_t c = 0; c < n_embd; c++) {
                        g += (double)gate[e].deq[r * n_embd + c] * x[t * n_embd + c];
                        u += (double)up[e].deq[r * n_embd + c] * x[t * n_embd + c];
                    }
                    h[r] = oai ? swiglu_oai_d(g + jobs[e].gate_b[r], u + jobs[e].up_b[r]) : silu_d(g) * u;
                }
                for (int64_t r = 0; r < n_embd; r++) {
                    double o = oai ? jobs[e].down_b[r] : 0;
                    for (int64_t c = 0; c < n_ff; c++) o += (double)down[e].deq[r * n_ff + c] * h[c];
                    ref[t * n_embd + r] += wsel[t * k + j] * o;
                }
            }
        }
        float *out[3];
        for (int p = 0; p < 3; p++) {
            out[p] = malloc((size_t)(nb * n_embd) * sizeof(float));
            memcpy(out[p], base, (size_t)(nb * n_embd) * sizeof(float));
            hm_scratch s = scratch_make(hm_cpu_moe_scratch_size(nb, nb * k, n_embd, n_ff, p + 1));
            hm_cpu_moe_act(pools[p], act, jobs, n_expert, x, nb, n_embd, n_ff, out[p], &s);
            hm_free_aligned(s.data);
            double e = nmse(out[p], ref, nb * n_embd);
            CHECKF(e < bound, "moe %s/%s%s batch=%lld threads=%d: nmse %.3g > %.3g", hm_type_name(type_gu),
                   hm_type_name(type_down), oai ? " swiglu_oai+bias" : "", (long long)nb, p + 1, e, bound);
        }
        CHECKF(memcmp(out[0], out[1], (size_t)(nb * n_embd) * sizeof(float)) == 0 &&
                   memcmp(out[0], out[2], (size_t)(nb * n_embd) * sizeof(float)) == 0,
               "moe batch=%lld: results differ across thread counts", (long long)nb);
        /* a subset of jobs (the CPU's share) adds exactly the other jobs' complement */
        float *part = malloc((size_t)(nb * n_embd) * sizeof(float));
        memcpy(part, base, (size_t)(nb * n_embd) * sizeof(float));
        hm_scratch s = scratch_make(hm_cpu_moe_scratch_size(nb, nb * k, n_embd, n_ff, 2));
        hm_cpu_moe_act(pools[1], act, jobs, 3, x, nb, n_embd, n_ff, part, &s);
        hm_cpu_moe_act(pools[1], act, jobs + 3, n_expert - 3, x, nb, n_embd, n_ff, part, &s);
        hm_free_aligned(s.data);
        double e = nmse(part, ref, nb * n_embd);
        CHECKF(e < bound, "moe split jobs batch=%lld: nmse %.3g", (long long)nb, e);
        for (int p = 0; p < 3; p++) free(out[p]);
        free(part);
        free(base);
        free(h);
        free(ref);
        free(jt);
        free(jw);
        free(sel);
        free(wsel);
        free(x);
        free(bias);
    }
    for (int e = 0; e < n_expert; e++) {
        mat_free(&gate[e]);
        mat_free(&up[e]);
        mat_free(&down[e]);
    }
}

/* One token (decode): hm_cpu_moe's one-token path must give the general path's bytes exactly, for
 * 1, 2 and 8 units (with empty jobs between them), Q4_K gate/up, Q4_K and Q6_K down, at 1, 2, 3 and
 * 16 threads; both against the double reference too; and with gpt-oss's experts (clamped SwiGLU,
 * gate/up/down biases) the two paths' bytes equal. Weights of decode size (n_embd 2048). */
static void test_moe_one_token(hm_pool **pools, int64_t n_ff) {
    const int64_t n_embd = 2048;
    enum { N_UNIT = 8 };
    static const int units[] = {1, 2, 8};
    static const int downs[] = {HM_TYPE_Q4_K, HM_TYPE_Q6_K};
    hm_pool *p16 = NULL;
    hm_err err;
    CHECKF(hm_pool_open(&p16, 16, &err) == HM_OK, "pool of 16: %s", err.msg);
    if (!p16) return;
    hm_pool *tp[4] = {pools[0], pools[1], pools[2], p16};
    static const int tn[4] = {1, 2, 3, 16};
    test_mat gate[N_UNIT], up[N_UNIT], down[N_UNIT];
    for (int e = 0; e < N_UNIT; e++) {
        mat_make(&gate[e], HM_TYPE_Q4_K, n_embd, n_ff);
        mat_make(&up[e], HM_TYPE_Q4_K, n_embd, n_ff);
    }
    float *x = malloc((size_t)n_embd * sizeof(float));
    float *base = malloc((size_t)n_embd * sizeof(float));
    float *gen = malloc((size_t)n_embd * sizeof(float));
    float *one = malloc((size_t)n_embd * sizeof(float));
    double *ref = malloc((size_t)n_embd * sizeof(double));
    double *h = malloc((size_t)n_ff * sizeof(double));
    const int32_t tok0 = 0;
    float wu[N_UNIT];
    hm_scratch s = scratch_make(hm_cpu_moe_scratch_size(1, N_UNIT, n_embd, n_ff, 16));
    float *bias = malloc((size_t)(N_UNIT + 2) * (size_t)(2 * n_ff + n_embd) * sizeof(float));
    fill(bias, (int64_t)(N_UNIT + 2) * (2 * n_ff + n_embd), 4.0f);
    for (size_t di = 0; di < sizeof downs / sizeof downs[0]; di++) {
        for (int e = 0; e < N_UNIT; e++) mat_make(&down[e], downs[di], n_ff, n_embd);
        for (size_t ui = 0; ui < sizeof units / sizeof units[0]; ui++) {
            const int nu = units[ui];
            fill(x, n_embd, 1.0f);
            fill(base, n_embd, 0.1f);
            /* jobs: an empty one first, then the units (experts in reverse order), an empty one
             * after the first unit */
            hm_moe_job jobs[N_UNIT + 2];
            int nj = 0;
            memset(jobs, 0, sizeof jobs);
            jobs[nj++] = (hm_moe_job){.gate = gate[0].m, .up = up[0].m, .down = down[0].m, .tok = &tok0, .w = wu};
            for (int i = 0; i < nu; i++) {
                const int e = N_UNIT - 1 - i;
                wu[i] = (float)(0.1 + rnd_u());
                jobs[nj++] = (hm_moe_job){.gate = gate[e].m, .up = up[e].m, .down = down[e].m, .tok = &tok0,
                                          .w = &wu[i], .n_tok = 1};
                if (i == 0)
                    jobs[nj++] = (hm_moe_job){.gate = gate[1].m, .up = up[1].m, .down = down[1].m, .tok = &tok0, .w = wu};
            }
            for (int64_t i = 0; i < n_embd; i++) ref[i] = base[i];
            for (int i = 0; i < nu; i++) {
                const int e = N_UNIT - 1 - i;
                for (int64_t r = 0; r < n_ff; r++) {
                    double g = 0, u = 0;
                    for (int64_t c = 0; c < n_embd; c++) {
                        g += (double)gate[e].deq[r * n_embd + c] * x[c];
                        u += (double)up[e].deq[r * n_embd + c] * x[c];
                    }
                    h[r] = silu_d(g) * u;
                }
                for (int64_t r = 0; r < n_embd; r++) {
                    double o = 0;
                    for (int64_t c = 0; c < n_ff; c++) o += (double)down[e].deq[r * n_ff + c] * h[c];
                    ref[r] += wu[i] * o;
                }
            }
            const double bound = 4 * partner_bound(HM_TYPE_Q8_K);
            for (int t = 0; t < 4; t++) {
                memcpy(gen, base, (size_t)n_embd * sizeof(float));
                hm_cpu_moe_set_one_token_path(false);
                hm_cpu_moe(tp[t], jobs, nj, x, 1, n_embd, n_ff, gen, &s);
                memcpy(one, base, (size_t)n_embd * sizeof(float));
                hm_cpu_moe_set_one_token_path(true);
                hm_cpu_moe(tp[t], jobs, nj, x, 1, n_embd, n_ff, one, &s);
                int64_t first = -1;
                for (int64_t i = 0; i < n_embd && first < 0; i++)
                    if (memcmp(&gen[i], &one[i], sizeof(float)) != 0) first = i;
                CHECKF(first < 0, "moe one token n_ff=%lld down=%s units=%d threads=%d: differs from the "
                       "general path at %lld (%.9g vs %.9g)", (long long)n_ff, hm_type_name(downs[di]), nu,
                       tn[t], (long long)first, first < 0 ? 0.0 : (double)one[first],
                       first < 0 ? 0.0 : (double)gen[first]);
                double e = nmse(one, ref, n_embd);
                CHECKF(e < bound, "moe one token n_ff=%lld down=%s units=%d threads=%d: nmse %.3g > %.3g",
                       (long long)n_ff, hm_type_name(downs[di]), nu, tn[t], e, bound);
                /* gpt-oss's experts (clamped SwiGLU, the jobs' biases): the same bytes on both paths
                 * (their values: test_moe_type) */
                hm_moe_job bj[N_UNIT + 2];
                memcpy(bj, jobs, sizeof bj);
                for (int j = 0; j < nj; j++) {
                    bj[j].gate_b = bias + (size_t)j * (size_t)(2 * n_ff + n_embd);
                    bj[j].up_b = bj[j].gate_b + n_ff;
                    bj[j].down_b = bj[j].up_b + n_ff;
                }
                memcpy(gen, base, (size_t)n_embd * sizeof(float));
                hm_cpu_moe_set_one_token_path(false);
                hm_cpu_moe_act(tp[t], HM_CPU_ACT_SWIGLU_OAI, bj, nj, x, 1, n_embd, n_ff, gen, &s);
                memcpy(one, base, (size_t)n_embd * sizeof(float));
                hm_cpu_moe_set_one_token_path(true);
                hm_cpu_moe_act(tp[t], HM_CPU_ACT_SWIGLU_OAI, bj, nj, x, 1, n_embd, n_ff, one, &s);
                CHECKF(!memcmp(gen, one, (size_t)n_embd * sizeof(float)),
                       "moe one token swiglu_oai+bias n_ff=%lld down=%s units=%d threads=%d: differs from the "
                       "general path", (long long)n_ff, hm_type_name(downs[di]), nu, tn[t]);
            }
        }
        for (int e = 0; e < N_UNIT; e++) mat_free(&down[e]);
    }
    hm_free_aligned(s.data);
    free(bias);
    for (int e = 0; e < N_UNIT; e++) {
        mat_free(&gate[e]);
        mat_free(&up[e]);
    }
    free(h);
    free(ref);
    free(one);
    free(gen);
    free(base);
    free(x);
    hm_pool_close(p16);
}

static void test_moe(hm_pool **pools) {
    if (hm_cpu_type_ok(HM_TYPE_Q4_K) && hm_cpu_type_ok(HM_TYPE_Q6_K)) {
        test_moe_one_token(pools, 512);
        test_moe_one_token(pools, 768);
    }
    for (int oai = 0; oai < 2; oai++) {
        test_moe_type(pools, HM_TYPE_F32, HM_TYPE_F32, oai);
        if (hm_cpu_type_ok(HM_TYPE_Q4_K) && hm_cpu_type_ok(HM_TYPE_Q6_K))
            test_moe_type(pools, HM_TYPE_Q4_K, HM_TYPE_Q6_K, oai);
        if (hm_cpu_type_ok(HM_TYPE_Q8_0) && hm_cpu_type_ok(HM_TYPE_Q4_K))
            test_moe_type(pools, HM_TYPE_Q8_0, HM_TYPE_Q4_K, oai);
        if (hm_cpu_type_ok(HM_TYPE_MXFP4)) test_moe_type(pools, HM_TYPE_MXFP4, HM_TYPE_MXFP4, oai);
    }
}

/* ---- attention ---- */

/* hm_cpu_attention_tiled over a ring cache with a sliding window (gemma4's sliding layers): 40
 * queries at positions 100..139, window 24, 8 q / 2 kv heads, the ring of 24 + 40 - 1 = 63 rows
 * written position by position from 0 (so it holds 77..139, each at p % 63), against a double
 * reference over the same f16 rows; bit-identical on 1, 2 and 3 threads. With sinks (gpt-oss: one
 * more logit per q head in the denominator), the tiled kernel and, on the last 4 queries, the
 * per-query ring kernel (hm_cpu_attention_ring_sinks below the tiled batch size). */
static void test_attention_ring(hm_pool **pools, int d, bool with_sinks) {
    const int n_head = 8, n_kv = 2, W = 24, n_tok = 40, pos0 = 100;
    const int64_t cap = W + n_tok - 1;
    const int64_t row_q = n_head * d;
    uint16_t *kc = malloc((size_t)(n_kv * cap * d) * 2), *vc = malloc((size_t)(n_kv * cap * d) * 2);
    for (int p = 0; p < pos0 + n_tok; p++)
        for (int h = 0; h < n_kv; h++)
            for (int i = 0; i < d; i++) {
                const size_t at = ((size_t)h * (size_t)cap + (size_t)(p % cap)) * (size_t)d + (size_t)i;
                kc[at] = hm_f32_to_fp16((float)sin(0.37 * p + 1.3 * h + 0.11 * i));
                vc[at] = hm_f32_to_fp16((float)cos(0.23 * p - 0.7 * h + 0.05 * i));
            }
    float *q = malloc((size_t)(n_tok * row_q) * sizeof(float));
    fill(q, n_tok * row_q, 1.0f);
    int32_t pos[40];
    for (int t = 0; t < n_tok; t++) pos[t] = pos0 + t;
    const float scale = 1.0f / sqrtf((float)d);
    float sinks[8];
    for (int h = 0; h < n_head; h++) sinks[h] = (float)(1.5 * sin(0.9 * h + 0.4)); /* around the scores' range */
    const float *sk = with_sinks ? sinks : NULL;
    double *ref = malloc((size_t)(n_tok * row_q) * sizeof(double)), sc[64];
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            const int g = h / (n_head / n_kv), p0 = pos[t] - W + 1;
            double m = -INFINITY, l = 0;
            for (int p = p0; p <= pos[t]; p++) {
                const uint16_t *kr = kc + ((size_t)g * (size_t)cap + (size_t)(p % cap)) * (size_t)d;
                double s = 0;
                for (int i = 0; i < d; i++) s += (double)q[t * row_q + h * d + i] * hm_fp16_to_f32(kr[i]);
                sc[p - p0] = s * scale;
                m = sc[p - p0] > m ? sc[p - p0] : m;
            }
            for (int p = p0; p <= pos[t]; p++) l += (sc[p - p0] = exp(sc[p - p0] - m));
            if (sk) l += exp((double)sk[h] - m);
            for (int i = 0; i < d; i++) {
                double o = 0;
                for (int p = p0; p <= pos[t]; p++)
                    o += sc[p - p0] * hm_fp16_to_f32(vc[((size_t)g * (size_t)cap + (size_t)(p % cap)) * (size_t)d + (size_t)i]);
                ref[t * row_q + h * d + i] = o / l;
            }
        }
    float *out[3];
    for (int p = 0; p < 3; p++) {
        out[p] = malloc((size_t)(n_tok * row_q) * sizeof(float));
        float *ws = malloc(hm_cpu_attn_tiled_scratch_floats(n_head, n_kv, d, p + 1) * sizeof(float));
        hm_cpu_attention_tiled_sinks(pools[p], q, n_tok, pos, kc, vc, HM_TYPE_F16, cap, W, n_head, n_kv, d, scale, sk,
                                     out[p], ws);
        const double e = nmse(out[p], ref, n_tok * row_q);
        CHECKF(e < 1e-10, "tiled ring attention d=%d%s threads=%d: nmse %.3g", d, sk ? " sinks" : "", p + 1, e);
        if (sk) { /* the per-query kernel on the last 4 queries */
            float *o4 = malloc((size_t)(4 * row_q) * sizeof(float));
            float *s4 = malloc(hm_cpu_attention_ring_scratch_floats(cap, p + 1) * sizeof(float));
            const int t4 = n_tok - 4;
            hm_cpu_attention_ring_sinks(pools[p], q + t4 * row_q, 4, pos + t4, kc, vc, HM_TYPE_F16, cap, W, n_head, n_kv,
                                        d, scale, sk, o4, s4);
            const double e4 = nmse(o4, ref + t4 * row_q, 4 * row_q);
            CHECKF(e4 < 1e-10, "ring attention d=%d sinks threads=%d: nmse %.3g", d, p + 1, e4);
            free(o4);
            free(s4);
        }
        if (p > 0)
            CHECKF(!memcmp(out[p], out[0], (size_t)(n_tok * row_q) * sizeof(float)),
                   "tiled ring attention d=%d: %d threads differ from 1", d, p + 1);
        free(ws);
    }
    for (int p = 0; p < 3; p++) free(out[p]);
    free(kc);
    free(vc);
    free(q);
    free(ref);
}

/* d = 64 takes the grouped (GQA) path on AVX-512 builds, d = 40 the per-head path. */
static void test_attention(hm_pool **pools, int d) {
    const int n_head = 4, n_kv = 2, n_ctx = 40;
    const int64_t row_q = n_head * d, row_kv = n_kv * d;
    const int prefill = 23, n_total = 30;
    float *q = malloc((size_t)(n_total * row_q) * sizeof(float));
    float *k = malloc((size_t)(n_total * row_kv) * sizeof(float));
    float *v = malloc((size_t)(n_total * row_kv) * sizeof(float));
    fill(q, n_total * row_q, 1.0f);
    fill(k, n_total * row_kv, 1.0f);
    fill(v, n_total * row_kv, 1.0f);
    const float scale = 1.0f / sqrtf((float)d);
    /* reference over f16-rounded K/V (what the cache holds) */
    double *ref = malloc((size_t)(n_total * row_q) * sizeof(double));
    double *sc = malloc((size_t)n_total * sizeof(double));
    for (int t = 0; t < n_total; t++)
        for (int h = 0; h < n_head; h++) {
            int kh = h / (n_head / n_kv);
            double m = -INFINITY;
            for (int p = 0; p <= t; p++) {
                double s = 0;
                for (int i = 0; i < d; i++)
                    s += (double)q[t * row_q + h * d + i] *
                         hm_fp16_to_f32(hm_f32_to_fp16(k[p * row_kv + kh * d + i]));
                sc[p] = s * scale;
                m = sc[p] > m ? sc[p] : m;
            }
            double l = 0;
            for (int p = 0; p <= t; p++) l += (sc[p] = exp(sc[p] - m));
            for (int i = 0; i < d; i++) {
                double o = 0;
                for (int p = 0; p <= t; p++) o += sc[p] * hm_fp16_to_f32(hm_f32_to_fp16(v[p * row_kv + kh * d + i]));
                ref[t * row_q + h * d + i] = o / l;
            }
        }
    for (int p = 0; p < 3; p++) {
        size_t cs = (size_t)n_kv * n_ctx * d;
        uint16_t *kc = calloc(cs, 2), *vc = calloc(cs, 2);
        float *out = malloc((size_t)(n_total * row_q) * sizeof(float));
        int32_t pos[64];
        for (int i = 0; i < n_total; i++) pos[i] = i;
        /* sized once for the largest batch: it must serve the one-token calls too */
        hm_scratch s = scratch_make(hm_cpu_attention_scratch_size(prefill, n_ctx, n_head, d, p + 1));
        /* prefill as one batch, then one token at a time */
        hm_cpu_kv_write(pools[p], kc, vc, n_ctx, n_kv, d, k, v, prefill, pos);
        hm_cpu_attention(pools[p], q, prefill, pos, kc, vc, n_ctx, n_head, n_kv, d, scale, out, &s);
        for (int t = prefill; t < n_total; t++) {
            hm_cpu_kv_write(pools[p], kc, vc, n_ctx, n_kv, d, k + t * row_kv, v + t * row_kv, 1, pos + t);
            hm_cpu_attention(pools[p], q + t * row_q, 1, pos + t, kc, vc, n_ctx, n_head, n_kv, d, scale,
                             out + t * row_q, &s);
        }
        double e = nmse(out, ref, n_total * row_q);
        CHECKF(e < 1e-10, "attention d=%d threads=%d: nmse %.3g", d, p + 1, e);
        /* cache contents are the f16 rounding of the inputs */
        int bad = 0;
        for (int t = 0; t < n_total; t++)
            for (int h = 0; h < n_kv; h++)
                for (int i = 0; i < d; i++)
                    bad += kc[((size_t)h * n_ctx + t) * d + i] != hm_f32_to_fp16(k[t * row_kv + h * d + i]) ||
                           vc[((size_t)h * n_ctx + t) * d + i] != hm_f32_to_fp16(v[t * row_kv + h * d + i]);
        CHECKF(bad == 0, "kv_write: %d elements differ", bad);
        hm_free_aligned(s.data);
        free(kc);
        free(vc);
        free(out);
    }
    free(q);
    free(k);
    free(v);
    free(ref);
    free(sc);
}

/* ---- row and elementwise ops ---- */

static void test_rows(hm_pool **pools) {
    const int64_t n_rows = 37, n = 1024; /* large enough to go through the pool */
    float *x = malloc((size_t)(n_rows * n) * sizeof(float));
    float *w = malloc((size_t)n * sizeof(float));
    float *y = malloc((size_t)(n_rows * n) * sizeof(float));
    float *b = malloc((size_t)(n_rows * n) * sizeof(float));
    double *ref = malloc((size_t)(n_rows * n) * sizeof(double));
    fill(x, n_rows * n, 2.0f);
    fill(w, n, 1.0f);
    fill(b, n_rows * n, 1.0f);
    const float eps = 1e-6f;
    for (int p = 0; p < 3; p++) {
        /* rmsnorm */
        for (int64_t r = 0; r < n_rows; r++) {
            double ss = 0;
            for (int64_t i = 0; i < n; i++) ss += (double)x[r * n + i] * x[r * n + i];
            double sc = 1.0 / sqrt(ss / (double)n + eps);
            for (int64_t i = 0; i < n; i++) ref[r * n + i] = x[r * n + i] * sc * w[i];
        }
        hm_cpu_rmsnorm(pools[p], x, w, y, n_rows, n, eps);
        CHECKF(nmse(y, ref, n_rows * n) < 1e-12, "rmsnorm threads=%d", p + 1);
        /* per-head rmsnorm: heads of 128 */
        const int hd = 128, nh = (int)(n / hd);
        for (int64_t r = 0; r < n_rows * nh; r++) {
            double ss = 0;
            for (int i = 0; i < hd; i++) ss += (double)x[r * hd + i] * x[r * hd + i];
            double sc = 1.0 / sqrt(ss / hd + eps);
            for (int i = 0; i < hd; i++) ref[r * hd + i] = x[r * hd + i] * sc * w[i];
        }
        memcpy(y, x, (size_t)(n_rows * n) * sizeof(float));
        hm_cpu_rmsnorm_heads(pools[p], y, w, n_rows, nh, hd, eps);
        CHECKF(nmse(y, ref, n_rows * n) < 1e-12, "rmsnorm_heads threads=%d", p + 1);
        /* rope neox: n_rot < head_dim leaves the tail */
        const int n_rot = 96;
        int32_t pos[64];
        for (int t = 0; t < n_rows; t++) pos[t] = t * 977 % 5000;
        for (int64_t t = 0; t < n_rows; t++)
            for (int h = 0; h < nh; h++) {
                const float *xv = x + (t * nh + h) * hd;
                double *rv = ref + (t * nh + h) * hd;
                for (int i = 0; i < hd; i++) rv[i] = xv[i];
                for (int i = 0; i < n_rot / 2; i++) {
                    double a = pos[t] * pow(1e6, -2.0 * i / n_rot);
                    rv[i] = xv[i] * cos(a) - xv[i + n_rot / 2] * sin(a);
                    rv[i + n_rot / 2] = xv[i] * sin(a) + xv[i + n_rot / 2] * cos(a);
                }
            }
        memcpy(y, x, (size_t)(n_rows * n) * sizeof(float));
        hm_cpu_rope_neox(pools[p], y, n_rows, nh, hd, n_rot, pos, 1e6f);
        CHECKF(nmse(y, ref, n_rows * n) < 1e-12, "rope threads=%d: %.3g", p + 1, nmse(y, ref, n_rows * n));
        /* softmax */
        for (int64_t r = 0; r < n_rows; r++) {
            double m = -INFINITY, s = 0;
            for (int64_t i = 0; i < n; i++) m = x[r * n + i] > m ? x[r * n + i] : m;
            for (int64_t i = 0; i < n; i++) s += exp(x[r * n + i] - m);
            for (int64_t i = 0; i < n; i++) ref[r * n + i] = exp(x[r * n + i] - m) / s;
        }
        memcpy(y, x, (size_t)(n_rows * n) * sizeof(float));
        hm_cpu_softmax(pools[p], y, n_rows, n);
        CHECKF(nmse(y, ref, n_rows * n) < 1e-12, "softmax threads=%d", p + 1);
        /* elementwise */
        const int64_t ne = n_rows * n;
        hm_cpu_add(pools[p], x, b, y, ne);
        for (int64_t i = 0; i < ne; i++) ref[i] = (double)x[i] + b[i];
        CHECKF(nmse(y, ref, ne) < 1e-14, "add");
        hm_cpu_mul(pools[p], x, b, y, ne);
        for (int64_t i = 0; i < ne; i++) ref[i] = (double)x[i] * b[i];
        CHECKF(nmse(y, ref, ne) < 1e-14, "mul");
        hm_cpu_scale(pools[p], x, 0.3f, y, ne);
        for (int64_t i = 0; i < ne; i++) ref[i] = (double)x[i] * 0.3f;
        CHECKF(nmse(y, ref, ne) < 1e-14, "scale");
        hm_cpu_silu(pools[p], x, y, ne);
        for (int64_t i = 0; i < ne; i++) ref[i] = silu_d(x[i]);
        CHECKF(nmse(y, ref, ne) < 1e-12, "silu");
        hm_cpu_swiglu(pools[p], x, b, y, ne);
        for (int64_t i = 0; i < ne; i++) ref[i] = silu_d(x[i]) * b[i];
        CHECKF(nmse(y, ref, ne) < 1e-12, "swiglu");
    }
    free(x);
    free(w);
    free(y);
    free(b);
    free(ref);
}

static void test_router(void) {
    const int n_expert = 128, k = 8, n_tok = 9;
    float *logits = malloc((size_t)(n_tok * n_expert) * sizeof(float));
    fill(logits, n_tok * n_expert, 2.0f);
    logits[5] = logits[7] = 10.0f; /* a tie: id 5 must come first */
    int32_t ids[9 * 8];
    float wts[9 * 8];
    for (int renorm = 0; renorm < 2; renorm++) {
        hm_cpu_router(logits, n_tok, n_expert, k, renorm, ids, wts);
        for (int t = 0; t < n_tok; t++) {
            const float *l = logits + t * n_expert;
            double m = -INFINITY, s = 0;
            for (int e = 0; e < n_expert; e++) m = l[e] > m ? l[e] : m;
            for (int e = 0; e < n_expert; e++) s += exp(l[e] - m);
            bool used[128] = {0};
            double sel_sum = 0;
            for (int j = 0; j < k; j++) {
                /* expected j-th: largest unused, lowest id on ties */
                int best = -1;
                for (int e = 0; e < n_expert; e++)
                    if (!used[e] && (best < 0 || l[e] > l[best])) best = e;
                used[best] = true;
                CHECKF(ids[t * k + j] == best, "router t=%d j=%d: id %d, expected %d", t, j, ids[t * k + j], best);
                sel_sum += exp(l[best] - m) / s;
            }
            for (int j = 0; j < k; j++) {
                double pj = exp(l[ids[t * k + j]] - m) / s;
                if (renorm) pj /= sel_sum;
                CHECK_NEAR(wts[t * k + j], pj, 1e-6);
            }
        }
    }
    free(logits);
}

/* The routing spec (backend/route_spec.h). First a case derived by hand: 8 experts in 4 groups of
 * 2, sigmoid scores, a bias that bars expert 4 (the highest score), 2 groups kept, k 2, norm, scale
 * 2.5. s = sigmoid(l): .5 .7311 .8808 .2689 .9526 .6225 .1192 .8176; c4 = .9526 - 2 = -1.0474.
 * Group scores (the two largest c, with a bias): 1.2311, 1.1497, -.4249, .9368: groups 0 and 1 stay,
 * experts 0..3. Top 2 of c there: 2 (.8808) then 1 (.7311); weights s2, s1 over their sum, x 2.5. */
static double sigm_d(double v) { return 1.0 / (1.0 + exp(-v)); }

static void test_route_hand(void) {
    const float l[8] = {0.0f, 1.0f, 2.0f, -1.0f, 3.0f, 0.5f, -2.0f, 1.5f};
    const float bias[8] = {0, 0, 0, 0, -2.0f, 0, 0, 0};
    const hm_route_spec sp = {.n_expert = 8, .k = 2, .score = HM_ROUTE_SIGMOID, .norm = true, .scale = 2.5f,
                              .n_group = 4, .topk_group = 2};
    CHECK(hm_route_spec_invalid(&sp) == NULL);
    int32_t id[2];
    float w[2];
    hm_cpu_route(&sp, l, 1, bias, NULL, NULL, id, w);
    CHECKF(id[0] == 2 && id[1] == 1, "hand route ids %d %d, expected 2 1", id[0], id[1]);
    const double s2 = sigm_d(2.0), s1 = sigm_d(1.0);
    CHECK_NEAR(w[0], 2.5 * s2 / (s2 + s1), 1e-6);
    CHECK_NEAR(w[1], 2.5 * s1 / (s2 + s1), 1e-6);
    /* without groups expert 7 (c .8176) beats 1; without the bias too, 4 is first */
    hm_route_spec ng = sp;
    ng.n_group = 0;
    hm_cpu_route(&ng, l, 1, bias, NULL, NULL, id, w);
    CHECKF(id[0] == 2 && id[1] == 7, "no groups: ids %d %d, expected 2 7", id[0], id[1]);
    hm_cpu_route(&ng, l, 1, NULL, NULL, NULL, id, w);
    CHECKF(id[0] == 4 && id[1] == 2, "no bias: ids %d %d, expected 4 2", id[0], id[1]);
    /* gpt-oss: top 2 of the logits (4, 2), weights softmax(3, 2) = e/(e+1), 1/(e+1) */
    const hm_route_spec gt = {.n_expert = 8, .k = 2, .score = HM_ROUTE_SOFTMAX_TOPK};
    hm_cpu_route(&gt, l, 1, NULL, NULL, NULL, id, w);
    CHECKF(id[0] == 4 && id[1] == 2, "softmax_topk: ids %d %d", id[0], id[1]);
    CHECK_NEAR(w[0], exp(1.0) / (exp(1.0) + 1.0), 1e-6);
    CHECK_NEAR(w[1], 1.0 / (exp(1.0) + 1.0), 1e-6);
    /* hash-routed: token 1's row of the table, weights sqrt(softplus(l)) at those ids, normalised */
    const int32_t table[3 * 2] = {0, 1, 6, 3, 5, 5};
    const int32_t tok[2] = {1, 2};
    int32_t id2[4];
    float w2[4];
    const hm_route_spec hs = {.n_expert = 8, .k = 2, .score = HM_ROUTE_SQRT_SOFTPLUS, .norm = true};
    float l2[16];
    memcpy(l2, l, sizeof l);
    memcpy(l2 + 8, l, sizeof l);
    hm_cpu_route(&hs, l2, 2, bias, table, tok, id2, w2);
    CHECKF(id2[0] == 6 && id2[1] == 3 && id2[2] == 5 && id2[3] == 5, "hash ids %d %d %d %d", id2[0], id2[1], id2[2],
           id2[3]);
    const double a = sqrt(log1p(exp(-2.0))), b = sqrt(log1p(exp(-1.0)));
    CHECK_NEAR(w2[0], a / (a + b), 1e-6);
    CHECK_NEAR(w2[1], b / (a + b), 1e-6);
    CHECK_NEAR(w2[2], 0.5, 1e-6);
    /* invalid specs are named */
    hm_route_spec bad = sp;
    bad.topk_group = 0;
    CHECK(hm_route_spec_invalid(&bad) != NULL);
    bad = sp;
    bad.n_group = 3; /* 8 % 3 */
    CHECK(hm_route_spec_invalid(&bad) != NULL);
    bad = sp;
    bad.topk_group = 1;
    bad.k = 3; /* one group of 2 holds fewer than 3 */
    CHECK(hm_route_spec_invalid(&bad) != NULL);
}

/* Every spec on random logits against an independent reference: scores in double, the choice by a
 * full ranking (sort by c descending, id ascending) over the allowed experts. */
typedef struct { double c; int e; } rank_ent;
static int rank_cmp(const void *pa, const void *pb) {
    const rank_ent *a = pa, *b = pb;
    if (a->c != b->c) return a->c > b->c ? -1 : 1;
    return a->e - b->e;
}

static void route_ref(const hm_route_spec *sp, const float *l, const float *bias, int32_t *id, double *w) {
    const int ne = sp->n_expert, k = sp->k;
    double s[256], c[256];
    double m = -INFINITY, z = 0;
    for (int e = 0; e < ne; e++) m = l[e] > m ? l[e] : m;
    for (int e = 0; e < ne; e++) z += exp(l[e] - m);
    for (int e = 0; e < ne; e++) {
        const double v = l[e];
        s[e] = sp->score == HM_ROUTE_SOFTMAX ? exp(v - m) / z
               : sp->score == HM_ROUTE_SIGMOID ? sigm_d(v)
               : sp->score == HM_ROUTE_SQRT_SOFTPLUS ? sqrt(v > 20 ? v : log1p(exp(v)))
                                                     : v;
        c[e] = s[e] + (bias ? bias[e] : 0.0);
    }
    bool ok[256];
    for (int e = 0; e < ne; e++) ok[e] = true;
    if (sp->n_group > 1) {
        const int gs = ne / sp->n_group;
        rank_ent gr[32];
        for (int g = 0; g < sp->n_group; g++) {
            rank_ent in[256];
            for (int i = 0; i < gs; i++) in[i] = (rank_ent){c[g * gs + i], i};
            qsort(in, (size_t)gs, sizeof in[0], rank_cmp);
            gr[g] = (rank_ent){bias && gs > 1 ? in[0].c + in[1].c : in[0].c, g};
        }
        qsort(gr, (size_t)sp->n_group, sizeof gr[0], rank_cmp);
        for (int e = 0; e < ne; e++) ok[e] = false;
        for (int i = 0; i < sp->topk_group; i++)
            for (int j = 0; j < gs; j++) ok[gr[i].e * gs + j] = true;
    }
    rank_ent all[256];
    int n = 0;
    for (int e = 0; e < ne; e++)
        if (ok[e]) all[n++] = (rank_ent){c[e], e};
    qsort(all, (size_t)n, sizeof all[0], rank_cmp);
    double sum = 0, mx = -INFINITY;
    for (int i = 0; i < k; i++) {
        id[i] = all[i].e;
        w[i] = s[all[i].e];
        mx = w[i] > mx ? w[i] : mx;
    }
    if (sp->score == HM_ROUTE_SOFTMAX_TOPK) {
        for (int i = 0; i < k; i++) sum += (w[i] = exp(w[i] - mx));
        for (int i = 0; i < k; i++) w[i] /= sum;
    } else if (sp->norm) {
        for (int i = 0; i < k; i++) sum += w[i];
        for (int i = 0; i < k; i++) w[i] /= sum;
    }
    for (int i = 0; i < k; i++) w[i] *= sp->scale == 0.0f ? 1.0 : sp->scale;
}

static void test_route_random(void) {
    const hm_route_spec specs[] = {
        {.n_expert = 128, .k = 8, .score = HM_ROUTE_SOFTMAX, .norm = true},
        {.n_expert = 256, .k = 8, .score = HM_ROUTE_SIGMOID, .norm = true, .scale = 2.5f, .n_group = 8, .topk_group = 4},
        {.n_expert = 256, .k = 6, .score = HM_ROUTE_SQRT_SOFTPLUS, .norm = true, .scale = 1.5f},
        {.n_expert = 128, .k = 4, .score = HM_ROUTE_SOFTMAX_TOPK},
        {.n_expert = 160, .k = 6, .score = HM_ROUTE_SOFTMAX, .norm = false, .n_group = 8, .topk_group = 3},
    };
    enum { NT = 40 };
    float *l = malloc(sizeof(float) * NT * 256), bias[256];
    fill(l, NT * 256, 3.0f);
    fill(bias, 256, 0.5f);
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++)
        for (int wb = 0; wb < 2; wb++) {
            const hm_route_spec *sp = &specs[si];
            CHECK(hm_route_spec_invalid(sp) == NULL);
            int32_t id[NT * 8];
            float w[NT * 8];
            hm_cpu_route(sp, l, NT, wb ? bias : NULL, NULL, NULL, id, w);
            int bad = 0;
            double maxd = 0;
            for (int t = 0; t < NT; t++) {
                int32_t rid[8];
                double rw[8];
                route_ref(sp, l + t * sp->n_expert, wb ? bias : NULL, rid, rw);
                for (int i = 0; i < sp->k; i++) {
                    bad += id[t * sp->k + i] != rid[i];
                    const double d = fabs(w[t * sp->k + i] - rw[i]) / (fabs(rw[i]) + 1e-30);
                    maxd = d > maxd ? d : maxd;
                }
            }
            CHECKF(bad == 0 && maxd < 1e-5, "route spec %zu bias %d: %d ids differ, max rel weight error %.2e", si, wb,
                   bad, maxd);
        }
    free(l);
}

static void test_get_rows(hm_pool **pools) {
    const int64_t ne0 = 512, ne1 = 50;
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (int32_t)((i * 7 + 3) % ne1);
    for (int ti = 0; ti < N_TEST_TYPES; ti++) {
        int type = test_types[ti];
        if (!hm_cpu_type_ok(type)) continue;
        test_mat w;
        mat_make(&w, type, ne0, ne1);
        float *out = malloc((size_t)(40 * ne0) * sizeof(float));
        hm_cpu_get_rows(pools[1], &w.m, ids, 40, out);
        int bad = 0;
        for (int i = 0; i < 40; i++)
            for (int64_t c = 0; c < ne0; c++) bad += out[i * ne0 + c] != w.deq[ids[i] * ne0 + c];
        CHECKF(bad == 0, "get_rows %s: %d elements differ", hm_type_name(type), bad);
        free(out);
        mat_free(&w);
    }
}

int main(void) {
    test_pool();
    hm_pool *pools[3];
    for (int p = 0; p < 3; p++) {
        hm_err err;
        if (hm_pool_open(&pools[p], p + 1, &err) != HM_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    }
    test_matmul(pools);
    test_moe(pools);
    test_attention(pools, 64);
    test_attention(pools, 40);
    if (hm_cpu_attn_tiled_takes(40, 8, 2, 64)) { /* the tiled prefill path over a ring with a window */
        test_attention_ring(pools, 64, false);
        test_attention_ring(pools, 256, false);
        test_attention_ring(pools, 512, false); /* o past 16 registers of 16 lanes */
        test_attention_ring(pools, 64, true);
        test_attention_ring(pools, 256, true);
    }
    test_rows(pools);
    test_router();
    test_route_hand();
    test_route_random();
    test_get_rows(pools);
    for (int p = 0; p < 3; p++) hm_pool_close(pools[p]);
    return test_done();
}
