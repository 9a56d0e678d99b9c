/* bench_ssd.c - how fast this machine's disk delivers expert units: random unit-sized reads of a
 * GGUF model's units (their 4096-aligned spans, as the RAM tier reads them) at 1 / 4 / 16 units
 * in flight, O_DIRECT on and off, next to the baseline of touching the same units through the file
 * mapping (what an mmap-only engine does on a miss), and the calibration `plan` uses.
 * Then a decode-shaped run of the RAM tier alone (no compute): skewed routes, k units per layer,
 * a RAM budget of a quarter of the experts, LRU, without and with prefetch (predictions = the true
 * routes with one of k replaced, ~88 % recall), printing hit rates, bytes read and time blocked
 * per token. Usage: bench_ssd MODEL.gguf [UNITS]   (UNITS per measurement, default 128). Not a test. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/timer.h"
#include "plan/calib.h"
#include "experts/tier_ram.h"
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

static uint64_t rng(uint64_t *x) {
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

/* k distinct experts of n, skewed: half the picks from the first n/8. */
static void route(uint64_t *x, int32_t n, int32_t k, int32_t *ids) {
    for (int32_t i = 0; i < k;) {
        int32_t e = (int32_t)(rng(x) % 2 ? rng(x) % (uint64_t)(n / 8 > 0 ? n / 8 : 1) : rng(x) % (uint64_t)n);
        bool dup = false;
        for (int32_t j = 0; j < i; j++) dup |= ids[j] == e;
        if (!dup) ids[i++] = e;
    }
}

static int decode_run(const char *path, const hm_units *u, bool prefetch, int32_t n_tok) {
    hm_ram_tier_opts o;
    hm_ram_tier_opts_default(&o);
    o.budget = (int64_t)(u->expert_bytes / 4);
    o.policy.kind = HM_POLICY_LRU;
    hm_ram_tier *t = NULL;
    hm_err err = {{0}};
    if (hm_ram_tier_open(&t, path, u, &o, &err) != HM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int32_t k = u->n_expert_used > 0 ? u->n_expert_used : 8, nl = u->n_layer;
    int32_t *ids = malloc((size_t)nl * (size_t)k * sizeof *ids), pred[64];
    hm_unit_parts parts[64];
    uint64_t x = 42;
    int64_t t0 = hm_time_us();
    for (int32_t tok = 0; tok < n_tok && k <= 64; tok++) {
        for (int32_t l = 0; l < nl; l++) route(&x, u->layers[l].n_expert, k, ids + l * k);
        for (int32_t l = 0; l < nl; l++) {
            if (!u->layers[l].n_expert) continue;
            if (prefetch && l == 0) hm_ram_tier_prefetch(t, 0, ids, k);
            int32_t n = 0;
            if (hm_ram_tier_acquire(t, l, ids + l * k, NULL, k, parts, &n, &err) != HM_OK || n != k) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            if (prefetch && l + 1 < nl && u->layers[l + 1].n_expert) { /* one of k predicted wrong */
                memcpy(pred, ids + (l + 1) * k, (size_t)k * sizeof *pred);
                pred[rng(&x) % (uint64_t)k] = (int32_t)(rng(&x) % (uint64_t)u->layers[l + 1].n_expert);
                hm_ram_tier_prefetch(t, l + 1, pred, k);
            }
            hm_ram_tier_release(t, l, ids + l * k, n);
        }
        if (hm_ram_tier_step_end(t, 1, false, &err) != HM_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    }
    double s_all = (double)(hm_time_us() - t0) / 1e6;
    hm_ram_tier_stats s;
    hm_ram_tier_get_stats(t, &s);
    double a = (double)(s.acquired ? s.acquired : 1);
    printf("%-9s %5.1f%% %5.1f%% %5.1f%% %6.1f%% %6.1f%% %9.1f %9.2f %8.1f\n", prefetch ? "prefetch" : "demand",
           100.0 * (double)(s.hit_slot + s.hit_stage) / a, 100.0 * (double)s.hit_prefetch / a,
           100.0 * (double)(s.hit_slot + s.hit_stage + s.hit_prefetch) / a,
           s.pred ? 100.0 * (double)s.pred_used / (double)s.pred : 0.0,
           s.acq_predicted ? 100.0 * (double)s.pred_used / (double)s.acq_predicted : 0.0,
           (double)s.read_bytes / 1048576.0 / (double)s.tokens, s.wait_us / 1000.0 / (double)s.tokens,
           (double)s.tokens / s_all);
    free(ids);
    hm_ram_tier_close(t);
    return 0;
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
    printf("\nRAM tier, decode-shaped (no compute): budget %.0f MiB of %.0f MiB experts, LRU, 64 tokens\n",
           (double)(u.expert_bytes / 4) / 1048576.0, (double)u.expert_bytes / 1048576.0);
    printf("%-9s %6s %6s %6s %7s %7s %9s %9s %8s\n", "mode", "cache", "pref", "hit", "prec", "recall", "MiB/tok",
           "wait ms", "tok/s");
    if (decode_run(path, &u, false, 64) || decode_run(path, &u, true, 64)) return 1;
    hm_units_free(&u);
    hm_gguf_close(g); /* u points at its tensor table */
    return 0;
}
