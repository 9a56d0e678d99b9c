/* bench_flash.c - GPU time of the attention op at long context, the way a prefill calls it: causal
 * GQA attention of micro-batches of UB queries over an f16 KV cache that already holds every earlier
 * position (hm_cuda_attention, which runs the flash kernel of cuda_flash.cu for batches of at least
 * HM_CUDA_FLASH_MIN_TOK queries), at the qwen36-geom shape (32 q / 4 kv heads of 128) unless told
 * otherwise.
 *
 *   bench_flash [-hd D] [-heads H] [-kv K] [-ub UB] [-r REPS] [-exact] [-variant V] [-decode] [LENGTH ...]
 *
 * For each LENGTH (default 4096 16384 65536): the whole prefill of LENGTH tokens as the engine runs
 * it, LENGTH / UB calls of UB queries at positions 0, UB, 2 UB, ... (UB default 512; -ub LENGTH is
 * one call), timed with CUDA's queue drained before and after (wall clock, best of REPS, default 3);
 * then one batch of 512 queries at depth LENGTH (llama-bench's pp512 @ dLENGTH) and one decode
 * query at depth LENGTH. Prints milliseconds and the attention's useful rate: 4 * head_dim * heads
 * * (keys each query sees) FLOPs (Q.K^T and P.V, multiply and add), over the time. -exact runs the
 * exact f32 kernels (the flash kernel off); -variant V the flash kernel's register variant
 * (hm_cuda_set_flash_variant). -decode times only decode at each depth instead: batches of 1 and 4
 * queries (a verify step) at position LENGTH, 200 calls back to back between two drains of the
 * queue (so a launch's host cost hides behind the previous call, as in a decode step), printing
 * microseconds a call and the cache's read rate (K and V rows of every kv head, LENGTH + 1 of them,
 * over the time). The cache holds random values; no result is checked
 * here (test_cuda_flash_gpu checks the kernel). Without CUDA or a device: "skipped: no GPU", exit 77. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef HM_HAVE_CUDA
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "core/fp16.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CK(call)                                                                    \
    do {                                                                            \
        if ((call) != HM_OK) {                                                      \
            fprintf(stderr, "bench_flash: %s\n", err.msg);                          \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

static hm_err err;

typedef struct shape {
    int hd, heads, kv;
    int64_t cap;
} shape;

/* Time n_call calls of ub queries starting at position p0 (the i-th at p0 + i * ub); returns the
 * seconds of the best of reps runs and the keys the queries saw in total. */
static double run(hm_cuda_ctx *c, const shape *s, const float *dq, int32_t *dpos, int32_t *hpos, const uint16_t *dk,
                  const uint16_t *dv, float *dout, void *scr, size_t scr_n, int64_t p0, int64_t ub, int64_t n_call,
                  int reps, double *keys) {
    double best = 1e30;
    *keys = 0;
    for (int64_t i = 0; i < n_call; i++)
        for (int64_t t = 0; t < ub; t++) *keys += (double)(p0 + i * ub + t + 1);
    for (int r = 0; r < reps; r++) {
        CK(hm_cuda_sync(c, &err));
        double t = 0;
        for (int64_t i = 0; i < n_call; i++) {
            for (int64_t k = 0; k < ub; k++) hpos[k] = (int32_t)(p0 + i * ub + k);
            CK(hm_cuda_upload(c, dpos, hpos, (size_t)ub * 4, &err)); /* synchronous: outside the timing */
            const double t0 = now_s();
            CK(hm_cuda_attention(c, dq, ub, dpos, p0 + (i + 1) * ub, dk, dv, s->cap, s->heads, s->kv, s->hd,
                                 0.08838835f, dout, scr, scr_n, &err));
            CK(hm_cuda_sync(c, &err));
            t += now_s() - t0;
        }
        if (t < best) best = t;
    }
    return best;
}

/* -decode: the microseconds of one call of ub queries at positions p0 .. p0 + ub - 1, as the mean
 * of 200 calls back to back (best of reps). */
static double run_decode(hm_cuda_ctx *c, const shape *s, const float *dq, int32_t *dpos, int32_t *hpos,
                         const uint16_t *dk, const uint16_t *dv, float *dout, void *scr, size_t scr_n, int64_t p0,
                         int64_t ub, int reps) {
    enum { CALLS = 200 };
    for (int64_t k = 0; k < ub; k++) hpos[k] = (int32_t)(p0 + k);
    CK(hm_cuda_upload(c, dpos, hpos, (size_t)ub * 4, &err));
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        CK(hm_cuda_sync(c, &err));
        const double t0 = now_s();
        for (int i = 0; i < CALLS; i++)
            CK(hm_cuda_attention(c, dq, ub, dpos, p0 + ub, dk, dv, s->cap, s->heads, s->kv, s->hd, 0.08838835f, dout,
                                 scr, scr_n, &err));
        CK(hm_cuda_sync(c, &err));
        const double t = (now_s() - t0) / CALLS;
        if (t < best) best = t;
    }
    return best * 1e6;
}

int main(int argc, char **argv) {
    shape s = {.hd = 128, .heads = 32, .kv = 4};
    int64_t ub = 512, lens[16];
    int n_len = 0, reps = 3;
    bool exact = false, decode = false;
    int variant = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-hd") && i + 1 < argc) s.hd = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-heads") && i + 1 < argc) s.heads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-kv") && i + 1 < argc) s.kv = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-ub") && i + 1 < argc) ub = atoll(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-exact")) exact = true;
        else if (!strcmp(argv[i], "-decode")) decode = true;
        else if (!strcmp(argv[i], "-variant") && i + 1 < argc) variant = atoi(argv[++i]);
        else if (argv[i][0] != '-' && n_len < 16) lens[n_len++] = atoll(argv[i]);
        else {
            fprintf(stderr, "usage: bench_flash [-hd D] [-heads H] [-kv K] [-ub UB] [-r REPS] [-exact] [-variant V] "
                            "[-decode] [LENGTH ...]\n");
            return 2;
        }
    }
    if (!n_len) {
        lens[0] = 4096, lens[1] = 16384, lens[2] = 65536;
        n_len = 3;
    }
    if (s.hd <= 0 || s.heads <= 0 || s.kv <= 0 || s.heads % s.kv || ub <= 0 || reps <= 0) {
        fprintf(stderr, "bench_flash: bad shape\n");
        return 2;
    }
    if (hm_cuda_device_count() <= 0) {
        printf("skipped: no GPU\n");
        return 77;
    }
    hm_cuda_ctx *c = NULL;
    CK(hm_cuda_open(&c, 0, &err));
    hm_cuda_set_flash(c, !exact);
    hm_cuda_set_flash_variant(c, variant);
    int64_t max_len = 0;
    for (int i = 0; i < n_len; i++) max_len = lens[i] > max_len ? lens[i] : max_len;
    s.cap = max_len + 512;
    const int64_t qmax = ub > 512 ? ub : 512;
    const size_t nc = (size_t)s.kv * (size_t)s.cap * (size_t)s.hd;
    uint16_t *hk = malloc(nc * 2);
    float *hq = malloc((size_t)qmax * (size_t)s.heads * (size_t)s.hd * 4);
    int32_t *hpos = malloc((size_t)qmax * 4);
    if (!hk || !hq || !hpos) return 1;
    uint32_t r = 12345;
    for (size_t i = 0; i < nc; i++) {
        r = r * 1103515245u + 12345u;
        hk[i] = hm_f32_to_fp16(((float)(r >> 8) / 16777216.0f - 0.5f) * 2.0f);
    }
    for (size_t i = 0; i < (size_t)qmax * (size_t)s.heads * (size_t)s.hd; i++) {
        r = r * 1103515245u + 12345u;
        hq[i] = ((float)(r >> 8) / 16777216.0f - 0.5f) * 2.0f;
    }
    uint16_t *dk = NULL, *dv = NULL;
    float *dq = NULL, *dout = NULL;
    int32_t *dpos = NULL;
    void *scr = NULL;
    const size_t scr_n = hm_cuda_attention_scratch_size(c, qmax, s.cap, s.heads, s.kv, s.hd);
    CK(hm_cuda_alloc(c, nc * 2, (void **)&dk, &err));
    CK(hm_cuda_alloc(c, nc * 2, (void **)&dv, &err));
    CK(hm_cuda_alloc(c, (size_t)qmax * (size_t)s.heads * (size_t)s.hd * 4, (void **)&dq, &err));
    CK(hm_cuda_alloc(c, (size_t)qmax * (size_t)s.heads * (size_t)s.hd * 4, (void **)&dout, &err));
    CK(hm_cuda_alloc(c, (size_t)qmax * 4, (void **)&dpos, &err));
    CK(hm_cuda_alloc(c, scr_n ? scr_n : 16, &scr, &err));
    CK(hm_cuda_upload(c, dk, hk, nc * 2, &err));
    CK(hm_cuda_upload(c, dv, hk, nc * 2, &err));
    CK(hm_cuda_upload(c, dq, hq, (size_t)qmax * (size_t)s.heads * (size_t)s.hd * 4, &err));

    if (decode) {
        printf("decode attention (%s, variant %d): %d q / %d kv heads of %d, f16 cache, mean of 200 calls, best of %d\n",
               exact ? "exact f32 kernels" : "flash", variant, s.heads, s.kv, s.hd, reps);
        printf("| depth | tg1 us | tg1 GB/s | tg4 us | tg4 GB/s |\n| ---: | ---: | ---: | ---: | ---: |\n");
        for (int i = 0; i < n_len; i++) {
            const int64_t L = lens[i];
            const double gb = 4.0 * s.kv * s.hd * (double)(L + 1) / 1e9; /* K and V, f16 */
            const double t1 = run_decode(c, &s, dq, dpos, hpos, dk, dv, dout, scr, scr_n, L, 1, reps);
            const double t4 = run_decode(c, &s, dq, dpos, hpos, dk, dv, dout, scr, scr_n, L, 4, reps);
            printf("| %lld | %.1f | %.0f | %.1f | %.0f |\n", (long long)L, t1, gb / (t1 * 1e-6), t4,
                   gb / (t4 * 1e-6));
        }
    }
    const double per_key = 4.0 * s.hd * s.heads;
    if (!decode) {
        printf("attention (%s, variant %d): %d q / %d kv heads of %d, f16 cache, -ub %lld, best of %d\n",
               exact ? "exact f32 kernels" : "flash", variant, s.heads, s.kv, s.hd, (long long)ub, reps);
        printf("| test | calls | ms | TFLOP/s |\n| --- | ---: | ---: | ---: |\n");
    }
    for (int i = 0; !decode && i < n_len; i++) {
        const int64_t L = lens[i], u = ub < L ? ub : L, n_call = L / u;
        double keys, t = run(c, &s, dq, dpos, hpos, dk, dv, dout, scr, scr_n, 0, u, n_call, reps, &keys);
        printf("| pp%lld | %lld | %.2f | %.1f |\n", (long long)(n_call * u), (long long)n_call, t * 1e3,
               per_key * keys / t / 1e12);
        t = run(c, &s, dq, dpos, hpos, dk, dv, dout, scr, scr_n, L, 512, 1, reps, &keys);
        printf("| pp512 @ d%lld | 1 | %.3f | %.1f |\n", (long long)L, t * 1e3, per_key * keys / t / 1e12);
        t = run(c, &s, dq, dpos, hpos, dk, dv, dout, scr, scr_n, L, 1, 1, reps, &keys);
        printf("| tg1 @ d%lld | 1 | %.3f | %.2f |\n", (long long)L, t * 1e3, per_key * keys / t / 1e12);
    }
    hm_cuda_free(c, dk);
    hm_cuda_free(c, dv);
    hm_cuda_free(c, dq);
    hm_cuda_free(c, dout);
    hm_cuda_free(c, dpos);
    hm_cuda_free(c, scr);
    hm_cuda_close(c);
    free(hk), free(hq), free(hpos);
    return 0;
}
#else
int main(void) {
    printf("skipped: no GPU\n");
    return 77;
}
#endif
