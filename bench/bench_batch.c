/* bench_batch.c - aggregate decode throughput of N concurrent sessions: one hm_batch_eval per
 * round (batched) vs one hm_session_eval per session per round (the server's old per-session loop).
 *
 *   bench_batch MODEL [-t THREADS] [-n 1,2,4] [-d DECODE_ROUNDS] [-r REPEATS] [-p PROMPT_LEN] [-own-pools 1]
 *
 * -own-pools 1: every session gets a pool of its own (as before sessions shared the model's pool:
 * a 1-thread session is opened first and holds the model's pool), i.e. the server's old set-up.
 *
 * For each N: N sessions, each prefilled with its own PROMPT_LEN-token prompt (different tokens),
 * 2 warm-up rounds (and once, before everything, a 256-token prompt that pages in the experts), then DECODE_ROUNDS timed rounds in which every session decodes its greedy
 * token; tok/s = N * rounds / seconds. The modes alternate within each repeat (batched, loop,
 * batched, ...; sessions reset and re-prefilled each time) and the medians are printed, one line
 * per N: "N  batched_tok_s  loop_tok_s  speedup". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hotmoe.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define MAXN 16

/* One timed run; returns tok/s or -1. */
static double run(hm_session **ss, int n, int32_t n_vocab, int plen, int rounds, int batched) {
    hm_err err;
    int32_t next[MAXN], prompt[256];
    const float *lg[MAXN];
    for (int i = 0; i < n; i++) {
        hm_session_reset(ss[i]);
        for (int j = 0; j < plen; j++) prompt[j] = (int32_t)((1000 + 7919 * (i + 1) * (j + 3)) % n_vocab);
        if (hm_session_eval(ss[i], prompt, plen, false, &lg[i], &err) != HM_OK) {
            fprintf(stderr, "prefill: %s\n", err.msg);
            return -1;
        }
        next[i] = argmax(lg[i], n_vocab);
    }
    const int32_t *tp[MAXN];
    int32_t nn[MAXN];
    for (int i = 0; i < n; i++) {
        tp[i] = &next[i];
        nn[i] = 1;
    }
    double t0 = 0;
    for (int r = 0; r < rounds + 2; r++) {
        if (r == 2) t0 = now_s();
        if (batched) {
            if (hm_batch_eval(ss, tp, nn, n, lg, &err) != HM_OK) {
                fprintf(stderr, "batch eval: %s\n", err.msg);
                return -1;
            }
        } else {
            for (int i = 0; i < n; i++)
                if (hm_session_eval(ss[i], &next[i], 1, false, &lg[i], &err) != HM_OK) {
                    fprintf(stderr, "eval: %s\n", err.msg);
                    return -1;
                }
        }
        for (int i = 0; i < n; i++) next[i] = argmax(lg[i], n_vocab);
    }
    return (double)n * rounds / (now_s() - t0);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [-t THREADS] [-n 1,2,4] [-d ROUNDS] [-r REPEATS] [-p PROMPT_LEN]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    int threads = 2, rounds = 16, repeats = 5, plen = 16, own = 0;
    char ns_arg[64] = "1,2,4";
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-t")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-n")) snprintf(ns_arg, sizeof ns_arg, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "-d")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r")) repeats = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-p")) plen = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-own-pools")) own = atoi(argv[i + 1]);
    }
    if (plen < 1 || plen > 256 || repeats < 1 || repeats > 64 || rounds < 1) return 2;
    hm_err err;
    hm_model *m = NULL;
    if (hm_model_open(&m, path, NULL, &err) != HM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int32_t n_vocab = hm_model_n_vocab(m);
    hm_session *holder = NULL; /* -own-pools: takes the model's pool with 1 thread */
    if (own) {
        hm_session_opts ho;
        hm_session_opts_default(&ho);
        ho.n_ctx = 16;
        ho.n_threads = threads == 1 ? 2 : 1;
        if (hm_session_open(&holder, m, &ho, &err) != HM_OK) return 1;
    }
    { /* warm the mapping: a 256-token random prompt routes to (nearly) every expert unit, so the
       * timed runs do not pay first-touch page faults (which would favour whichever runs later) */
        hm_session *w = NULL;
        hm_session_opts wo;
        hm_session_opts_default(&wo);
        wo.n_ctx = 256;
        wo.n_threads = threads;
        int32_t ids[256];
        for (int j = 0; j < 256; j++) ids[j] = (int32_t)((7 + 104729 * (uint64_t)j) % (uint64_t)n_vocab);
        const float *lg;
        if (hm_session_open(&w, m, &wo, &err) != HM_OK || hm_session_eval(w, ids, 256, false, &lg, &err) != HM_OK) {
            fprintf(stderr, "warm-up: %s\n", err.msg);
            return 1;
        }
        hm_session_close(w);
    }
    printf("# %s, -t %d, %d decode rounds after a %d-token prompt, median of %d, %s\n", path, threads, rounds, plen,
           repeats, own ? "a pool per session" : "the model's shared pool");
    printf("# N  batched_tok_s  loop_tok_s  speedup\n");
    for (char *tok = strtok(ns_arg, ","); tok; tok = strtok(NULL, ",")) {
        int n = atoi(tok);
        if (n < 1 || n > MAXN) continue;
        hm_session *ss[MAXN] = {0};
        hm_session_opts so;
        hm_session_opts_default(&so);
        so.n_ctx = plen + rounds + 8;
        so.n_threads = threads;
        for (int i = 0; i < n; i++)
            if (hm_session_open(&ss[i], m, &so, &err) != HM_OK) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
        double b[64], l[64];
        for (int r = 0; r < repeats; r++) {
            b[r] = run(ss, n, n_vocab, plen, rounds, 1);
            l[r] = run(ss, n, n_vocab, plen, rounds, 0);
            if (b[r] < 0 || l[r] < 0) return 1;
        }
        qsort(b, (size_t)repeats, sizeof b[0], cmp_d);
        qsort(l, (size_t)repeats, sizeof l[0], cmp_d);
        double mb = b[repeats / 2], ml = l[repeats / 2];
        printf("%d  %.2f  %.2f  %.2fx\n", n, mb, ml, mb / ml);
        fflush(stdout);
        for (int i = 0; i < n; i++) hm_session_close(ss[i]);
    }
    hm_session_close(holder);
    hm_model_close(m);
    return 0;
}
