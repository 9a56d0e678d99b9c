/* status.c - error message formatting and assertion failure reporting. */
#include "status.h"

#include <stdio.h>
#include <stdlib.h>

hm_status hm_verrf(hm_err *err, hm_status code, const char *fmt, va_list ap) {
    if (err) vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return code;
}

hm_status hm_errf(hm_err *err, hm_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    hm_verrf(err, code, fmt, ap);
    va_end(ap);
    return code;
}

const char *hm_status_name(hm_status s) {
    switch (s) {
    case HM_OK: return "HM_OK";
    case HM_ERR_IO: return "HM_ERR_IO";
    case HM_ERR_FORMAT: return "HM_ERR_FORMAT";
    case HM_ERR_NOMEM: return "HM_ERR_NOMEM";
    case HM_ERR_ARG: return "HM_ERR_ARG";
    case HM_ERR_UNSUPPORTED: return "HM_ERR_UNSUPPORTED";
    case HM_ERR_CUDA: return "HM_ERR_CUDA";
    case HM_ERR_INTERNAL: return "HM_ERR_INTERNAL";
    }
    return "HM_ERR_UNKNOWN";
}

void hm_assert_fail(const char *file, int line, const char *expr) {
    fprintf(stderr, "hotmoe: internal error at %s:%d: assertion '%s' failed\n", file, line, expr);
    abort();
}
