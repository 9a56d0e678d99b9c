/* sim.c - replaying traces and sampling synthetic ones through a store (see sim.h). */
#include "sim.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "experts/trace.h"

/* The trace's geometry must fit the units: same layers, ids below every MoE layer's n_expert. */
static hm_status check_geom(const hm_units *u, const char *path, int32_t nl, int32_t ne, hm_err *err) {
    if (nl != u->n_layer || ne != u->n_expert)
        return hm_errf(err, HM_ERR_ARG, "%s: the trace has %d layers x %d experts, the model %d x %d", path, nl, ne,
                       u->n_layer, u->n_expert);
    return HM_OK;
}

hm_status hm_sim_replay(hm_experts *s, const char *path, hm_err *err) {
    hm_trace_reader *r;
    hm_status st = hm_trace_reader_open(&r, path, err);
    if (st) return st;
    int32_t nl, ne, k;
    hm_trace_reader_geom(r, &nl, &ne, &k);
    const hm_units *u = hm_experts_units(s);
    if ((st = check_geom(u, path, nl, ne, err))) goto done;
    for (;;) {
        hm_trace_event ev;
        if ((st = hm_trace_next(r, &ev, err)) || ev.kind == HM_TRACE_END) break;
        if (ev.kind == HM_TRACE_STEP) {
            if ((st = hm_experts_step_end(s, ev.n, ev.prompt, err))) break;
        } else if (u->layers[ev.layer].n_expert != ne) {
            st = hm_errf(err, HM_ERR_ARG, "%s: routing for layer %d, which has no experts in the model", path, ev.layer);
            break;
        } else {
            hm_experts_record(s, ev.layer, ev.ids, ev.n);
        }
    }
done:
    hm_trace_reader_close(r);
    return st;
}

hm_status hm_sim_trace_profile(const char *path, int32_t n_layer, int32_t n_expert, hm_profile *p, hm_err *err) {
    memset(p, 0, sizeof *p);
    hm_trace_reader *r;
    hm_status st = hm_trace_reader_open(&r, path, err);
    if (st) return st;
    int32_t nl, ne, k;
    hm_trace_reader_geom(r, &nl, &ne, &k);
    if ((n_layer > 0 && nl != n_layer) || (n_expert > 0 && ne != n_expert)) {
        st = hm_errf(err, HM_ERR_ARG, "%s has %d layers x %d experts but the model has %d x %d", path, nl, ne, n_layer,
                     n_expert);
        goto done;
    }
    if ((int64_t)nl * ne > HM_PROFILE_MAX_CELLS) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s: %d layers x %d experts is more than the %d units a trace may count", path,
                     nl, ne, HM_PROFILE_MAX_CELLS);
        goto done;
    }
    if ((st = hm_profile_init(p, nl, ne, err))) goto done;
    snprintf(p->schema, sizeof p->schema, "hotmoe.trace");
    p->k = k;
    for (;;) {
        hm_trace_event ev;
        if ((st = hm_trace_next(r, &ev, err)) || ev.kind == HM_TRACE_END) break;
        if (ev.kind == HM_TRACE_STEP) {
            p->steps++;
            p->tokens += (uint64_t)ev.n;
            if (ev.prompt) p->prompt_tokens += (uint64_t)ev.n;
            else p->decode_tokens += (uint64_t)ev.n;
        } else {
            uint64_t *row = p->counts + (size_t)ev.layer * (size_t)ne;
            for (int32_t i = 0; i < ev.n; i++) row[ev.ids[i]]++;
        }
    }
    if (st) hm_profile_free(p);
done:
    hm_trace_reader_close(r);
    return st;
}

/* ---- synthetic routing ---- */

struct hm_sim_gen {
    int32_t n_layer, n_expert, k;
    double *w;      /* [n_layer][n_expert] weights (counts, or 1 for a layer without counts) */
    double *cdf;    /* [n_layer][n_expert] running sums of w */
    uint64_t rng[2];
};

/* xoroshiro128+ */
static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t next_u64(uint64_t s[2]) {
    uint64_t a = s[0], b = s[1], res = a + b;
    b ^= a;
    s[0] = rotl(a, 24) ^ b ^ (b << 16);
    s[1] = rotl(b, 37);
    return res;
}
static double next_unit(uint64_t s[2]) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; }
static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

hm_status hm_sim_gen_open(hm_sim_gen **out, const hm_profile *p, int32_t k, uint64_t seed, hm_err *err) {
    *out = NULL;
    if (k <= 0 || k > p->n_expert)
        return hm_errf(err, HM_ERR_ARG, "synthetic trace: k = %d must be in [1, n_expert = %d] (the profile does "
                       "not say how many experts a token uses?)", k, p->n_expert);
    hm_sim_gen *g = calloc(1, sizeof *g);
    size_t n = (size_t)p->n_layer * (size_t)p->n_expert;
    if (g) g->w = malloc(n * sizeof *g->w), g->cdf = malloc(n * sizeof *g->cdf);
    if (!g || !g->w || !g->cdf) {
        hm_sim_gen_close(g);
        return hm_errf(err, HM_ERR_NOMEM, "synthetic trace: out of memory");
    }
    g->n_layer = p->n_layer, g->n_expert = p->n_expert, g->k = k;
    for (int32_t l = 0; l < p->n_layer; l++) {
        uint64_t tot = hm_profile_layer_total(p, l);
        for (int32_t e = 0; e < p->n_expert; e++) {
            size_t i = (size_t)l * (size_t)p->n_expert + (size_t)e;
            g->w[i] = tot ? (double)p->counts[i] : 1.0;
            g->cdf[i] = (e ? g->cdf[i - 1] : 0.0) + g->w[i];
        }
    }
    uint64_t x = seed;
    g->rng[0] = splitmix(&x);
    g->rng[1] = splitmix(&x);
    *out = g;
    return HM_OK;
}

void hm_sim_gen_close(hm_sim_gen *g) {
    if (!g) return;
    free(g->w);
    free(g->cdf);
    free(g);
}

/* The slow, exact draw among the experts not taken yet (a walk over the weights). */
static int32_t draw_walk(const hm_sim_gen *g, const double *w, const int32_t *ids, int32_t j, double t) {
    int32_t pick = -1;
    for (int32_t e = 0; e < g->n_expert; e++) {
        bool taken = false;
        for (int32_t q = 0; q < j; q++) taken |= ids[q] == e;
        if (taken) continue;
        if (w[e] > 0 || pick < 0) pick = e; /* the last untaken one with weight, else any */
        if (w[e] > 0 && t < w[e]) break;
        if (w[e] > 0) t -= w[e];
    }
    return pick;
}

void hm_sim_gen_token(hm_sim_gen *g, int32_t layer, int32_t *ids) {
    const size_t off = (size_t)layer * (size_t)g->n_expert;
    const double *w = g->w + off, *cdf = g->cdf + off;
    const double total = cdf[g->n_expert - 1];
    double taken_w = 0;
    for (int32_t j = 0; j < g->k; j++) {
        int32_t pick = -1;
        /* Rejection: a draw from the whole layer that lands on a taken expert is drawn again,
         * which is the draw among the untaken ones. Give up to the walk when most weight is taken. */
        for (int tries = 0; tries < 64 && taken_w < 0.9 * total; tries++) {
            double t = next_unit(g->rng) * total;
            int32_t lo = 0, hi = g->n_expert - 1;
            while (lo < hi) { /* first e with cdf[e] > t */
                int32_t mid = (lo + hi) / 2;
                if (cdf[mid] > t) hi = mid;
                else lo = mid + 1;
            }
            bool taken = false;
            for (int32_t q = 0; q < j; q++) taken |= ids[q] == lo;
            if (!taken && w[lo] > 0) {
                pick = lo;
                break;
            }
        }
        if (pick < 0) pick = draw_walk(g, w, ids, j, next_unit(g->rng) * (total - taken_w));
        taken_w += w[pick];
        ids[j] = pick;
    }
}

hm_status hm_sim_synthetic(hm_experts *s, hm_sim_gen *g, int64_t n_tokens, hm_err *err) {
    const hm_units *u = hm_experts_units(s);
    if (u->n_layer != g->n_layer || u->n_expert != g->n_expert)
        return hm_errf(err, HM_ERR_ARG, "synthetic trace: %d layers x %d experts, the model %d x %d", g->n_layer,
                       g->n_expert, u->n_layer, u->n_expert);
    int32_t ids[256];
    if (g->k > 256) return hm_errf(err, HM_ERR_UNSUPPORTED, "synthetic trace: k %d > 256", g->k);
    for (int64_t t = 0; t < n_tokens; t++) {
        for (int32_t l = 0; l < g->n_layer; l++) {
            if (u->layers[l].n_expert != g->n_expert) continue;
            hm_sim_gen_token(g, l, ids);
            hm_experts_record(s, l, ids, g->k);
        }
        hm_status st = hm_experts_step_end(s, 1, false, err);
        if (st) return st;
    }
    return HM_OK;
}

hm_status hm_sim_write_trace(hm_sim_gen *g, int64_t n_tokens, const char *path, hm_err *err) {
    hm_trace_writer *w;
    hm_status st = hm_trace_writer_open(&w, path, g->n_layer, g->n_expert, g->k, err);
    if (st) return st;
    int32_t ids[256];
    if (g->k > 256) {
        hm_trace_writer_close(w, NULL);
        return hm_errf(err, HM_ERR_UNSUPPORTED, "synthetic trace: k %d > 256", g->k);
    }
    for (int64_t t = 0; t < n_tokens; t++) {
        for (int32_t l = 0; l < g->n_layer; l++) {
            hm_sim_gen_token(g, l, ids);
            hm_trace_write_route(w, l, ids, g->k);
        }
        hm_trace_write_step(w, 1, false);
    }
    return hm_trace_writer_close(w, err);
}
