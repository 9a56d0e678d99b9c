/* bench_lowbit_cuda.c - per weight type, the GPU decode matvec (GB/s of weight bytes) and prefill
 * matmul (TFLOP/s) of hotmoe's int8 kernels next to the paths they replace and, optionally, next
 * to llama.cpp's CUDA backend on the same shapes (issue 22's benchmark, docs/PERFORMANCE.md).
 *
 *   bench_lowbit_cuda [-t TYPES] [-n ITERS] [--llama-bin DIR | --llama-perf FILE]
 *
 * TYPES: comma-separated ggml names (default q2_K,q3_K,iq2_xxs,iq2_xs,iq2_s,iq3_xxs,iq3_s,iq1_s,
 * iq1_m,q4_K). Shapes, each type:
 *   - 14336 x 4096 (ne0 = k = 14336 columns, ne1 = m = 4096 rows): the shape of llama.cpp's
 *     `test-backend-ops perf -o MUL_MAT` rows (MUL_MAT(type_a=T,type_b=f32,m=4096,n=N,k=14336)),
 *     at n_tok 1 (decode) and 512 (prefill);
 *   - expert-shaped, n_tok 1 and 512: 2048 x 768 (Qwen3-30B-A3B's gate / up), 768 x 2048 (its
 *     down), 7168 x 2048 (DeepSeek-V3's gate / up).
 * Columns: decode "f32" = the exact-f32 block-decoder kernel (HM_CUDA_KERN_F32, what the low-bit
 * types ran before the int8 units), "int8" = the engine's default (dp4a on Q8_K activations);
 * prefill "bf16" = the tensor-core bf16 kernel (MMQ off), "mmq" = the int8 mma.sync MMQ (the
 * default where the type has tiles; Q2_K has none, so both columns are bf16 there). Decode weights
 * are cycled through >= 1 GiB of copies so every call reads HBM (the H200's L2 is 50 MB); GB/s
 * counts the weight bytes once per call. Time = wall clock over ITERS back-to-back calls after a
 * sync (the launches pipeline; the calls are >= 5 us).
 * --llama-bin DIR runs DIR/bin/test-backend-ops perf -o MUL_MAT -b CUDA0 for the same types and
 * shape first (before this program touches the GPU) and prints its us/run beside ours, converted
 * to GB/s and TFLOP/s with the same byte and flop counts; --llama-perf FILE reads a saved output
 * of that command instead. Weights: 8 rows quantised by the CPU's reference quantiser, tiled
 * (timing does not depend on the values). A benchmark prints numbers; it asserts nothing. Without
 * CUDA or without a device it prints "skipped: no GPU" and exits 77. */
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

static hm_cuda_ctx *ctx;
static hm_err err;

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

static uint64_t rng = 0x853c49e6748fea9bull;
static float rnd_normal(void) {
    double t = 0;
    for (int i = 0; i < 4; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        t += (double)(rng >> 11) / 9007199254740992.0;
    }
    return (float)((t - 2.0) * 1.7320508);
}

/* llama.cpp's us/run per (type, n_tok) at the 14336 x 4096 shape, from its perf output. */
#define MAX_LL 64
static struct {
    char type[16];
    int n;
    double us;
} ll[MAX_LL];
static int n_ll;

static void ll_parse(FILE *f) {
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "MUL_MAT(type_a=");
        if (!p) continue;
        char type[16];
        int m, n, k;
        if (sscanf(p, "MUL_MAT(type_a=%15[^,],type_b=f32,m=%d,n=%d,k=%d", type, &m, &n, &k) != 4) continue;
        const char *u = strstr(p, " us/run");
        if (!u || m != 4096 || k != 14336 || n_ll == MAX_LL) continue;
        const char *s = u;
        while (s > p && s[-1] == ' ') s--;
        while (s > p && (s[-1] == '.' || (s[-1] >= '0' && s[-1] <= '9'))) s--;
        snprintf(ll[n_ll].type, sizeof ll[n_ll].type, "%s", type);
        ll[n_ll].n = n;
        ll[n_ll].us = atof(s);
        n_ll++;
    }
}
static double ll_us(const char *type, int n) {
    for (int i = 0; i < n_ll; i++)
        if (ll[i].n == n && !strcmp(ll[i].type, type)) return ll[i].us;
    return 0;
}

/* ne1 rows of ne0: 8 rows quantised from normal floats, tiled. */
static uint8_t *make_w(int type, int64_t ne0, int64_t ne1, size_t *rs) {
    *rs = hm_row_size(type, ne0);
    float *f = malloc(sizeof(float) * (size_t)(8 * ne0));
    uint8_t *w = malloc(*rs * (size_t)ne1);
    if (!f || !w) exit(1);
    for (int64_t i = 0; i < 8 * ne0; i++) f[i] = 0.05f * rnd_normal();
    for (int r = 0; r < 8; r++) hm_type_get(type)->from_float_ref(f + r * ne0, w + (size_t)r * *rs, ne0);
    for (int64_t r = 8; r < ne1; r++) memcpy(w + (size_t)r * *rs, w + (size_t)(r % 8) * *rs, *rs);
    free(f);
    return w;
}

/* Seconds per call of y = W x, n_tok tokens; with copies > 1 call i reads copy i % copies. */
static double time_mm(int type, int64_t ne0, int64_t ne1, void *buf, size_t mb, size_t copies, int64_t n_tok,
                      const float *dx, float *dy, int iters) {
    double t0 = 0;
    for (int it = -5; it < iters; it++) {
        if (it == 0) {
            CK(hm_cuda_sync(ctx, &err));
            t0 = now_s();
        }
        const hm_cuda_mat w = {(char *)buf + (size_t)((it + 5) % (int)copies) * mb, type, ne0, ne1,
                               hm_row_size(type, ne0)};
        CK(hm_cuda_matmul(ctx, &w, dx, n_tok, dy, &err));
    }
    CK(hm_cuda_sync(ctx, &err));
    return (now_s() - t0) / iters;
}

static void run_shape(int type, int64_t ne0, int64_t ne1, int iters, bool llama_shape) {
    size_t rs;
    uint8_t *w = make_w(type, ne0, ne1, &rs);
    const size_t bytes = rs * (size_t)ne1, mb = (bytes + 255) & ~(size_t)255;
    const size_t copies = bytes >= ((size_t)1 << 30) ? 1 : ((size_t)1 << 30) / mb + 1;
    void *buf;
    CK(hm_cuda_alloc(ctx, copies * mb, &buf, &err));
    CK(hm_cuda_upload(ctx, buf, w, bytes, &err));
    for (size_t c = 1; c < copies; c++) CK(hm_cuda_copy(ctx, (char *)buf + c * mb, buf, bytes, &err));
    const int64_t n_pre = 512;
    float *hx = malloc(sizeof(float) * (size_t)(n_pre * ne0));
    if (!hx) exit(1);
    for (int64_t i = 0; i < n_pre * ne0; i++) hx[i] = rnd_normal();
    float *dx, *dy;
    CK(hm_cuda_alloc(ctx, sizeof(float) * (size_t)(n_pre * ne0), (void **)&dx, &err));
    CK(hm_cuda_alloc(ctx, sizeof(float) * (size_t)(n_pre * ne1), (void **)&dy, &err));
    CK(hm_cuda_upload(ctx, dx, hx, sizeof(float) * (size_t)(n_pre * ne0), &err));
    /* decode: f32 block decoders, then the default (int8 where the type has units) */
    double td[2];
    for (int k = 0; k < 2; k++) {
        hm_cuda_set_kern(ctx, k ? HM_CUDA_KERN_DEFAULT : HM_CUDA_KERN_F32);
        td[k] = time_mm(type, ne0, ne1, buf, mb, copies, 1, dx, dy, iters);
    }
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
    /* prefill: bf16 (MMQ off), then MMQ on (bf16 again for types without tiles) */
    double tp[2];
    for (int k = 0; k < 2; k++) {
        CK(hm_cuda_set_mmq(ctx, k == 1, &err));
        tp[k] = time_mm(type, ne0, ne1, buf, mb, 1, n_pre, dx, dy, iters / 8 + 5);
    }
    const double gb = (double)bytes * 1e-9, tf = 2.0 * (double)ne0 * (double)ne1 * (double)n_pre * 1e-12;
    const char *name = hm_type_name(type);
    printf("%-8s %5lld x %-5lld decode: f32 %7.1f us %5.0f GB/s, int8 %7.1f us %5.0f GB/s", name, (long long)ne0,
           (long long)ne1, td[0] * 1e6, gb / td[0], td[1] * 1e6, gb / td[1]);
    const double ld = llama_shape ? ll_us(name, 1) : 0, lp = llama_shape ? ll_us(name, (int)n_pre) : 0;
    if (ld > 0) printf(", llama.cpp %7.1f us %5.0f GB/s", ld, gb / (ld * 1e-6));
    printf("\n%-8s %5s   %-5s prefill 512: bf16 %7.1f us %5.1f TFLOP/s, mmq %7.1f us %5.1f TFLOP/s", "", "", "",
           tp[0] * 1e6, tf / tp[0], tp[1] * 1e6, tf / tp[1]);
    if (lp > 0) printf(", llama.cpp %7.1f us %5.1f TFLOP/s", lp, tf / (lp * 1e-6));
    printf("\n");
    fflush(stdout);
    hm_cuda_free(ctx, buf), hm_cuda_free(ctx, dx), hm_cuda_free(ctx, dy);
    free(w), free(hx);
}

int main(int argc, char **argv) {
    const char *types_arg = "q2_K,q3_K,iq2_xxs,iq2_xs,iq2_s,iq3_xxs,iq3_s,iq1_s,iq1_m,q4_K";
    const char *llama_bin = NULL, *llama_perf = NULL;
    int iters = 200;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) types_arg = argv[++i];
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--llama-bin") && i + 1 < argc) llama_bin = argv[++i];
        else if (!strcmp(argv[i], "--llama-perf") && i + 1 < argc) llama_perf = argv[++i];
        else {
            fprintf(stderr, "usage: %s [-t TYPES] [-n ITERS] [--llama-bin DIR | --llama-perf FILE]\n", argv[0]);
            return 2;
        }
    }
    if (iters < 10) iters = 10;
    int types[32], n_types = 0;
    char tl[512];
    snprintf(tl, sizeof tl, "%s", types_arg);
    for (char *s = strtok(tl, ","); s && n_types < 32; s = strtok(NULL, ",")) {
        const int t = hm_type_from_name(s);
        if (t < 0 || !hm_cuda_type_ok(t) || hm_type_get(t)->blck_size > 256 || !hm_type_get(t)->from_float_ref) {
            fprintf(stderr, "bench_lowbit_cuda: type '%s' is unknown or has no CUDA kernel / reference quantiser\n", s);
            return 2;
        }
        types[n_types++] = t;
    }
    if (hm_cuda_device_count() == 0) {
        printf("skipped: no GPU\n");
        return 77;
    }
    if (llama_bin) { /* before we open the device: llama.cpp measures an idle GPU */
        char pat[600] = "", cmd[1400];
        for (int i = 0; i < n_types; i++)
            snprintf(pat + strlen(pat), sizeof pat - strlen(pat), "%s%s", i ? "|" : "", hm_type_name(types[i]));
        snprintf(cmd, sizeof cmd,
                 "'%s/bin/test-backend-ops' perf -o MUL_MAT -b CUDA0 -p 'type_a=(%s),type_b=f32,m=4096,n=(1|512),k=14336,' "
                 "2>&1",
                 llama_bin, pat);
        printf("llama.cpp: %s\n", cmd);
        FILE *f = popen(cmd, "r");
        if (!f) {
            fprintf(stderr, "bench_lowbit_cuda: cannot run %s\n", cmd);
            return 1;
        }
        ll_parse(f);
        pclose(f);
    } else if (llama_perf) {
        FILE *f = fopen(llama_perf, "r");
        if (!f) {
            fprintf(stderr, "bench_lowbit_cuda: cannot read %s\n", llama_perf);
            return 1;
        }
        ll_parse(f);
        fclose(f);
    }
    if ((llama_bin || llama_perf) && n_ll == 0)
        printf("llama.cpp: no MUL_MAT rows of m=4096, k=14336 found in its output\n");
    CK(hm_cuda_open(&ctx, 0, &err));
    printf("GPU decode (1 token, weights from HBM) and prefill (512 tokens), ne0 x ne1 (ne0 = k, ne1 = m)\n");
    for (int i = 0; i < n_types; i++) {
        run_shape(types[i], 14336, 4096, iters, true);
        run_shape(types[i], 2048, 768, iters, false);
        run_shape(types[i], 768, 2048, iters, false);
        run_shape(types[i], 7168, 2048, iters, false);
    }
    hm_cuda_close(ctx);
    return 0;
}
#endif
