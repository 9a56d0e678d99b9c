/* cpu_route.c - the MoE router on the CPU: the routing spec of backend/route_spec.h (scores,
 * bias, group-limited choice, top-k or a hash table, weights, norm, scale) for each token. One
 * token at a time on the caller's thread (n_expert <= 1024 logits: cheaper than a dispatch). */
#include <math.h>
#include <string.h>

#include "cpu_impl.h"

/* The top k of c[0..n) into id[] in descending c, ties to the lower index (strict > keeps the
 * earlier one), skipping entries where allowed is not NULL and allowed[e] is false. */
static void topk(const float *c, int n, int k, const bool *allowed, int32_t *id) {
    float v[32];
    int m = 0;
    for (int e = 0; e < n; e++) {
        if (allowed && !allowed[e]) continue;
        const float x = c[e];
        if (m == k && !(x > v[k - 1])) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && x > v[j - 1]) {
            v[j] = v[j - 1];
            id[j] = id[j - 1];
            j--;
        }
        v[j] = x;
        id[j] = e;
    }
}

/* Step 3: which experts the topk_group best groups hold (allowed[e]). */
static void group_mask(const hm_route_spec *sp, const float *c, bool has_bias, bool *allowed) {
    const int ng = sp->n_group, gs = sp->n_expert / ng;
    float gscore[32];
    for (int g = 0; g < ng; g++) {
        const float *cg = c + g * gs;
        float a = -INFINITY, b = -INFINITY; /* the two largest */
        for (int i = 0; i < gs; i++) {
            if (cg[i] > a) {
                b = a;
                a = cg[i];
            } else if (cg[i] > b) {
                b = cg[i];
            }
        }
        gscore[g] = has_bias && gs > 1 ? a + b : a;
    }
    int32_t keep[32];
    topk(gscore, ng, sp->topk_group, NULL, keep);
    memset(allowed, 0, (size_t)sp->n_expert * sizeof(bool));
    for (int i = 0; i < sp->topk_group; i++)
        for (int j = 0; j < gs; j++) allowed[keep[i] * gs + j] = true;
}

void hm_cpu_route(const hm_route_spec *sp, const float *logits, int64_t n_tok, const float *bias,
                  const int32_t *hash, const int32_t *tokens, int32_t *ids, float *weights) {
    HM_ASSERT(!hm_route_spec_invalid(sp) && (!hash || tokens));
    const int ne = sp->n_expert, k = sp->k;
    const float scale = sp->scale == 0.0f ? 1.0f : sp->scale;
    float s[1024], c[1024];
    bool allowed[1024];
    for (int64_t t = 0; t < n_tok; t++) {
        const float *l = logits + t * ne;
        int32_t *id = ids + t * k;
        float *w = weights + t * k;
        memcpy(s, l, (size_t)ne * sizeof(float));
        switch (sp->score) {
        case HM_ROUTE_SOFTMAX: {
            const float m = hm_max_f32(s, ne);
            const float inv = 1.0f / hm_exp_sub_sum(s, ne, m);
            for (int e = 0; e < ne; e++) s[e] *= inv;
            break;
        }
        case HM_ROUTE_SIGMOID:
            for (int e = 0; e < ne; e++) s[e] = 1.0f / (1.0f + expf(-s[e]));
            break;
        case HM_ROUTE_SQRT_SOFTPLUS:
            for (int e = 0; e < ne; e++) s[e] = sqrtf(s[e] > 20.0f ? s[e] : log1pf(expf(s[e])));
            break;
        case HM_ROUTE_SOFTMAX_TOPK: break;
        }
        if (hash) {
            memcpy(id, hash + (int64_t)tokens[t] * k, (size_t)k * sizeof(int32_t));
        } else {
            const float *ch = s;
            if (bias) {
                for (int e = 0; e < ne; e++) c[e] = s[e] + bias[e];
                ch = c;
            }
            if (sp->n_group > 1) group_mask(sp, ch, bias != NULL, allowed);
            topk(ch, ne, k, sp->n_group > 1 ? allowed : NULL, id);
        }
        for (int i = 0; i < k; i++) w[i] = s[id[i]];
        if (sp->score == HM_ROUTE_SOFTMAX_TOPK) { /* softmax over the chosen logits */
            float m = w[0];
            for (int i = 1; i < k; i++) m = w[i] > m ? w[i] : m;
            float sum = 0.0f;
            for (int i = 0; i < k; i++) sum += (w[i] = expf(w[i] - m));
            for (int i = 0; i < k; i++) w[i] /= sum;
        } else if (sp->norm) {
            float sum = 0.0f;
            for (int i = 0; i < k; i++) sum += w[i];
            const float inv = 1.0f / sum;
            for (int i = 0; i < k; i++) w[i] *= inv;
        }
        if (scale != 1.0f)
            for (int i = 0; i < k; i++) w[i] *= scale;
    }
}

void hm_cpu_router(const float *logits, int64_t n_tok, int n_expert, int k, bool renorm,
                   int32_t *ids, float *weights) {
    const hm_route_spec sp = {.n_expert = n_expert, .k = k, .score = HM_ROUTE_SOFTMAX, .norm = renorm, .scale = 1.0f};
    hm_cpu_route(&sp, logits, n_tok, NULL, NULL, NULL, ids, weights);
}
