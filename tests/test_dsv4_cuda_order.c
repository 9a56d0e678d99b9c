/* test_dsv4_cuda_order.c - the orders DeepSeek-V4's CUDA path (exec_cuda.c's g_dsv4_attn,
 * backend/cuda/cuda_dsv4.cu) computes in, emulated on the host against the CPU's (cpu_dsv4.c), so
 * that every build checks them (tests/test_deepseek4_gpu.c runs the kernels themselves):
 *   - the compressors' chunks: a chunk of up to HM_DSV4_BLOCK rows has its ring rows written, then
 *     its ended blocks compressed; every block must read exactly the ring rows the CPU's row-by-row
 *     order (write, then compress when a block ends) reads (rows tagged with their positions), for
 *     ratios 4 (overlapping) and 128, several starts and batch sizes; a chunk of 2 x HM_DSV4_BLOCK is
 *     shown to break it (the emulation can fail);
 *   - the indexer's top-k as k_index forms it (256 threads scanning strided, an xor-shuffle tree per
 *     warp, then the warps in order, k times) chooses what the CPU's k passes of a first maximum
 *     choose, on scores full of ties. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_dsv4.h"
#include "test.h"

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* a value in [-1, 1) */
static float frand(uint64_t *s) { return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0); }


/* The ring rows (position tags) compress_block reads for block b of ratio r (overlap: r == 4);
 * -1 where a read row holds another position than the one the CPU's order reads. */
static int64_t ring_reads_ok(const int64_t *ring, int32_t r, int64_t b) {
    const int64_t start = b * r, S = HM_DSV4_RING;
    int64_t bad = 0;
    for (int half = r == 4 ? 0 : 1; half < 2; half++)
        for (int64_t j = 0; j < r; j++) {
            const int64_t p = (half == 0 ? start - r : start) + j;
            if (p >= 0 && ring[p % S] != p) bad++;
        }
    return bad;
}

/* A batch of n rows from position p0 through the compressor ring: row by row (the CPU: write, then
 * compress when a block ends) or in chunks (write the chunk, then compress its ended blocks);
 * returns the reads that saw a wrong row. The ring starts holding positions p0 - S .. p0 - 1. */
static int64_t chunk_order_bad(int32_t r, int64_t p0, int64_t n, int64_t chunk) {
    int64_t ring[HM_DSV4_RING], bad = 0;
    for (int64_t p = p0 - HM_DSV4_RING; p < p0; p++)
        if (p >= 0) ring[p % HM_DSV4_RING] = p;
    for (int64_t t0 = 0; t0 < n; t0 += chunk) {
        const int64_t t1 = n - t0 < chunk ? n : t0 + chunk;
        for (int64_t t = t0; t < t1; t++) ring[(p0 + t) % HM_DSV4_RING] = p0 + t;
        for (int64_t t = t0; t < t1; t++)
            if ((p0 + t + 1) % r == 0) bad += ring_reads_ok(ring, r, (p0 + t) / r);
    }
    return bad;
}

static void check_chunk_order(void) {
    const int64_t starts[4] = {0, 5, 127, 300}, ns[4] = {1, 128, 200, 512};
    int64_t bad = 0, bad_wide = 0;
    for (int ri = 0; ri < 2; ri++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) {
                const int32_t r = ri ? 128 : 4;
                bad += chunk_order_bad(r, starts[i], ns[j], 1) != 0; /* the CPU's order: the emulation's base */
                bad += chunk_order_bad(r, starts[i], ns[j], HM_DSV4_BLOCK);
                bad_wide += chunk_order_bad(r, starts[i], ns[j], 2 * HM_DSV4_BLOCK);
            }
    printf("compressor chunks: %lld wrong ring reads with chunks of %d, %lld with chunks of %d\n", (long long)bad,
           HM_DSV4_BLOCK, (long long)bad_wide, 2 * HM_DSV4_BLOCK);
    CHECKF(bad == 0, "chunked compressor order: %lld wrong ring reads", (long long)bad);
    CHECKF(bad_wide > 0, "the emulation should see chunks of %d break the ring (it saw none)", 2 * HM_DSV4_BLOCK);
}

/* The CPU's choice (cpu_dsv4.c's index_row): k passes of the first maximum among the untaken. */
static void topk_cpu(float *sc, int64_t n, int k, int32_t *sel) {
    for (int i = 0; i < k; i++) {
        int64_t best = -1;
        for (int64_t b = 0; b < n; b++)
            if (sc[b] != -INFINITY && (best < 0 || sc[b] > sc[best])) best = b;
        sel[i] = (int32_t)best;
        sc[best] = -INFINITY;
    }
}

static void better(float *s, int *i, float s2, int i2) {
    if (i2 < 0) return;
    if (*i < 0 || s2 > *s || (s2 == *s && i2 < *i)) *s = s2, *i = i2;
}

/* k_index's choice: 256 threads scan strided, each warp reduces by xor shuffles (lane l takes
 * lane l ^ o's pair, o = 16 .. 1), thread 0 takes the warps in order. */
static void topk_gpu_emul(float *sc, int64_t n, int k, int32_t *sel) {
    enum { NT = 256 };
    for (int i = 0; i < k; i++) {
        float bs[NT], ws[NT / 32];
        int bi[NT], wi[NT / 32];
        for (int t = 0; t < NT; t++) {
            bs[t] = 0.0f, bi[t] = -1;
            for (int64_t b = t; b < n; b += NT)
                if (sc[b] != -INFINITY) better(&bs[t], &bi[t], sc[b], (int)b);
        }
        for (int w = 0; w < NT / 32; w++) {
            float s[32];
            int id[32];
            for (int l = 0; l < 32; l++) s[l] = bs[w * 32 + l], id[l] = bi[w * 32 + l];
            for (int o = 16; o > 0; o >>= 1) {
                float s2[32];
                int i2[32];
                for (int l = 0; l < 32; l++) s2[l] = s[l ^ o], i2[l] = id[l ^ o];
                for (int l = 0; l < 32; l++) better(&s[l], &id[l], s2[l], i2[l]);
            }
            ws[w] = s[0], wi[w] = id[0];
        }
        float s = ws[0];
        int b = wi[0];
        for (int w = 1; w < NT / 32; w++) better(&s, &b, ws[w], wi[w]);
        sel[i] = b;
        if (b >= 0) sc[b] = -INFINITY;
    }
}

static void check_topk_order(void) {
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int bad = 0;
    for (int trial = 0; trial < 6; trial++) {
        const int64_t n = trial < 3 ? 300 : 1031;
        const int k = trial % 3 == 0 ? 8 : trial % 3 == 1 ? 64 : 255;
        float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
        CHECK(a && b);
        if (!a || !b) return;
        for (int64_t i = 0; i < n; i++) a[i] = b[i] = (float)(int)(frand(&s) * 6.0f); /* many ties */
        int32_t sa[256], sb[256];
        topk_cpu(a, n, k, sa);
        topk_gpu_emul(b, n, k, sb);
        bad += memcmp(sa, sb, (size_t)k * sizeof(int32_t)) != 0;
        free(a), free(b);
    }
    printf("indexer top-k: the GPU's reduction order chose as the CPU in %d of 6 cases with ties\n", 6 - bad);
    CHECKF(bad == 0, "indexer top-k emulation: %d cases differ from the CPU's choice", bad);
}

int main(void) {
    check_chunk_order();
    check_topk_order();
    return test_done();
}
