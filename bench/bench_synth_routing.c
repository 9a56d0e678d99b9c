/* bench_synth_routing.c - does a model made by `hotmoe synth --routing-profile` route like its
 * profile when the real engine runs it?
 *
 *   bench_synth_routing -m MODEL.gguf --profile P.json [-n TOKENS] [--decode N] [--ctx C]
 *                       [-t THREADS] [--seed S] [-o MEASURED.json] [--replay-only]
 *
 * Runs TOKENS random token ids (uniform over the vocabulary, as llama-bench feeds them) through
 * hotmoe's forward pass: sequences of C positions, the first C - N of each sequence as one prompt
 * batch and its last N one token at a time (decode), the session reset between sequences. The
 * routing the engine computes is counted by wrapping hm_moe_route_build (linked with
 * -Wl,--wrap=hm_moe_route_build, see CMakeLists.txt): every (token, expert) of every layer.
 * Nothing in src/ is changed for it.
 *
 * Prints per layer: the profile layer it maps to (hotmoe.synth.routing.layer_map), the total
 * variation distance between the engine's selection frequencies and the profile's, the same for
 * an independent replay (the GGUF's embedding row -> RMSNorm * ffn_norm -> F32 router -> top-k,
 * written here from the file alone; exact at every layer when the construction holds, because no
 * layer writes the reserved channels), and the fraction of (token, layer) whose k experts the
 * engine and the replay agree on, and the synth tool's own calibration fit (TV on its 8192-token
 * sample, hotmoe.synth.routing.fit_tv). Then the means, and the TV a model without skew (uniform
 * routing) would have. --replay-only skips the engine (its columns are then empty): the replay
 * alone, for large token counts. -o writes the engine's counts as a hotmoe.profile.v1 file. A benchmark
 * prints numbers; it asserts nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experts/profile.h"
#include "gguf/gguf.h"
#include "hotmoe.h"
#include "exec/moe.h"
#include "quant/quant.h"

/* ---- the engine's routing, seen through hm_moe_route_build ---- */

/* Every MoE layer of a forward call hands its router's top-k ids ([n_tok, k]) to
 * hm_moe_route_build, layer after layer, from the arch's file (so --wrap sees every call; the
 * compute behind it may go through the expert tiers). The layer is the call's index modulo
 * n_layer: every layer of these archs is MoE, and with logits for every row each call of one
 * forward has the same n_tok, which is checked. */
void __real_hm_moe_route_build(hm_moe_route *r, const int32_t *ids, const float *weights, int32_t n_tok);
void __wrap_hm_moe_route_build(hm_moe_route *r, const int32_t *ids, const float *weights, int32_t n_tok);

static struct {
    int32_t n_layer, n_expert, k;
    uint64_t *counts;   /* [n_layer * n_expert] */
    int32_t *ids;       /* [n_tokens * n_layer * k] the engine's experts */
    uint8_t *n_ids;     /* [n_tokens * n_layer] */
    int64_t n_tokens;
    int64_t base, next; /* global index of the current forward's token 0 */
    int64_t calls, n_tok0, mismatched;
} g_eng;

void __wrap_hm_moe_route_build(hm_moe_route *r, const int32_t *ids, const float *weights, int32_t n_tok) {
    const int32_t l = (int32_t)(g_eng.calls++ % g_eng.n_layer), k = r->k;
    if (l == 0) { /* layer 0 opens a forward call */
        g_eng.base = g_eng.next;
        g_eng.next += n_tok;
        g_eng.n_tok0 = n_tok;
    } else if (n_tok != g_eng.n_tok0) {
        g_eng.mismatched++;
    }
    for (int32_t t = 0; t < n_tok; t++)
        for (int32_t i = 0; i < k; i++) {
            const int32_t e = ids[(size_t)t * (size_t)k + (size_t)i];
            if (e < 0 || e >= g_eng.n_expert) continue;
            g_eng.counts[(size_t)l * (size_t)g_eng.n_expert + (size_t)e]++;
            const int64_t gt = g_eng.base + t;
            if (gt >= g_eng.n_tokens || k != g_eng.k) continue;
            const size_t slot = (size_t)gt * (size_t)g_eng.n_layer + (size_t)l;
            if (g_eng.n_ids[slot] < g_eng.k) g_eng.ids[slot * (size_t)g_eng.k + g_eng.n_ids[slot]++] = e;
        }
    __real_hm_moe_route_build(r, ids, weights, n_tok);
}

/* ---- the replay, from the file alone ---- */

static const hm_gguf_tensor *find(const hm_gguf *g, int l, const char *suffix) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s.weight", l, suffix);
    return hm_gguf_find_tensor(g, name);
}

/* ids[0..k) = the top-k of the naive router of layer l for token tok. */
static void replay(const hm_gguf *g, int l, int32_t tok, int32_t k, float *h, float *logit, int32_t *ids) {
    const hm_gguf_tensor *emb = hm_gguf_find_tensor(g, "token_embd.weight");
    const hm_gguf_tensor *fn = find(g, l, "ffn_norm"), *gi = find(g, l, "ffn_gate_inp");
    if (!fn) fn = find(g, l, "post_attention_norm"); /* qwen35moe's norm in front of the MoE */
    const int64_t E = emb->ne[0], X = gi->ne[1];
    size_t rb = hm_row_size(emb->type, E);
    hm_type_get(emb->type)->to_float((const char *)emb->data + (size_t)tok * rb, h, E);
    double ss = 0;
    for (int64_t j = 0; j < E; j++) ss += (double)h[j] * h[j];
    const float inv = (float)(1.0 / sqrt(ss / (double)E + 1e-6));
    for (int64_t j = 0; j < E; j++) h[j] = h[j] * inv * ((const float *)fn->data)[j];
    for (int64_t e = 0; e < X; e++) {
        const float *w = (const float *)gi->data + e * E;
        double s = 0;
        for (int64_t j = 0; j < E; j++) s += (double)w[j] * h[j];
        logit[e] = (float)s;
    }
    for (int32_t i = 0; i < k; i++) {
        int32_t best = -1;
        for (int32_t e = 0; e < (int32_t)X; e++)
            if (logit[e] > -INFINITY && (best < 0 || logit[e] > logit[best])) best = e;
        ids[i] = best;
        logit[best] = -INFINITY;
    }
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double tv_dist(const uint64_t *a, const hm_profile *p, int32_t pl, int32_t n) {
    double ta = 0, tp = (double)hm_profile_layer_total(p, pl), tv = 0;
    for (int32_t e = 0; e < n; e++) ta += (double)a[e];
    for (int32_t e = 0; e < n; e++) tv += fabs((double)a[e] / ta - (double)hm_profile_count(p, pl, e) / tp);
    return 0.5 * tv;
}

static void usage(void) {
    fputs("usage: bench_synth_routing -m MODEL.gguf --profile P.json [-n TOKENS] [--decode N] [--ctx C]\n"
          "                           [-t THREADS] [--seed S] [-o MEASURED.json] [--replay-only]\n",
          stderr);
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *prof_path = NULL, *out_path = NULL;
    int64_t n_tokens = 2048;
    int32_t n_decode = 64, n_ctx = 512, n_threads = 0;
    bool replay_only = false;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--replay-only")) {
            replay_only = true;
            continue;
        }
        if (!v) {
            usage();
            return 2;
        }
        i++;
        if (!strcmp(a, "-m")) model_path = v;
        else if (!strcmp(a, "--profile")) prof_path = v;
        else if (!strcmp(a, "-o")) out_path = v;
        else if (!strcmp(a, "-n")) n_tokens = atoll(v);
        else if (!strcmp(a, "--decode")) n_decode = atoi(v);
        else if (!strcmp(a, "--ctx")) n_ctx = atoi(v);
        else if (!strcmp(a, "-t")) n_threads = atoi(v);
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 0);
        else {
            usage();
            return 2;
        }
    }
    if (!model_path || !prof_path || n_tokens < 1 || n_ctx < 2 || n_decode < 0 || n_decode >= n_ctx) {
        usage();
        return 2;
    }
    hm_err err = {{0}};
    hm_profile prof;
    memset(&prof, 0, sizeof prof);
    hm_gguf *g = NULL;
    hm_model *m = NULL;
    hm_session *s = NULL;
    if (hm_profile_read(&prof, prof_path, &err) || hm_gguf_open(&g, model_path, &err) ||
        hm_model_open(&m, model_path, NULL, &err)) {
        fprintf(stderr, "bench_synth_routing: %s\n", err.msg);
        return 1;
    }
    const hm_model_info *info = hm_model_get_info(m);
    const int32_t L = info->n_layer, X = info->n_expert, k = info->n_expert_used;
    if (prof.n_expert != X) {
        fprintf(stderr, "bench_synth_routing: profile has %d experts, model %d\n", prof.n_expert, X);
        return 1;
    }
    int32_t *map = calloc((size_t)L, sizeof *map);
    hm_gguf_arr arr;
    bool have_map = hm_gguf_get_arr(g, "hotmoe.synth.routing.layer_map", &arr) && arr.n == (uint64_t)L;
    for (int32_t l = 0; l < L; l++) {
        int64_t v = (int64_t)((2 * l + 1) * (int64_t)prof.n_layer / (2 * (int64_t)L));
        if (have_map) hm_gguf_arr_int(&arr, (uint64_t)l, &v);
        map[l] = (int32_t)v;
    }
    if (!have_map) fprintf(stderr, "note: %s has no hotmoe.synth.routing.layer_map (not skewed?)\n", model_path);

    g_eng.n_layer = L;
    g_eng.n_expert = X;
    g_eng.k = k;
    g_eng.n_tokens = n_tokens;
    g_eng.counts = calloc((size_t)L * (size_t)X, sizeof *g_eng.counts);
    g_eng.ids = calloc((size_t)n_tokens * (size_t)L * (size_t)k, sizeof *g_eng.ids);
    g_eng.n_ids = calloc((size_t)n_tokens * (size_t)L, 1);
    int32_t *toks = malloc((size_t)n_tokens * sizeof *toks);
    uint64_t rs = seed;
    for (int64_t i = 0; i < n_tokens; i++) toks[i] = (int32_t)(splitmix(&rs) % (uint64_t)info->n_vocab);

    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = n_ctx;
    so.n_threads = n_threads;
    if (hm_session_open(&s, m, &so, &err)) {
        fprintf(stderr, "bench_synth_routing: %s\n", err.msg);
        return 1;
    }
    if (!replay_only)
        fprintf(stderr, "running %lld random tokens (sequences of %d: %d prompt + %d decode)...\n", (long long)n_tokens, n_ctx,
            n_ctx - n_decode, n_decode);
    for (int64_t i = replay_only ? n_tokens : 0; i < n_tokens;) {
        hm_session_reset(s);
        int64_t left = n_tokens - i;
        int32_t n_prompt = (int32_t)(left < n_ctx - n_decode ? left : n_ctx - n_decode);
        const float *logits;
        /* logits_all: qwen3moe's last layer otherwise computes only the rows whose logits are wanted */
        if (hm_session_eval(s, toks + i, n_prompt, true, &logits, &err)) goto eval_fail;
        i += n_prompt;
        for (int32_t d = 0; d < n_decode && i < n_tokens; d++, i++)
            if (hm_session_eval(s, toks + i, 1, true, &logits, &err)) goto eval_fail;
    }

    /* replay and compare */
    const hm_gguf_tensor *emb = hm_gguf_find_tensor(g, "token_embd.weight");
    float *h = malloc((size_t)emb->ne[0] * sizeof *h), *logit = malloc((size_t)X * sizeof *logit);
    uint64_t *rcounts = calloc((size_t)L * (size_t)X, sizeof *rcounts);
    int32_t ids[256];
    double sum_tv = 0, sum_rtv = 0, sum_agree = 0, sum_uni = 0;
    hm_gguf_arr fit;
    const bool have_fit = hm_gguf_get_arr(g, "hotmoe.synth.routing.fit_tv", &fit) && fit.n == (uint64_t)L;
    printf("layer  profile  TV(engine)  TV(replay)  agree(engine=replay)  TV(uniform)  synth fit TV\n");
    for (int32_t l = 0; l < L; l++) {
        uint64_t *rc = rcounts + (size_t)l * (size_t)X;
        int64_t agree = 0;
        for (int64_t t = 0; t < n_tokens; t++) {
            replay(g, l, toks[t], k, h, logit, ids);
            size_t slot = (size_t)t * (size_t)L + (size_t)l;
            int same = g_eng.n_ids[slot] == k;
            for (int32_t i = 0; i < k; i++) {
                rc[ids[i]]++;
                int found = 0;
                for (int32_t j = 0; j < g_eng.n_ids[slot]; j++) found |= g_eng.ids[slot * (size_t)k + (size_t)j] == ids[i];
                same &= found;
            }
            agree += same;
        }
        uint64_t *uni = calloc((size_t)X, sizeof *uni);
        for (int32_t e = 0; e < X; e++) uni[e] = 1;
        double tv = tv_dist(g_eng.counts + (size_t)l * (size_t)X, &prof, map[l], X);
        double rtv = tv_dist(rc, &prof, map[l], X), utv = tv_dist(uni, &prof, map[l], X);
        free(uni);
        double ag = (double)agree / (double)n_tokens;
        double ftv = -1;
        if (have_fit) hm_gguf_arr_float(&fit, (uint64_t)l, &ftv);
        printf("%5d  %7d  %10.4f  %10.4f  %19.4f  %11.4f  %12.4f\n", l, map[l], tv, rtv, ag, utv, ftv);
        sum_tv += tv;
        sum_rtv += rtv;
        sum_agree += ag;
        sum_uni += utv;
    }
    printf(" mean           %10.4f  %10.4f  %19.4f  %11.4f\n", sum_tv / L, sum_rtv / L, sum_agree / L, sum_uni / L);
    printf("(%lld tokens x %d layers x k %d; router calls %lld%s)\n", (long long)n_tokens, L, k, (long long)g_eng.calls,
           g_eng.mismatched ? "; LAYER ORDER UNCLEAR: calls of one forward with different n_tok" : "");

    if (out_path) {
        hm_profile mp;
        if (hm_profile_init(&mp, L, X, &err) == HM_OK) {
            snprintf(mp.model, sizeof mp.model, "%s", info->name);
            snprintf(mp.arch, sizeof mp.arch, "%s", info->arch);
            mp.k = k;
            mp.tokens = (uint64_t)n_tokens;
            memcpy(mp.counts, g_eng.counts, (size_t)L * (size_t)X * sizeof *mp.counts);
            if (hm_profile_write(&mp, out_path, HM_PROFILE_HOTMOE, &err)) fprintf(stderr, "%s\n", err.msg);
            hm_profile_free(&mp);
        }
    }
    free(h);
    free(logit);
    free(rcounts);
    hm_session_close(s);
    hm_model_close(m);
    hm_gguf_close(g);
    hm_profile_free(&prof);
    return 0;
eval_fail:
    fprintf(stderr, "bench_synth_routing: %s\n", err.msg);
    return 1;
}
