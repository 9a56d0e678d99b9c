/* calib.c - CPU cost of one expert unit, and the GPU cost model of a decode token (see calib.h);
 * the GPU measurement itself is calib_gpu_cuda.c (a stub here without CUDA). */
#include "calib.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "quant/quant.h"

#define CAL_UNITS 48

typedef struct cal_part {
    const char *w;        /* expert slab */
    size_t row_bytes;
    int64_t ne0, rows;
    hm_vec_dot_fn dot;
    void *y;              /* activation in the dot partner type, owned */
} cal_part;

typedef struct cal_ctx {
    cal_part parts[CAL_UNITS][3];
    int32_t n_parts[CAL_UNITS];
    int32_t n_units;
    float sink[64];
} cal_ctx;

static void run_units(void *vctx, int ith, int nth) {
    cal_ctx *c = vctx;
    float acc = 0;
    for (int32_t i = 0; i < c->n_units; i++)
        for (int32_t p = 0; p < c->n_parts[i]; p++) {
            const cal_part *q = &c->parts[i][p];
            int64_t r0 = q->rows * ith / nth, r1 = q->rows * (ith + 1) / nth;
            for (int64_t r = r0; r < r1; r++) {
                float v;
                q->dot(q->ne0, &v, q->w + (size_t)r * q->row_bytes, q->y);
                acc += v;
            }
        }
    c->sink[ith % 64] += acc;
}

static double time_run(hm_pool *pool, cal_ctx *c) {
    double best = DBL_MAX;
    for (int rep = 0; rep < 3; rep++) {
        int64_t t0 = hm_time_us();
        hm_pool_run(pool, run_units, c);
        double dt = (double)(hm_time_us() - t0);
        if (dt < best) best = dt;
    }
    return best;
}

hm_status hm_calib_cpu(const hm_units *u, int32_t n_threads, hm_calib *out, hm_err *err) {
    memset(out, 0, sizeof *out);
    cal_ctx *c = calloc(1, sizeof *c);
    if (!c) return hm_errf(err, HM_ERR_NOMEM, "calibration: out of memory");
    hm_status st = HM_OK;
    hm_pool *pool = NULL;
    int32_t moe[4096], n_moe = 0;
    for (int32_t l = 0; l < u->n_layer && n_moe < 4096; l++)
        if (u->layers[l].n_expert && u->layers[l].part[HM_UNIT_DOWN]) moe[n_moe++] = l;
    if (!n_moe) {
        st = hm_errf(err, HM_ERR_ARG, "calibration: the model has no expert tensors");
        goto done;
    }
    uint64_t bytes = 0;
    for (int32_t i = 0; i < CAL_UNITS; i++) {
        const hm_units_layer *L = &u->layers[moe[i % n_moe]];
        int32_t e = (int32_t)(((int64_t)i * 37 + 11) % L->n_expert);
        for (int p = 0; p < HM_UNIT_NPART; p++) {
            const hm_gguf_tensor *t = L->part[p];
            if (!t) continue;
            const hm_type_traits *tr = hm_type_get(t->type);
            const hm_type_traits *yt = tr && tr->supported ? hm_type_get(tr->vec_dot_type) : NULL;
            if (!yt || !tr->vec_dot || !yt->from_float || c->n_parts[i] >= 3) {
                st = hm_errf(err, HM_ERR_UNSUPPORTED, "calibration: tensor '%s' has type %s, which has no dot product here",
                             t->name, hm_type_name(t->type));
                goto done;
            }
            cal_part *q = &c->parts[i][c->n_parts[i]++];
            q->ne0 = t->ne[0];
            q->rows = t->ne[1];
            q->row_bytes = hm_row_size(t->type, t->ne[0]);
            q->w = (const char *)t->data + (size_t)e * L->slab_bytes[p];
            q->dot = tr->vec_dot;
            float *x = malloc((size_t)q->ne0 * sizeof *x);
            q->y = hm_malloc_aligned(hm_row_size(tr->vec_dot_type, q->ne0) + 64);
            if (!x || !q->y) {
                free(x);
                st = hm_errf(err, HM_ERR_NOMEM, "calibration: out of memory");
                goto done;
            }
            for (int64_t j = 0; j < q->ne0; j++) x[j] = (float)((j * 2654435761u) % 1000) / 1000.0f - 0.5f;
            yt->from_float(x, q->y, q->ne0);
            free(x);
        }
        bytes += L->unit_bytes;
        c->n_units = i + 1;
    }
    hm_pool *one = NULL;
    if ((st = hm_pool_open(&one, 1, err))) goto done;
    hm_pool_run(one, run_units, c); /* fault the pages in, then time from RAM */
    double t1 = time_run(one, c);
    hm_pool_close(one);
    if (n_threads < 1) n_threads = 1;
    if ((st = hm_pool_open(&pool, n_threads, err))) goto done;
    double tn = time_run(pool, c);
    out->n_units = c->n_units;
    out->us_unit_1t = t1 / c->n_units;
    out->n_threads = n_threads;
    out->us_unit_nt = tn / c->n_units;
    out->gbs_nt = tn > 0 ? (double)bytes / (tn * 1e3) : 0;
done:
    hm_pool_close(pool);
    for (int32_t i = 0; i < CAL_UNITS; i++)
        for (int32_t p = 0; p < 3; p++) hm_free_aligned(c->parts[i][p].y);
    free(c);
    return st;
}

double hm_calib_gpu_token_ms(const hm_calib_gpu *g, double us_cpu_unit, const double *layer_hit, int32_t n) {
    double us = 0, k = g->k;
    for (int32_t i = 0; i < n; i++) {
        double h = layer_hit[i] < 0 ? 0 : layer_hit[i] > 1 ? 1 : layer_hit[i];
        double gpu = k * h * g->us_hot_unit;
        double cpu = h < 1 ? k * (1 - h) * us_cpu_unit + (1 - pow(h, k)) * g->us_cold_layer : 0;
        us += gpu > cpu ? gpu : cpu;
    }
    return g->ms_dense + us / 1000.0;
}

#ifndef HM_HAVE_CUDA
hm_status hm_calib_gpu_measure(const char *path, const hm_units *u, int32_t n_threads, double us_cpu_unit,
                               hm_calib_gpu *out, hm_err *err) {
    (void)path, (void)u, (void)n_threads, (void)us_cpu_unit;
    memset(out, 0, sizeof *out);
    return hm_errf(err, HM_ERR_UNSUPPORTED, "built without CUDA");
}
#endif
