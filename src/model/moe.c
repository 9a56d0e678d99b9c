/* moe.c - grouping a router's choices by expert unit, and computing the units.
 * Grouping is a counting sort by expert (stable, so each unit's tokens stay ascending): O(n_tok*k
 * + n_expert), deterministic, no allocation. */
#include "moe.h"

#include <string.h>

#include "backend/cpu/cpu_gemma.h"
#include "core/alloc.h"

hm_status hm_moe_route_init(hm_moe_route *r, int32_t n_expert, int32_t k, int32_t cap_tok, hm_err *err) {
    memset(r, 0, sizeof *r);
    if (n_expert <= 0 || k <= 0 || k > n_expert || cap_tok <= 0)
        return hm_errf(err, HM_ERR_ARG, "moe route: bad sizes n_expert %d k %d cap %d", n_expert, k, cap_tok);
    r->n_expert = n_expert;
    r->k = k;
    r->cap_tok = cap_tok;
    size_t pairs = (size_t)cap_tok * (size_t)k;
    r->unit = hm_malloc_aligned((size_t)n_expert * sizeof(int32_t));
    r->start = hm_malloc_aligned((size_t)(n_expert + 1) * sizeof(int32_t));
    r->count = hm_malloc_aligned((size_t)n_expert * sizeof(int32_t));
    r->tok = hm_malloc_aligned(pairs * sizeof(int32_t));
    r->w = hm_malloc_aligned(pairs * sizeof(float));
    r->jobs = hm_malloc_aligned((size_t)n_expert * sizeof(hm_moe_job));
    if (!r->unit || !r->start || !r->count || !r->tok || !r->w || !r->jobs) {
        hm_moe_route_free(r);
        return hm_errf(err, HM_ERR_NOMEM, "moe route: out of memory (%d tokens x %d experts)", cap_tok, k);
    }
    return HM_OK;
}

void hm_moe_route_free(hm_moe_route *r) {
    hm_free_aligned(r->unit);
    hm_free_aligned(r->start);
    hm_free_aligned(r->count);
    hm_free_aligned(r->tok);
    hm_free_aligned(r->w);
    hm_free_aligned(r->jobs);
    memset(r, 0, sizeof *r);
}

void hm_moe_route_build(hm_moe_route *r, const int32_t *ids, const float *weights, int32_t n_tok) {
    HM_ASSERT(n_tok >= 0 && n_tok <= r->cap_tok);
    const int32_t k = r->k, ne = r->n_expert;
    int32_t *count = r->count;
    memset(count, 0, (size_t)ne * sizeof(int32_t));
    for (int32_t i = 0; i < n_tok * k; i++) {
        HM_ASSERT(ids[i] >= 0 && ids[i] < ne);
        count[ids[i]]++;
    }
    /* active units in expert order; count[e] becomes e's write cursor */
    int32_t nu = 0, off = 0;
    for (int32_t e = 0; e < ne; e++) {
        if (!count[e]) continue;
        r->unit[nu] = e;
        r->start[nu] = off;
        off += count[e];
        count[e] = r->start[nu];
        nu++;
    }
    r->start[nu] = off;
    for (int32_t t = 0; t < n_tok; t++) {
        for (int32_t j = 0; j < k; j++) {
            int32_t e = ids[t * k + j];
            int32_t at = count[e]++;
            r->tok[at] = t;
            r->w[at] = weights[t * k + j];
        }
    }
    r->n_units = nu;
    r->n_tok = n_tok;
}

size_t hm_moe_compute_scratch_size(const hm_moe_route *r, int64_t n_embd, int64_t n_ff, int n_threads) {
    size_t a = hm_cpu_moe_scratch_size(r->cap_tok, (int64_t)r->cap_tok * r->k, n_embd, n_ff, n_threads);
    size_t b = hm_gemma_moe_scratch_size(r->cap_tok, n_embd, n_ff, n_threads);
    return a > b ? a : b;
}

void hm_moe_compute(hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *r, const float *x,
                    float *out, hm_scratch *scratch) {
    for (int32_t i = 0; i < r->n_units; i++) {
        hm_moe_job *j = &r->jobs[i];
        hm_moe_unit(mw, r->unit[i], &j->gate, &j->up, &j->down);
        j->tok = r->tok + r->start[i];
        j->w = r->w + r->start[i];
        j->n_tok = r->start[i + 1] - r->start[i];
    }
    if (mw->act == HM_MOE_ACT_GELU)
        hm_gemma_moe(pool, r->jobs, r->n_units, x, r->n_tok, mw->n_embd, mw->n_ff, out, scratch);
    else
        hm_cpu_moe(pool, r->jobs, r->n_units, x, r->n_tok, mw->n_embd, mw->n_ff, out, scratch);
}
