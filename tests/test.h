/* test.h - the minimal test harness: CHECK macros that count failures, and helpers to find
 * fixtures. A test program returns test_done() from main: 0 when every check passed, 1 else;
 * 77 means "skipped" (ctest SKIP_RETURN_CODE). */
#ifndef HM_TEST_H
#define HM_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int test_failures_;
static int test_checks_;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        test_checks_++;                                                               \
        if (!(cond)) {                                                                \
            test_failures_++;                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                             \
    } while (0)

#define CHECKF(cond, ...)                                                   \
    do {                                                                    \
        test_checks_++;                                                     \
        if (!(cond)) {                                                      \
            test_failures_++;                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
        }                                                                   \
    } while (0)

#define CHECK_NEAR(a, b, tol) \
    CHECKF(fabs((double)(a) - (double)(b)) <= (tol), "%.9g vs %.9g (tol %g)", (double)(a), (double)(b), (double)(tol))

static inline int test_done(void) {
    if (test_checks_ == 0) {
        fprintf(stderr, "no checks ran\n");
        return 1;
    }
    fprintf(stderr, "%d checks, %d failed\n", test_checks_, test_failures_);
    return test_failures_ ? 1 : 0;
}

/* Path under the source tree (HM_SOURCE_DIR set by ctest), in a static buffer. */
static inline const char *test_src_path(const char *rel) {
    static char buf[4096];
    const char *root = getenv("HM_SOURCE_DIR");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : ".", rel);
    return buf;
}

/* Write a tiny qwen3moe model (`hotmoe synth --preset tiny --type TYPE --seed SEED`, the binary
 * ctest names in HM_EXE) to /tmp/hm_test_TAG.PID.gguf, its path in path[n]. Returns 0, or 77 (the
 * skip code, with a line saying why) without HM_EXE or when synth fails. */
static inline int test_synth_tiny(const char *tag, const char *type, int seed, char *path, size_t n) {
    const char *exe = getenv("HM_EXE");
    if (!exe) {
        printf("HM_EXE not set: skipping\n");
        return 77;
    }
    char cmd[1024];
    snprintf(path, n, "/tmp/hm_test_%s.%d.gguf", tag, (int)getpid());
    snprintf(cmd, sizeof cmd, "'%s' synth --preset tiny --type %s --seed %d -q -o '%s' >/dev/null 2>&1", exe, type,
             seed, path);
    if (system(cmd) != 0) {
        printf("synth failed: skipping\n");
        return 77;
    }
    return 0;
}

#endif
