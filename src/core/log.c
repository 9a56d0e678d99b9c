/* log.c - leveled logging to stderr. A NULL logger prints warnings and errors. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>

void hm_log_printf(const hm_log *log, hm_log_level lvl, const char *fmt, ...) {
    hm_log_level max = log ? log->level : HM_LOG_WARN;
    if (lvl > max) return;
    static const char *const tag[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "hotmoe %s: ", tag[lvl]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
