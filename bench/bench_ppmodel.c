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
 *                      [--refresh N[,N...]]     (defaults: P 256, C 256, 8 windows, refresh 0,16,64) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hotmoe.h"

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

int main(int argc, char **argv) {
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
