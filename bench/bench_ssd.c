/* bench_ssd.c - how fast this machine's disk delivers expert units: random unit-sized reads of a
 * GGUF model's units (their 4096-aligned spans, as the RAM tier reads them) at 1 / 4 / 16 units
 * in flight, O_DIRECT on and off, next to the baseline of touching the same units through the file
 * mapping (what an mmap-only engine does on a miss), and the calibration `plan` uses.
 * Usage: bench_ssd MODEL.gguf [UNITS]   (UNITS per measurement, default 128). Not a test. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/timer.h"
#include "experts/calib.h"
#include "experts/tier_ssd.h"
#include "gguf/gguf.h"

/* Copy n random units out of the mapping after dropping the file's cached pages: page faults
 * bring them in (readahead included), one unit at a time. MB/s of unit bytes. */
static double mmap_baseline(const char *path, const hm_units *u, int32_t n, double *us_unit) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    hm_gguf *g = NULL;
    hm_err err;
    if (hm_gguf_open(&g, path, &err) != HM_OK) return 0;
    char *dst = malloc(u->unit_bytes_max);
    uint64_t x = 0xD1B54A32D192ED03ull, bytes = 0;
    int64_t t0 = hm_time_us();
    for (int32_t i = 0; i < n && dst; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t ui = (x >> 33) % u->n_units;
        int32_t l = 0;
        while (ui >= (uint64_t)u->layers[l].n_expert) ui -= (uint64_t)u->layers[l++].n_expert;
        const hm_units_layer *L = &u->layers[l];
        size_t pos = 0;
        for (int p = 0; p < HM_UNIT_NPART; p++) {
            if (!L->part[p]) continue;
            const hm_gguf_tensor *t = hm_gguf_find_tensor(g, L->part[p]->name);
            memcpy(dst + pos, (const char *)t->data + ui * L->slab_bytes[p], L->slab_bytes[p]);
            pos += L->slab_bytes[p];
        }
        bytes += pos;
    }
    double us = (double)(hm_time_us() - t0);
    free(dst);
    hm_gguf_close(g);
    *us_unit = us / n;
    return us > 0 ? (double)bytes / us : 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [UNITS]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    int32_t n = argc > 2 ? atoi(argv[2]) : 128;
    hm_gguf *g = NULL;
    hm_units u;
    hm_err err = {{0}};
    if (hm_gguf_open(&g, path, &err) != HM_OK || hm_units_init(&u, g, &err) != HM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    hm_gguf_close(g); /* the tier reads through its own descriptors */
    if (!u.n_units) {
        fprintf(stderr, "%s: no expert units\n", path);
        return 1;
    }
    printf("bench_ssd: %s: %llu units of %.2f-%.2f MiB (slot %.2f MiB), %d units per measurement\n", path,
           (unsigned long long)u.n_units, (double)u.unit_bytes_min / 1048576.0, (double)u.unit_bytes_max / 1048576.0,
           (double)hm_ssd_slot_bytes(&u) / 1048576.0, n);
    printf("%-26s %4s %10s %10s\n", "reads", "qd", "MB/s", "us/unit");
    const int qds[3] = {1, 4, 16};
    for (int d = 0; d < 2; d++)
        for (int q = 0; q < 3; q++) {
            hm_calib_ssd c;
            if (hm_calib_ssd_read(path, &u, 2 * n, qds[q], d == 1, &c, &err) != HM_OK) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            char mode[64];
            snprintf(mode, sizeof mode, "%s, %s", c.uring ? "io_uring" : "pread", c.direct ? "O_DIRECT" : "buffered");
            printf("%-26s %4d %10.0f %10.0f\n", mode, qds[q], c.mbs_qd, c.us_unit_qd);
        }
    double us_mmap = 0, mbs_mmap = mmap_baseline(path, &u, n, &us_mmap);
    printf("%-26s %4d %10.0f %10.0f   (baseline: page faults on the mapping)\n", "mmap + memcpy", 1, mbs_mmap, us_mmap);
    hm_calib_ssd c;
    if (hm_calib_ssd_read(path, &u, 2 * n, 8, false, &c, &err) != HM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("calibration (plan): %.0f us/unit one at a time, %.0f us/unit with 8 in flight (%s, %s)\n", c.us_unit_qd1,
           c.us_unit_qd, c.uring ? "io_uring" : "pread", c.direct ? "O_DIRECT" : "buffered");
    hm_units_free(&u);
    return 0;
}
