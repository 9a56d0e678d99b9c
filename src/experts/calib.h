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

#endif
