/* bench_deltanet.c - speed of the gated delta rule (one DeltaNet layer's recurrence, the part of
 * the layer that prefill by chunks changes) at Qwen3.6-35B-A3B's shape: 16 key heads, 32 value
 * heads, d_k = d_v = 128.
 *
 *   bench_deltanet [-t THREADS] [-r REPS] [-cpu] [N_TOK ...]     (default: 1 4 8 16 64 512)
 *
 * For each batch length it prints tokens/s of the token-by-token recurrence
 * (hm_cpu_gated_delta_seq, the decode path) beside the chunked form (hm_cpu_gated_delta_chunked),
 * and their max relative difference. The state is carried from run to run as in a prompt; inputs
 * are L2-normalised q/k and model-like decays. Best of REPS runs, wall clock (-cpu: the calling
 * thread's CPU time, which with -t 1 removes other processes' noise on a shared machine). A
 * benchmark, not a test: it asserts nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_deltanet.h"
#include "core/alloc.h"
#include "core/threadpool.h"
#include "core/timer.h"

enum { NK = 16, NV = 32, DK = 128, DV = 128 };

static float frand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((double)(*s >> 11) / 9007199254740992.0 - 0.5);
}

static void l2rows(float *x, int64_t n, float scale) {
    for (int64_t r = 0; r < n * NK; r++) {
        float *v = x + r * DK;
        double ss = 0;
        for (int i = 0; i < DK; i++) ss += (double)v[i] * v[i];
        for (int i = 0; i < DK; i++) v[i] = (float)(v[i] * scale / sqrt(ss + 1e-6));
    }
}

static int use_cpu_clock;
static double now_s(void) {
    if (!use_cpu_clock) return (double)hm_time_us() * 1e-6;
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef void (*delta_fn)(hm_pool *pool, int64_t n, const float *q, const float *k, const float *v, const float *g,
                         const float *beta, float *state, float *out, hm_scratch *scr);

static void run_seq(hm_pool *pool, int64_t n, const float *q, const float *k, const float *v, const float *g,
                    const float *beta, float *state, float *out, hm_scratch *scr) {
    (void)scr;
    hm_cpu_gated_delta_seq(pool, q, k, NK * DK, v, NV * DV, g, beta, n, NK, NV, false, DK, DV, state, out);
}

static void run_chunked(hm_pool *pool, int64_t n, const float *q, const float *k, const float *v, const float *g,
                        const float *beta, float *state, float *out, hm_scratch *scr) {
    hm_cpu_gated_delta_chunked(pool, q, k, NK * DK, v, NV * DV, g, beta, n, NK, NV, false, DK, DV, state, out, scr);
}

/* Best seconds of reps runs of n tokens (state carried); the first run's output left in out. */
static double time_fn(delta_fn f, hm_pool *pool, int64_t n, int reps, const float *q, const float *k, const float *v,
                      const float *g, const float *beta, const float *s0, float *state, float *out, float *junk,
                      hm_scratch *scr) {
    double best = 1e30;
    memcpy(state, s0, (size_t)NV * DK * DV * sizeof(float));
    for (int r = 0; r < reps; r++) {
        const double t0 = now_s();
        f(pool, n, q, k, v, g, beta, state, r == 0 ? out : junk, scr);
        const double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

int main(int argc, char **argv) {
    int n_threads = 1, reps = 5;
    int64_t lens[16];
    int n_lens = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) n_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-cpu")) use_cpu_clock = 1;
        else if (n_lens < 16 && atoi(argv[i]) > 0) lens[n_lens++] = atoi(argv[i]);
        else {
            fprintf(stderr, "usage: bench_deltanet [-t THREADS] [-r REPS] [-cpu] [N_TOK ...]\n");
            return 2;
        }
    }
    if (n_lens == 0) {
        const int64_t def[] = {1, 4, 8, 16, 64, 512};
        for (int i = 0; i < 6; i++) lens[n_lens++] = def[i];
    }
    int64_t nmax = 0;
    for (int i = 0; i < n_lens; i++) nmax = lens[i] > nmax ? lens[i] : nmax;
    hm_pool *pool = NULL;
    hm_err err;
    if (hm_pool_open(&pool, n_threads, &err) != HM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const size_t nqk = (size_t)nmax * NK * DK, nvv = (size_t)nmax * NV * DV, ns = (size_t)NV * DK * DV;
    float *q = hm_malloc_aligned(nqk * sizeof(float)), *k = hm_malloc_aligned(nqk * sizeof(float));
    float *v = hm_malloc_aligned(nvv * sizeof(float)), *g = hm_malloc_aligned((size_t)nmax * NV * sizeof(float));
    float *beta = hm_malloc_aligned((size_t)nmax * NV * sizeof(float)), *s0 = hm_malloc_aligned(ns * sizeof(float));
    float *st = hm_malloc_aligned(ns * sizeof(float)), *o1 = hm_malloc_aligned(nvv * sizeof(float));
    float *o2 = hm_malloc_aligned(nvv * sizeof(float)), *junk = hm_malloc_aligned(nvv * sizeof(float));
    hm_scratch scr = {NULL, hm_cpu_gated_delta_scratch_size(DK, DV, n_threads)};
    scr.data = hm_malloc_aligned(scr.size);
    uint64_t seed = 99;
    for (size_t i = 0; i < nqk; i++) q[i] = frand(&seed), k[i] = frand(&seed);
    for (size_t i = 0; i < nvv; i++) v[i] = frand(&seed);
    for (size_t i = 0; i < ns; i++) s0[i] = 0.1f * frand(&seed);
    for (int64_t i = 0; i < nmax * NV; i++) {
        g[i] = -0.3f * (0.5f + frand(&seed));
        beta[i] = 0.5f + frand(&seed);
    }
    l2rows(q, nmax, 1.0f / sqrtf((float)DK));
    l2rows(k, nmax, 1.0f);

    printf("gated delta rule, %d key / %d value heads, d_k %d, d_v %d, %d thread(s), chunk %d, best of %d (%s)\n", NK,
           NV, DK, DV, n_threads, HM_DELTA_CHUNK, reps, use_cpu_clock ? "thread CPU time" : "wall clock");
    printf("%6s  %14s  %14s  %7s  %9s\n", "n_tok", "token-by-token", "chunked", "speedup", "max rel d");
    for (int i = 0; i < n_lens; i++) {
        const int64_t n = lens[i];
        const double ts = time_fn(run_seq, pool, n, reps, q, k, v, g, beta, s0, st, o1, junk, &scr);
        const double tc = time_fn(run_chunked, pool, n, reps, q, k, v, g, beta, s0, st, o2, junk, &scr);
        double d = 0, m = 0;
        for (size_t j = 0; j < (size_t)n * NV * DV; j++) {
            d = fmax(d, fabs((double)o1[j] - o2[j]));
            m = fmax(m, fabs((double)o1[j]));
        }
        printf("%6lld  %10.0f t/s  %10.0f t/s  %6.2fx  %9.1e\n", (long long)n, (double)n / ts, (double)n / tc, ts / tc,
               d / (m > 0 ? m : 1));
    }
    hm_free_aligned(q), hm_free_aligned(k), hm_free_aligned(v), hm_free_aligned(g), hm_free_aligned(beta);
    hm_free_aligned(s0), hm_free_aligned(st), hm_free_aligned(o1), hm_free_aligned(o2), hm_free_aligned(junk);
    hm_free_aligned(scr.data);
    hm_pool_close(pool);
    return 0;
}
