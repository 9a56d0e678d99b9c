/* bench_cpu_ops.c - speed of the CPU backend's matmul, the pool's dispatch latency, and RAM.
 *
 *   bench_cpu_ops [-t THREADS] [-r REPS] [-cpu] [TYPE ...]
 *   bench_cpu_ops -membw [-membw-mib N] [-t THREADS] [-r REPS]
 *
 * For each weight type (default q4_K q6_K q8_0, skipped when not registered) and shape (expert
 * gate/up 2048->768, expert down 768->2048, attention 2048->4096) it prints hm_cpu_matmul at decode
 * (n_tok = 1) and prefill (n_tok = 512), weight GB/s and GFLOP/s, beside a baseline: the plain
 * loop of one traits vec_dot per (row, token) on one thread (what a naive engine does). Best of
 * REPS runs. A benchmark, not a test: it asserts nothing.
 *
 * -membw measures the RAM tier's read bandwidth instead (nothing else runs): a buffer of N MiB
 * (default 2048, far beyond any cache) is written once by the pool's threads (each its own slice,
 * so first touch places the pages near the thread that reads them), then read by all THREADS
 * threads, each summing the 64-bit words of its slice. Best of REPS passes, wall clock (-cpu is
 * ignored: CPU time of one thread is not a bandwidth). Prints one line that scripts parse
 * (bench/gpu_offload.sh feeds it to its decode roofline as RAM_GBS):
 *   ram read bandwidth: X.X GB/s (N threads, M MiB)
 * GB is 1e9 bytes.
 *
 * -moe-cold times only the one-token MoE on units read from RAM (see bench_moe_cold). */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_ops.h"
#include "core/alloc.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "quant/quant.h"

static void noop(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    atomic_fetch_add((_Atomic int *)ctx, 1);
}

/* -cpu: time the calling thread's CPU time instead of the wall clock; with -t 1 that removes the
 * noise of other processes on a shared machine. */
static int use_cpu_clock;
static double now_s(void) {
    if (!use_cpu_clock) return (double)hm_time_us() * 1e-6;
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void bench_dispatch(hm_pool *pool) {
    _Atomic int cnt = 0;
    const int n = 20000;
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_s();
        for (int i = 0; i < n; i++) hm_pool_run(pool, noop, &cnt);
        double dt = (now_s() - t0) / n;
        best = dt < best ? dt : best;
    }
    printf("pool dispatch (%d threads, empty run): %.2f us\n", hm_pool_size(pool), best * 1e6);
}

/* -membw: every thread of the pool reads (or first writes) its 64-byte-aligned slice of buf. */
typedef struct {
    const uint64_t *buf;
    size_t n_lines;     /* 64-byte lines in buf */
    int write;          /* 1: touch (write) the slice instead of reading it */
    uint64_t sum[256];  /* one per thread: keeps the reads live */
} membw_ctx;

static void membw_slice(void *ctx, int ith, int nth) {
    membw_ctx *c = ctx;
    size_t l0 = c->n_lines * (size_t)ith / (size_t)nth, l1 = c->n_lines * (size_t)(ith + 1) / (size_t)nth;
    uint64_t *p = (uint64_t *)c->buf + l0 * 8, *end = (uint64_t *)c->buf + l1 * 8;
    if (c->write) {
        for (uint64_t *q = p; q < end; q++) *q = (uint64_t)(q - p) ^ (uint64_t)ith;
        return;
    }
#ifdef __AVX2__
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    for (; p < end; p += 8) { /* one line a step, two independent adds */
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)p));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + 4)));
    }
    a0 = _mm256_add_epi64(a0, a1);
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, a0);
    c->sum[ith] = lanes[0] + lanes[1] + lanes[2] + lanes[3];
#else
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (; p < end; p += 8) {
        s0 += p[0] + p[4];
        s1 += p[1] + p[5];
        s2 += p[2] + p[6];
        s3 += p[3] + p[7];
    }
    c->sum[ith] = s0 + s1 + s2 + s3;
#endif
}

static volatile uint64_t membw_sink; /* the sums end here, so no pass can be optimised away */

static int bench_membw(hm_pool *pool, size_t mib, int reps) {
    size_t bytes;
    int nth = hm_pool_size(pool);
    if (mib == 0 || !hm_mul_ok(mib, (size_t)1 << 20, &bytes)) {
        fprintf(stderr, "bench_cpu_ops: -membw-mib %zu: not a buffer size\n", mib);
        return 1;
    }
    if (nth > 256) {
        fprintf(stderr, "bench_cpu_ops: -membw takes at most 256 threads, not %d\n", nth);
        return 1;
    }
    uint64_t *buf = hm_malloc_aligned(bytes);
    if (!buf) {
        fprintf(stderr, "bench_cpu_ops: cannot allocate %zu MiB for -membw (try a smaller -membw-mib)\n", mib);
        return 1;
    }
    membw_ctx c = {.buf = buf, .n_lines = bytes / 64, .write = 1};
    hm_pool_run(pool, membw_slice, &c);
    c.write = 0;
    double best = 1e9;
    for (int r = 0; r < (reps < 1 ? 1 : reps); r++) {
        double t0 = (double)hm_time_us() * 1e-6;
        hm_pool_run(pool, membw_slice, &c);
        double dt = (double)hm_time_us() * 1e-6 - t0;
        best = dt < best ? dt : best;
        for (int i = 0; i < nth; i++) membw_sink ^= c.sum[i];
    }
    best = best > 1e-6 ? best : 1e-6;
    printf("ram read bandwidth: %.1f GB/s (%d threads, %zu MiB)\n", (double)bytes / best * 1e-9, nth, mib);
    hm_free_aligned(buf);
    return 0;
}

static float frand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((double)(*s >> 11) / 9007199254740992.0 - 0.5);
}

/* Qwen3-30B-A3B attention: 32 q heads, 4 kv heads, head_dim 128; prefill of 512 tokens, then one
 * decode step at position 4096. */
static void bench_attention(hm_pool *pool) {
    const int nh = 32, nkv = 4, d = 128;
    const int64_t n_ctx = 4608, n_tok = 512;
    uint64_t seed = 777;
    size_t cs = (size_t)nkv * (size_t)n_ctx * d;
    uint16_t *kc = hm_malloc_aligned(cs * 2), *vc = hm_malloc_aligned(cs * 2);
    float *kv = malloc((size_t)n_ctx * nkv * d * sizeof(float));
    for (size_t i = 0; i < (size_t)n_ctx * nkv * d; i++) kv[i] = frand(&seed);
    int32_t *pos = malloc((size_t)n_ctx * sizeof(int32_t));
    for (int64_t i = 0; i < n_ctx; i++) pos[i] = (int32_t)i;
    hm_cpu_kv_write(pool, kc, vc, n_ctx, nkv, d, kv, kv, n_ctx, pos);
    float *q = malloc((size_t)n_tok * nh * d * sizeof(float)), *o = malloc((size_t)n_tok * nh * d * sizeof(float));
    for (int64_t i = 0; i < n_tok * nh * d; i++) q[i] = frand(&seed);
    hm_scratch s = {NULL, hm_cpu_attention_scratch_size(n_tok, n_ctx, nh, d, hm_pool_size(pool))};
    s.data = hm_malloc_aligned(s.size);
    double best = 1e9;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        hm_cpu_attention(pool, q, n_tok, pos, kc, vc, n_ctx, nh, nkv, d, 0.088f, o, &s);
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    double flops = 4.0 * nh * d * (double)n_tok * (double)(n_tok + 1) / 2;
    printf("attention prefill 512 tok (32/4 heads, d 128): %8.1f us  %6.1f GFLOP/s\n", best * 1e6, flops / best * 1e-9);
    best = 1e9;
    for (int r = 0; r < 20; r++) {
        double t0 = now_s();
        hm_cpu_attention(pool, q, 1, pos + 4096, kc, vc, n_ctx, nh, nkv, d, 0.088f, o, &s);
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    printf("attention decode at pos 4096:                   %8.1f us  %6.1f GB/s of KV\n", best * 1e6,
           4097.0 * nkv * d * 2 * 2 / best * 1e-9);
    /* the 512 queries again at positions 4096..4607 (pp512 @ d4096): the per-query kernels against
     * the tiled one (cpu_attn.c), best of 3 each */
    if (hm_cpu_attn_tiled_takes(n_tok, nh, nkv, d)) {
        int32_t *pd = malloc((size_t)n_tok * sizeof(int32_t));
        for (int64_t i = 0; i < n_tok; i++) pd[i] = (int32_t)(4096 + i);
        float *ws = hm_malloc_aligned(hm_cpu_attn_tiled_scratch_floats(nh, nkv, d, hm_pool_size(pool)) * sizeof(float));
        double bq = 1e9, bt = 1e9;
        for (int r = 0; r < 3; r++) {
            double t0 = now_s();
            hm_cpu_attention(pool, q, n_tok, pd, kc, vc, n_ctx, nh, nkv, d, 0.088f, o, &s);
            double t1 = now_s();
            hm_cpu_attention_tiled(pool, q, n_tok, pd, kc, vc, HM_TYPE_F16, n_ctx, 0, nh, nkv, d, 0.088f, o, ws);
            double t2 = now_s();
            bq = t1 - t0 < bq ? t1 - t0 : bq;
            bt = t2 - t1 < bt ? t2 - t1 : bt;
        }
        const double fl = 4.0 * nh * d * (double)n_tok * (4096.0 + (double)(n_tok + 1) / 2);
        printf("attention prefill 512 @ 4096, per-query:         %8.1f us  %6.1f GFLOP/s\n", bq * 1e6, fl / bq * 1e-9);
        printf("attention prefill 512 @ 4096, tiled:             %8.1f us  %6.1f GFLOP/s\n", bt * 1e6, fl / bt * 1e-9);
        hm_free_aligned(ws);
        free(pd);
    }
    hm_free_aligned(s.data);
    hm_free_aligned(kc);
    hm_free_aligned(vc);
    free(kv);
    free(pos);
    free(q);
    free(o);
}

/* One Qwen3-30B-A3B MoE layer (128 experts, top-8, n_embd 2048, n_ff 768) in type `type` for
 * gate/up and `dtype` for down: decode (1 token) and prefill (512 tokens, random routing). */
static void bench_moe(hm_pool *pool, int type, int dtype) {
    const int64_t E = 2048, F = 768;
    const int n_exp = 128, k = 8;
    uint64_t seed = 99;
    const hm_type_traits *tr = hm_type_get(type), *dr = hm_type_get(dtype);
    size_t rs_gu = hm_row_size(type, E), rs_d = hm_row_size(dtype, F);
    char *gu = hm_malloc_aligned(rs_gu * (size_t)F * 2 * n_exp), *dn = hm_malloc_aligned(rs_d * (size_t)E * n_exp);
    float *tmp = malloc((size_t)E * sizeof(float));
    for (int64_t r = 0; r < F * 2 * n_exp; r++) {
        for (int64_t c = 0; c < E; c++) tmp[c] = frand(&seed);
        tr->from_float_ref(tmp, gu + (size_t)r * rs_gu, E);
    }
    for (int64_t r = 0; r < E * n_exp; r++) {
        for (int64_t c = 0; c < F; c++) tmp[c] = frand(&seed);
        dr->from_float_ref(tmp, dn + (size_t)r * rs_d, F);
    }
    const int64_t batches[2] = {1, 512};
    for (int bi = 0; bi < 2; bi++) {
        const int64_t nb = batches[bi];
        float *x = malloc((size_t)(nb * E) * sizeof(float)), *out = calloc((size_t)(nb * E), sizeof(float));
        for (int64_t i = 0; i < nb * E; i++) x[i] = frand(&seed);
        int32_t *tok = malloc((size_t)(nb * k) * sizeof(int32_t));
        float *w = malloc((size_t)(nb * k) * sizeof(float));
        hm_moe_job *jobs = calloc((size_t)n_exp, sizeof *jobs);
        int32_t *sel = malloc((size_t)(nb * k) * sizeof(int32_t));
        for (int64_t t = 0; t < nb; t++)
            for (int j = 0; j < k; j++) sel[t * k + j] = (int32_t)((t * 37 + j * 16 + (int64_t)((frand(&seed) + 0.5f) * 15)) % n_exp);
        int32_t at = 0;
        for (int e = 0; e < n_exp; e++) {
            jobs[e].gate = hm_mat_make(gu + (size_t)(2 * e) * F * rs_gu, type, E, F, rs_gu);
            jobs[e].up = hm_mat_make(gu + (size_t)(2 * e + 1) * F * rs_gu, type, E, F, rs_gu);
            jobs[e].down = hm_mat_make(dn + (size_t)e * E * rs_d, dtype, F, E, rs_d);
            jobs[e].tok = tok + at;
            jobs[e].w = w + at;
            for (int64_t t = 0; t < nb; t++) {
                bool hit = false;
                for (int j = 0; j < k; j++) hit |= sel[t * k + j] == e;
                if (hit) {
                    tok[at] = (int32_t)t;
                    w[at++] = 0.125f;
                    jobs[e].n_tok++;
                }
            }
        }
        hm_scratch s = {NULL, hm_cpu_moe_scratch_size(nb, at, E, F, hm_pool_size(pool))};
        s.data = hm_malloc_aligned(s.size);
        double best = 1e9;
        for (int r = 0; r < (nb == 1 ? 50 : 3); r++) {
            double t0 = now_s();
            hm_cpu_moe(pool, jobs, n_exp, x, nb, E, F, out, &s);
            double dt = now_s() - t0;
            best = dt < best ? dt : best;
        }
        double flops = 2.0 * 3 * (double)E * (double)F * at;
        printf("moe layer %s/%s batch %-4lld (%d pairs): %9.1f us  %7.1f GFLOP/s  %.1f tok/s per layer\n", tr->name,
               dr->name, (long long)nb, at, best * 1e6, flops / best * 1e-9, (double)nb / best);
        hm_free_aligned(s.data);
        free(x);
        free(out);
        free(tok);
        free(w);
        free(jobs);
        free(sel);
    }
    free(tmp);
    hm_free_aligned(gu);
    hm_free_aligned(dn);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* -moe-cold: one-token hm_cpu_moe (decode) on weights that come from RAM, the GPU decode's cold
 * units (1-2 a layer) and a CPU-only layer (8): each call takes U distinct units at random out of a
 * pool of MIB MiB of Qwen3-30B-shaped units (n_embd 2048, n_ff 768; 8 distinct quantised units
 * copied over the pool), far beyond the caches. Calls alternate between the one-token path and the
 * general path (hm_cpu_moe_set_one_token_path), each on fresh units; prints the median and mean of
 * each over REPS calls, then the same with the same U units every call (warm). */
static void bench_moe_cold(hm_pool *pool, int type, int dtype, size_t mib, int reps) {
    const int64_t E = 2048, F = 768;
    const int n_src = 8;
    uint64_t seed = 7;
    const hm_type_traits *tr = hm_type_get(type), *dr = hm_type_get(dtype);
    const size_t rs_gu = hm_row_size(type, E), rs_d = hm_row_size(dtype, F);
    const size_t b_gu = rs_gu * (size_t)F, b_d = rs_d * (size_t)E, b_unit = 2 * b_gu + b_d;
    int n_units = (int)(mib * 1024 * 1024 / b_unit);
    if (n_units < 2 * n_src) n_units = 2 * n_src;
    char *wp = hm_malloc_aligned(b_unit * (size_t)n_units);
    float *tmp = malloc((size_t)E * sizeof(float));
    for (int u = 0; u < n_src; u++) {
        char *b = wp + (size_t)u * b_unit;
        for (int64_t r = 0; r < 2 * F; r++) {
            for (int64_t c = 0; c < E; c++) tmp[c] = frand(&seed);
            tr->from_float_ref(tmp, b + (size_t)r * rs_gu, E);
        }
        for (int64_t r = 0; r < E; r++) {
            for (int64_t c = 0; c < F; c++) tmp[c] = frand(&seed);
            dr->from_float_ref(tmp, b + 2 * b_gu + (size_t)r * rs_d, F);
        }
    }
    for (int u = n_src; u < n_units; u++) memcpy(wp + (size_t)u * b_unit, wp + (size_t)(u % n_src) * b_unit, b_unit);
    float *x = malloc((size_t)E * sizeof(float)), *out = calloc((size_t)E, sizeof(float));
    for (int64_t i = 0; i < E; i++) x[i] = frand(&seed);
    const int32_t tok0 = 0;
    const float w = 0.125f;
    hm_scratch s = {NULL, hm_cpu_moe_scratch_size(1, 8, E, F, hm_pool_size(pool))};
    s.data = hm_malloc_aligned(s.size);
    double *ts[2] = {malloc((size_t)reps * sizeof(double)), malloc((size_t)reps * sizeof(double))};
    printf("moe decode, %s/%s units from a %.0f MiB pool (%d units), %d threads, %d calls per path:\n", tr->name,
           dr->name, (double)(b_unit * (size_t)n_units) / (1024.0 * 1024.0), n_units, hm_pool_size(pool), reps);
    static const int us[] = {1, 2, 8};
    for (int warm = 0; warm < 2; warm++)
        for (size_t ui = 0; ui < sizeof us / sizeof us[0]; ui++) {
            const int nu = us[ui];
            hm_moe_job jobs[8];
            int pick[8];
            for (int r = 0; r < 2 * reps; r++) {
                if (!warm || r == 0)
                    for (int i = 0; i < nu; i++) {
                        bool dup;
                        do {
                            pick[i] = (int)(((double)frand(&seed) + 0.5) * n_units) % n_units;
                            dup = false;
                            for (int k = 0; k < i; k++) dup |= pick[k] == pick[i];
                        } while (dup);
                        char *b = wp + (size_t)pick[i] * b_unit;
                        jobs[i] = (hm_moe_job){.gate = hm_mat_make(b, type, E, F, rs_gu),
                                               .up = hm_mat_make(b + b_gu, type, E, F, rs_gu),
                                               .down = hm_mat_make(b + 2 * b_gu, dtype, F, E, rs_d), .tok = &tok0,
                                               .w = &w, .n_tok = 1};
                    }
                const int path = r & 1; /* 1: one-token path */
                hm_cpu_moe_set_one_token_path(path == 1);
                double t0 = now_s();
                hm_cpu_moe(pool, jobs, nu, x, 1, E, F, out, &s);
                ts[path][r / 2] = now_s() - t0;
            }
            double med[2], mean[2];
            for (int p = 0; p < 2; p++) {
                mean[p] = 0;
                for (int r = 0; r < reps; r++) mean[p] += ts[p][r] / reps;
                qsort(ts[p], (size_t)reps, sizeof(double), cmp_double);
                med[p] = ts[p][reps / 2];
            }
            printf("  %s %d unit%s: general %8.1f us median %8.1f mean | one-token %8.1f us median %8.1f mean"
                   " | %.2fx (median)\n", warm ? "warm" : "cold", nu, nu > 1 ? "s" : " ", med[0] * 1e6,
                   mean[0] * 1e6, med[1] * 1e6, mean[1] * 1e6, med[0] / med[1]);
        }
    hm_cpu_moe_set_one_token_path(true);
    free(ts[0]);
    free(ts[1]);
    hm_free_aligned(s.data);
    free(x);
    free(out);
    free(tmp);
    hm_free_aligned(wp);
}

static void bench_type(hm_pool *pool, int type, int reps) {
    static const struct { const char *name; int64_t ne0, ne1; } shapes[] = {
        {"expert gate/up 2048->768", 2048, 768},
        {"expert down    768->2048", 768, 2048},
        {"attention     2048->4096", 2048, 4096},
    };
    static const int64_t toks[] = {1, 512};
    const hm_type_traits *tr = hm_type_get(type);
    uint64_t seed = 12345;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t ne0 = shapes[si].ne0, ne1 = shapes[si].ne1;
        size_t rs = hm_row_size(type, ne0);
        char *wq = hm_malloc_aligned(rs * (size_t)ne1);
        float *tmp = malloc((size_t)ne0 * sizeof(float));
        for (int64_t r = 0; r < ne1; r++) {
            for (int64_t c = 0; c < ne0; c++) tmp[c] = frand(&seed);
            tr->from_float_ref(tmp, wq + (size_t)r * rs, ne0);
        }
        hm_mat w = hm_mat_make(wq, type, ne0, ne1, rs);
        for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
            const int64_t n_tok = toks[ti];
            float *x = malloc((size_t)(n_tok * ne0) * sizeof(float));
            float *y = malloc((size_t)(n_tok * ne1) * sizeof(float));
            for (int64_t i = 0; i < n_tok * ne0; i++) x[i] = frand(&seed);
            hm_scratch s = {NULL, hm_cpu_matmul_scratch_size(ne0, n_tok, hm_pool_size(pool))};
            s.data = hm_malloc_aligned(s.size);
            int r_eff = n_tok == 1 ? reps * 20 : reps;
            double best = 1e9;
            for (int r = 0; r < r_eff; r++) {
                double t0 = now_s();
                hm_cpu_matmul(pool, &w, x, n_tok, y, &s);
                double dt = now_s() - t0;
                best = dt < best ? dt : best;
            }
            /* baseline: quantise x, one vec_dot per (row, token), one thread */
            const hm_type_traits *pt = hm_type_get((int)tr->vec_dot_type);
            size_t qs = hm_row_size((int)tr->vec_dot_type, ne0);
            char *xq = hm_malloc_aligned(qs * (size_t)n_tok);
            double base = 1e9;
            for (int r = 0; r < (n_tok == 1 ? r_eff : 1); r++) {
                double t0 = now_s();
                for (int64_t t = 0; t < n_tok; t++) pt->from_float(x + t * ne0, xq + (size_t)t * qs, ne0);
                for (int64_t t = 0; t < n_tok; t++)
                    for (int64_t rr = 0; rr < ne1; rr++)
                        tr->vec_dot(ne0, &y[t * ne1 + rr], wq + (size_t)rr * rs, xq + (size_t)t * qs);
                double dt = now_s() - t0;
                base = dt < base ? dt : base;
            }
            double bytes = (double)rs * (double)ne1, flops = 2.0 * (double)ne0 * (double)ne1 * (double)n_tok;
            printf("%-6s %s n_tok=%-4lld  %8.1f us  %6.1f GB/s  %7.1f GFLOP/s   | vec_dot loop 1 thr: %8.1f us  %6.1f GB/s  %7.1f GFLOP/s\n",
                   tr->name, shapes[si].name, (long long)n_tok, best * 1e6, bytes / best * 1e-9,
                   flops / best * 1e-9, base * 1e6, bytes / base * 1e-9, flops / base * 1e-9);
            fflush(stdout);
            hm_free_aligned(xq);
            hm_free_aligned(s.data);
            free(x);
            free(y);
        }
        free(tmp);
        hm_free_aligned(wq);
    }
}

static void usage(void) {
    fprintf(stderr, "usage: bench_cpu_ops [-t THREADS] [-r REPS] [-cpu] [TYPE ...]\n"
                    "       bench_cpu_ops -membw [-membw-mib N] [-t THREADS] [-r REPS]\n"
                    "       bench_cpu_ops -moe-cold [-moe-cold-mib N] [-t THREADS] [-r CALLS]\n"
                    "  -t THREADS     threads of the pool (default 1)\n"
                    "  -r REPS        best of REPS runs (default 5)\n"
                    "  -cpu           time the calling thread's CPU time, not the wall clock\n"
                    "  -membw         only measure RAM read bandwidth with all THREADS threads; one line:\n"
                    "                 ram read bandwidth: X.X GB/s (N threads, M MiB)\n"
                    "  -membw-mib N   size of the -membw buffer in MiB (default 2048)\n"
                    "  -moe-cold      only time one-token MoE (1, 2, 8 units) on units from RAM, one-token\n"
                    "                 path vs general path, CALLS calls each (default 300)\n"
                    "  -moe-cold-mib N  size of the -moe-cold unit pool in MiB (default 512)\n"
                    "  TYPE           weight types to time (default q4_K q6_K q8_0)\n");
}

int main(int argc, char **argv) {
    int n_threads = 1, reps = 5, membw = 0, moe_cold = 0, reps_set = 0;
    long long membw_mib = 2048, cold_mib = 512;
    int types[16], n_types = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) n_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) {
            reps = atoi(argv[++i]);
            reps_set = 1;
        } else if (!strcmp(argv[i], "-moe-cold")) moe_cold = 1;
        else if (!strcmp(argv[i], "-moe-cold-mib") && i + 1 < argc) cold_mib = atoll(argv[++i]);
        else if (!strcmp(argv[i], "-cpu")) use_cpu_clock = 1;
        else if (!strcmp(argv[i], "-membw")) membw = 1;
        else if (!strcmp(argv[i], "-membw-mib") && i + 1 < argc) {
            membw_mib = atoll(argv[++i]);
            if (membw_mib < 1) {
                fprintf(stderr, "-membw-mib %s: want a size in MiB >= 1\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage();
            return 0;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            usage();
            return 2;
        } else if (n_types < 16) {
            int t = hm_type_from_name(argv[i]);
            if (t < 0) {
                fprintf(stderr, "unknown type %s\n", argv[i]);
                return 2;
            }
            types[n_types++] = t;
        }
    }
    if (n_types == 0) {
        types[n_types++] = HM_TYPE_Q4_K;
        types[n_types++] = HM_TYPE_Q6_K;
        types[n_types++] = HM_TYPE_Q8_0;
    }
    hm_pool *pool = NULL;
    hm_err err;
    if (hm_pool_open(&pool, n_threads, &err) != HM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (membw) {
        int rc = bench_membw(pool, (size_t)membw_mib, reps);
        hm_pool_close(pool);
        return rc;
    }
    if (moe_cold) {
        if (hm_cpu_type_ok(HM_TYPE_Q4_K) && hm_cpu_type_ok(HM_TYPE_Q6_K))
            bench_moe_cold(pool, HM_TYPE_Q4_K, HM_TYPE_Q6_K, (size_t)(cold_mib > 0 ? cold_mib : 512),
                           reps_set && reps > 0 ? reps : 300);
        hm_pool_close(pool);
        return 0;
    }
    bench_dispatch(pool);
    bench_attention(pool);
    if (hm_cpu_type_ok(HM_TYPE_Q4_K) && hm_cpu_type_ok(HM_TYPE_Q6_K)) bench_moe(pool, HM_TYPE_Q4_K, HM_TYPE_Q6_K);
    for (int i = 0; i < n_types; i++) {
        if (!hm_cpu_type_ok(types[i])) {
            printf("%s: not registered in this build, skipped\n", hm_type_name(types[i]));
            continue;
        }
        bench_type(pool, types[i], reps);
    }
    hm_pool_close(pool);
    return 0;
}
