/* cuda_test.h - shared setup for the tests of the CUDA backend's internals (test_cuda_ops_gpu.c,
 * test_cuda_tier_gpu.c): one device context and error for the whole program, a CK() that ends the
 * test on a failing backend call (a setup failure, not a checked result), and small host helpers.
 *
 * Typical use:
 *   int main(void) {
 *       test_host_only_part();
 *       int rc = cuda_test_open("the host check passed");
 *       if (rc >= 0) return rc;               (no device: 77, or 1 when the host part failed)
 *       ... tests using ctx, err, CK(hm_cuda_...(ctx, ..., &err)) ...
 *       hm_cuda_close(ctx);
 *       return test_done();
 *   }
 *
 * Everything is static (one translation unit per test); this includes test.h. */
#ifndef HM_TEST_CUDA_TEST_H
#define HM_TEST_CUDA_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "quant/quant.h"
#include "test.h"

static hm_cuda_ctx *ctx; /* device 0, opened by cuda_test_open; the test closes it */
static hm_err err;       /* the error of the last backend call (CK prints it) */

/* A backend call that must succeed: on failure print it with err.msg and exit(1). */
#define CK(call)                                                                              \
    do {                                                                                      \
        hm_status st_ = (call);                                                               \
        if (st_ != HM_OK) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, err.msg);          \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

/* Without a CUDA device: returns test_done()'s code when a check already failed (the host-only
 * part), else prints "skipped: no GPU (<host_passed>)" and returns 77. With one: prints device 0's
 * name, opens ctx (CK) and returns -1: go on. */
static inline int cuda_test_open(const char *host_passed) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* before any output: a crash keeps the lines printed so far */
    if (hm_cuda_device_count() == 0) {
        if (test_failures_) return test_done();
        printf("skipped: no GPU (%s)\n", host_passed);
        return 77;
    }
    char name[256];
    if (hm_cuda_device_name(0, name, sizeof name) == 0) printf("device 0: %s\n", name);
    CK(hm_cuda_open(&ctx, 0, &err));
    return -1;
}

/* One xorshift64 step of *s (the tests' reproducible random source; each keeps its own seed). */
static inline uint64_t xorshift64(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Uniform in [0, 1) from *s (53 bits). */
static inline double rnd_unit(uint64_t *s) { return (double)(xorshift64(s) >> 11) / 9007199254740992.0; }
/* About normal (mean 0, variance 1: a sum of 4 uniforms, rescaled) from *s. */
static inline float rnd_normal(uint64_t *s) {
    double t = 0;
    for (int i = 0; i < 4; i++) t += rnd_unit(s);
    return (float)((t - 2.0) * 1.7320508);
}
/* x[0 .. n) = rnd_normal(s) * scale. */
static inline void fill_normal(uint64_t *s, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = rnd_normal(s) * scale;
}

static inline void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* The grid i-quants (IQ1/IQ2/IQ3 but IQ4), whose reference quantisers search a lattice: too slow
 * for weights of GPU-test and timing shapes, which take random_iq_blocks instead. */
static inline bool cuda_test_iq_type(int type) {
    return type == HM_TYPE_IQ2_XXS || type == HM_TYPE_IQ2_XS || type == HM_TYPE_IQ2_S || type == HM_TYPE_IQ3_XXS ||
           type == HM_TYPE_IQ3_S || type == HM_TYPE_IQ1_S || type == HM_TYPE_IQ1_M;
}
/* bytes of random blocks of an i-quant (every grid index, sign and scale code is valid) with each
 * block's fp16 super-scale set to 0.03 .. 0.06 (IQ1_M keeps it in the top nibbles of bytes 49, 51,
 * 53, 55; the others in bytes 0..1). */
static inline void random_iq_blocks(uint64_t *s, int type, uint8_t *w, size_t bytes) {
    const size_t bs = hm_type_get(type)->type_size;
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)(rnd_unit(s) * 256);
    for (size_t b = 0; b + bs <= bytes; b += bs) {
        const uint16_t d = (uint16_t)(0x2800 + (int)(rnd_unit(s) * 0x800));
        uint8_t *blk = w + b;
        if (type == HM_TYPE_IQ1_M)
            for (int k = 0; k < 4; k++) blk[49 + 2 * k] = (uint8_t)((blk[49 + 2 * k] & 15) | ((d >> (4 * k)) & 15) << 4);
        else
            blk[0] = (uint8_t)d, blk[1] = (uint8_t)(d >> 8);
    }
}

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
