/* bench_cuda_decode.c - GPU time of each CUDA op of one decode layer (one token) at the qwen36-geom
 * shape (hotmoe synth --preset qwen36-geom: n_embd 2048, 32 q / 4 kv heads of 128, rope theta 1e7,
 * 256 experts top-8 of n_ff 512; q4_K attention, f32 router, q4_K/q6_K experts), the pre-rewrite
 * f32 kernels (OLD, NEW) beside the int8 ones the engine runs (DEFAULT: "q8 v1", the first int8
 * kernels, and "q8", the current ones), through the hm_cuda_set_kern and hm_cuda_q8_set_variant
 * test hooks. Ops without an int8 kernel run NEW under both q8 columns.
 *
 *   bench_cuda_decode [-n CALLS] [-r BATCHES] [-pos POS] [-ff N_FF]
 *   bench_cuda_decode -hbm
 *
 * -hbm measures the HBM bandwidth of device 0 instead (nothing else runs): two 1 GiB device buffers
 * (256 MiB each when 1 GiB does not fit), filled, then device-to-device copies of one into the other
 * (hm_cuda_copy, which enqueues on the compute stream and returns at once, then hm_cuda_sync): one
 * warm-up copy, then the best of 5 rounds of 8 copies, wall clock. A copy reads and writes each byte
 * once, and reads and writes share the memory's bandwidth, so the figure is the traffic of both
 * (what a read-only stream such as a decode's weights can use, as bandwidthTest counts a
 * device-to-device copy). One line that scripts parse (bench/gpu_offload.sh's HBM_GBS):
 *   hbm bandwidth: X.X GB/s (N MiB device-to-device copies, read + write traffic)
 * with X = 2 * bytes * copies / seconds / 1e9. GB is 1e9 bytes.
 *
 * -ff sets the experts' n_ff (512 by default; Qwen3-30B-A3B has 768). After the layer, the same
 * columns for big matrices alone (4096 x 4096 q4_K and q6_K, cold), with the GB/s of weight bytes.
 * Last, a check that the two int8 variants agree bit for bit on random weights (matvecs of 1..8
 * tokens at sizes where each warp of the current kernel takes several rows, the MoE): it prints
 * "identical" or the number of differing outputs (it still exits 0: a benchmark asserts nothing).
 *
 * Hot: every call on the same buffers (L2-resident after the first). Cold: call i on copy
 * i % C of the op's whole working set (inputs, weights, cache, outputs), C copies filling >= 192
 * MB, so each call's data comes from HBM (the H200's L2 is 50 MB); the MoE draws its 8 experts from
 * 64 random routings over all 256 (hot: one routing).
 *
 * Timing: the ops run on the context's (opaque) compute stream. Each batch first enqueues memsets of
 * a 256 MB buffer that keep the GPU busy while the host enqueues event 1, CALLS calls and event 2;
 * the host then polls event 1 and event 2 and divides the time between them by CALLS: the GPU time of
 * back-to-back calls, free of the host's launch cost (a batch whose event 1 had already fired is
 * retried with a longer prefix). Median of BATCHES. A benchmark prints numbers; it asserts nothing.
 * Without CUDA or without a device it prints "skipped: no GPU" and exits 77. */
#include <stdio.h>
#include <stdlib.h>

#ifndef HM_HAVE_CUDA
int main(void) {
    printf("skipped: no GPU (built without the CUDA backend)\n");
    return 77;
}
#else

#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "quant/quant.h"

#define N_EMBD 2048
#define N_HEAD 32
#define N_KV 4
#define HD 128
#define N_EXPERT 256
#define K_USED 8
static int64_t N_FF = 512; /* -ff */
#define N_CTX 4096
#define COLD_BYTES ((size_t)192 << 20)
#define N_ROUTE 64

static hm_cuda_ctx *ctx;
static hm_err err;

/* Test hook defined in cuda_matvec.cu: 1 = the first int8 decode kernels, 0 = the current ones. */
void hm_cuda_q8_set_variant(int v);

#define CK(call)                                                                              \
    do {                                                                                      \
        if ((call) != HM_OK) {                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, err.msg);          \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t al256(size_t n) { return (n + 255) & ~(size_t)255; }

/* One op: `set` bytes of working set per copy, `copies` copies in `arena`; run() enqueues one call
 * on copy `c`. Offsets inside a copy are fixed per op (the o[] table). */
typedef struct op op;
struct op {
    const char *name;
    int wtype;        /* the big-matrix ops: weight type, ne0 x ne1 */
    int64_t ne0, ne1;
    size_t set;
    size_t o[8];
    int copies;
    char *arena;
    void (*run)(const op *p, int c, bool hot);
};

static int32_t *g_pos;        /* device [1]: the decode position */
static void *g_scratch;       /* attention / MoE scratch (shared, written before it is read) */
static size_t g_scratch_size;
static hm_cuda_moe_slot *g_slots; /* device [N_EXPERT], into the MoE arena */
static int32_t *g_ids;        /* device [N_ROUTE * K_USED] */
static float *g_wts;          /* device [N_ROUTE * K_USED] */
static int g_call;            /* the MoE's routing index */

static char *at(const op *p, int c, int i) { return p->arena + (size_t)c * p->set + p->o[i]; }

static void run_rmsnorm(const op *p, int c, bool hot) {
    (void)hot;
    CK(hm_cuda_rmsnorm(ctx, (float *)at(p, c, 0), (float *)at(p, c, 1), (float *)at(p, c, 2), 1, N_EMBD, 1e-6f, &err));
}
static void run_add_rmsnorm(const op *p, int c, bool hot) {
    (void)hot;
    CK(hm_cuda_add_rmsnorm(ctx, (float *)at(p, c, 0), (float *)at(p, c, 1), (float *)at(p, c, 2), (float *)at(p, c, 1),
                           1, N_EMBD, 1e-6f, &err));
}
static void run_qk(const op *p, int c, bool hot) {
    (void)hot;
    CK(hm_cuda_qk_norm_rope_kv(ctx, (float *)at(p, c, 0), (float *)at(p, c, 1), (float *)at(p, c, 2),
                               (float *)at(p, c, 3), (float *)at(p, c, 4), 1, N_HEAD, N_KV, HD, HD, g_pos, 1e7f, 1e-6f,
                               (uint16_t *)at(p, c, 5), (uint16_t *)at(p, c, 6), N_CTX, &err));
}
static int64_t g_kv_len;
static void run_attn(const op *p, int c, bool hot) {
    (void)hot;
    CK(hm_cuda_attention(ctx, (float *)at(p, c, 0), 1, g_pos, g_kv_len, (uint16_t *)at(p, c, 1), (uint16_t *)at(p, c, 2),
                         N_CTX, N_HEAD, N_KV, HD, 0.08838834764f, (float *)at(p, c, 3), g_scratch, g_scratch_size, &err));
}
static void run_router(const op *p, int c, bool hot) {
    (void)hot;
    CK(hm_cuda_router(ctx, (float *)at(p, c, 0), 1, N_EXPERT, K_USED, true, (int32_t *)at(p, c, 1),
                      (float *)at(p, c, 2), &err));
}
static void run_qkv(const op *p, int c, bool hot) {
    (void)hot;
    const int64_t rows[3] = {N_HEAD * HD, N_KV * HD, N_KV * HD};
    const hm_cuda_mat w = {at(p, c, 0), HM_TYPE_Q4_K, N_EMBD, rows[0] + rows[1] + rows[2], hm_row_size(HM_TYPE_Q4_K, N_EMBD)};
    float *const ys[3] = {(float *)at(p, c, 2), (float *)at(p, c, 3), (float *)at(p, c, 4)};
    CK(hm_cuda_matvec_multi(ctx, &w, (float *)at(p, c, 1), 1, 3, ys, rows, &err));
}
static void run_wo(const op *p, int c, bool hot) {
    (void)hot;
    const hm_cuda_mat w = {at(p, c, 0), HM_TYPE_Q4_K, N_HEAD * HD, N_EMBD, hm_row_size(HM_TYPE_Q4_K, N_HEAD * HD)};
    CK(hm_cuda_matmul(ctx, &w, (float *)at(p, c, 1), 1, (float *)at(p, c, 2), &err));
}
static void run_router_mv(const op *p, int c, bool hot) {
    (void)hot;
    const hm_cuda_mat w = {at(p, c, 0), HM_TYPE_F32, N_EMBD, N_EXPERT, hm_row_size(HM_TYPE_F32, N_EMBD)};
    CK(hm_cuda_matmul(ctx, &w, (float *)at(p, c, 1), 1, (float *)at(p, c, 2), &err));
}
static void run_big(const op *p, int c, bool hot) {
    (void)hot;
    const hm_cuda_mat w = {at(p, c, 0), p->wtype, p->ne0, p->ne1, hm_row_size(p->wtype, p->ne0)};
    CK(hm_cuda_matmul(ctx, &w, (float *)at(p, c, 1), 1, (float *)at(p, c, 2), &err));
}
static void run_moe(const op *p, int c, bool hot) {
    (void)c;
    const int r = hot ? 0 : g_call++ % N_ROUTE;
    CK(hm_cuda_moe_dev(ctx, g_slots, HM_TYPE_Q4_K, HM_TYPE_Q6_K, g_ids + r * K_USED, g_wts + r * K_USED, K_USED,
                       (float *)at(p, 0, 0), 1, N_EMBD, N_FF, (float *)at(p, 0, 1), g_scratch, g_scratch_size, &err));
}

/* The layout of one copy: n buffers of the given bytes, each 256-byte aligned. */
static void layout(op *p, int n, const size_t *bytes) {
    size_t at_ = 0;
    for (int i = 0; i < n; i++) {
        p->o[i] = at_;
        at_ += al256(bytes[i]);
    }
    p->set = at_;
}

static void *g_busy;
#define BUSY_BYTES ((size_t)256 << 20)
static int g_prefix = 8;
static hm_cuda_event *g_e1, *g_e2;

/* GPU seconds per call of n back-to-back calls (see the top of the file). */
static double time_batch(const op *p, int n, bool hot, int *cidx) {
    for (;;) {
        for (int i = 0; i < g_prefix; i++) CK(hm_cuda_memset(ctx, g_busy, i & 0xff, BUSY_BYTES, &err));
        CK(hm_cuda_event_record(ctx, g_e1, false, &err));
        for (int i = 0; i < n; i++) {
            p->run(p, hot ? 0 : *cidx, hot);
            if (!hot) *cidx = (*cidx + 1) % p->copies;
        }
        CK(hm_cuda_event_record(ctx, g_e2, false, &err));
        if (hm_cuda_event_done(g_e1)) { /* the calls may have started before the clock: longer prefix */
            CK(hm_cuda_event_wait(g_e2, &err));
            if (g_prefix >= 64) {
                fprintf(stderr, "bench_cuda_decode: cannot keep the GPU busy while enqueueing %d calls (try a "
                        "smaller -n)\n", n);
                exit(1);
            }
            g_prefix *= 2;
            continue;
        }
        while (!hm_cuda_event_done(g_e1)) {
        }
        const double t1 = now_s();
        while (!hm_cuda_event_done(g_e2)) {
        }
        const double t2 = now_s();
        CK(hm_cuda_event_wait(g_e2, &err)); /* reports a fault of the calls */
        return (t2 - t1) / n;
    }
}

/* ---- v1 vs current int8 kernels, bit for bit ---- */

static uint64_t g_rs = 0x2545f4914f6cdd1dull;
static uint64_t rnd64(void) {
    g_rs ^= g_rs << 13;
    g_rs ^= g_rs >> 7;
    g_rs ^= g_rs << 17;
    return g_rs;
}
/* n bytes of random blocks of `type` (every quant code is valid) with the f16 scales set to
 * ~0.01 * (1 + small), so the sums stay finite. */
static void rand_blocks(int type, uint8_t *w, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
        const uint64_t v = rnd64();
        memcpy(w + i, &v, n - i < 8 ? n - i : 8);
    }
    const size_t bs = hm_row_size(type, 256);
    const size_t doff = type == HM_TYPE_Q6_K ? 208 : 0, n2 = type == HM_TYPE_Q4_K || type == HM_TYPE_Q5_K ? 2 : 1;
    for (size_t b = 0; b + bs <= n; b += bs)
        for (size_t k = 0; k < n2; k++) {
            w[b + doff + 2 * k] = (uint8_t)(0x10 + (rnd64() & 0x1f));
            w[b + doff + 2 * k + 1] = 0x21;
        }
}
static float *rand_x(int64_t n) {
    float *x = malloc(sizeof(float) * (size_t)n);
    if (!x) exit(1);
    for (int64_t i = 0; i < n; i++) x[i] = (float)((double)(rnd64() >> 11) / 9007199254740992.0 - 0.5);
    return x;
}
/* The outputs of the two variants: download of n floats at d after run() under each (d filled
 * with a different pattern before each, so an output one variant leaves unwritten shows). */
static int diff_variants(void (*run)(void *), void *arg, float *d, float *a, float *b, size_t n) {
    for (int v = 1; v >= 0; v--) {
        CK(hm_cuda_memset(ctx, d, v ? 0x7f : 0xff, sizeof(float) * n, &err));
        hm_cuda_q8_set_variant(v);
        run(arg);
        CK(hm_cuda_download(ctx, v ? a : b, d, sizeof(float) * n, &err));
    }
    hm_cuda_q8_set_variant(0);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
    return bad;
}
typedef struct {
    hm_cuda_mat m;
    const float *x;
    float *y;
    int n_tok;
} mv_arg;
static void run_mv_arg(void *p) {
    const mv_arg *a = p;
    CK(hm_cuda_matmul(ctx, &a->m, a->x, a->n_tok, a->y, &err));
}
typedef struct {
    const hm_cuda_moe_slot *slots;
    const int32_t *ids;
    const float *wts, *x;
    float *out;
    int64_t n_tok;
} moe_arg;
static void run_moe_arg(void *p) {
    const moe_arg *a = p;
    CK(hm_cuda_memset(ctx, a->out, 0, sizeof(float) * (size_t)(a->n_tok * N_EMBD), &err));
    CK(hm_cuda_moe_dev(ctx, a->slots, HM_TYPE_Q4_K, HM_TYPE_Q6_K, a->ids, a->wts, K_USED, a->x, a->n_tok, N_EMBD,
                       N_FF, a->out, g_scratch, g_scratch_size, &err));
}

static void check_variants(char *experts, size_t es, size_t gs, size_t ds) {
    CK(hm_cuda_sync(ctx, &err)); /* the uploads below overwrite experts the timed calls read */
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
    printf("\nint8 kernels, v1 vs current on random weights (bit for bit):\n");
    const struct { int type; int64_t ne0, ne1; } mv[] = {
        {HM_TYPE_Q4_K, 2048, 5003}, {HM_TYPE_Q6_K, 2048, 5003}, {HM_TYPE_Q5_K, 1024, 4500}, {HM_TYPE_IQ4_XS, 4096, 2500},
        {HM_TYPE_Q6_K, 4096, 300}};
    for (size_t s = 0; s < sizeof mv / sizeof mv[0]; s++) {
        const size_t rs = hm_row_size(mv[s].type, mv[s].ne0), wb = rs * (size_t)mv[s].ne1;
        const size_t ny = (size_t)(8 * mv[s].ne1);
        uint8_t *w = malloc(wb);
        float *x = rand_x(8 * mv[s].ne0), *a = malloc(sizeof(float) * ny), *b = malloc(sizeof(float) * ny);
        if (!w || !a || !b) exit(1);
        rand_blocks(mv[s].type, w, wb);
        void *dw, *dx, *dy;
        CK(hm_cuda_alloc(ctx, wb, &dw, &err));
        CK(hm_cuda_alloc(ctx, sizeof(float) * (size_t)(8 * mv[s].ne0), &dx, &err));
        CK(hm_cuda_alloc(ctx, sizeof(float) * ny, &dy, &err));
        CK(hm_cuda_upload(ctx, dw, w, wb, &err));
        CK(hm_cuda_upload(ctx, dx, x, sizeof(float) * (size_t)(8 * mv[s].ne0), &err));
        int bad = 0;
        for (int nt = 1; nt <= 8; nt++) {
            mv_arg arg = {{dw, mv[s].type, mv[s].ne0, mv[s].ne1, rs}, dx, dy, nt};
            bad += diff_variants(run_mv_arg, &arg, dy, a, b, (size_t)(nt * mv[s].ne1));
        }
        printf("  matvec %-6s %5lld x %-5lld n_tok 1..8: %s (%d differ)\n", hm_type_name(mv[s].type),
               (long long)mv[s].ne0, (long long)mv[s].ne1, bad ? "DIFFERENT" : "identical", bad);
        hm_cuda_free(ctx, dw), hm_cuda_free(ctx, dx), hm_cuda_free(ctx, dy);
        free(w), free(x), free(a), free(b);
    }
    /* the MoE: the first 2 * K_USED experts of the arena randomised, 1 and 3 tokens over them */
    const size_t eb = 2 * gs + ds;
    uint8_t *e = malloc(eb);
    if (!e) exit(1);
    for (int j = 0; j < 2 * K_USED; j++) {
        rand_blocks(HM_TYPE_Q4_K, e, 2 * gs);
        rand_blocks(HM_TYPE_Q6_K, e + 2 * gs, ds);
        CK(hm_cuda_upload(ctx, experts + (size_t)j * es, e, eb, &err));
    }
    const int64_t nt_max = 3;
    int32_t ids[3 * K_USED];
    float wts[3 * K_USED];
    for (int i = 0; i < nt_max * K_USED; i++) {
        ids[i] = (int32_t)((i * 5 + i / K_USED) % (2 * K_USED));
        wts[i] = (float)(0.05 + (double)(rnd64() >> 11) / 9007199254740992.0 * 0.2);
    }
    float *x = rand_x(nt_max * N_EMBD), *a = malloc(sizeof(float) * nt_max * N_EMBD),
          *b = malloc(sizeof(float) * nt_max * N_EMBD);
    if (!a || !b) exit(1);
    void *dids, *dwts, *dx, *dout;
    CK(hm_cuda_alloc(ctx, sizeof ids, &dids, &err));
    CK(hm_cuda_alloc(ctx, sizeof wts, &dwts, &err));
    CK(hm_cuda_alloc(ctx, sizeof(float) * nt_max * N_EMBD, &dx, &err));
    CK(hm_cuda_alloc(ctx, sizeof(float) * nt_max * N_EMBD, &dout, &err));
    CK(hm_cuda_upload(ctx, dids, ids, sizeof ids, &err));
    CK(hm_cuda_upload(ctx, dwts, wts, sizeof wts, &err));
    CK(hm_cuda_upload(ctx, dx, x, sizeof(float) * nt_max * N_EMBD, &err));
    for (int64_t nt = 1; nt <= nt_max; nt += 2) {
        moe_arg arg = {g_slots, dids, dwts, dx, dout, nt};
        const int bad = diff_variants(run_moe_arg, &arg, dout, a, b, (size_t)(nt * N_EMBD));
        printf("  moe_dev q4_K/q6_K %d / %lld, top-%d, n_tok %lld: %s (%d differ)\n", N_EMBD, (long long)N_FF, K_USED,
               (long long)nt, bad ? "DIFFERENT" : "identical", bad);
    }
    hm_cuda_free(ctx, dids), hm_cuda_free(ctx, dwts), hm_cuda_free(ctx, dx), hm_cuda_free(ctx, dout);
    free(e), free(x), free(a), free(b);
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median over `reps` batches of n calls, in us; kern < 0: DEFAULT with int8 variant -1 - kern. */
static double time_op(const op *p, int kern, bool hot, int n, int reps) {
    hm_cuda_q8_set_variant(kern < 0 ? -1 - kern : 0);
    hm_cuda_set_kern(ctx, kern < 0 ? HM_CUDA_KERN_DEFAULT : kern);
    int cidx = 0;
    double t[64];
    if (reps > 64) reps = 64;
    (void)time_batch(p, n < 20 ? n : 20, hot, &cidx); /* warm-up */
    for (int r = 0; r < reps; r++) t[r] = time_batch(p, n, hot, &cidx);
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
    hm_cuda_q8_set_variant(0);
    qsort(t, (size_t)reps, sizeof t[0], cmp_d);
    return t[reps / 2] * 1e6;
}

/* -hbm: see the top comment. Returns the exit status. */
static int bench_hbm(void) {
    enum { ROUNDS = 5, COPIES = 8 };
    void *a = NULL, *b = NULL;
    size_t mib = 1024;
    if (hm_cuda_alloc(ctx, mib << 20, &a, &err) != HM_OK || hm_cuda_alloc(ctx, mib << 20, &b, &err) != HM_OK) {
        hm_cuda_free(ctx, a);
        a = b = NULL;
        mib = 256;
        if (hm_cuda_alloc(ctx, mib << 20, &a, &err) != HM_OK ||
            hm_cuda_alloc(ctx, mib << 20, &b, &err) != HM_OK) {
            fprintf(stderr, "bench_cuda_decode -hbm: cannot allocate two %zu MiB device buffers: %s\n", mib,
                    err.msg);
            hm_cuda_free(ctx, a);
            return 1;
        }
    }
    const size_t bytes = mib << 20;
    CK(hm_cuda_memset(ctx, a, 0x5a, bytes, &err));
    CK(hm_cuda_memset(ctx, b, 0xa5, bytes, &err));
    CK(hm_cuda_sync(ctx, &err));
    CK(hm_cuda_copy(ctx, b, a, bytes, &err)); /* warm-up */
    CK(hm_cuda_sync(ctx, &err));
    double best = 1e9;
    for (int r = 0; r < ROUNDS; r++) {
        const double t0 = now_s();
        for (int i = 0; i < COPIES; i++) CK(hm_cuda_copy(ctx, i & 1 ? a : b, i & 1 ? b : a, bytes, &err));
        CK(hm_cuda_sync(ctx, &err));
        const double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    best = best > 1e-9 ? best : 1e-9;
    const double rw = 2.0 * (double)bytes * COPIES / best / 1e9;
    printf("hbm bandwidth: %.1f GB/s (%zu MiB device-to-device copies, read + write traffic)\n", rw, mib);
    hm_cuda_free(ctx, a);
    hm_cuda_free(ctx, b);
    return 0;
}

int main(int argc, char **argv) {
    int n = 200, reps = 7, pos = 511;
    bool hbm = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-pos") && i + 1 < argc) pos = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-ff") && i + 1 < argc) N_FF = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-hbm")) hbm = true;
        else {
            fprintf(stderr,
                    "usage: bench_cuda_decode [-n CALLS] [-r BATCHES] [-pos POS (< %d)] [-ff N_FF (256k)]\n"
                    "       bench_cuda_decode -hbm\n",
                    N_CTX);
            return 2;
        }
    }
    if (n < 1 || reps < 1 || pos < 0 || pos >= N_CTX || N_FF < 256 || N_FF % 256) {
        fprintf(stderr, "bench_cuda_decode: bad -n / -r / -pos / -ff\n");
        return 2;
    }
    if (hm_cuda_device_count() == 0) {
        printf("skipped: no GPU\n");
        return 77;
    }
    if (hbm) {
        CK(hm_cuda_open(&ctx, 0, &err));
        const int rc = bench_hbm();
        hm_cuda_close(ctx);
        return rc;
    }
    char dev[256];
    if (hm_cuda_device_name(0, dev, sizeof dev) == 0) printf("device 0: %s\n", dev);
    CK(hm_cuda_open(&ctx, 0, &err));
    CK(hm_cuda_event_create(ctx, &g_e1, &err));
    CK(hm_cuda_event_create(ctx, &g_e2, &err));
    CK(hm_cuda_alloc(ctx, BUSY_BYTES, &g_busy, &err));
    g_kv_len = pos + 1;
    CK(hm_cuda_alloc(ctx, sizeof(int32_t), (void **)&g_pos, &err));
    const int32_t pos32 = pos;
    CK(hm_cuda_upload(ctx, g_pos, &pos32, sizeof pos32, &err));

    /* scratch: the larger of attention (either kernel set) and the MoE */
    size_t ss = hm_cuda_moe_dev_scratch_size(3, K_USED, N_FF); /* 3: check_variants */
    for (int kern = HM_CUDA_KERN_OLD; kern <= HM_CUDA_KERN_NEW; kern++) {
        hm_cuda_set_kern(ctx, kern);
        const size_t a = hm_cuda_attention_scratch_size(ctx, 1, g_kv_len, N_HEAD, N_KV, HD);
        if (a > ss) ss = a;
    }
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
    g_scratch_size = ss;
    CK(hm_cuda_alloc(ctx, ss, &g_scratch, &err));

    const size_t fe = sizeof(float) * N_EMBD, fq = sizeof(float) * N_HEAD * HD, fk = sizeof(float) * N_KV * HD;
    const size_t cache = sizeof(uint16_t) * (size_t)N_KV * N_CTX * HD;
    const size_t qkv_w = hm_row_size(HM_TYPE_Q4_K, N_EMBD) * (N_HEAD + 2 * N_KV) * HD;
    const size_t wo_w = hm_row_size(HM_TYPE_Q4_K, N_HEAD * HD) * N_EMBD;
    const size_t rt_w = hm_row_size(HM_TYPE_F32, N_EMBD) * N_EXPERT;
    op ops[11];
    int n_ops = 0;
#define OP(NAME, RUN, ...)                                                                     \
    do {                                                                                       \
        const size_t b_[] = {__VA_ARGS__};                                                     \
        op *p_ = &ops[n_ops++];                                                                \
        memset(p_, 0, sizeof *p_);                                                             \
        p_->name = NAME;                                                                       \
        p_->run = RUN;                                                                         \
        layout(p_, (int)(sizeof b_ / sizeof b_[0]), b_);                                       \
    } while (0)
    OP("rmsnorm (attn norm)", run_rmsnorm, fe, fe, fe);
    OP("matvec q|k|v q4_K", run_qkv, qkv_w, fe, fq, fk, fk);
    OP("qk_norm_rope_kv", run_qk, fq, fk, fk, sizeof(float) * HD, sizeof(float) * HD, cache, cache);
    OP("attention", run_attn, fq, cache, cache, fq);
    OP("matvec wo q4_K", run_wo, wo_w, fq, fe);
    OP("add_rmsnorm (ffn norm)", run_add_rmsnorm, fe, fe, fe);
    OP("matvec router f32", run_router_mv, rt_w, fe, sizeof(float) * N_EXPERT);
    OP("router softmax top-8", run_router, sizeof(float) * N_EXPERT, sizeof(int32_t) * K_USED, sizeof(float) * K_USED);
    OP("moe_dev q4_K/q6_K", run_moe, fe, fe);
    const int n_layer_ops = n_ops;
    const int64_t big = 4096;
    OP("matvec 4096^2 q4_K", run_big, hm_row_size(HM_TYPE_Q4_K, big) * big, sizeof(float) * big, sizeof(float) * big);
    ops[n_ops - 1].wtype = HM_TYPE_Q4_K;
    OP("matvec 4096^2 q6_K", run_big, hm_row_size(HM_TYPE_Q6_K, big) * big, sizeof(float) * big, sizeof(float) * big);
    ops[n_ops - 1].wtype = HM_TYPE_Q6_K;
    for (int i = n_layer_ops; i < n_ops; i++) ops[i].ne0 = ops[i].ne1 = big;
#undef OP

    /* the MoE's experts: one arena of all 256 (~0.5 GB), routings random over them */
    const size_t gs = hm_row_size(HM_TYPE_Q4_K, N_EMBD) * N_FF, ds = hm_row_size(HM_TYPE_Q6_K, N_FF) * N_EMBD;
    const size_t es = al256(2 * gs + ds);
    char *experts;
    CK(hm_cuda_alloc(ctx, es * N_EXPERT, (void **)&experts, &err));
    CK(hm_cuda_memset(ctx, experts, 0x11, es * N_EXPERT, &err));
    hm_cuda_moe_slot slots[N_EXPERT];
    for (int e = 0; e < N_EXPERT; e++)
        slots[e] = (hm_cuda_moe_slot){.gate = experts + (size_t)e * es, .up = experts + (size_t)e * es + gs,
                                      .down = experts + (size_t)e * es + 2 * gs};
    CK(hm_cuda_alloc(ctx, sizeof slots, (void **)&g_slots, &err));
    CK(hm_cuda_upload(ctx, g_slots, slots, sizeof slots, &err));
    int32_t ids[N_ROUTE * K_USED];
    float wts[N_ROUTE * K_USED];
    uint64_t rs = 0x9e3779b97f4a7c15ull;
    for (int r = 0; r < N_ROUTE; r++)
        for (int j = 0; j < K_USED; j++) {
            int e;
            bool dup;
            do { /* distinct experts within a routing */
                rs ^= rs << 13;
                rs ^= rs >> 7;
                rs ^= rs << 17;
                e = (int)(rs % N_EXPERT);
                dup = false;
                for (int i = 0; i < j; i++) dup |= ids[r * K_USED + i] == e;
            } while (dup);
            ids[r * K_USED + j] = e;
            wts[r * K_USED + j] = 0.125f;
        }
    CK(hm_cuda_alloc(ctx, sizeof ids, (void **)&g_ids, &err));
    CK(hm_cuda_alloc(ctx, sizeof wts, (void **)&g_wts, &err));
    CK(hm_cuda_upload(ctx, g_ids, ids, sizeof ids, &err));
    CK(hm_cuda_upload(ctx, g_wts, wts, sizeof wts, &err));

    printf("decode ops at qwen36-geom (experts' n_ff %lld), 1 token at position %d; GPU us per call, median of %d "
           "batches of %d back-to-back calls\n", (long long)N_FF, pos, reps, n);
    /* columns: hot OLD, NEW, q8 v1, q8, then the same cold */
    const int kerns[4] = {HM_CUDA_KERN_OLD, HM_CUDA_KERN_NEW, -2, -1};
    printf("%-24s %8s %8s %8s %8s %9s %8s %8s %8s\n", "op", "hot OLD", "NEW", "q8 v1", "q8", "cold OLD", "NEW",
           "q8 v1", "q8");
    double sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < n_ops; i++) {
        op *p = &ops[i];
        if (i == n_layer_ops) {
            printf("%-24s %8.2f %8.2f %8.2f %8.2f %9.2f %8.2f %8.2f %8.2f\n", "layer (sum)", sum[0], sum[1], sum[2],
                   sum[3], sum[4], sum[5], sum[6], sum[7]);
            printf("%-24s %8.1f %8.1f %8.1f %8.1f %9.1f %8.1f %8.1f %8.1f  (us per token, 40 layers, no head)\n",
                   "x 40 layers", 40 * sum[0], 40 * sum[1], 40 * sum[2], 40 * sum[3], 40 * sum[4], 40 * sum[5],
                   40 * sum[6], 40 * sum[7]);
        }
        const bool moe = p->run == run_moe;
        p->copies = moe ? 1 : (int)((COLD_BYTES + p->set - 1) / p->set);
        if (p->copies < 2 && !moe) p->copies = 2;
        CK(hm_cuda_alloc(ctx, p->set * (size_t)p->copies, (void **)&p->arena, &err));
        /* 0x3c: f32 ~0.0115, f16 ~1.06, sane q4_K scales; the KV rows and the routing are valid */
        CK(hm_cuda_memset(ctx, p->arena, 0x3c, p->set * (size_t)p->copies, &err));
        double t[8];
        for (int k = 0; k < 8; k++) t[k] = time_op(p, kerns[k & 3], k < 4, n, reps);
        printf("%-24s %8.2f %8.2f %8.2f %8.2f %9.2f %8.2f %8.2f %8.2f\n", p->name, t[0], t[1], t[2], t[3], t[4], t[5],
               t[6], t[7]);
        /* bytes of weights per call: the big matrices, and the MoE's 8 experts */
        const double wb = p->run == run_big ? (double)hm_row_size(p->wtype, p->ne0) * (double)p->ne1
                          : moe                ? (double)K_USED * (double)(2 * gs + ds)
                                               : 0.0;
        if (wb > 0)
            printf("%-24s %8.0f %8.0f %8.0f %8.0f %9.0f %8.0f %8.0f %8.0f  (GB/s of weights, %.1f MB)\n", "",
                   wb / t[0] * 1e-3, wb / t[1] * 1e-3, wb / t[2] * 1e-3, wb / t[3] * 1e-3, wb / t[4] * 1e-3, wb / t[5] * 1e-3,
                   wb / t[6] * 1e-3, wb / t[7] * 1e-3, wb * 1e-6);
        if (i < n_layer_ops)
            for (int k = 0; k < 8; k++) sum[k] += t[k];
        hm_cuda_free(ctx, p->arena);
    }
    check_variants(experts, es, gs, ds);
    hm_cuda_free(ctx, experts);
    hm_cuda_free(ctx, g_slots);
    hm_cuda_free(ctx, g_ids);
    hm_cuda_free(ctx, g_wts);
    hm_cuda_free(ctx, g_scratch);
    hm_cuda_free(ctx, g_pos);
    hm_cuda_free(ctx, g_busy);
    hm_cuda_event_destroy(g_e1);
    hm_cuda_event_destroy(g_e2);
    hm_cuda_close(ctx);
    return 0;
}
#endif
