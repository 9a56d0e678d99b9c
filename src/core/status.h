/* status.h - the one error convention of hotmoe.
 *
 * Every fallible function returns hm_status (HM_OK = 0, errors negative) and, when it fails,
 * writes a human-readable message into the caller's hm_err. Messages name the file, tensor,
 * field or byte offset involved so the caller can print them as they are. hm_err may be NULL:
 * the status is still returned, the message is dropped. */
#ifndef HM_CORE_STATUS_H
#define HM_CORE_STATUS_H

#include <stdarg.h>

#include "hotmoe.h" /* hm_status, hm_err */

/* Formats the message into err (if non-NULL) and returns code, so callers can write
 * `return hm_errf(err, HM_ERR_FORMAT, "...", ...)`. */
hm_status hm_errf(hm_err *err, hm_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
hm_status hm_verrf(hm_err *err, hm_status code, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Assertions are for bugs only, never for bad input. */
void hm_assert_fail(const char *file, int line, const char *expr) __attribute__((noreturn));
#define HM_ASSERT(x) \
    do { if (!(x)) hm_assert_fail(__FILE__, __LINE__, #x); } while (0)

#endif
