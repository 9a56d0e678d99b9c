/* bench_quant_dot.c - one-thread decode dot speed per low-bit type: GB/s of weights through each
 * vec_dot variant of ours (AVX2, AVX-512; scalar with --scalar) beside ggml's, from one run.
 *
 *   bench_quant_dot [--ggml DIR] [--mib N] [--reps R] [--ne0 N] [--scalar] [TYPE ...]
 *
 * DIR: a llama.cpp build's directory holding libggml-base.so and libggml-cpu.so (e.g.
 * llama.cpp/build/bin); its CPU dots are loaded with dlopen (ggml_get_type_traits_cpu) and run on
 * the same bytes: the weights (random blocks, N MiB, rows of ne0) and one Q8_K activation row
 * (ggml's block_q8_K and ours are the same bytes). Each cell is the median of R passes over all
 * rows (a matvec, as decode does) in the thread's CPU time (a busy machine's other work does not
 * count), the variants taking turns pass by pass; the ggml column also says whether its first rows' dots equal ours
 * within 1e-4 relative. Default types: the seven grid i-quants, q2_K, q3_K and q4_K. A benchmark,
 * never a test: it asserts nothing. */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/quant.h"

/* ggml's CPU type traits as libggml-cpu exports them (ggml-cpu.h's struct ggml_type_traits_cpu). */
typedef void (*ggml_vec_dot_fn)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by, int nrc);
typedef struct ggml_traits_cpu {
    void *from_float;
    ggml_vec_dot_fn vec_dot;
    int vec_dot_type;
    int64_t nrows;
} ggml_traits_cpu;
typedef const ggml_traits_cpu *(*ggml_get_traits_fn)(int type);

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Random blocks (their scales can be inf / nan: the speed does not depend on the values). */
static void fill(uint8_t *w, size_t n) {
    for (size_t i = 0; i < n; i++) w[i] = (uint8_t)rnd();
}

/* Seconds of one pass over the rows: ours (g NULL) or ggml's. */
/* This thread's CPU seconds: on a shared machine, time the thread was not running does not count. */
static double thread_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double pass(hm_vec_dot_fn f, ggml_vec_dot_fn g, int64_t ne0, const uint8_t *w, size_t rs, int64_t rows,
                   const void *y, float *out) {
    const double t0 = thread_s();
    if (g)
        for (int64_t i = 0; i < rows; i++) g((int)ne0, &out[i], 0, w + (size_t)i * rs, 0, y, 0, 1);
    else
        for (int64_t i = 0; i < rows; i++) f(ne0, &out[i], w + (size_t)i * rs, y);
    return thread_s() - t0;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *ggml_dir = NULL;
    int mib = 16, reps = 9;
    int64_t ne0 = 4096;
    bool scalar = false;
    int types[HM_TYPE_COUNT], n_types = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ggml") && i + 1 < argc) ggml_dir = argv[++i];
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ne0") && i + 1 < argc) ne0 = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--scalar")) scalar = true;
        else if (argv[i][0] != '-' && hm_type_from_name(argv[i]) >= 0 && n_types < HM_TYPE_COUNT)
            types[n_types++] = hm_type_from_name(argv[i]);
        else {
            fprintf(stderr, "usage: %s [--ggml DIR] [--mib N] [--reps R] [--ne0 N] [--scalar] [TYPE ...]\n", argv[0]);
            return 2;
        }
    }
    if (mib < 1 || reps < 1 || ne0 < 256 || ne0 % 256) {
        fprintf(stderr, "bench_quant_dot: --mib and --reps must be >= 1, --ne0 a multiple of 256\n");
        return 2;
    }
    if (!n_types) {
        const int def[] = {HM_TYPE_IQ1_S, HM_TYPE_IQ1_M, HM_TYPE_IQ2_XXS, HM_TYPE_IQ2_XS, HM_TYPE_IQ2_S,
                           HM_TYPE_IQ3_XXS, HM_TYPE_IQ3_S, HM_TYPE_Q2_K, HM_TYPE_Q3_K, HM_TYPE_Q4_K};
        for (size_t i = 0; i < sizeof def / sizeof def[0]; i++) types[n_types++] = def[i];
    }
    ggml_get_traits_fn get = NULL;
    if (ggml_dir) {
        char p[4096];
        snprintf(p, sizeof p, "%s/libggml-base.so", ggml_dir);
        void *hb = dlopen(p, RTLD_NOW | RTLD_GLOBAL);
        snprintf(p, sizeof p, "%s/libggml-cpu.so", ggml_dir);
        void *hc = hb ? dlopen(p, RTLD_NOW | RTLD_GLOBAL) : NULL;
        void (*init)(void) = hc ? (void (*)(void))dlsym(hc, "ggml_cpu_init") : NULL;
        get = hc ? (ggml_get_traits_fn)dlsym(hc, "ggml_get_type_traits_cpu") : NULL;
        if (!get || !init) {
            fprintf(stderr, "bench_quant_dot: cannot load ggml's CPU dots from %s: %s\n", ggml_dir, dlerror());
            return 1;
        }
        init();
    }
    /* one activation row, Q8_K (the partner of every type here) */
    float *yf = malloc((size_t)ne0 * sizeof(float));
    void *y = malloc(hm_row_size(HM_TYPE_Q8_K, ne0));
    for (int64_t i = 0; i < ne0; i++) yf[i] = (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2 - 1);
    hm_type_get(HM_TYPE_Q8_K)->from_float_ref(yf, y, ne0);
    printf("one thread, %d MiB of weights a type, rows of %lld, median of %d interleaved passes, thread CPU time (GB/s of weights)\n", mib, (long long)ne0, reps);
    printf("%-8s %9s %9s %9s %9s  %s\n", "type", "scalar", "avx2", "avx512", "ggml", "ours/ggml");
    for (int k = 0; k < n_types; k++) {
        const int t = types[k];
        const hm_type_traits *tr = hm_type_get(t);
        if (!tr || !tr->supported || tr->vec_dot_type != HM_TYPE_Q8_K) {
            printf("%-8s (not a Q8_K-partner type here)\n", hm_type_name(t));
            continue;
        }
        const size_t rs = hm_row_size(t, ne0);
        const int64_t rows = ((int64_t)mib << 20) / (int64_t)rs;
        uint8_t *w = malloc((size_t)rows * rs);
        float *o = malloc((size_t)rows * sizeof(float)), *og = malloc((size_t)rows * sizeof(float));
        fill(w, (size_t)rows * rs);
        const double gb = (double)rows * (double)rs * 1e-9;
        /* the variants take turns, pass by pass, so a busy machine slows them alike; medians */
        enum { NV = HM_ISA_COUNT + 1 };
        hm_vec_dot_fn fn[NV] = {0};
        ggml_vec_dot_fn gfn = NULL;
        for (int isa = 0; isa < HM_ISA_COUNT; isa++)
            if (tr->vec_dot_isa[isa] && (isa != HM_ISA_SCALAR || scalar) && hm_isa_available((hm_isa)isa))
                fn[isa] = tr->vec_dot_isa[isa];
        if (get) {
            const ggml_traits_cpu *gt = get(t);
            if (gt && gt->vec_dot && gt->vec_dot_type == HM_TYPE_Q8_K) gfn = gt->vec_dot;
        }
        double *sec = malloc(sizeof(double) * (size_t)(NV * reps)), v[NV] = {0};
        for (int r = 0; r < reps; r++)
            for (int j = 0; j < NV; j++)
                if (j < HM_ISA_COUNT ? fn[j] != NULL : gfn != NULL)
                    sec[j * reps + r] = pass(fn[j < HM_ISA_COUNT ? j : 0], j < HM_ISA_COUNT ? NULL : gfn, ne0, w, rs,
                                             rows, y, j < HM_ISA_COUNT ? o : og);
        for (int j = 0; j < NV; j++)
            if (j < HM_ISA_COUNT ? fn[j] != NULL : gfn != NULL) {
                qsort(sec + j * reps, (size_t)reps, sizeof(double), cmp_d);
                v[j] = gb / sec[j * reps + reps / 2];
            }
        free(sec);
        const double g = v[HM_ISA_COUNT];
        bool same = true;
        for (int64_t i = 0; g > 0 && i < rows && i < 64; i++)
            if (isfinite(o[i]) && isfinite(og[i]) && fabsf(o[i] - og[i]) > 1e-4f * (fabsf(og[i]) + 1e-3f)) same = false;
        const double best = v[HM_ISA_AVX512] > v[HM_ISA_AVX2] ? v[HM_ISA_AVX512] : v[HM_ISA_AVX2];
        char ratio[64] = "-";
        if (g > 0) snprintf(ratio, sizeof ratio, "%.2fx%s", best / g, same ? "" : " (values differ!)");
        printf("%-8s %9.2f %9.2f %9.2f %9.2f  %s\n", hm_type_name(t), v[0], v[1], v[2], g, ratio);
        free(w);
        free(o);
        free(og);
    }
    free(yf);
    free(y);
    return 0;
}
