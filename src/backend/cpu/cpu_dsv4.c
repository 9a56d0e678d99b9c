/* cpu_dsv4.c - DeepSeek-V4's attention and hyper-connection kernels on the CPU (cpu_dsv4.h).
 *
 * RoPE here is the "normal" (GPT-J) pairing llama.cpp's deepseek4 uses: element pairs (2i, 2i+1)
 * of the last n_rot values of a head, angle pos * base^(-2i / n_rot), computed as ggml does
 * (the angle multiplied by base^(-2 / n_rot) pair after pair, in float). */
#include "cpu_dsv4.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "cpu_impl.h"

static float f16r(float v) { return hm_fp16_to_f32(hm_f32_to_fp16(v)); }

size_t hm_dsv4_layout(const hm_dsv4_dims *d, int32_t ratio, int32_t n_ctx, int32_t n_ubatch, float *base,
                      hm_dsv4_state *st) {
    const int64_t hd = d->hd, ihd = d->idx_hd, S = HM_DSV4_RING;
    int64_t cap = (int64_t)d->window + n_ubatch;
    if (cap > n_ctx) cap = n_ctx;
    const int64_t coff = ratio == 4 ? 2 : 1;
    size_t at = 0;
#define TAKE(field, nf) do { if (base) st->field = base + at; at += (size_t)(nf); } while (0)
    if (base) memset(st, 0, sizeof *st), st->cap = cap;
    TAKE(raw, cap * hd);
    if (ratio > 0) {
        TAKE(ckv, S * coff * hd);
        TAKE(csc, S * coff * hd);
        TAKE(comp, ((int64_t)n_ctx / ratio + 1) * hd);
    }
    if (ratio == 4) {
        TAKE(ikv, S * 2 * ihd);
        TAKE(isc, S * 2 * ihd);
        TAKE(icomp, ((int64_t)n_ctx / 4 + 1) * ihd);
    }
#undef TAKE
    return at;
}

/* ---- small row helpers ---- */

static void rmsnorm_row(float *x, const float *w, int64_t n, float eps) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    const float sc = 1.0f / sqrtf((float)(s / (double)n) + eps);
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * sc * (w ? w[i] : 1.0f);
}

/* RoPE (normal pairing) of the last n_rot values of a head of hd at position p, pair i's angle
 * divided by ff[i] (NULL: none); inv: the inverse rotation (llama.cpp's rope_ext_back). */
static void rope_tail(float *x, int hd, int n_rot, int32_t p, float base, const float *ff, bool inv) {
    const float tscale = powf(base, -2.0f / (float)n_rot);
    float theta = (float)p;
    float *r = x + (hd - n_rot);
    for (int i = 0; i < n_rot; i += 2) {
        const float th = ff ? theta / ff[i / 2] : theta;
        const float c = cosf(th), s = inv ? -sinf(th) : sinf(th);
        const float a = r[i], b = r[i + 1];
        r[i] = a * c - b * s;
        r[i + 1] = a * s + b * c;
        theta *= tscale;
    }
}

/* Compress block b of a compressor whose ring holds rows of w = coff * dim values: dim outputs,
 * each a softmax over the block's (and with overlap the previous block's) positions of the
 * scores, weighting the values; then rmsnorm * norm, RoPE at the block's first position. */
static void compress_block(const float *kv, const float *sc, int64_t w, int32_t r, bool overlap, int64_t b,
                           int64_t dim, const float *norm, int n_rot, float theta, const float *ff, float eps,
                           float *out) {
    const int64_t start = b * r, S = HM_DSV4_RING;
    for (int64_t d = 0; d < dim; d++) {
        float mx = -INFINITY;
        /* overlap: the previous block's values from the first half, the current block's from the
         * second; before block 0 nothing (a zero value with a -inf score) */
        for (int pass = 0; pass < 2; pass++) {
            float sum = 0.0f, acc = 0.0f;
            for (int half = overlap ? 0 : 1; half < 2; half++) {
                const int64_t p0 = half == 0 ? start - r : start, col = overlap && half == 1 ? dim + d : d;
                for (int64_t j = 0; j < r; j++) {
                    const int64_t p = p0 + j;
                    if (p < 0) continue;
                    const float s = sc[(p % S) * w + col];
                    if (pass == 0) {
                        if (s > mx) mx = s;
                    } else {
                        const float e = expf(s - mx);
                        sum += e;
                        acc += e * kv[(p % S) * w + col];
                    }
                }
            }
            if (pass == 1) out[d] = acc / sum;
        }
    }
    rmsnorm_row(out, norm, dim, eps);
    rope_tail(out, (int)dim, n_rot, (int32_t)start, theta, ff, false);
    for (int64_t d = 0; d < dim; d++) out[d] = f16r(out[d]);
}

/* ---- the attention ---- */

typedef struct attn_ctx {
    const hm_dsv4_dims *d;
    const hm_dsv4_lw *w;
    const hm_dsv4_state *st;
    const int32_t *pos;
    int64_t n;
    float *q;            /* [n, H hd]: queries in, outputs out (per head, in place) */
    const float *iq;     /* [n, ih ihd] indexer queries */
    const float *iw;     /* [n, ih] indexer head weights */
    int32_t *sel;        /* [n, topk] chosen compressed rows */
    int32_t *n_sel;      /* [n] */
    float *ws;           /* per thread: ws_floats */
    int64_t ws_floats;
    _Atomic int64_t next;
} attn_ctx;

/* The indexer's choice for row t: the visible compressed rows, or the topk best of them by
 * sum_h relu(iq_h . icomp_b) w_h (ties: the lower row). */
static void index_row(attn_ctx *c, int64_t t, float *sc) {
    const hm_dsv4_dims *d = c->d;
    const int64_t n_vis = ((int64_t)c->pos[t] + 1) / 4, ih = d->idx_heads, ihd = d->idx_hd, k = d->idx_topk;
    int32_t *sel = c->sel + t * k;
    if (n_vis <= k) {
        for (int64_t b = 0; b < n_vis; b++) sel[b] = (int32_t)b;
        c->n_sel[t] = (int32_t)n_vis;
        return;
    }
    for (int64_t b = 0; b < n_vis; b++) {
        const float *kb = c->st->icomp + b * ihd;
        float s = 0.0f;
        for (int64_t h = 0; h < ih; h++) {
            const float *qh = c->iq + (t * ih + h) * ihd;
            float dot = 0.0f;
            for (int64_t i = 0; i < ihd; i++) dot += qh[i] * kb[i];
            s += (dot > 0.0f ? dot : 0.0f) * c->iw[t * ih + h];
        }
        sc[b] = s;
    }
    for (int64_t i = 0; i < k; i++) { /* k passes of a max: k is small against n_vis */
        int64_t best = -1;
        for (int64_t b = 0; b < n_vis; b++)
            if (sc[b] != -INFINITY && (best < 0 || sc[b] > sc[best])) best = b;
        sel[i] = (int32_t)best;
        sc[best] = -INFINITY;
    }
    c->n_sel[t] = (int32_t)k;
}

static void index_task(void *p, int ith, int nth) {
    attn_ctx *c = p;
    (void)nth;
    float *sc = c->ws + (size_t)ith * (size_t)c->ws_floats;
    for (int64_t t = atomic_fetch_add(&c->next, 1); t < c->n; t = atomic_fetch_add(&c->next, 1)) index_row(c, t, sc);
}

/* One (row, head): softmax over the window's rows, the visible (ratio 128) or chosen (ratio 4)
 * compressed rows and the head's sink; the K=V rows weighted; the output de-roped. */
static void attn_item(attn_ctx *c, int64_t t, int h, float *sc, float *acc) {
    const hm_dsv4_dims *d = c->d;
    const hm_dsv4_state *st = c->st;
    const int64_t hd = d->hd, p = c->pos[t];
    const int32_t r = c->w->ratio;
    float *qh = c->q + (t * d->n_head + h) * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t j0 = p - d->window + 1 > 0 ? p - d->window + 1 : 0, n_raw = p - j0 + 1;
    int64_t n_cmp = 0;
    const int32_t *sel = NULL;
    if (r == 128) n_cmp = (p + 1) / 128;
    if (r == 4) n_cmp = c->n_sel[t], sel = c->sel + t * d->idx_topk;
    float mx = c->w->sinks[h];
    for (int64_t i = 0; i < n_raw + n_cmp; i++) {
        const float *k = i < n_raw ? st->raw + ((j0 + i) % st->cap) * hd
                                   : st->comp + (int64_t)(sel ? sel[i - n_raw] : i - n_raw) * hd;
        float s = 0.0f;
        for (int64_t e = 0; e < hd; e++) s += qh[e] * k[e];
        sc[i] = s * scale;
        if (sc[i] > mx) mx = sc[i];
    }
    float sum = expf(c->w->sinks[h] - mx);
    memset(acc, 0, (size_t)hd * sizeof(float));
    for (int64_t i = 0; i < n_raw + n_cmp; i++) {
        const float *v = i < n_raw ? st->raw + ((j0 + i) % st->cap) * hd
                                   : st->comp + (int64_t)(sel ? sel[i - n_raw] : i - n_raw) * hd;
        const float e = expf(sc[i] - mx);
        sum += e;
        for (int64_t k = 0; k < hd; k++) acc[k] += e * v[k];
    }
    for (int64_t k = 0; k < hd; k++) qh[k] = acc[k] / sum;
    rope_tail(qh, (int)hd, d->n_rot, (int32_t)p, c->w->theta, c->w->ratio ? d->c_ff : NULL, true);
}

static void attn_task(void *p, int ith, int nth) {
    attn_ctx *c = p;
    (void)nth;
    float *sc = c->ws + (size_t)ith * (size_t)c->ws_floats, *acc = sc + c->ws_floats - c->d->hd;
    const int64_t items = c->n * c->d->n_head;
    for (int64_t i = atomic_fetch_add(&c->next, 1); i < items; i = atomic_fetch_add(&c->next, 1))
        attn_item(c, i / c->d->n_head, (int)(i % c->d->n_head), sc, acc);
}

/* Per-thread floats: scores over the window + the compressed rows (ratio 4 at most: n_ctx / 4),
 * then hd for the output accumulator. */
static int64_t ws_floats(const hm_dsv4_dims *d, int64_t n_cmp) { return (int64_t)d->window + n_cmp + d->hd + 16; }

size_t hm_dsv4_scratch_bytes(const hm_dsv4_dims *d, int64_t n_tok, int32_t n_ctx, int n_threads) {
    return (size_t)n_threads * (size_t)ws_floats(d, (int64_t)n_ctx / 4 + 1) * sizeof(float) +
           (size_t)n_tok * ((size_t)d->idx_topk + 1) * sizeof(int32_t) + 4 * HM_ALIGN;
}

void hm_dsv4_attention(hm_pool *pool, const hm_dsv4_dims *d, const hm_dsv4_lw *w, hm_dsv4_state *st, int64_t E,
                  const float *h, float *qr, float *kv, float *q, float *out, float *ca, float *cb, float *ia,
                  float *ib, float *iq, int64_t n, const int32_t *pos, hm_scratch *scratch) {
    (void)E;
    const int64_t H = d->n_head, hd = d->hd, ih = d->idx_heads, ihd = d->idx_hd, S = HM_DSV4_RING;
    const int32_t r = w->ratio;
    const float *ff = r ? d->c_ff : NULL; /* the layer's RoPE frequencies */
    /* queries: rmsnorm(h Wq_a) * q_a_norm, Wq_b, per-head rmsnorm, RoPE of the tails */
    hm_cpu_rmsnorm(pool, qr, w->q_a_norm, qr, n, d->q_lora, d->eps);
    hm_cpu_matmul(pool, w->wq_b, qr, n, q, scratch);
    hm_cpu_rmsnorm(pool, q, NULL, q, n * H, hd, d->eps);
    for (int64_t t = 0; t < n; t++)
        for (int64_t hh = 0; hh < H; hh++) rope_tail(q + (t * H + hh) * hd, (int)hd, d->n_rot, pos[t], w->theta, ff, false);
    /* the shared K=V row: rmsnorm * kv_norm, RoPE, into the window's ring */
    hm_cpu_rmsnorm(pool, kv, w->kv_norm, kv, n, hd, d->eps);
    for (int64_t t = 0; t < n; t++) {
        rope_tail(kv + t * hd, (int)hd, d->n_rot, pos[t], w->theta, ff, false);
        float *row = st->raw + (pos[t] % st->cap) * hd;
        for (int64_t e = 0; e < hd; e++) row[e] = f16r(kv[t * hd + e]);
    }
    /* the compressors: each position's projections into the ring, a block compressed once its last
     * position is in */
    if (r > 0) {
        const int64_t coff = r == 4 ? 2 : 1, cw = coff * hd;
        const hm_mat *cm[2] = {w->c_kv, w->c_gate};
        float *cy[2] = {ca, cb};
        hm_cpu_matmul_n(pool, cm, 2, h, n, cy, scratch);
        if (r == 4) {
            const hm_mat *im[2] = {w->i_kv, w->i_gate};
            float *iy[2] = {ia, ib};
            hm_cpu_matmul_n(pool, im, 2, h, n, iy, scratch);
        }
        for (int64_t t = 0; t < n; t++) {
            const int64_t p = pos[t], ro = (p % S);
            for (int64_t e = 0; e < cw; e++) {
                st->ckv[ro * cw + e] = ca[t * cw + e];
                st->csc[ro * cw + e] = cb[t * cw + e] + w->c_ape[(p % r) * cw + e];
            }
            if (r == 4)
                for (int64_t e = 0; e < 2 * ihd; e++) {
                    st->ikv[ro * 2 * ihd + e] = ia[t * 2 * ihd + e];
                    st->isc[ro * 2 * ihd + e] = ib[t * 2 * ihd + e] + w->i_ape[(p % 4) * 2 * ihd + e];
                }
            if ((p + 1) % r) continue;
            const int64_t b = p / r;
            compress_block(st->ckv, st->csc, cw, r, r == 4, b, hd, w->c_norm, d->n_rot, d->c_theta, d->c_ff, d->eps,
                           st->comp + b * hd);
            if (r == 4)
                compress_block(st->ikv, st->isc, 2 * ihd, 4, true, b, ihd, w->i_norm, d->n_rot, d->c_theta, d->c_ff,
                               d->eps, st->icomp + b * ihd);
        }
    }
    attn_ctx c = {.d = d, .w = w, .st = st, .pos = pos, .n = n, .q = q};
    hm_bump bump = hm_bump_init(scratch);
    const int nth = hm_pool_size(pool);
    /* the indexer: queries from qr (RoPE at the compressed base), head weights from h */
    if (r == 4) {
        hm_cpu_matmul(pool, w->i_qb, qr, n, iq, scratch);
        for (int64_t t = 0; t < n; t++)
            for (int64_t hh = 0; hh < ih; hh++)
                rope_tail(iq + (t * ih + hh) * ihd, (int)ihd, d->n_rot, pos[t], d->c_theta, d->c_ff, false);
        hm_cpu_matmul(pool, w->i_proj, h, n, out, scratch); /* out: the head weights for now */
        const float ws = 1.0f / sqrtf((float)(ihd * ih));
        for (int64_t i = 0; i < n * ih; i++) out[i] *= ws;
        c.iq = iq;
        c.iw = out;
    }
    /* per-thread scores: the window, then the compressed rows of the longest row's view */
    int64_t n_cmp_max = 0;
    if (r > 0) n_cmp_max = ((int64_t)pos[n - 1] + 1) / r;
    c.ws_floats = ws_floats(d, n_cmp_max);
    c.ws = hm_bump_take(&bump, (size_t)nth * (size_t)c.ws_floats * sizeof(float));
    if (r == 4) {
        c.sel = hm_bump_take(&bump, (size_t)n * (size_t)d->idx_topk * sizeof(int32_t));
        c.n_sel = hm_bump_take(&bump, (size_t)n * sizeof(int32_t));
        atomic_init(&c.next, 0);
        hm_pool_run(pool, index_task, &c);
    }
    atomic_init(&c.next, 0);
    hm_pool_run(pool, attn_task, &c);
    /* the grouped low-rank output: group g's heads times its block of Wo_a */
    const int64_t G = d->o_groups, gd = H * hd / G, L = d->o_lora;
    for (int64_t g = 0; g < G; g++) {
        for (int64_t t = 0; t < n; t++) memcpy(ca + t * gd, q + t * H * hd + g * gd, (size_t)gd * sizeof(float));
        hm_mat wg = *w->wo_a;
        wg.data = (const char *)wg.data + (size_t)(g * L) * wg.nb1;
        wg.ne1 = L;
        hm_cpu_matmul(pool, &wg, ca, n, cb, scratch);
        for (int64_t t = 0; t < n; t++) memcpy(out + t * G * L + g * L, cb + t * L, (size_t)L * sizeof(float));
    }
}

/* ---- hyper-connections ---- */

void hm_dsv4_hc_expand(float *x, int64_t n, int64_t E, int hc) {
    for (int64_t t = n - 1; t >= 0; t--) /* backwards: row t's copies lie at or after its packed row */
        for (int h = hc - 1; h >= 0; h--) memmove(x + (t * hc + h) * E, x + t * E, (size_t)E * sizeof(float));
}

static float sigm(float v) { return 1.0f / (1.0f + expf(-v)); }

void hm_dsv4_hc_mix(float *m, int64_t n, int hc, bool head, const float *scale, const float *base, int iters,
                    float eps) {
    const int64_t w = head ? hc : (2 + hc) * hc;
    for (int64_t t = 0; t < n; t++) {
        float *r = m + t * w;
        for (int i = 0; i < hc; i++) r[i] = sigm(r[i] * scale[0] + base[i]) + eps;
        if (head) continue;
        for (int i = 0; i < hc; i++) r[hc + i] = 2.0f * sigm(r[hc + i] * scale[1] + base[hc + i]);
        float *cm = r + 2 * hc; /* cm[dst + hc src] */
        for (int i = 0; i < hc * hc; i++) cm[i] = cm[i] * scale[2] + base[2 * hc + i];
        for (int s = 0; s < hc; s++) { /* softmax over dst, then + eps */
            float mx = -INFINITY, sum = 0.0f;
            for (int dd = 0; dd < hc; dd++) mx = cm[dd + hc * s] > mx ? cm[dd + hc * s] : mx;
            for (int dd = 0; dd < hc; dd++) sum += (cm[dd + hc * s] = expf(cm[dd + hc * s] - mx));
            for (int dd = 0; dd < hc; dd++) cm[dd + hc * s] = cm[dd + hc * s] / sum + eps;
        }
        for (int it = 0; it < iters; it++) {
            if (it > 0)
                for (int s = 0; s < hc; s++) { /* rows: over dst */
                    float sum = 0.0f;
                    for (int dd = 0; dd < hc; dd++) sum += cm[dd + hc * s];
                    for (int dd = 0; dd < hc; dd++) cm[dd + hc * s] /= sum + eps;
                }
            for (int dd = 0; dd < hc; dd++) { /* columns: over src */
                float sum = 0.0f;
                for (int s = 0; s < hc; s++) sum += cm[dd + hc * s];
                for (int s = 0; s < hc; s++) cm[dd + hc * s] /= sum + eps;
            }
        }
    }
}

typedef struct hc_ctx {
    const float *x, *a, *f; /* reduce: a = pre (row stride ps); post: a = the mixes, f the block output */
    float *out;
    int64_t n, E, ps;
    int hc;
} hc_ctx;

static void reduce_task(void *p, int ith, int nth) {
    const hc_ctx *c = p;
    int64_t lo, hi;
    hm_split(c->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *o = c->out + t * c->E;
        const float *xt = c->x + t * c->hc * c->E, *pt = c->a + t * c->ps;
        for (int64_t e = 0; e < c->E; e++) o[e] = xt[e] * pt[0];
        for (int h = 1; h < c->hc; h++)
            for (int64_t e = 0; e < c->E; e++) o[e] += xt[h * c->E + e] * pt[h];
    }
}

void hm_dsv4_hc_reduce(hm_pool *pool, const float *x, const float *pre, int64_t ps, int64_t n, int64_t E, int hc,
                       float *y) {
    hc_ctx c = {.x = x, .a = pre, .out = y, .n = n, .E = E, .ps = ps, .hc = hc};
    hm_pool_run(pool, reduce_task, &c);
}

static void post_task(void *p, int ith, int nth) {
    const hc_ctx *c = p;
    const int hc = c->hc;
    const int64_t w = (2 + hc) * hc, E = c->E;
    int64_t lo, hi;
    hm_split(c->n * hc, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) { /* (row, destination stream) */
        const int64_t t = i / hc;
        const int dd = (int)(i % hc);
        const float *post = c->a + t * w + hc, *cm = c->a + t * w + 2 * hc, *xt = c->x + t * hc * E;
        const float *ft = c->f + t * E;
        float *o = c->out + (t * hc + dd) * E;
        for (int64_t e = 0; e < E; e++) o[e] = ft[e] * post[dd];
        for (int s = 0; s < hc; s++)
            for (int64_t e = 0; e < E; e++) o[e] += xt[s * E + e] * cm[dd + hc * s];
    }
}

void hm_dsv4_hc_post(hm_pool *pool, const float *f, const float *x, const float *mix, int64_t n, int64_t E, int hc,
                     float *out) {
    hc_ctx c = {.x = x, .a = mix, .f = f, .out = out, .n = n, .E = E, .hc = hc};
    hm_pool_run(pool, post_task, &c);
}

void hm_dsv4_swiglu_clamp(hm_pool *pool, const float *g, float *u, float *out, int64_t n, float limit) {
    if (limit > 0.0f)
        for (int64_t i = 0; i < n; i++) {
            const float gi = g[i] > limit ? limit : g[i];
            const float ui = u[i] > limit ? limit : u[i] < -limit ? -limit : u[i];
            out[i] = gi / (1.0f + expf(-gi)) * ui;
        }
    else
        hm_cpu_swiglu(pool, g, u, out, n);
}
