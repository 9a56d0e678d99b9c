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

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
