/* alloc.h - aligned allocation, size-checked arithmetic and locking memory in RAM.
 *
 * Sizes that come from files or users go through the checked helpers so an overflow becomes an
 * error instead of a short allocation. */
#ifndef HM_CORE_ALLOC_H
#define HM_CORE_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define HM_ALIGN 64 /* cache line; enough for AVX-512 loads */

/* Owned result, free with hm_free_aligned. NULL on failure or size 0. */
void *hm_malloc_aligned(size_t size);
void *hm_calloc_aligned(size_t size); /* zeroed */
void hm_free_aligned(void *p);

/* a*b / a+b into *out; false on overflow. */
static inline bool hm_mul_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool hm_add_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
static inline uint64_t hm_align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Whether n bytes may be locked in a machine of phys bytes of RAM: at most phys less a reserve
 * for everything else (a tenth of it, at least 1 GiB). Else HM_ERR_NOMEM with a message naming
 * `what`, both sizes and what to do instead: locking more would leave the machine without memory
 * (mlock as root, or pinning for the GPU, is not stopped by RLIMIT_MEMLOCK). */
hm_status hm_mlock_fits(uint64_t n, uint64_t phys, const char *what, hm_err *err);
/* This machine's RAM in bytes (sysconf), 0 when unknown. */
uint64_t hm_phys_ram_bytes(void);
/* RAM that can be given to new allocations without swapping now: /proc/meminfo's MemAvailable
 * (free memory plus reclaimable page cache), 0 when unknown. */
uint64_t hm_mem_available_bytes(void);

/* Lock the pages of [p, p + n) in RAM (mlock; the range is widened to whole pages), after
 * hm_mlock_fits against this machine's RAM. Failure is HM_ERR_NOMEM from that, or HM_ERR_IO with a
 * message that names `what`, the limit (RLIMIT_MEMLOCK) and how to raise it. */
hm_status hm_mlock_range(const void *p, size_t n, const char *what, hm_err *err);

#endif
