/* moe.c - grouping a router's choices by expert unit, and computing the units.
 * Grouping is a counting sort by expert (stable, so each unit's tokens stay ascending): O(n_tok*k
 * + n_expert), deterministic, no allocation. */
#include "moe.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "backend/cpu/cpu_gemma.h"
#include "core/alloc.h"
#include "experts/tier_ram.h"
#include "model/model.h"

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
    r->tier_unit = hm_malloc_aligned((size_t)n_expert * sizeof(int32_t));
    r->tier_ntok = hm_malloc_aligned((size_t)n_expert * sizeof(int32_t));
    r->parts = hm_malloc_aligned((size_t)n_expert * sizeof(hm_unit_parts));
    r->pred = hm_malloc_aligned((size_t)n_expert * sizeof(int32_t));
    r->pred_mark = hm_malloc_aligned((size_t)n_expert);
    r->pred_logits = hm_malloc_aligned((size_t)cap_tok * (size_t)n_expert * sizeof(float));
    if (!r->unit || !r->start || !r->count || !r->tok || !r->w || !r->jobs || !r->tier_unit || !r->tier_ntok ||
        !r->parts || !r->pred || !r->pred_mark || !r->pred_logits) {
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
    hm_free_aligned(r->tier_unit);
    hm_free_aligned(r->tier_ntok);
    hm_free_aligned(r->parts);
    hm_free_aligned(r->pred);
    hm_free_aligned(r->pred_mark);
    hm_free_aligned(r->pred_logits);
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

hm_status hm_moe_bind(const hm_model *m, int32_t layer, int32_t n_expert, int64_t n_embd, int64_t n_ff,
                      hm_moe_act act, bool fused_ok, hm_moe_weights *mw, hm_err *err) {
    char n[96];
    hm_status st;
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s ".weight", layer), n)
    mw->layer = layer;
    mw->n_expert = n_expert;
    mw->n_embd = n_embd;
    mw->n_ff = n_ff;
    mw->act = act;
    if (fused_ok && hm_gguf_find_tensor(m->gguf, NAME("ffn_gate_up_exps"))) {
        hm_mat gu;
        size_t nb2;
        if ((st = hm_model_bind_exps(m, n, n_embd, 2 * n_ff, n_expert, true, &gu, &nb2, err)) != HM_OK) return st;
        /* slab e: rows 0..n_ff-1 the gate, n_ff..2n_ff-1 the up projection */
        mw->gate = mw->up = gu;
        mw->gate.ne1 = mw->up.ne1 = n_ff;
        mw->up.data = (const char *)gu.data + (size_t)n_ff * gu.nb1;
        mw->gate_nb2 = mw->up_nb2 = nb2;
    } else {
        if ((st = hm_model_bind_exps(m, NAME("ffn_gate_exps"), n_embd, n_ff, n_expert, true, &mw->gate,
                                     &mw->gate_nb2, err)) != HM_OK)
            return st;
        if ((st = hm_model_bind_exps(m, NAME("ffn_up_exps"), n_embd, n_ff, n_expert, true, &mw->up, &mw->up_nb2,
                                     err)) != HM_OK)
            return st;
    }
    st = hm_model_bind_exps(m, NAME("ffn_down_exps"), n_ff, n_embd, n_expert, true, &mw->down, &mw->down_nb2, err);
#undef NAME
    return st;
}

void hm_moe_route_rows(const hm_model *m, int32_t layer, hm_moe_route *r, const hm_route_spec *sp,
                       const float *rlog, int64_t nr, const float *bias, const int32_t *hash,
                       const int32_t *tokens, const float *expert_scale, int32_t *rid, float *rw) {
    const int32_t k = sp->k;
    hm_cpu_route(sp, rlog, nr, bias, hash, tokens, rid, rw);
    if (expert_scale)
        for (int64_t i = 0; i < nr * k; i++) rw[i] *= expert_scale[rid[i]];
    /* usage counts: the units this layer computes (only the wanted rows in the last layer) */
    if (m->experts) hm_experts_record(m->experts, layer, rid, (int32_t)nr * k);
    hm_moe_route_build(r, rid, rw, (int32_t)nr);
}

size_t hm_moe_compute_scratch_size(const hm_moe_route *r, int64_t n_embd, int64_t n_ff, int n_threads) {
    size_t a = hm_cpu_moe_scratch_size(r->cap_tok, (int64_t)r->cap_tok * r->k, n_embd, n_ff, n_threads);
    size_t c = hm_cpu_matmul_scratch_size(n_embd, r->cap_tok, n_threads); /* the prefetch's router */
    return a > c ? a : c;
}

void hm_moe_compute(hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *r, const float *x,
                    float *out, hm_scratch *scratch) {
    for (int32_t i = 0; i < r->n_units; i++) {
        hm_moe_job *j = &r->jobs[i];
        hm_moe_job_unit(mw, r->unit[i], j);
        j->tok = r->tok + r->start[i];
        j->w = r->w + r->start[i];
        j->n_tok = r->start[i + 1] - r->start[i];
    }
    hm_cpu_moe_act_lim(pool, hm_moe_cpu_act(mw->act), mw->act_limit, r->jobs, r->n_units, x, r->n_tok, mw->n_embd,
                       mw->n_ff, out, scratch);
}

static void run_jobs(hm_pool *pool, const hm_moe_weights *mw, const hm_moe_job *jobs, int32_t n_jobs,
                     const float *x, int32_t n_tok, float *out, hm_scratch *scratch) {
    if (n_jobs <= 0) return;
    hm_cpu_moe_act_lim(pool, hm_moe_cpu_act(mw->act), mw->act_limit, jobs, n_jobs, x, n_tok, mw->n_embd, mw->n_ff,
                       out, scratch);
}

void hm_moe_job_from_parts(const hm_moe_weights *mw, const hm_unit_parts *p, hm_moe_job *j) {
    if (p->p[HM_UNIT_GATE_UP]) { /* the fused form: up lies this far into the unit's gate_up slab */
        const ptrdiff_t up_off = (const char *)mw->up.data - (const char *)mw->gate.data;
        j->gate.data = p->p[HM_UNIT_GATE_UP];
        j->up.data = (const char *)p->p[HM_UNIT_GATE_UP] + up_off;
    } else {
        j->gate.data = p->p[HM_UNIT_GATE];
        j->up.data = p->p[HM_UNIT_UP];
    }
    j->down.data = p->p[HM_UNIT_DOWN];
}

/* One round of the RAM tier: acquire units r->tier_unit[done .. n) (as many as its staging allows,
 * *n_ready >= 1, their parts in r->parts[done ..]); a round that gets none is HM_ERR_NOMEM. */
static hm_status acquire_round(hm_ram_tier *t, const hm_moe_weights *mw, hm_moe_route *r, int32_t done, int32_t n,
                               int32_t *n_ready, hm_err *err) {
    hm_status st = hm_ram_tier_acquire(t, mw->layer, r->tier_unit + done, r->tier_ntok + done, n - done,
                                       r->parts + done, n_ready, err);
    if (st != HM_OK) return st;
    if (*n_ready <= 0)
        return hm_errf(err, HM_ERR_NOMEM, "layer %d: the RAM tier has no free staging buffer for %d units "
                       "(raise --ram-budget)", (int)mw->layer, (int)(n - done));
    return HM_OK;
}

hm_status hm_moe_run_cold(const hm_model *m, hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *r, int32_t n,
                          const float *x, float *out, hm_scratch *scratch, hm_err *err) {
    hm_ram_tier *t = m->ram;
    if (!t) {
        run_jobs(pool, mw, r->jobs, n, x, r->n_tok, out, scratch);
        return HM_OK;
    }
    for (int32_t done = 0; done < n;) {
        int32_t n_ready = 0;
        hm_status st = acquire_round(t, mw, r, done, n, &n_ready, err);
        if (st != HM_OK) return st;
        for (int32_t i = done; i < done + n_ready; i++) hm_moe_job_from_parts(mw, &r->parts[i], &r->jobs[i]);
        run_jobs(pool, mw, r->jobs + done, n_ready, x, r->n_tok, out, scratch);
        hm_ram_tier_release(t, mw->layer, r->tier_unit + done, n_ready);
        done += n_ready;
    }
    return HM_OK;
}

/* The next layer's router on x: the union of each token's top-k (by logit: the softmax keeps
 * the order), started as prefetch reads. */
static void prefetch_next(hm_ram_tier *t, hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *r,
                          const hm_mat *router, const float *x, hm_scratch *scratch) {
    const int32_t ne = (int32_t)router->ne1, k = r->k;
    if (ne <= 0 || ne > r->n_expert || r->n_tok <= 0) return;
    hm_cpu_matmul(pool, router, x, r->n_tok, r->pred_logits, scratch);
    memset(r->pred_mark, 0, (size_t)ne);
    int32_t np = 0;
    for (int32_t t0 = 0; t0 < r->n_tok; t0++) {
        const float *lg = r->pred_logits + (size_t)t0 * (size_t)ne;
        for (int32_t j = 0; j < k && j < ne; j++) { /* k passes of argmax over the unmarked-this-token */
            int32_t best = -1;
            for (int32_t e = 0; e < ne; e++) {
                if (r->pred_mark[e] & 2) continue;
                if (best < 0 || lg[e] > lg[best]) best = e;
            }
            if (best < 0) break;
            r->pred_mark[best] |= 2;
            if (!(r->pred_mark[best] & 1)) {
                r->pred_mark[best] |= 1;
                r->pred[np++] = best;
            }
        }
        for (int32_t e = 0; e < ne; e++) r->pred_mark[e] &= 1;
    }
    hm_ram_tier_prefetch(t, mw->layer + 1, r->pred, np);
}

hm_status hm_moe_forward(const hm_model *m, hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *r,
                         const float *x, float *out, hm_scratch *scratch, const hm_mat *next_router, hm_err *err) {
    hm_ram_tier *t = m->ram;
    if (!t) {
        hm_moe_compute(pool, mw, r, x, out, scratch);
        return HM_OK;
    }
    /* units HOT in VRAM keep their place in the job order; the rest come through the RAM tier */
    const int32_t *smap = m->experts ? hm_experts_slot_map(m->experts, mw->layer) : NULL;
    int32_t n = 0;
    for (int32_t i = 0; i < r->n_units; i++) {
        int32_t e = r->unit[i];
        if (smap && smap[e] >= 0) continue;
        r->tier_unit[n] = e;
        r->tier_ntok[n] = r->start[i + 1] - r->start[i];
        n++;
    }
    bool pf = m->prefetch && next_router && next_router->data;
    int32_t done = 0, i0 = 0;
    while (i0 < r->n_units) {
        int32_t n_ready = 0;
        if (done < n) {
            hm_status st = acquire_round(t, mw, r, done, n, &n_ready, err);
            if (st != HM_OK) return st;
        }
        if (pf) { /* after the first acquire (its reads are out), before the compute */
            prefetch_next(t, pool, mw, r, next_router, x, scratch);
            pf = false;
        }
        int32_t nj = 0, used = 0, i = i0;
        for (; i < r->n_units; i++) {
            const int32_t e = r->unit[i];
            const bool hot = smap && smap[e] >= 0;
            if (!hot && used == n_ready) break;
            hm_moe_job *j = &r->jobs[nj++];
            hm_moe_job_unit(mw, e, j);
            if (!hot) {
                HM_ASSERT(r->tier_unit[done + used] == e);
                hm_moe_job_from_parts(mw, &r->parts[done + used], j);
                used++;
            }
            j->tok = r->tok + r->start[i];
            j->w = r->w + r->start[i];
            j->n_tok = r->start[i + 1] - r->start[i];
        }
        /* jobs in route order, summed into out in job order: the same sums as hm_moe_compute */
        run_jobs(pool, mw, r->jobs, nj, x, r->n_tok, out, scratch);
        if (n_ready > 0) hm_ram_tier_release(t, mw->layer, r->tier_unit + done, n_ready);
        done += n_ready;
        i0 = i;
    }
    return HM_OK;
}
