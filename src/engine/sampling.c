/* sampling.c - token samplers: repetition penalty, greedy, top-k, top-p, min-p, temperature.
 *
 * Invariants: every buffer is sized from n_vocab at open, so hm_sampler_sample never allocates;
 * the only state that changes across calls is the penalty history and the generator, so a
 * sampler re-seeded with the same seed and fed the same logits and history draws the same
 * tokens. Ties between equal logits go to the lower token id, on every path.
 *
 * Order (as llama.cpp's default chain, minus the samplers we do not have):
 *   penalty -> [temp <= 0: argmax] -> top-k -> top-p -> min-p -> temperature -> draw.
 * top-p and min-p look at the softmax at temperature 1 of the candidates that survive top-k. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "hotmoe.h"

struct hm_sampler {
    hm_sampler_opts o;
    int32_t n_vocab;
    float *val;      /* [n_vocab] logits after the penalty */
    float *prob;     /* [n_vocab] candidate probabilities, in candidate order */
    int32_t *cand;   /* [n_vocab] candidate ids, sorted by val descending */
    uint32_t *stamp; /* [n_vocab] marks tokens already penalised in this call */
    uint32_t gen;
    int32_t *hist;   /* ring of the last repeat_last_n accepted tokens */
    int32_t hist_n, hist_pos;
    uint64_t rng;
};

void hm_sampler_opts_default(hm_sampler_opts *o) {
    o->temp = 0.8f;
    o->top_k = 40;
    o->top_p = 0.95f;
    o->min_p = 0.05f;
    o->repeat_penalty = 1.0f;
    o->repeat_last_n = 64;
    o->seed = 0;
}

/* splitmix64: tiny, full-period, good enough to draw tokens. */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

hm_status hm_sampler_open(hm_sampler **out, int32_t n_vocab, const hm_sampler_opts *opts, hm_err *err) {
    *out = NULL;
    if (n_vocab <= 0) return hm_errf(err, HM_ERR_ARG, "sampler: n_vocab %d must be > 0", n_vocab);
    hm_sampler *s = calloc(1, sizeof *s);
    if (!s) return hm_errf(err, HM_ERR_NOMEM, "sampler: out of memory");
    if (opts) s->o = *opts;
    else hm_sampler_opts_default(&s->o);
    if (s->o.repeat_last_n < 0) s->o.repeat_last_n = 0;
    s->n_vocab = n_vocab;
    size_t n = (size_t)n_vocab;
    s->val = hm_malloc_aligned(n * sizeof(float));
    s->prob = hm_malloc_aligned(n * sizeof(float));
    s->cand = hm_malloc_aligned(n * sizeof(int32_t));
    s->stamp = hm_calloc_aligned(n * sizeof(uint32_t));
    s->hist = hm_malloc_aligned((size_t)(s->o.repeat_last_n + 1) * sizeof(int32_t));
    if (!s->val || !s->prob || !s->cand || !s->stamp || !s->hist) {
        hm_sampler_close(s);
        return hm_errf(err, HM_ERR_NOMEM, "sampler: out of memory for %d-token buffers", n_vocab);
    }
    hm_sampler_reset(s);
    *out = s;
    return HM_OK;
}

void hm_sampler_close(hm_sampler *s) {
    if (!s) return;
    hm_free_aligned(s->val);
    hm_free_aligned(s->prob);
    hm_free_aligned(s->cand);
    hm_free_aligned(s->stamp);
    hm_free_aligned(s->hist);
    free(s);
}

void hm_sampler_reset(hm_sampler *s) {
    s->hist_n = 0;
    s->hist_pos = 0;
    s->rng = s->o.seed;
}

void hm_sampler_accept(hm_sampler *s, int32_t token) {
    int32_t cap = s->o.repeat_last_n;
    if (cap <= 0) return;
    s->hist[s->hist_pos] = token;
    s->hist_pos = (s->hist_pos + 1) % cap;
    if (s->hist_n < cap) s->hist_n++;
}

/* a ranks before b: larger value, then smaller id. */
static inline int ranks_before(const float *val, int32_t a, int32_t b) {
    return val[a] > val[b] || (val[a] == val[b] && a < b);
}

/* Min-heap on rank (root = worst kept candidate). */
static void heap_down(const float *val, int32_t *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && ranks_before(val, h[w], h[l])) w = l;
        if (r < n && ranks_before(val, h[w], h[r])) w = r;
        if (w == i) return;
        int32_t t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

/* Leaves the best k ids of val[0..n) in cand[0..k), sorted best first. O(n log k), no allocation. */
static void select_top(const float *val, int32_t n, int32_t k, int32_t *cand) {
    for (int32_t i = 0; i < k; i++) cand[i] = i;
    for (int32_t i = k / 2 - 1; i >= 0; i--) heap_down(val, cand, k, i);
    for (int32_t i = k; i < n; i++) {
        if (ranks_before(val, i, cand[0])) {
            cand[0] = i;
            heap_down(val, cand, k, 0);
        }
    }
    /* heap sort: repeatedly move the worst to the end */
    for (int32_t end = k - 1; end > 0; end--) {
        int32_t t = cand[0]; cand[0] = cand[end]; cand[end] = t;
        heap_down(val, cand, end, 0);
    }
}

int32_t hm_sampler_sample(hm_sampler *s, const float *logits) {
    const int32_t n = s->n_vocab;
    const hm_sampler_opts *o = &s->o;
    float *val = s->val;
    memcpy(val, logits, (size_t)n * sizeof(float));

    if (o->repeat_penalty != 1.0f && s->hist_n > 0) {
        if (++s->gen == 0) { /* wrapped: clear stale stamps once every 2^32 calls */
            memset(s->stamp, 0, (size_t)n * sizeof(uint32_t));
            s->gen = 1;
        }
        for (int32_t i = 0; i < s->hist_n; i++) {
            int32_t t = s->hist[i];
            if (t < 0 || t >= n || s->stamp[t] == s->gen) continue;
            s->stamp[t] = s->gen;
            val[t] = val[t] > 0 ? val[t] / o->repeat_penalty : val[t] * o->repeat_penalty;
        }
    }

    if (o->temp <= 0.0f) {
        int32_t best = 0;
        for (int32_t i = 1; i < n; i++)
            if (val[i] > val[best]) best = i;
        return best;
    }

    int32_t k = (o->top_k > 0 && o->top_k < n) ? o->top_k : n;
    select_top(val, n, k, s->cand);
    const int32_t *cand = s->cand;

    /* softmax at temperature 1 over the k candidates (cand[0] is the max) */
    float *p = s->prob;
    double sum = 0;
    for (int32_t i = 0; i < k; i++) {
        p[i] = expf(val[cand[i]] - val[cand[0]]);
        sum += p[i];
    }
    int32_t keep = k;
    if (o->top_p < 1.0f) {
        double cum = 0;
        for (int32_t i = 0; i < k; i++) {
            cum += p[i] / sum;
            if (cum >= o->top_p) { keep = i + 1; break; }
        }
    }
    if (o->min_p > 0.0f) { /* p[0] is the max, p[i]/p[0] the ratio to it */
        int32_t m = 1;
        while (m < keep && p[m] >= o->min_p * p[0]) m++;
        keep = m;
    }

    /* temperature, then draw */
    float inv_t = 1.0f / o->temp;
    sum = 0;
    for (int32_t i = 0; i < keep; i++) {
        p[i] = expf((val[cand[i]] - val[cand[0]]) * inv_t);
        sum += p[i];
    }
    double u = rng_uniform(&s->rng) * sum, cum = 0;
    for (int32_t i = 0; i < keep; i++) {
        cum += p[i];
        if (u < cum) return cand[i];
    }
    return cand[keep - 1];
}
