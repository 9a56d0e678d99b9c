/* size.c - human byte sizes ("12GiB", "512M") for budgets and options. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "status.h"

hm_status hm_parse_size(const char *s, int64_t *out, hm_err *err) {
    if (!s || !*s) return hm_errf(err, HM_ERR_ARG, "empty size");
    if (strcasecmp(s, "auto") == 0 || strcmp(s, "-1") == 0) {
        *out = -1;
        return HM_OK;
    }
    errno = 0;
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0)
        return hm_errf(err, HM_ERR_ARG, "bad size '%s' (expected e.g. 12GiB, 512MiB, 4096)", s);
    while (*end == ' ') end++;
    static const struct { const char *suf; double mul; } units[] = {
        {"", 1.0},           {"b", 1.0},
        {"k", 1024.0},       {"kb", 1e3},     {"kib", 1024.0},
        {"m", 1048576.0},    {"mb", 1e6},     {"mib", 1048576.0},
        {"g", 1073741824.0}, {"gb", 1e9},     {"gib", 1073741824.0},
        {"t", 1099511627776.0}, {"tb", 1e12}, {"tib", 1099511627776.0},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].suf) == 0) {
            double bytes = v * units[i].mul;
            if (bytes > 9.0e18) return hm_errf(err, HM_ERR_ARG, "size '%s' is too large", s);
            *out = (int64_t)bytes;
            return HM_OK;
        }
    }
    return hm_errf(err, HM_ERR_ARG, "bad size unit in '%s' (use B, KiB, MiB, GiB, TiB or KB, MB, GB)", s);
}
