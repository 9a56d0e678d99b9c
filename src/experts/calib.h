/* calib.h - measured per-unit costs on this machine, for `plan`'s predictions.
 *
 * CPU: one decode token through one unit = gate and up matvecs over n_embd, down over n_ff,
 * timed with the quant table's vec_dot on the model's own unit slices (its types, its layout),
 * activations quantised to each type's dot partner once beforehand (as the CPU backend does).
 * Units are spread over layers and experts and touched once before timing, so the timing
 * streams weights from RAM the way decode does, not from cache. GPU and upload costs join when
 * the CUDA backend does (issue 5). */
#ifndef HM_EXPERTS_CALIB_H
#define HM_EXPERTS_CALIB_H

#include <stdbool.h>

#include "units.h"

typedef struct hm_calib {
    int32_t n_units;      /* units timed */
    double us_unit_1t;    /* one unit, one thread, microseconds */
    int32_t n_threads;
    double us_unit_nt;    /* one unit with rows split over n_threads */
    double gbs_nt;        /* unit bytes / us_unit_nt: the bandwidth that reached */
} hm_calib;

/* Time units of u (from a real file: parts present). n_threads >= 1. HM_ERR_UNSUPPORTED when a
 * unit's type has no vec_dot. */
hm_status hm_calib_cpu(const hm_units *u, int32_t n_threads, hm_calib *out, hm_err *err);

/* SSD: reading whole units (their 4096-aligned spans, as the RAM tier does, tier_ssd.h) from the
 * model file into RAM, over up to n_units distinct units in random order, first one read at a
 * time, then queue_depth units in flight. O_DIRECT unless no_direct or the file system refuses it;
 * buffered reads first drop the file's cached pages (posix_fadvise) so they measure the disk. */
typedef struct hm_calib_ssd {
    int32_t n_units;      /* units read in each measurement */
    int32_t queue_depth;  /* units in flight in the second one */
    bool direct, uring;   /* what the reads went through */
    double us_unit_qd1;   /* microseconds per unit, one at a time: a lone miss */
    double us_unit_qd;    /* per unit with queue_depth in flight: a layer's misses read together */
    double mbs_qd1, mbs_qd; /* MB/s (1e6 bytes) of those */
} hm_calib_ssd;

hm_status hm_calib_ssd_read(const char *path, const hm_units *u, int32_t n_units, int32_t queue_depth, bool no_direct,
                            hm_calib_ssd *out, hm_err *err);

#endif
