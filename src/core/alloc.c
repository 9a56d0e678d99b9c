/* alloc.c - aligned allocation and locking memory in RAM. */
#include "alloc.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

void *hm_malloc_aligned(size_t size) {
    if (size == 0) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, HM_ALIGN, hm_align_up(size, HM_ALIGN)) != 0) return NULL;
    return p;
}

void *hm_calloc_aligned(size_t size) {
    void *p = hm_malloc_aligned(size);
    if (p) memset(p, 0, size);
    return p;
}

void hm_free_aligned(void *p) { free(p); }

hm_status hm_mlock_fits(uint64_t n, uint64_t phys, const char *what, hm_err *err) {
    if (!phys) return HM_OK; /* unknown: the kernel decides */
    const uint64_t gib = 1ull << 30, reserve = phys / 10 > gib ? phys / 10 : gib;
    if (n <= phys && phys - n >= reserve) return HM_OK;
    return hm_errf(err, HM_ERR_NOMEM, "--mlock: %s (%" PRIu64 " MiB) cannot be locked in this machine's %" PRIu64
                   " MiB of RAM and leave %" PRIu64 " MiB for the rest; run without --mlock, or with --ram-budget to "
                   "keep only part of the experts in RAM", what, n >> 20, phys >> 20, reserve >> 20);
}

uint64_t hm_phys_ram_bytes(void) {
    const long pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
    return pages > 0 && pg > 0 ? (uint64_t)pages * (uint64_t)pg : 0;
}

uint64_t hm_mem_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    fclose(f);
    return found ? (uint64_t)kib * 1024 : 0;
}

hm_status hm_mlock_range(const void *p, size_t n, const char *what, hm_err *err) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p / pg * pg;
    const uintptr_t hi = ((uintptr_t)p + n + pg - 1) / pg * pg;
    hm_status st = hm_mlock_fits((uint64_t)(hi - lo), hm_phys_ram_bytes(), what, err);
    if (st != HM_OK) return st;
    if (mlock((const void *)lo, (size_t)(hi - lo)) == 0) return HM_OK;
    const int e = errno;
    struct rlimit rl;
    char lim[64] = "unknown";
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY) snprintf(lim, sizeof lim, "unlimited");
        else snprintf(lim, sizeof lim, "%" PRIu64 " KiB", (uint64_t)rl.rlim_cur / 1024);
    }
    return hm_errf(err, HM_ERR_IO, "--mlock: locking %s (%zu MiB) in RAM failed: %s (RLIMIT_MEMLOCK is %s; raise it "
                   "with `ulimit -l unlimited`, LimitMEMLOCK= for a service, or grant CAP_IPC_LOCK; or run without "
                   "--mlock)", what, (size_t)(hi - lo) >> 20, strerror(e), lim);
}
