/* synth_routing.c - `hotmoe synth --routing-profile P.json`: build a usage profile's per-layer
 * expert popularity into the random weights, so that any engine that runs the file (llama.cpp,
 * the seed forks, hotmoe) routes it with that skew. docs/SYNTH.md has the derivation.
 *
 * Construction (the residual stream is written only by attn_output and ffn_down_exps in qwen3moe,
 * and by attn_output / ssm_out, ffn_down_exps and ffn_down_shexp in qwen35moe):
 *  - R = the last nu + ns channels of the residual stream: U = [u0, u0 + nu) and S = [s0, s0 + ns).
 *  - token_embd: every row gets the constant c on U; its S values stay the generator's, so each
 *    token carries its own random "routing code" z_t on S.
 *  - attn_output, ssm_out, ffn_down_exps, ffn_down_shexp: the rows that write channels of R are
 *    zero, so h restricted to R stays the embedding's at every layer (zero rows quantise to exact
 *    zeros in every format).
 *  - ffn_norm (qwen35moe: post_attention_norm): 1 on R.
 *  - ffn_gate_inp (F32) row e of layer l: zero outside R; on S a random vector n_le with std
 *    sigma_n; on U the constant b_le / (nu c).
 * After the pre-FFN RMSNorm, x = gamma_t * h (on R) with gamma_t = 1 / rms(h_t) common to all
 * experts, so  logit_le = gamma_t * (b_le * lambda_t + n_le . z_t)  with lambda_t = mean(h_U) / c
 * (1 up to the embedding's quantisation). Top-k selection ignores gamma_t: which experts a token
 * picks in layer l depends on its token id only, through the same (b, n, z) in every engine.
 * The biases b_le are calibrated here by fixed-point iteration on a sample of real embedding rows
 * (generated, quantised and dequantised exactly as written) so that the fraction of tokens that
 * select expert e equals the profile's k * count_e / total in the mapped profile layer.
 *
 * Invariants: everything is a function of (options, seed, profile); the row hook is pure and
 * thread-safe; calibration threads change nothing in the output (each layer is one task). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../experts/profile.h"
#include "../quant/quant.h"
#include "synth_impl.h"

#define N_U 32            /* channels of the constant direction: one whole quant sub-block */
#define MAX_S 128         /* routing-code channels */
#define CAL_TOKENS 8192   /* embedding rows the calibration samples (all of them when fewer) */
#define CAL_ITERS 60
#define B_NEVER (-12.0f)  /* bias of an expert the profile never routed (12 noise std down) */
#define MAX_K 64
#define MAX_THREADS 64

typedef enum route_op {
    OP_NONE = 0,
    OP_EMBD,     /* token_embd: c on U */
    OP_NORM,     /* ffn_norm: 1 on R */
    OP_ZERO_OUT, /* attn_output, ffn_down_exps: rows writing R are zero */
    OP_ROUTER,   /* ffn_gate_inp */
} route_op;

struct hm_synth_routing {
    int32_t n_layer, n_expert, k, n_embd;
    int32_t u0, s0, ns; /* U = [u0, u0 + N_U), S = [s0, s0 + ns), s0 = u0 + N_U, s0 + ns = n_embd */
    float c;            /* value of every embedding row on U */
    float sigma_n;      /* std of the router weights on S */
    uint64_t seed;
    float *bias;        /* [n_layer * n_expert] b_le */
    float *target;      /* [n_layer * n_expert] wanted fraction of tokens selecting e */
    float *fit_tv;      /* [n_layer] total variation of the calibrated sample vs target */
    int32_t *map;       /* [n_layer] model layer -> profile layer */
    char profile_name[256];
    int32_t profile_layers;
    /* calibration input, freed after open */
    int64_t n_cal;
    float *z;      /* [n_cal * ns] dequantised S values */
    float *lambda; /* [n_cal] */
};

/* ---- the row hook ---- */

int hm_synth_routing_op(const hm_synth_routing *r, const hm_synth_tensor *t, int32_t *layer) {
    *layer = -1;
    if (!r) return OP_NONE;
    if (strcmp(t->name, "token_embd.weight") == 0) return OP_EMBD;
    int l = -1, n = 0;
    char suffix[64];
    if (sscanf(t->name, "blk.%d.%63[a-z_].weight%n", &l, suffix, &n) != 2 || t->name[n] || l < 0) return OP_NONE;
    *layer = l;
    /* the norm in front of the router: ffn_norm (qwen3moe), post_attention_norm (qwen35moe) */
    if (strcmp(suffix, "ffn_norm") == 0 || strcmp(suffix, "post_attention_norm") == 0) return OP_NORM;
    /* every writer of the residual stream: attention / DeltaNet outputs, routed and shared experts */
    if (strcmp(suffix, "attn_output") == 0 || strcmp(suffix, "ssm_out") == 0 || strcmp(suffix, "ffn_down_exps") == 0 ||
        strcmp(suffix, "ffn_down_shexp") == 0 || strcmp(suffix, "ffn_down") == 0 /* gemma4's dense MLP */)
        return OP_ZERO_OUT;
    if (strcmp(suffix, "ffn_gate_inp") == 0) return OP_ROUTER;
    return OP_NONE;
}

void hm_synth_routing_row(const hm_synth_routing *r, int op, int32_t layer, uint64_t key, int64_t row, float *x,
                          int64_t ne0) {
    const int32_t u0 = r->u0, s0 = r->s0, E = r->n_embd;
    switch ((route_op)op) {
    case OP_NONE: return;
    case OP_EMBD:
        for (int32_t j = u0; j < u0 + N_U; j++) x[j] = r->c;
        return;
    case OP_NORM:
        for (int32_t j = u0; j < E; j++) x[j] = 1.0f;
        return;
    case OP_ZERO_OUT: /* row = output channel (+ expert * n_embd for the 3-D down tensor) */
        if (row % E >= u0) memset(x, 0, (size_t)ne0 * sizeof *x);
        return;
    case OP_ROUTER: {
        const float bu = r->bias[(size_t)layer * (size_t)r->n_expert + (size_t)row] / ((float)N_U * r->c);
        for (int32_t j = 0; j < u0; j++) x[j] = 0.0f;
        for (int32_t j = u0; j < s0; j++) x[j] = bu;
        for (int32_t j = s0; j < E; j++) x[j] = r->sigma_n * hm_synth_gauss(key, (uint64_t)row * (uint64_t)ne0 + (uint64_t)j);
        return;
    }
    }
}

bool hm_synth_routing_zeroes_row(const hm_synth_routing *r, int op, int64_t row) {
    return r && (route_op)op == OP_ZERO_OUT && row % r->n_embd >= r->u0;
}

/* ---- calibration ---- */

/* Standard normal quantile by bisection on the CDF (called a few thousand times per layer). */
static double probit(double p) {
    double lo = -9.0, hi = 9.0;
    for (int i = 0; i < 60; i++) {
        double mid = 0.5 * (lo + hi);
        if (0.5 * erfc(-mid / M_SQRT2) < p) lo = mid;
        else hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* cnt[e] += 1 for the k largest of b[e] * lambda + noise[e] (ties: lower id, as a stable sort). */
static void topk_count(const float *noise, const float *b, float lambda, int32_t n_expert, int32_t k, uint32_t *cnt) {
    float v[MAX_K];
    int32_t id[MAX_K];
    int32_t n = 0;
    for (int32_t e = 0; e < n_expert; e++) {
        float x = b[e] * lambda + noise[e];
        if (n == k && x <= v[k - 1]) continue;
        int32_t i = n < k ? n++ : k - 1;
        while (i > 0 && v[i - 1] < x) {
            v[i] = v[i - 1];
            id[i] = id[i - 1];
            i--;
        }
        v[i] = x;
        id[i] = e;
    }
    for (int32_t i = 0; i < n; i++) cnt[id[i]]++;
}

typedef struct cal_task {
    hm_synth_routing *r;
    _Atomic int32_t next_layer;
    int32_t n_threads;
} cal_task;

/* Fit layer l's biases; scratch: noise [n_cal * E], w [ns * E], cnt [E]. */
static void calibrate_layer(hm_synth_routing *r, int32_t l, float *noise, float *wt, uint32_t *cnt) {
    const int32_t E = r->n_expert, ns = r->ns, k = r->k;
    const int64_t T = r->n_cal;
    char name[64];
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
    const uint64_t key = hm_synth_key(r->seed, name);
    /* wt[s][e] = router weight of expert e on channel s0 + s, as the row hook writes it */
    for (int32_t e = 0; e < E; e++)
        for (int32_t s = 0; s < ns; s++)
            wt[(size_t)s * (size_t)E + (size_t)e] =
                r->sigma_n * hm_synth_gauss(key, (uint64_t)e * (uint64_t)r->n_embd + (uint64_t)(r->s0 + s));
    for (int64_t t = 0; t < T; t++) { /* noise[t][e] = n_le . z_t (axpy form: vectorises) */
        float *nt = noise + (size_t)t * (size_t)E;
        const float *zt = r->z + (size_t)t * (size_t)ns;
        memset(nt, 0, (size_t)E * sizeof *nt);
        for (int32_t s = 0; s < ns; s++) {
            const float zs = zt[s], *w = wt + (size_t)s * (size_t)E;
            for (int32_t e = 0; e < E; e++) nt[e] += zs * w[e];
        }
    }
    /* noise std over the sample, so that biases start in the right units */
    double ss = 0;
    for (int64_t i = 0; i < T * E; i++) ss += (double)noise[i] * noise[i];
    const double sd = sqrt(ss / (double)(T * E)) + 1e-30;

    const float *pi = r->target + (size_t)l * (size_t)E;
    float *b = r->bias + (size_t)l * (size_t)E;
    float best_b[4096];
    double best_tv = 1e30;
    const bool keep_best = E <= 4096;
    for (int32_t e = 0; e < E; e++) b[e] = pi[e] > 0 ? (float)(sd * probit(pi[e])) : (float)(B_NEVER * sd);
    for (int it = 0; it <= CAL_ITERS; it++) {
        memset(cnt, 0, (size_t)E * sizeof *cnt);
        for (int64_t t = 0; t < T; t++) topk_count(noise + (size_t)t * (size_t)E, b, r->lambda[t], E, k, cnt);
        double tv = 0;
        for (int32_t e = 0; e < E; e++) tv += fabs((double)cnt[e] / (double)T - pi[e]);
        tv *= 0.5 / k;
        if (tv < best_tv) {
            best_tv = tv;
            if (keep_best) memcpy(best_b, b, (size_t)E * sizeof *b);
        }
        if (it == CAL_ITERS || tv < 1e-4) break;
        /* under a fixed per-token threshold tau, P(select e) = Phi((b_e - tau) / sd): move b_e by
         * the probit gap (damped), which is Newton's step for that model */
        const double lo = 0.5 / (double)T, hi = 1.0 - lo;
        for (int32_t e = 0; e < E; e++) {
            if (pi[e] <= 0) continue;
            double got = (double)cnt[e] / (double)T;
            got = got < lo ? lo : got > hi ? hi : got;
            double want = pi[e] < lo ? lo : pi[e] > hi ? hi : pi[e];
            b[e] += (float)(0.8 * sd * (probit(want) - probit(got)));
        }
    }
    if (keep_best) memcpy(b, best_b, (size_t)E * sizeof *b);
    r->fit_tv[l] = (float)best_tv;
}

static void *cal_worker(void *p) {
    cal_task *c = p;
    hm_synth_routing *r = c->r;
    float *noise = malloc((size_t)r->n_cal * (size_t)r->n_expert * sizeof(float));
    float *wt = malloc((size_t)r->ns * (size_t)r->n_expert * sizeof(float));
    uint32_t *cnt = malloc((size_t)r->n_expert * sizeof(uint32_t));
    if (noise && wt && cnt)
        for (;;) {
            int32_t l = atomic_fetch_add(&c->next_layer, 1);
            if (l >= r->n_layer) break;
            calibrate_layer(r, l, noise, wt, cnt);
        }
    free(noise);
    free(wt);
    free(cnt);
    return NULL;
}

/* Sample embedding rows exactly as synth writes them: generate, hook, quantise, dequantise. */
static hm_status sample_embeddings(hm_synth_routing *r, const hm_synth_tensor *emb, hm_err *err) {
    const int64_t V = emb->ne[1], ne0 = emb->ne[0];
    const hm_type_traits *tr = hm_type_get(emb->type);
    if (!tr || !tr->from_float_ref || !tr->to_float)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --routing-profile: token_embd type %s cannot be replayed",
                       hm_type_name(emb->type));
    r->n_cal = V < CAL_TOKENS ? V : CAL_TOKENS;
    r->z = malloc((size_t)r->n_cal * (size_t)r->ns * sizeof(float));
    r->lambda = malloc((size_t)r->n_cal * sizeof(float));
    float *x = malloc((size_t)ne0 * sizeof(float));
    void *q = malloc(hm_row_size(emb->type, ne0));
    hm_status st = HM_OK;
    if (!r->z || !r->lambda || !x || !q) {
        st = hm_errf(err, HM_ERR_NOMEM, "synth: out of memory for the routing calibration");
        goto done;
    }
    const uint64_t key = hm_synth_key(r->seed, emb->name);
    for (int64_t i = 0; i < r->n_cal; i++) {
        const int64_t tok = i * V / r->n_cal; /* evenly spread over the vocabulary */
        for (int64_t c = 0; c < ne0; c++)
            x[c] = emb->mean + emb->std * hm_synth_gauss(key, (uint64_t)tok * (uint64_t)ne0 + (uint64_t)c);
        hm_synth_routing_row(r, OP_EMBD, -1, key, tok, x, ne0);
        tr->from_float_ref(x, q, ne0);
        tr->to_float(q, x, ne0);
        double su = 0;
        for (int32_t j = r->u0; j < r->s0; j++) su += x[j];
        r->lambda[i] = (float)(su / ((double)N_U * r->c));
        memcpy(r->z + (size_t)i * (size_t)r->ns, x + r->s0, (size_t)r->ns * sizeof(float));
    }
done:
    free(x);
    free(q);
    return st;
}

/* ---- open / close ---- */

void hm_synth_routing_close(hm_synth_routing *r) {
    if (!r) return;
    free(r->bias);
    free(r->target);
    free(r->fit_tv);
    free(r->map);
    free(r->z);
    free(r->lambda);
    free(r);
}

hm_status hm_synth_routing_open(hm_synth_routing **out, const char *path, const hm_synth_preset *p, int32_t n_layer,
                                const hm_synth_tensor *plan, int64_t n_plan, uint64_t seed, int n_threads,
                                hm_err *err) {
    *out = NULL;
    hm_profile prof;
    memset(&prof, 0, sizeof prof);
    hm_status st = hm_profile_read(&prof, path, err);
    if (st) return st;
    hm_synth_routing *r = calloc(1, sizeof *r);
    if (!r) {
        hm_profile_free(&prof);
        return hm_errf(err, HM_ERR_NOMEM, "synth: out of memory");
    }
    if (prof.n_expert != p->n_expert) {
        st = hm_errf(err, HM_ERR_ARG,
                     "synth: --routing-profile %s has %d experts per layer but preset '%s' has %d; the expert "
                     "count must match (pick a preset with %d experts)",
                     path, prof.n_expert, p->name, p->n_expert, prof.n_expert);
        goto fail;
    }
    if (p->n_expert_used > MAX_K || p->n_expert_used > p->n_expert) {
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --routing-profile supports k <= %d (preset '%s' has %d)", MAX_K,
                     p->name, p->n_expert_used);
        goto fail;
    }
    const hm_synth_tensor *emb = NULL;
    for (int64_t i = 0; i < n_plan; i++)
        if (strcmp(plan[i].name, "token_embd.weight") == 0) emb = &plan[i];
    r->n_layer = n_layer;
    r->n_expert = p->n_expert;
    r->k = p->n_expert_used;
    r->n_embd = p->n_embd;
    r->ns = p->n_embd / 4 < MAX_S ? p->n_embd / 4 : MAX_S;
    r->ns -= r->ns % 32;
    r->s0 = p->n_embd - r->ns;
    r->u0 = r->s0 - N_U;
    r->seed = seed;
    if (!emb || r->ns < 32 || r->u0 < p->n_embd / 2) {
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --routing-profile needs n_embd >= 128 (preset '%s' has %d)",
                     p->name, p->n_embd);
        goto fail;
    }
    /* c and sigma_n: U looks like an ordinary embedding value; noise n . z has std 1 per unit
     * gamma (sigma_n * std * sqrt(ns) = 1), so biases come out in units of the noise */
    r->c = emb->std > 0 ? emb->std : 0.02f;
    r->sigma_n = 1.0f / (r->c * sqrtf((float)r->ns));
    snprintf(r->profile_name, sizeof r->profile_name, "%s", strrchr(path, '/') ? strrchr(path, '/') + 1 : path);
    r->profile_layers = prof.n_layer;

    const size_t LE = (size_t)n_layer * (size_t)r->n_expert;
    r->bias = calloc(LE, sizeof *r->bias);
    r->target = calloc(LE, sizeof *r->target);
    r->fit_tv = calloc((size_t)n_layer, sizeof *r->fit_tv);
    r->map = calloc((size_t)n_layer, sizeof *r->map);
    if (!r->bias || !r->target || !r->fit_tv || !r->map) {
        st = hm_errf(err, HM_ERR_NOMEM, "synth: out of memory");
        goto fail;
    }
    /* layer l of n_layer takes profile layer floor((l + 1/2) * P / n_layer): identity when the
     * depths match, evenly spread otherwise */
    for (int32_t l = 0; l < n_layer; l++) {
        int32_t pl = (int32_t)(((int64_t)2 * l + 1) * prof.n_layer / (2 * (int64_t)n_layer));
        r->map[l] = pl;
        uint64_t tot = hm_profile_layer_total(&prof, pl);
        float *pi = r->target + (size_t)l * (size_t)r->n_expert;
        for (int32_t e = 0; e < r->n_expert; e++) {
            double v = tot ? (double)r->k * (double)hm_profile_count(&prof, pl, e) / (double)tot
                           : (double)r->k / (double)r->n_expert; /* a dense / unrecorded layer: uniform */
            pi[e] = (float)(v < 1.0 ? v : 1.0); /* a token picks an expert at most once */
        }
    }
    hm_profile_free(&prof);

    if ((st = sample_embeddings(r, emb, err)) != HM_OK) goto fail;
    cal_task task = {.r = r, .n_threads = n_threads < 1 ? 1 : n_threads > MAX_THREADS ? MAX_THREADS : n_threads};
    atomic_store(&task.next_layer, 0);
    pthread_t tid[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int i = 1; i < task.n_threads; i++) started[i] = pthread_create(&tid[i], NULL, cal_worker, &task) == 0;
    cal_worker(&task);
    for (int i = 1; i < task.n_threads; i++)
        if (started[i]) pthread_join(tid[i], NULL);
    if (atomic_load(&task.next_layer) < n_layer) { /* every worker failed to allocate */
        st = hm_errf(err, HM_ERR_NOMEM, "synth: out of memory for the routing calibration");
        goto fail;
    }
    free(r->z);
    free(r->lambda);
    r->z = r->lambda = NULL;
    *out = r;
    return HM_OK;
fail:
    hm_profile_free(&prof);
    hm_synth_routing_close(r);
    return st;
}

hm_status hm_synth_routing_write_meta(const hm_synth_routing *r, hm_gguf_writer *w) {
    if (!r) return HM_OK;
    hm_status st = hm_gguf_writer_set_str(w, "hotmoe.synth.routing.profile", r->profile_name);
    if (!st) st = hm_gguf_writer_set_u32(w, "hotmoe.synth.routing.profile_layers", (uint32_t)r->profile_layers);
    if (!st) st = hm_gguf_writer_set_arr(w, "hotmoe.synth.routing.layer_map", HM_GGUF_I32, r->map, (uint64_t)r->n_layer);
    if (!st) st = hm_gguf_writer_set_u32(w, "hotmoe.synth.routing.u_first", (uint32_t)r->u0);
    if (!st) st = hm_gguf_writer_set_u32(w, "hotmoe.synth.routing.u_count", N_U);
    if (!st) st = hm_gguf_writer_set_u32(w, "hotmoe.synth.routing.s_count", (uint32_t)r->ns);
    if (!st) st = hm_gguf_writer_set_arr(w, "hotmoe.synth.routing.fit_tv", HM_GGUF_F32, r->fit_tv, (uint64_t)r->n_layer);
    return st;
}
