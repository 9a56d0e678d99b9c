/* calib_ssd.c - `plan`'s SSD measurement (calib.h): microseconds per expert unit read from the
 * model file through the SSD tier's reader (experts/tier_ssd.h), one unit at a time and with
 * several in flight. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "calib.h"
#include "core/alloc.h"
#include "core/timer.h"
#include "experts/tier_ssd.h"

/* Read units order[0 .. n) with qd units in flight through io (requests 0 .. qd-1 over bufs);
 * elapsed microseconds, or < 0 on a read error (err filled). */
static double timed_reads(hm_ssd *io, const hm_units *u, char *bufs, size_t slot, const int32_t *order, int32_t n,
                          int32_t qd, hm_err *err) {
    int64_t t0 = hm_time_us();
    int32_t next = 0, done = 0;
    for (int32_t r = 0; r < qd && next < n; r++, next++) {
        int32_t ui = order[next], l = 0;
        while (ui >= u->layers[l].n_expert) ui -= u->layers[l++].n_expert;
        hm_ssd_start(io, r, l, ui, bufs + (size_t)r * slot);
    }
    for (int32_t r = 0; done < n; r = (r + 1) % qd, done++) {
        if (hm_ssd_wait(io, r, err) != HM_OK) return -1; /* the caller's hm_ssd_close drains the rest */
        if (next < n) {
            int32_t ui = order[next++], l = 0;
            while (ui >= u->layers[l].n_expert) ui -= u->layers[l++].n_expert;
            hm_ssd_start(io, r, l, ui, bufs + (size_t)r * slot);
        }
    }
    return (double)(hm_time_us() - t0);
}

hm_status hm_calib_ssd_read(const char *path, const hm_units *u, int32_t n_units, int32_t queue_depth, bool no_direct,
                            hm_calib_ssd *out, hm_err *err) {
    memset(out, 0, sizeof *out);
    if (!u->n_units || n_units < 1 || queue_depth < 1 || queue_depth > 1024)
        return hm_errf(err, HM_ERR_ARG, "%s: SSD calibration needs expert units, n_units >= 1, 1 <= queue depth <= 1024",
                       path);
    if ((uint64_t)n_units > u->n_units) n_units = (int32_t)u->n_units;
    size_t slot = hm_ssd_slot_bytes(u);
    int32_t *order = malloc((size_t)u->n_units * sizeof *order);
    char *bufs = mmap(NULL, slot * (size_t)queue_depth, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    hm_ssd *io = NULL;
    hm_status st = HM_OK;
    if (!order || bufs == MAP_FAILED) {
        st = hm_errf(err, HM_ERR_NOMEM, "SSD calibration: out of memory for %d buffers of %zu bytes", queue_depth, slot);
        goto done;
    }
    hm_ssd_opts o;
    hm_ssd_opts_default(&o);
    o.no_direct = no_direct;
    o.queue_depth = queue_depth * HM_UNIT_NPART;
    if ((st = hm_ssd_open(&io, path, u, queue_depth, &o, err)) != HM_OK) goto done;
    uint64_t x = 0x9E3779B97F4A7C15ull; /* a fixed shuffle: the same units each run */
    for (uint64_t i = 0; i < u->n_units; i++) order[i] = (int32_t)i;
    for (uint64_t i = u->n_units - 1; i > 0; i--) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t j = (x >> 33) % (i + 1);
        int32_t tmp = order[i];
        order[i] = order[j], order[j] = tmp;
    }
    int32_t half = n_units / 2 > 0 ? n_units / 2 : 1; /* distinct units in each run: nothing comes from cache */
    int32_t n1 = half, nq = n_units - half > 0 ? n_units - half : half;
    const int32_t *o1 = order, *oq = n_units - half > 0 ? order + half : order;
    hm_ssd_stats s0, s1, s2;
    hm_ssd_get_stats(io, &s0);
    hm_ssd_drop_cache(io);
    double us1 = timed_reads(io, u, bufs, slot, o1, n1, 1, err);
    hm_ssd_get_stats(io, &s1);
    hm_ssd_drop_cache(io);
    double usq = us1 < 0 ? -1 : timed_reads(io, u, bufs, slot, oq, nq, queue_depth, err);
    hm_ssd_get_stats(io, &s2);
    if (us1 < 0 || usq < 0) {
        st = HM_ERR_IO;
        goto done;
    }
    out->n_units = n1;
    out->queue_depth = queue_depth;
    out->direct = s2.direct;
    out->uring = s2.uring;
    out->us_unit_qd1 = us1 / n1;
    out->us_unit_qd = usq / nq;
    out->mbs_qd1 = us1 > 0 ? (double)(s1.bytes - s0.bytes) / us1 : 0;
    out->mbs_qd = usq > 0 ? (double)(s2.bytes - s1.bytes) / usq : 0;
done:
    hm_ssd_close(io);
    if (bufs != MAP_FAILED) munmap(bufs, slot * (size_t)queue_depth);
    free(order);
    return st;
}
