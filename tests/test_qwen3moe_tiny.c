/* test_qwen3moe_tiny.c - the qwen3moe forward pass against an independent reference.
 *
 * Builds a tiny random qwen3moe GGUF (F32 weights, head_dim 12 != n_embd / n_head = 8, GQA 4/2,
 * 6 experts, top-2) with the GGUF writer, keeps the weights in memory, and compares the engine's
 * logits with a naive double-precision forward pass written here from the model's definition
 * (plain loops over the in-memory weights; nothing shared with the engine). The reference
 * stores K and V rounded to IEEE half, as the engine's f16 KV cache does.
 *
 * Also: prefill == token-by-token decode, identical results for 1/2/3 threads and for small
 * micro-batches, tied output embeddings, trim + re-eval, context overflow, and bad files (wrong
 * architecture, missing tensor, wrong shape, wrong type) whose errors name the tensor.
 *
 * Expert usage (section 7): the reference's own router picks (double precision) are the truth
 * for the model's expert store. The engine runs with a routing trace; every (token, layer) expert
 * set in the trace must equal the reference's top-k (near-ties, where the k-th and the next
 * probability differ by < 1e-6, are reported and excused), the store's counts must equal the
 * trace's recount and the reference's tally, and the profile written in both formats must read
 * back with the same counts and token split. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "experts/profile.h"
#include "experts/trace.h"
#include "gguf/gguf.h"
#include "hotmoe.h"
#include "test.h"

enum { E = 32, NH = 4, NKV = 2, HD = 12, NL = 2, NX = 6, K = 2, FF = 16, NV = 50, CTX_TRAIN = 256 };
#define THETA 10000.0
#define EPS 1e-6

typedef struct layer_w {
    float attn_norm[E], q_norm[HD], k_norm[HD], ffn_norm[E];
    float wq[NH * HD][E], wk[NKV * HD][E], wv[NKV * HD][E], wo[E][NH * HD];
    float router[NX][E];
    float gate[NX][FF][E], up[NX][FF][E], down[NX][E][FF];
} layer_w;

typedef struct model_w {
    float embd[NV][E], out_norm[E], out[NV][E];
    layer_w l[NL];
} model_w;

static uint64_t rng_state;
static double urand(void) { /* uniform [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / 4503599627370496.0 - 1.0;
}
static void fill(float *p, size_t n, double scale, double offset) {
    for (size_t i = 0; i < n; i++) p[i] = (float)(offset + scale * urand());
}

static void init_weights(model_w *w, uint64_t seed) {
    rng_state = seed;
    fill(&w->embd[0][0], NV * E, 1.0, 0);
    fill(w->out_norm, E, 0.2, 1.0);
    fill(&w->out[0][0], NV * E, 0.3, 0);
    for (int l = 0; l < NL; l++) {
        layer_w *L = &w->l[l];
        fill(L->attn_norm, E, 0.2, 1.0);
        fill(L->q_norm, HD, 0.2, 1.0);
        fill(L->k_norm, HD, 0.2, 1.0);
        fill(L->ffn_norm, E, 0.2, 1.0);
        fill(&L->wq[0][0], sizeof L->wq / 4, 0.4, 0);
        fill(&L->wk[0][0], sizeof L->wk / 4, 0.4, 0);
        fill(&L->wv[0][0], sizeof L->wv / 4, 0.4, 0);
        fill(&L->wo[0][0], sizeof L->wo / 4, 0.3, 0);
        fill(&L->router[0][0], sizeof L->router / 4, 0.5, 0);
        fill(&L->gate[0][0][0], sizeof L->gate / 4, 0.4, 0);
        fill(&L->up[0][0][0], sizeof L->up / 4, 0.4, 0);
        fill(&L->down[0][0][0], sizeof L->down / 4, 0.4, 0);
    }
}

/* ---- writing the file ---- */

typedef enum variant { V_OK, V_TIED, V_WRONG_ARCH, V_MISSING, V_BAD_SHAPE, V_BAD_TYPE, V_BAD_QTYPE } variant;

typedef struct tdesc {
    char name[64];
    int type;
    uint32_t nd;
    int64_t ne[3];
    const void *data;
    size_t bytes;
} tdesc;

static int add(tdesc *t, int n, const char *name, const void *data, uint32_t nd, int64_t a, int64_t b, int64_t c) {
    tdesc *d = &t[n];
    snprintf(d->name, sizeof d->name, "%s", name);
    d->type = 0;
    d->nd = nd;
    d->ne[0] = a;
    d->ne[1] = b;
    d->ne[2] = c;
    d->data = data;
    d->bytes = (size_t)a * (size_t)(nd > 1 ? b : 1) * (size_t)(nd > 2 ? c : 1) * 4;
    return n + 1;
}

static int write_model(const char *path, const model_w *w, variant var) {
    static tdesc t[256];
    static uint16_t half[E];
    int n = 0;
    n = add(t, n, "token_embd.weight", w->embd, 2, E, NV, 1);
    n = add(t, n, "output_norm.weight", w->out_norm, 1, E, 1, 1);
    if (var != V_TIED) n = add(t, n, "output.weight", w->out, 2, E, NV, 1);
    for (int l = 0; l < NL; l++) {
        const layer_w *L = &w->l[l];
        char nm[64];
#define T(s, data, nd, a, b, c) (snprintf(nm, sizeof nm, "blk.%d." s ".weight", l), n = add(t, n, nm, data, nd, a, b, c))
        T("attn_norm", L->attn_norm, 1, E, 1, 1);
        T("attn_q", L->wq, 2, E, NH * HD, 1);
        T("attn_k", L->wk, 2, E, NKV * HD, 1);
        T("attn_v", L->wv, 2, E, NKV * HD, 1);
        T("attn_output", L->wo, 2, NH * HD, E, 1);
        T("attn_q_norm", L->q_norm, 1, HD, 1, 1);
        if (!(var == V_MISSING && l == 1)) T("attn_k_norm", L->k_norm, 1, HD, 1, 1);
        T("ffn_norm", L->ffn_norm, 1, E, 1, 1);
        T("ffn_gate_inp", L->router, 2, E, NX, 1);
        T("ffn_gate_exps", L->gate, 3, E, FF, NX);
        T("ffn_up_exps", L->up, 3, E, FF, NX);
        if (var == V_BAD_SHAPE && l == 0) T("ffn_down_exps", L->down, 3, E, FF, NX); /* transposed slabs */
        else T("ffn_down_exps", L->down, 3, FF, E, NX);
#undef T
    }
    if (var == V_BAD_TYPE) { /* blk.0.ffn_norm as f16: norms must be f32 */
        for (int i = 0; i < n; i++)
            if (strcmp(t[i].name, "blk.0.ffn_norm.weight") == 0) {
                t[i].type = 1;
                t[i].data = half;
                t[i].bytes = E * 2;
            }
    }
    if (var == V_BAD_QTYPE) { /* blk.1.attn_q as i8: a type ggml knows that we do not compute with */
        for (int i = 0; i < n; i++)
            if (strcmp(t[i].name, "blk.1.attn_q.weight") == 0) {
                t[i].type = 24;
                t[i].bytes /= 4;
            }
    }

    hm_err err;
    hm_gguf_writer *g = NULL;
    if (hm_gguf_writer_open(&g, path, 0, &err) != HM_OK) {
        fprintf(stderr, "writer: %s\n", err.msg);
        return -1;
    }
    hm_gguf_writer_set_str(g, "general.architecture", var == V_WRONG_ARCH ? "falcon" : "qwen3moe");
    const char *a = var == V_WRONG_ARCH ? "falcon" : "qwen3moe";
    char key[128];
#define KU32(s, v) (snprintf(key, sizeof key, "%s." s, a), hm_gguf_writer_set_u32(g, key, (uint32_t)(v)))
#define KF32(s, v) (snprintf(key, sizeof key, "%s." s, a), hm_gguf_writer_set_f32(g, key, (float)(v)))
    hm_gguf_writer_set_str(g, "general.name", "tiny-test");
    KU32("block_count", NL);
    KU32("context_length", CTX_TRAIN);
    KU32("embedding_length", E);
    KU32("feed_forward_length", 64);
    KU32("expert_feed_forward_length", FF);
    KU32("attention.head_count", NH);
    KU32("attention.head_count_kv", NKV);
    KU32("attention.key_length", HD);
    KU32("attention.value_length", HD);
    KF32("rope.freq_base", THETA);
    KF32("attention.layer_norm_rms_epsilon", EPS);
    KU32("expert_count", NX);
    KU32("expert_used_count", K);
#undef KU32
#undef KF32
    for (int i = 0; i < n; i++) hm_gguf_writer_add_tensor(g, t[i].name, t[i].type, t[i].nd, t[i].ne);
    hm_gguf_writer_begin_data(g);
    for (int i = 0; i < n; i++) hm_gguf_writer_write(g, t[i].data, t[i].bytes);
    if (hm_gguf_writer_finish(g) != HM_OK) {
        fprintf(stderr, "writer finish: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* ---- the reference forward pass (double, whole sequence, no cache) ---- */

static bool ref_half = true; /* model the f16 KV cache */
/* Round to the nearest IEEE half (ties to even; subnormal quantum 2^-24; our values never
 * overflow), via the float the engine stores from. */
static double to_half(double x) {
    if (!ref_half) return x;
    double f = (float)x;
    if (f == 0) return f;
    int e;
    frexp(f, &e);     /* f = m * 2^e, m in [0.5, 1): 11 significant bits -> quantum 2^(e-11) */
    int q = e - 11 < -24 ? -24 : e - 11;
    return ldexp(nearbyint(ldexp(f, -q)), q);
}

static void rmsnorm(const double *x, const float *w, double *out, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + EPS);
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

static void matvec(const float *w, int rows, int cols, const double *x, double *y) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += (double)w[r * cols + c] * x[c];
        y[r] = s;
    }
}

static void rope(double *v, int pos) {
    for (int i = 0; i < HD / 2; i++) {
        double ang = pos * pow(THETA, -2.0 * i / HD);
        double a = v[i], b = v[i + HD / 2];
        v[i] = a * cos(ang) - b * sin(ang);
        v[i + HD / 2] = a * sin(ang) + b * cos(ang);
    }
}

/* The reference router's picks of the last reference() call: [layer][token][K] (ascending ids) and
 * the gap between the k-th and the (k+1)-th probability (small = a near-tie). */
#define REF_MAX_TOK 64
static int ref_sel[NL][REF_MAX_TOK][K];
static double ref_gap[NL][REF_MAX_TOK];

/* logits: [n, NV] */
static void reference(const model_w *w, bool tied, const int32_t *tok, int n, double *logits) {
    double (*x)[E] = calloc((size_t)n, sizeof *x);
    double (*kc)[NKV * HD] = calloc((size_t)n, sizeof *kc);
    double (*vc)[NKV * HD] = calloc((size_t)n, sizeof *vc);
    double (*qs)[NH * HD] = calloc((size_t)n, sizeof *qs);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < E; i++) x[t][i] = w->embd[tok[t]][i];
    for (int l = 0; l < NL; l++) {
        const layer_w *L = &w->l[l];
        for (int t = 0; t < n; t++) {
            double h[E];
            rmsnorm(x[t], L->attn_norm, h, E);
            matvec(&L->wq[0][0], NH * HD, E, h, qs[t]);
            matvec(&L->wk[0][0], NKV * HD, E, h, kc[t]);
            matvec(&L->wv[0][0], NKV * HD, E, h, vc[t]);
            for (int hh = 0; hh < NH; hh++) {
                rmsnorm(qs[t] + hh * HD, L->q_norm, qs[t] + hh * HD, HD);
                rope(qs[t] + hh * HD, t);
            }
            for (int hh = 0; hh < NKV; hh++) {
                rmsnorm(kc[t] + hh * HD, L->k_norm, kc[t] + hh * HD, HD);
                rope(kc[t] + hh * HD, t);
            }
            for (int i = 0; i < NKV * HD; i++) {
                kc[t][i] = to_half(kc[t][i]);
                vc[t][i] = to_half(vc[t][i]);
            }
        }
        for (int t = 0; t < n; t++) {
            double att[NH * HD];
            for (int hh = 0; hh < NH; hh++) {
                int g = hh / (NH / NKV);
                double sc[512], mx = -1e300, sum = 0;
                for (int s = 0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < HD; i++) d += qs[t][hh * HD + i] * kc[s][g * HD + i];
                    sc[s] = d / sqrt((double)HD);
                    if (sc[s] > mx) mx = sc[s];
                }
                for (int s = 0; s <= t; s++) sum += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < HD; i++) {
                    double a = 0;
                    for (int s = 0; s <= t; s++) a += sc[s] / sum * vc[s][g * HD + i];
                    att[hh * HD + i] = a;
                }
            }
            double o[E];
            matvec(&L->wo[0][0], E, NH * HD, att, o);
            for (int i = 0; i < E; i++) x[t][i] += o[i];

            double h[E], p[NX], mx = -1e300, sum = 0;
            rmsnorm(x[t], L->ffn_norm, h, E);
            matvec(&L->router[0][0], NX, E, h, p);
            for (int e = 0; e < NX; e++) if (p[e] > mx) mx = p[e];
            for (int e = 0; e < NX; e++) sum += (p[e] = exp(p[e] - mx));
            for (int e = 0; e < NX; e++) p[e] /= sum;
            int sel[K];
            double wsum = 0;
            for (int j = 0; j < K; j++) {
                int best = -1;
                for (int e = 0; e < NX; e++) {
                    bool used = false;
                    for (int u = 0; u < j; u++) used |= sel[u] == e;
                    if (!used && (best < 0 || p[e] > p[best])) best = e;
                }
                sel[j] = best;
                wsum += p[best];
            }
            if (t < REF_MAX_TOK) {
                double next = -1;
                for (int e = 0; e < NX; e++) {
                    bool used = false;
                    for (int u = 0; u < K; u++) used |= sel[u] == e;
                    if (!used && p[e] > next) next = p[e];
                }
                ref_gap[l][t] = p[sel[K - 1]] - next;
                for (int j = 0; j < K; j++) ref_sel[l][t][j] = sel[j];
                for (int a = 0; a < K; a++) /* ascending, to compare as sets */
                    for (int b = a + 1; b < K; b++)
                        if (ref_sel[l][t][b] < ref_sel[l][t][a]) {
                            int sw = ref_sel[l][t][a];
                            ref_sel[l][t][a] = ref_sel[l][t][b];
                            ref_sel[l][t][b] = sw;
                        }
            }
            for (int j = 0; j < K; j++) {
                int e = sel[j];
                double gt[FF], up[FF], act[FF], y[E];
                matvec(&L->gate[e][0][0], FF, E, h, gt);
                matvec(&L->up[e][0][0], FF, E, h, up);
                for (int i = 0; i < FF; i++) act[i] = gt[i] / (1 + exp(-gt[i])) * up[i];
                matvec(&L->down[e][0][0], E, FF, act, y);
                for (int i = 0; i < E; i++) x[t][i] += p[e] / wsum * y[i];
            }
        }
    }
    for (int t = 0; t < n; t++) {
        double h[E];
        rmsnorm(x[t], w->out_norm, h, E);
        matvec(tied ? &w->embd[0][0] : &w->out[0][0], NV, E, h, logits + (size_t)t * NV);
    }
    free(x);
    free(kc);
    free(vc);
    free(qs);
}

/* ---- allocation counting: the decode loop must not allocate ---- */

/* glibc's own entry points; the definitions below interpose the public names for this binary.
 * Under AddressSanitizer (which owns malloc) the counter is off. */
#if defined(__SANITIZE_ADDRESS__)
static long n_allocs = 1;
#else
void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t sz);
void *__libc_realloc(void *p, size_t n);
void *__libc_memalign(size_t align, size_t n);
void *malloc(size_t n);
void *calloc(size_t n, size_t sz);
void *realloc(void *p, size_t n);
int posix_memalign(void **out, size_t align, size_t n);
void *aligned_alloc(size_t align, size_t n);

static _Atomic long n_allocs;
void *malloc(size_t n) { n_allocs++; return __libc_malloc(n); }
void *calloc(size_t n, size_t sz) { n_allocs++; return __libc_calloc(n, sz); }
void *realloc(void *p, size_t n) { n_allocs++; return __libc_realloc(p, n); }
int posix_memalign(void **out, size_t align, size_t n) {
    n_allocs++;
    void *p = __libc_memalign(align, n);
    if (!p) return 12; /* ENOMEM */
    *out = p;
    return 0;
}
void *aligned_alloc(size_t align, size_t n) { n_allocs++; return __libc_memalign(align, n); }
#endif

/* ---- helpers ---- */

static double max_abs_diff_f(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN sticks */
    }
    return m;
}

static hm_kv_type kv_type = HM_KV_F16;

static hm_session *open_session(hm_model *m, int threads, int ubatch, int ctx) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.kv_type = kv_type;
    so.n_threads = threads;
    so.n_ubatch = ubatch;
    so.n_ctx = ctx;
    hm_session *s = NULL;
    hm_err err;
    if (hm_session_open(&s, m, &so, &err) != HM_OK) fprintf(stderr, "session: %s\n", err.msg);
    return s;
}

#define NTOK 24

static float *eval_all(hm_model *m, const int32_t *tok, int n, int threads, int ubatch) {
    hm_session *s = open_session(m, threads, ubatch, 64);
    if (!s) return NULL;
    const float *lg = NULL;
    hm_err err;
    float *out = NULL;
    if (hm_session_eval(s, tok, n, true, &lg, &err) == HM_OK) {
        out = malloc((size_t)n * NV * sizeof(float));
        memcpy(out, lg, (size_t)n * NV * sizeof(float));
    } else {
        fprintf(stderr, "eval: %s\n", err.msg);
    }
    hm_session_close(s);
    return out;
}

static void check_bad(const char *path, const model_w *w, variant v, hm_status want, const char *const *needles) {
    CHECK(write_model(path, w, v) == 0);
    hm_model *m = NULL;
    hm_err err = {{0}};
    hm_status st = hm_model_open(&m, path, NULL, &err);
    CHECKF(st == want, "variant %d: status %s, want %s (%s)", (int)v, hm_status_name(st), hm_status_name(want), err.msg);
    CHECK(m == NULL);
    for (int i = 0; needles[i]; i++) CHECKF(strstr(err.msg, needles[i]) != NULL, "'%s' not in \"%s\"", needles[i], err.msg);
    fprintf(stderr, "  bad file %d -> %s\n", (int)v, err.msg);
    hm_model_close(m);
}

/* ---- 7. expert usage: the store against the reference router ---- */

/* Open the model at path with placement opts (NULL = defaults); the status, message in err. */
static hm_status open_placed(const char *path, const hm_placement_opts *po, hm_model **m, hm_err *err) {
    hm_model_opts mo;
    hm_model_opts_default(&mo);
    mo.placement = po;
    return hm_model_open(m, path, &mo, err);
}

static void check_usage(const char *path, const model_w *w, const int32_t *tok) {
    enum { UB = 5, NP = 10, ND = 3 };
    static double lg[NTOK * NV];
    reference(w, false, tok, NTOK, lg); /* fills ref_sel / ref_gap for these tokens */
    char trace[300], prof[300], prof1[300];
    snprintf(trace, sizeof trace, "%s.trace", path);
    snprintf(prof, sizeof prof, "%s.profile.json", path);
    snprintf(prof1, sizeof prof1, "%s.seed1.json", path);
    CHECK(write_model(path, w, V_OK) == 0);
    hm_model *m = NULL;
    hm_err err;
    CHECKF(hm_model_open(&m, path, NULL, &err) == HM_OK, "%s", err.msg);
    if (!m) return;
    CHECK(hm_model_has_experts(m) && strcmp(hm_model_policy(m), "none") == 0);
    CHECKF(hm_model_trace_out(m, trace, &err) == HM_OK, "%s", err.msg);
    hm_session *s = open_session(m, 2, UB, 64);
    CHECK(s != NULL);
    if (!s) {
        hm_model_close(m);
        return;
    }
    /* phase A: NTOK tokens, all logits (every row reaches the last layer), ubatches of UB.
     * phase B: a prompt of NP without logits (the last layer computes only its last row), then
     * ND decode steps continuing the same sequence. */
    const float *l = NULL;
    CHECKF(hm_session_eval(s, tok, NTOK, true, &l, &err) == HM_OK, "%s", err.msg);
    hm_session_reset(s);
    CHECKF(hm_session_eval(s, tok, NP, false, &l, &err) == HM_OK, "%s", err.msg);
    for (int i = 0; i < ND; i++) CHECKF(hm_session_eval(s, &tok[NP + i], 1, false, &l, &err) == HM_OK, "%s", err.msg);
    hm_session_close(s);

    hm_usage u;
    CHECKF(hm_model_usage(m, &u, &err) == HM_OK, "%s", err.msg);
    const int steps_a = (NTOK + UB - 1) / UB, steps_b = (NP + UB - 1) / UB + ND;
    CHECK(u.n_layer == NL && u.n_expert == NX && u.n_expert_used == K);
    CHECKF(u.prompt_tokens == NTOK + NP && u.decode_tokens == ND && u.tokens == NTOK + NP + ND, "%llu %llu",
           (unsigned long long)u.prompt_tokens, (unsigned long long)u.decode_tokens);
    CHECKF(u.steps == (uint64_t)(steps_a + steps_b), "steps %llu", (unsigned long long)u.steps);
    CHECK(u.units[HM_HOME_RAM] == NL * NX && u.units[HM_HOME_VRAM] == 0 && u.hits == 0 && u.vram_slots == 0);
    /* per layer: every token's k picks, except the last layer in phase B (its computed rows only) */
    for (int il = 0; il < NL; il++) {
        uint64_t sum = 0;
        for (int e = 0; e < NX; e++) sum += u.counts[il * NX + e];
        uint64_t want = (uint64_t)K * (NTOK + (il == NL - 1 ? 1 + ND : NP + ND));
        CHECKF(sum == want, "layer %d: %llu selections, want %llu", il, (unsigned long long)sum,
               (unsigned long long)want);
        CHECK(u.layer_misses[il] == sum && u.layer_hits[il] == 0);
    }
    /* the reference's tally over the same schedule */
    uint64_t refc[NL][NX];
    memset(refc, 0, sizeof refc);
    for (int il = 0; il < NL; il++) {
        for (int t = 0; t < NTOK; t++)
            for (int j = 0; j < K; j++) refc[il][ref_sel[il][t][j]]++;
        for (int t = il == NL - 1 ? NP - 1 : 0; t < NP + ND; t++)
            for (int j = 0; j < K; j++) refc[il][ref_sel[il][t][j]]++;
    }
    CHECKF(hm_model_profile_save(m, prof, HM_PROFILE_FMT_HOTMOE, &err) == HM_OK, "%s", err.msg);
    CHECKF(hm_model_profile_save(m, prof1, HM_PROFILE_FMT_SEED1, &err) == HM_OK, "%s", err.msg);

    /* placement options: refused and accepted */
    {
        hm_placement_opts po;
        hm_placement_opts_default(&po);
        po.vram_budget = 1 << 20;
        hm_model *x = NULL;
        /* a VRAM budget needs a CUDA build and a device: without them a clear refusal */
        hm_status vst = open_placed(path, &po, &x, &err);
        if (vst == HM_OK) {
            hm_model_close(x);
            x = NULL;
        } else {
            CHECK(x == NULL);
#ifdef HM_HAVE_CUDA
            CHECKF(vst == HM_ERR_CUDA && strstr(err.msg, "no CUDA device") != NULL, "%s", err.msg);
#else
            CHECKF(vst == HM_ERR_UNSUPPORTED && strstr(err.msg, "built without CUDA") != NULL, "%s", err.msg);
#endif
        }
        hm_placement_opts_default(&po);
        po.policy = "static";
        CHECK(open_placed(path, &po, &x, &err) == HM_ERR_ARG && strstr(err.msg, "profile") != NULL);
        po.policy = "fastest";
        CHECK(open_placed(path, &po, &x, &err) == HM_ERR_ARG && strstr(err.msg, "fastest") != NULL);
        hm_placement_opts_default(&po);
        po.profile = prof; /* policy NULL + a profile = static */
        CHECKF(open_placed(path, &po, &x, &err) == HM_OK, "%s", err.msg);
        if (x) {
            CHECK(strcmp(hm_model_policy(x), "static") == 0);
            CHECKF(hm_model_set_policy(x, "lru", &err) == HM_OK, "%s", err.msg);
            CHECK(strcmp(hm_model_policy(x), "lru") == 0);
            CHECK(hm_model_set_policy(x, "random", &err) == HM_ERR_ARG);
            CHECK(strcmp(hm_model_policy(x), "lru") == 0); /* a refused switch changes nothing */
            CHECKF(hm_model_set_policy(x, "static", &err) == HM_OK, "%s", err.msg); /* the store's switch */
            CHECK(strcmp(hm_model_policy(x), "static") == 0);
        }
        hm_model_close(x);
        x = NULL;
        po.profile = "tests/fixtures/does-not-exist.json";
        CHECK(open_placed(path, &po, &x, &err) != HM_OK && strstr(err.msg, "does-not-exist") != NULL);
    }
    CHECKF(hm_model_trace_close(m, &err) == HM_OK, "%s", err.msg); /* flushed, no write failed */
    CHECK(hm_model_trace_close(m, &err) == HM_OK);                  /* nothing left to close */
    hm_model_close(m);

    /* the trace: every (token, layer) set against the reference, and a recount */
    hm_trace_reader *r = NULL;
    CHECKF(hm_trace_reader_open(&r, trace, &err) == HM_OK, "%s", err.msg);
    uint64_t cnt[NL][NX];
    memset(cnt, 0, sizeof cnt);
    int n_match = 0, n_tie = 0, n_bad = 0, step = 0, n_steps = 0;
    uint64_t t_prompt = 0, t_decode = 0;
    for (hm_trace_event ev; r;) {
        if (hm_trace_next(r, &ev, &err) != HM_OK) {
            CHECKF(0, "trace: %s", err.msg);
            break;
        }
        if (ev.kind == HM_TRACE_END) break;
        /* the step's tokens: phase A steps 0..steps_a-1 start at 0, UB, ...; phase B restarts at 0 */
        int in_b = step >= steps_a, first = in_b ? (step - steps_a < (NP + UB - 1) / UB ? (step - steps_a) * UB
                                                                                       : NP + (step - steps_a - (NP + UB - 1) / UB))
                                                 : step * UB;
        if (ev.kind == HM_TRACE_STEP) {
            if (ev.prompt) t_prompt += (uint64_t)ev.n;
            else t_decode += (uint64_t)ev.n;
            step++, n_steps++;
            continue;
        }
        int rows = ev.n / K;
        int n_tok = in_b ? (first < NP ? (NP - first < UB ? NP - first : UB) : 1) : (NTOK - first < UB ? NTOK - first : UB);
        CHECKF(ev.n % K == 0 && rows <= n_tok, "layer %d: %d ids for a step of %d tokens", ev.layer, ev.n, n_tok);
        for (int i = 0; i < rows && ev.n % K == 0; i++) {
            int t = first + (n_tok - rows) + i; /* a short last layer computes the last rows */
            int got[K];
            for (int j = 0; j < K; j++) {
                got[j] = ev.ids[i * K + j];
                cnt[ev.layer][got[j]]++;
            }
            for (int a = 0; a < K; a++)
                for (int b = a + 1; b < K; b++)
                    if (got[b] < got[a]) {
                        int sw = got[a];
                        got[a] = got[b];
                        got[b] = sw;
                    }
            bool same = memcmp(got, ref_sel[ev.layer][t], sizeof got) == 0;
            if (same) n_match++;
            else if (ref_gap[ev.layer][t] < 1e-6) n_tie++;
            else {
                n_bad++;
                fprintf(stderr, "  layer %d token %d: engine {%d, %d}, reference {%d, %d} (gap %.3g)\n", ev.layer, t,
                        got[0], got[1], ref_sel[ev.layer][t][0], ref_sel[ev.layer][t][1], ref_gap[ev.layer][t]);
            }
        }
    }
    hm_trace_reader_close(r);
    fprintf(stderr, "expert routing vs reference: %d (token, layer) sets equal, %d near-ties, %d differ\n", n_match,
            n_tie, n_bad);
    CHECK(n_bad == 0 && n_match > 0);
    CHECK(n_steps == steps_a + steps_b && t_prompt == NTOK + NP && t_decode == ND);
    bool eq_trace = true, eq_ref = true;
    for (int il = 0; il < NL; il++)
        for (int e = 0; e < NX; e++) {
            eq_trace &= cnt[il][e] == u.counts[il * NX + e];
            eq_ref &= refc[il][e] == u.counts[il * NX + e];
        }
    CHECK(eq_trace);
    CHECK(eq_ref || n_tie > 0);

    /* the profiles read back: ours and the seed-1 schema */
    hm_profile p;
    CHECKF(hm_profile_read(&p, prof, &err) == HM_OK, "%s", err.msg);
    if (p.counts) {
        CHECK(strcmp(p.schema, HM_PROFILE_SCHEMA) == 0 && p.n_layer == NL && p.n_expert == NX && p.k == K);
        CHECK(p.tokens == u.tokens && p.prompt_tokens == u.prompt_tokens && p.decode_tokens == u.decode_tokens);
        CHECK(memcmp(p.counts, u.counts, sizeof(uint64_t) * NL * NX) == 0);
    }
    hm_profile_free(&p);
    CHECKF(hm_profile_read(&p, prof1, &err) == HM_OK, "%s", err.msg);
    if (p.counts) {
        CHECKF(strcmp(p.schema, "llama.cpp.moe_layer_perf.v1") == 0, "schema %s", p.schema);
        CHECK(p.n_layer == NL && p.n_expert == NX && p.k == K);
        CHECK(memcmp(p.counts, u.counts, sizeof(uint64_t) * NL * NX) == 0);
    }
    hm_profile_free(&p);
    hm_usage_free(&u);
    hm_usage_free(&u); /* idempotent */
    unlink(trace);
    unlink(prof);
    unlink(prof1);
}

int main(void) {
    static model_w w;
    init_weights(&w, 42);
    char path[256];
    snprintf(path, sizeof path, "/tmp/hm_test_qwen3moe_tiny_%d.gguf", (int)getpid());

    int32_t tok[NTOK];
    rng_state = 7;
    for (int i = 0; i < NTOK; i++) tok[i] = (int32_t)((urand() + 1) * 0.5 * NV) % NV;

    static double ref[NTOK * NV];
    static float reff[NTOK * NV];
    reference(&w, false, tok, NTOK, ref);
    double ref_max = 0;
    for (int i = 0; i < NTOK * NV; i++) {
        reff[i] = (float)ref[i];
        if (fabs(ref[i]) > ref_max) ref_max = fabs(ref[i]);
    }
    fprintf(stderr, "reference logits: max |l| = %.3f\n", ref_max);

    CHECK(write_model(path, &w, V_OK) == 0);
    hm_model *m = NULL;
    hm_err err;
    CHECKF(hm_model_open(&m, path, NULL, &err) == HM_OK, "%s", err.msg);
    if (!m) return test_done();
    const hm_model_info *inf = hm_model_get_info(m);
    CHECK(strcmp(inf->arch, "qwen3moe") == 0 && strcmp(hm_model_arch(m), "qwen3moe") == 0);
    CHECK(inf->n_vocab == NV && hm_model_n_vocab(m) == NV && hm_model_n_ctx_train(m) == CTX_TRAIN);
    CHECK(inf->head_dim == HD && inf->n_head == NH && inf->n_head_kv == NKV && inf->n_layer == NL);
    CHECK(inf->n_expert == NX && inf->n_expert_used == K && inf->n_ff_exp == FF && inf->n_embd == E);

    /* 1. engine vs reference */
    float *l1 = eval_all(m, tok, NTOK, 1, 512);
    CHECK(l1 != NULL);
    if (l1) {
        double d = max_abs_diff_f(l1, reff, NTOK * NV);
        fprintf(stderr, "engine vs reference: max |dlogit| = %.3g\n", d);
        CHECKF(d < 1e-4 * (ref_max > 1 ? ref_max : 1), "max |d| %g", d);
    }

    /* 1b. f32 KV cache vs the reference without half rounding */
    {
        static double ref32[NTOK * NV];
        static float ref32f[NTOK * NV];
        ref_half = false;
        reference(&w, false, tok, NTOK, ref32);
        ref_half = true;
        for (int i = 0; i < NTOK * NV; i++) ref32f[i] = (float)ref32[i];
        kv_type = HM_KV_F32;
        for (int th = 1; th <= 3; th += 2) {
            float *l32 = eval_all(m, tok, NTOK, th, 7);
            CHECK(l32 != NULL);
            if (l32) {
                double d = max_abs_diff_f(l32, ref32f, NTOK * NV);
                fprintf(stderr, "f32 KV (-t %d, ubatch 7) vs reference: max |dlogit| = %.3g\n", th, d);
                CHECKF(d < 1e-4 * (ref_max > 1 ? ref_max : 1), "f32 KV: max |d| %g", d);
            }
            free(l32);
        }
        kv_type = HM_KV_F16;
    }

    /* 2. thread counts and micro-batch splits */
    for (int th = 2; th <= 3; th++) {
        float *lt = eval_all(m, tok, NTOK, th, 512);
        CHECK(lt != NULL);
        if (lt && l1) {
            double d = max_abs_diff_f(lt, l1, NTOK * NV);
            fprintf(stderr, "-t %d vs -t 1: max |d| = %.3g\n", th, d);
            CHECKF(d < 1e-5, "-t %d: %g", th, d);
        }
        free(lt);
    }
    {
        float *lu = eval_all(m, tok, NTOK, 2, 5);
        CHECK(lu != NULL);
        if (lu && l1) {
            double d = max_abs_diff_f(lu, l1, NTOK * NV);
            fprintf(stderr, "ubatch 5 vs 512: max |d| = %.3g\n", d);
            CHECKF(d < 1e-5, "ubatch: %g", d);
        }
        free(lu);
    }

    /* 3. token-by-token decode == prefill; then trim and re-evaluate the tail */
    {
        hm_session *s = open_session(m, 2, 512, 64);
        CHECK(s != NULL);
        double dmax = 0;
        for (int t = 0; s && t < NTOK; t++) {
            const float *lg = NULL;
            CHECK(hm_session_eval(s, &tok[t], 1, false, &lg, &err) == HM_OK);
            if (lg && l1) {
                double d = max_abs_diff_f(lg, l1 + (size_t)t * NV, NV);
                if (d > dmax) dmax = d;
            }
        }
        fprintf(stderr, "decode vs prefill: max |d| = %.3g\n", dmax);
        if (s) { /* a further decode step and a prompt of several tokens allocate nothing */
            hm_session_trim(s, 4, &err);
            const float *lg = NULL;
            long before = n_allocs;
            CHECK(before > 0); /* the counter sees the library's allocations (interposition works) */
            for (int t = 4; t < 12; t++) CHECK(hm_session_eval(s, &tok[t], 1, false, &lg, &err) == HM_OK);
            CHECK(hm_session_eval(s, tok + 12, 6, false, &lg, &err) == HM_OK);
            fprintf(stderr, "allocations in 8 decode steps + a 6-token batch: %ld\n", n_allocs - before);
            CHECK(n_allocs == before);
            CHECK(hm_session_eval(s, tok + 18, NTOK - 18, false, &lg, &err) == HM_OK); /* back to NTOK */
        }
        CHECKF(dmax < 1e-5, "decode: %g", dmax);
        if (s) {
            CHECK(hm_session_n_past(s) == NTOK);
            CHECK(hm_session_trim(s, 10, &err) == HM_OK && hm_session_n_past(s) == 10);
            const float *lg = NULL;
            CHECK(hm_session_eval(s, tok + 10, NTOK - 10, true, &lg, &err) == HM_OK);
            if (lg && l1) CHECK(max_abs_diff_f(lg, l1 + 10 * NV, (NTOK - 10) * NV) < 1e-5);
            /* last-only logits equal the last row */
            hm_session_reset(s);
            CHECK(hm_session_n_past(s) == 0);
            CHECK(hm_session_eval(s, tok, NTOK, false, &lg, &err) == HM_OK);
            if (lg && l1) CHECK(max_abs_diff_f(lg, l1 + (NTOK - 1) * NV, NV) < 1e-5);
            CHECK(hm_session_trim(s, NTOK + 1, &err) == HM_ERR_ARG);
        }
        hm_session_close(s);
    }

    /* 3b. last-only logits through micro-batches of 5 (earlier ones want no logits at all) */
    {
        hm_session *s = open_session(m, 2, 5, 64);
        const float *lg = NULL;
        CHECK(s && hm_session_eval(s, tok, NTOK, false, &lg, &err) == HM_OK);
        if (lg && l1) CHECK(max_abs_diff_f(lg, l1 + (NTOK - 1) * NV, NV) < 1e-5);
        /* a rows-wanted batch after that continues the same cache */
        hm_session_close(s);
    }

    /* 4. bad requests: context overflow, token out of range */
    {
        hm_session *s = open_session(m, 1, 512, 16);
        const float *lg = NULL;
        CHECK(s && hm_session_n_ctx(s) == 16);
        if (s) {
            CHECK(hm_session_eval(s, tok, 17, false, &lg, &err) == HM_ERR_ARG);
            CHECK(hm_session_n_past(s) == 0);
            CHECK(hm_session_eval(s, tok, 16, false, &lg, &err) == HM_OK);
            CHECK(hm_session_eval(s, tok, 1, false, &lg, &err) == HM_ERR_ARG);
            hm_session_reset(s);
            int32_t badtok = NV;
            CHECK(hm_session_eval(s, &badtok, 1, false, &lg, &err) == HM_ERR_ARG);
            CHECK(strstr(err.msg, "vocabulary") != NULL);
        }
        hm_session_close(s);
    }
    free(l1);
    hm_model_close(m);

    /* 5. tied output embeddings */
    {
        static double reft[NTOK * NV];
        static float refft[NTOK * NV];
        reference(&w, true, tok, NTOK, reft);
        for (int i = 0; i < NTOK * NV; i++) refft[i] = (float)reft[i];
        CHECK(write_model(path, &w, V_TIED) == 0);
        m = NULL;
        CHECKF(hm_model_open(&m, path, NULL, &err) == HM_OK, "%s", err.msg);
        float *lt = m ? eval_all(m, tok, NTOK, 2, 512) : NULL;
        CHECK(lt != NULL);
        if (lt) {
            double d = max_abs_diff_f(lt, refft, NTOK * NV);
            fprintf(stderr, "tied: engine vs reference: max |d| = %.3g\n", d);
            CHECKF(d < 1e-4 * (ref_max > 1 ? ref_max : 1), "tied: %g", d);
        }
        free(lt);
        hm_model_close(m);
    }

    /* 7. expert usage counts, trace and profiles */
    check_usage(path, &w, tok);

    /* 6. bad files: the message names what is wrong */
    {
        const char *arch[] = {"falcon", "qwen3moe", NULL};
        check_bad(path, &w, V_WRONG_ARCH, HM_ERR_UNSUPPORTED, arch);
        const char *miss[] = {"blk.1.attn_k_norm.weight", "missing", NULL};
        check_bad(path, &w, V_MISSING, HM_ERR_FORMAT, miss);
        const char *shape[] = {"blk.0.ffn_down_exps.weight", "[16, 32, 6]", "[32, 16, 6]", NULL};
        check_bad(path, &w, V_BAD_SHAPE, HM_ERR_FORMAT, shape);
        const char *type[] = {"blk.0.ffn_norm.weight", "f16", NULL};
        check_bad(path, &w, V_BAD_TYPE, HM_ERR_UNSUPPORTED, type);
        const char *qtype[] = {"blk.1.attn_q.weight", "i8", NULL};
        check_bad(path, &w, V_BAD_QTYPE, HM_ERR_UNSUPPORTED, qtype);
        hm_model *none = NULL;
        CHECK(hm_model_open(&none, "/nonexistent/x.gguf", NULL, &err) != HM_OK && none == NULL);
        hm_model_close(NULL);
        hm_session_close(NULL);
    }
    unlink(path);
    return test_done();
}
