/* hotmoe.h - the public C API of hotmoe, an MoE inference engine that places experts.
 *
 * This header is the only one the CLI, the server and outside programs include. Everything not
 * declared here is internal. Conventions: functions return hm_status (HM_OK = 0, errors < 0) and
 * fill the caller's hm_err with a message naming what went wrong; handles are opaque; *_close(NULL)
 * is a no-op. */
#ifndef HOTMOE_H
#define HOTMOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HOTMOE_VERSION "0.1.0"

typedef enum hm_status {
    HM_OK = 0,
    HM_ERR_IO = -1,          /* open/read/write/mmap failed */
    HM_ERR_FORMAT = -2,      /* malformed or truncated input file */
    HM_ERR_NOMEM = -3,       /* allocation failed */
    HM_ERR_ARG = -4,         /* bad argument or option from the user */
    HM_ERR_UNSUPPORTED = -5, /* valid input we do not handle (arch, type, ...) */
    HM_ERR_CUDA = -6,        /* CUDA runtime/driver failure */
    HM_ERR_INTERNAL = -7,    /* a bug; message says where */
} hm_status;

/* Error message buffer filled by failing calls. */
typedef struct hm_err {
    char msg[512];
} hm_err;

/* Short constant name of a status ("HM_ERR_FORMAT"). */
const char *hm_status_name(hm_status s);

/* Parse a byte size: "12GiB", "512MiB", "1.5G", "4096" (bytes), "-1"/"auto" -> -1.
 * Returns HM_ERR_ARG on junk. */
hm_status hm_parse_size(const char *s, int64_t *out, hm_err *err);

#ifdef __cplusplus
}
#endif
#endif
