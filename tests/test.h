/* test.h - the minimal test harness: CHECK macros that count failures, and helpers to find
 * fixtures. A test program returns test_done() from main: 0 when every check passed, 1 else;
 * 77 means "skipped" (ctest SKIP_RETURN_CODE). */
#ifndef HM_TEST_H
#define HM_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

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

#endif
