/* bench_ppmodel.c - what the prompt-processing model costs in quality (issue 25): a held-out text
 * is cut into windows of P prompt tokens and C continuation tokens; in each window the main model
 * evaluates the continuation (teacher-forced, every row's logits) once after its own prefill of the
 * prompt (the reference) and once after the copy's prefill (hm_session_prefill with the copy
 * attached, for each --refresh value). Printed per refresh: the mean KL(reference || hand-over) of
 * the next-token distributions over the continuation, the perplexity of the continuation both ways
 * and its delta, the share of positions whose argmax differs; and, for scale, the copy alone's
 * perplexity on the same continuations. A benchmark program: it prints, it asserts nothing.
 *
 * usage: bench_ppmodel MAIN.gguf COPY.gguf TEXT [-p P] [-c C] [-w WINDOWS] [-t THREADS]
 *                      [--refresh N[,N...]]     (defaults: P 256, C 256, 8 windows, refresh 0,16,64)
 *        bench_ppmodel --requant TYPE IN.gguf OUT.gguf
 *                      the copy to measure: every quantised (not f32) tensor of 2+ dimensions of IN
 *                      dequantised and quantised again to TYPE (ggml's name: q4_0, q2_K, ...; llama.cpp's fallback
 *                      where a row is not whole blocks of it: Q2_K -> Q4_0, ...), 1-D tensors and
 *                      every key as they are. Requantised from IN's values (e.g. Q8_0), not from
 *                      the original float weights: a slightly worse copy than llama-quantize makes
 *                      from f16. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "hotmoe.h"
#include "quant/quant.h"
#include "synth/synth_impl.h"

#define MAX_REFRESH 8

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

/* log-softmax of x[n] into out (double). */
static void log_softmax(const float *x, int32_t n, double *out) {
    double mx = x[0];
    for (int32_t i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double s = 0;
    for (int32_t i = 0; i < n; i++) s += exp((double)x[i] - mx);
    const double ls = mx + log(s);
    for (int32_t i = 0; i < n; i++) out[i] = (double)x[i] - ls;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The C next-token distributions of a window's continuation on s: the prefill's last logits (they
 * predict cont[0]) then cont[0..C-1) with every row's logits. prefill: through hm_session_prefill
 * (the copy when attached) or the plain eval. Writes [C][V] logits to out. 0 ok. */
static int window_logits(hm_session *s, const int32_t *prompt, int32_t P, const int32_t *cont, int32_t C, float *out,
                         int32_t V) {
    hm_err err;
    const float *lg = NULL;
    hm_session_reset(s);
    if (hm_session_prefill(s, prompt, P, &lg, &err) != HM_OK) {
        fprintf(stderr, "bench_ppmodel: prefill: %s\n", err.msg);
        return -1;
    }
    memcpy(out, lg, (size_t)V * sizeof(float));
    if (C > 1 && hm_session_eval(s, cont, C - 1, true, &lg, &err) != HM_OK) {
        fprintf(stderr, "bench_ppmodel: continuation: %s\n", err.msg);
        return -1;
    }
    if (C > 1) memcpy(out + V, lg, (size_t)(C - 1) * (size_t)V * sizeof(float));
    return 0;
}

/* Value i of g (or an array element a, when a != NULL) as a writer value; nested arrays and string
 * arrays need storage: *keep collects it (freed by the caller after the set_value). */
typedef struct keep_list {
    void **p;
    int n, cap;
} keep_list;

static void *keep(keep_list *k, size_t bytes) {
    if (k->n == k->cap) {
        k->cap = k->cap ? 2 * k->cap : 16;
        k->p = realloc(k->p, (size_t)k->cap * sizeof *k->p);
    }
    return k->p[k->n++] = calloc(1, bytes ? bytes : 1);
}

static int arr_value(const hm_gguf_arr *a, hm_gguf_value *v, keep_list *k) {
    v->type = HM_GGUF_ARRAY;
    v->arr.elem_type = a->elem_type;
    v->arr.n = a->n;
    if (hm_gguf_vtype_size(a->elem_type)) {
        v->arr.data = a->data;
        return 0;
    }
    if (a->elem_type == HM_GGUF_STRING) {
        hm_gguf_str *ss = keep(k, (size_t)a->n * sizeof *ss);
        for (uint64_t i = 0; i < a->n; i++)
            if (!hm_gguf_arr_str(a, i, &ss[i])) return -1;
        v->arr.data = ss;
        return 0;
    }
    hm_gguf_value *vs = keep(k, (size_t)a->n * sizeof *vs);
    for (uint64_t i = 0; i < a->n; i++) {
        hm_gguf_arr sub;
        if (!hm_gguf_arr_arr(a, i, &sub) || arr_value(&sub, &vs[i], k)) return -1;
    }
    v->arr.data = vs;
    return 0;
}

static int kv_value(const hm_gguf *g, int64_t i, hm_gguf_value *v, keep_list *k) {
    memset(v, 0, sizeof *v);
    v->type = hm_gguf_kv_type(g, i);
    switch (v->type) {
    case HM_GGUF_STRING: return hm_gguf_kv_str(g, i, &v->str) ? 0 : -1;
    case HM_GGUF_ARRAY: {
        hm_gguf_arr a;
        return hm_gguf_kv_arr(g, i, &a) ? arr_value(&a, v, k) : -1;
    }
    case HM_GGUF_F32:
    case HM_GGUF_F64: return hm_gguf_kv_float(g, i, &v->f) ? 0 : -1;
    case HM_GGUF_I8:
    case HM_GGUF_I16:
    case HM_GGUF_I32:
    case HM_GGUF_I64: return hm_gguf_kv_int(g, i, &v->i) ? 0 : -1;
    default: {
        int64_t x;
        if (!hm_gguf_kv_int(g, i, &x)) return -1;
        v->u = (uint64_t)x;
        return 0;
    }
    }
}

static int requant(const char *type_name, const char *in, const char *out) {
    const int type = hm_type_from_name(type_name);
    const hm_type_traits *tt = type >= 0 ? hm_type_get(type) : NULL;
    if (!tt || !tt->from_float_ref) {
        fprintf(stderr, "bench_ppmodel: --requant: '%s' is not a type we can quantise to\n", type_name);
        return 2;
    }
    hm_err err = {{0}};
    hm_gguf *g = NULL;
    hm_gguf_writer *w = NULL;
    keep_list k = {0};
    int rc = 1;
    if (hm_gguf_open(&g, in, &err) != HM_OK || hm_gguf_writer_open(&w, out, 0, &err) != HM_OK) goto done;
    for (int64_t i = 0; i < hm_gguf_n_kv(g); i++) {
        const char *key = hm_gguf_key(g, i);
        /* the writer records its own alignment; the file type (a llama.cpp mix id) no longer holds */
        if (!strcmp(key, "general.alignment") || !strcmp(key, "general.file_type")) continue;
        hm_gguf_value v;
        if (kv_value(g, i, &v, &k)) {
            fprintf(stderr, "bench_ppmodel: --requant: cannot read key %s\n", key);
            goto done;
        }
        if (hm_gguf_writer_set_value(w, key, &v) != HM_OK) goto done;
    }
    const int64_t nt = hm_gguf_n_tensors(g);
    int *types = calloc((size_t)nt, sizeof *types);
    if (!types) goto done;
    for (int64_t i = 0; i < nt; i++) {
        const hm_gguf_tensor *t = hm_gguf_tensor_at(g, i);
        /* the quantised matrices only: f32 ones (routers, as llama-quantize leaves ffn_gate_inp) stay */
        types[i] = t->n_dims >= 2 && t->type != HM_TYPE_F32 && hm_type_get(t->type) && hm_type_get(t->type)->to_float_ref
                       ? hm_synth_type_fallback(type, t->ne[0]) : t->type;
        if (types[i] != t->type && t->ne[0] % hm_type_get(types[i])->blck_size) types[i] = t->type;
        if (hm_gguf_writer_add_tensor(w, t->name, types[i], t->n_dims, t->ne) != HM_OK) {
            free(types);
            goto done;
        }
    }
    if (hm_gguf_writer_begin_data(w) != HM_OK) {
        free(types);
        goto done;
    }
    for (int64_t i = 0; i < nt; i++) {
        const hm_gguf_tensor *t = hm_gguf_tensor_at(g, i);
        if (types[i] == t->type) {
            if (hm_gguf_writer_write(w, t->data, t->nbytes) != HM_OK) break;
            continue;
        }
        const int64_t ne0 = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
        const hm_type_traits *st = hm_type_get(t->type), *dt = hm_type_get(types[i]);
        const size_t in_row = (size_t)(ne0 / st->blck_size) * st->type_size;
        const size_t out_row = (size_t)(ne0 / dt->blck_size) * dt->type_size;
        float *f = malloc((size_t)ne0 * sizeof *f);
        void *q = malloc(out_row);
        hm_status ws = HM_OK;
        for (int64_t r = 0; f && q && ws == HM_OK && r < rows; r++) {
            st->to_float_ref((const char *)t->data + (size_t)r * in_row, f, ne0);
            dt->from_float_ref(f, q, ne0);
            ws = hm_gguf_writer_write(w, q, out_row);
        }
        free(f);
        free(q);
        if (ws != HM_OK) break;
    }
    free(types);
    if (hm_gguf_writer_finish(w) != HM_OK) {
        w = NULL;
        goto done;
    }
    w = NULL;
    fprintf(stderr, "bench_ppmodel: wrote %s (%s from %s)\n", out, type_name, in);
    rc = 0;
done:
    if (rc) fprintf(stderr, "bench_ppmodel: --requant: %s\n", err.msg);
    if (w) hm_gguf_writer_abort(w);
    for (int i = 0; i < k.n; i++) free(k.p[i]);
    free(k.p);
    hm_gguf_close(g);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--requant")) return requant(argv[2], argv[3], argv[4]);
    if (argc < 4) {
        fprintf(stderr, "usage: bench_ppmodel MAIN.gguf COPY.gguf TEXT [-p P] [-c C] [-w WINDOWS] [-t THREADS] "
                        "[--refresh N,N,...]\n");
        return 2;
    }
    int32_t P = 256, C = 256, W = 8, T = 0, refresh[MAX_REFRESH] = {0, 16, 64}, n_refresh = 3;
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-p")) P = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-c")) C = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-w")) W = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-t")) T = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--refresh")) {
            n_refresh = 0;
            for (char *q = argv[i + 1]; *q && n_refresh < MAX_REFRESH;) {
                refresh[n_refresh++] = (int32_t)strtol(q, &q, 10);
                if (*q == ',') q++;
                else break;
            }
        } else {
            fprintf(stderr, "bench_ppmodel: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (P < 1 || C < 1 || W < 1) {
        fprintf(stderr, "bench_ppmodel: -p, -c and -w must be >= 1\n");
        return 2;
    }
    hm_err err;
    hm_model *m = NULL, *pp = NULL;
    hm_tokenizer *tk = NULL;
    hm_session *ref = NULL, *hyb = NULL, *alone = NULL;
    char *text = read_text(argv[3]);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *lr = NULL, *lh = NULL;
    double *a = NULL, *b = NULL;
    int rc = 1;
    if (!text) {
        fprintf(stderr, "bench_ppmodel: cannot read %s\n", argv[3]);
        return 1;
    }
    if (hm_model_open(&m, argv[1], NULL, &err) != HM_OK || hm_model_open(&pp, argv[2], NULL, &err) != HM_OK ||
        hm_tokenizer_open(&tk, argv[1], &err) != HM_OK ||
        hm_tokenize(tk, text, strlen(text), NULL, &ids, &n_ids, &err) != HM_OK) {
        fprintf(stderr, "bench_ppmodel: %s\n", err.msg);
        goto done;
    }
    const int32_t V = hm_model_n_vocab(m);
    if ((size_t)W * (size_t)(P + C) > n_ids) W = (int32_t)(n_ids / (size_t)(P + C));
    if (W < 1) {
        fprintf(stderr, "bench_ppmodel: the text has %zu tokens, fewer than one window of %d\n", n_ids, P + C);
        goto done;
    }
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = P + C;
    so.n_threads = T;
    if (hm_session_open(&ref, m, &so, &err) != HM_OK || hm_session_open(&hyb, m, &so, &err) != HM_OK ||
        hm_session_open(&alone, pp, &so, &err) != HM_OK) {
        fprintf(stderr, "bench_ppmodel: %s\n", err.msg);
        goto done;
    }
    const size_t nl = (size_t)C * (size_t)V;
    lr = malloc(nl * sizeof *lr), lh = malloc(nl * sizeof *lh);
    a = malloc((size_t)V * sizeof *a), b = malloc((size_t)V * sizeof *b);
    if (!lr || !lh || !a || !b) goto done;
    double nll_ref = 0, nll_alone = 0, kl[MAX_REFRESH] = {0}, nll_h[MAX_REFRESH] = {0};
    uint64_t flips[MAX_REFRESH] = {0}, n_pos = 0;
    for (int32_t w = 0; w < W; w++) {
        const int32_t *pr = ids + (size_t)w * (size_t)(P + C), *ct = pr + P;
        if (window_logits(ref, pr, P, ct, C, lr, V) || window_logits(alone, pr, P, ct, C, lh, V)) goto done;
        for (int32_t i = 0; i < C; i++) {
            log_softmax(lr + (size_t)i * (size_t)V, V, a);
            nll_ref -= a[ct[i]];
            log_softmax(lh + (size_t)i * (size_t)V, V, b);
            nll_alone -= b[ct[i]];
        }
        for (int r = 0; r < n_refresh; r++) {
            hm_pp_opts po;
            hm_pp_opts_default(&po);
            po.model = pp;
            po.min_tokens = 1;
            po.refresh = refresh[r];
            if (hm_session_set_pp(hyb, &po, &err) != HM_OK) {
                fprintf(stderr, "bench_ppmodel: %s\n", err.msg);
                goto done;
            }
            if (window_logits(hyb, pr, P, ct, C, lh, V)) goto done;
            for (int32_t i = 0; i < C; i++) {
                const float *xr = lr + (size_t)i * (size_t)V, *xh = lh + (size_t)i * (size_t)V;
                log_softmax(xr, V, a);
                log_softmax(xh, V, b);
                double k = 0;
                for (int32_t j = 0; j < V; j++) k += exp(a[j]) * (a[j] - b[j]);
                kl[r] += k;
                nll_h[r] -= b[ct[i]];
                flips[r] += argmax(xr, V) != argmax(xh, V);
            }
        }
        n_pos += (uint64_t)C;
    }
    const double N = (double)n_pos, ppl_ref = exp(nll_ref / N);
    printf("main %s, copy %s: %d windows of %d prompt + %d continuation tokens (%llu positions)\n", argv[1], argv[2],
           W, P, C, (unsigned long long)n_pos);
    printf("main model's own cache: perplexity %.4f; the copy alone: %.4f\n", ppl_ref, exp(nll_alone / N));
    printf("| refresh | mean KL (nats) | perplexity | delta | delta %% | argmax differs |\n");
    printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int r = 0; r < n_refresh; r++) {
        const double ph = exp(nll_h[r] / N);
        printf("| %d | %.6f | %.4f | %+.4f | %+.2f %% | %.2f %% |\n", refresh[r], kl[r] / N, ph, ph - ppl_ref,
               100.0 * (ph - ppl_ref) / ppl_ref, 100.0 * (double)flips[r] / N);
    }
    rc = 0;
done:
    free(a);
    free(b);
    free(lr);
    free(lh);
    free(ids);
    free(text);
    hm_session_close(ref);
    hm_session_close(hyb);
    hm_session_close(alone);
    hm_tokenizer_close(tk);
    hm_model_close(pp);
    hm_model_close(m);
    return rc;
}
