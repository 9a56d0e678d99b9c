/* calib.h - measured per-unit costs on this machine, for `plan`'s predictions.
 *
 * CPU: one decode token through one unit = gate and up matvecs over n_embd, down over n_ff,
 * timed with the quant table's vec_dot on the model's own unit slices (its types, its layout),
 * activations quantised to each type's dot partner once beforehand (as the CPU backend does).
 * Units are spread over layers and experts and touched once before timing, so the timing
 * streams weights from RAM the way decode does, not from cache.
 *
 * GPU (CUDA builds with a device, calib_gpu_cuda.c): the upload rate through the VRAM tier, the
 * GPU time of a hot unit in a decode step's grouped launch, and two decode runs through the public
 * session API (every unit in VRAM; --cpu-moe) from which a per-token cost model is derived; see
 * hm_calib_gpu below. Without CUDA or a device it answers HM_ERR_UNSUPPORTED saying which. */
#ifndef HM_PLAN_CALIB_H
#define HM_PLAN_CALIB_H

#include <stdbool.h>

#include "experts/units.h"

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

/* GPU side of a decode token. Measured:
 *   upload: units copied from the file mapping into VRAM slots (hm_vram_tier fill + wait), after
 *     one untimed round that faults the pages in (so it measures the copy, not the disk);
 *   hot unit: one grouped launch (hm_cuda_moe) of k resident units for one token, per unit;
 *   decode: 3 warm-up + n_decode timed single-token hm_session_eval steps of the model opened
 *     with -ngl (every unit in VRAM, as many as fit) and with -ngl --cpu-moe (every unit on the CPU).
 * Derived (the cost model hm_calib_gpu_token_ms uses), per token:
 *   T = ms_dense + sum over MoE layers of max(k h t_gpu, k (1-h) t_cpu + (1 - h^k) c)
 * where h is the layer's hit rate, t_gpu = us_hot_unit, t_cpu = the CPU calibration's us_unit_nt
 * and c = us_cold_layer, the fixed cost of a layer that has a CPU part (the normed input down, the
 * CPU sum up, the threads' wake-up): the hot units run on the GPU while the CPU computes the cold
 * ones. ms_dense = T(all hot) - the hot units' time; c = (T(cpu-moe) - ms_dense) / layers - k t_cpu. */
typedef struct hm_calib_gpu {
    char device[160];        /* "NVIDIA H200 (sm_90, 139.8 GiB)" */
    bool have_upload, have_unit, have_decode; /* which parts were measured */
    char note[320];          /* why a part is missing (empty when all are there) */
    int32_t upload_units;
    double upload_gbs;       /* GB/s (1e9 bytes) file mapping -> VRAM slots */
    double us_upload_unit;   /* one unit's copy */
    int32_t k, n_moe_layer;
    double us_hot_unit;      /* GPU time of one hot unit for one token (launch of k units / k) */
    int32_t decode_tokens;   /* timed steps of each decode run */
    double ms_tok_hot, hit_hot; /* decode with every unit that fit in VRAM; its measured hit rate */
    double ms_tok_cpu_moe;   /* decode with --cpu-moe */
    double ms_dense;         /* derived: the per-token time without expert work */
    double us_cold_layer;    /* derived: c above */
} hm_calib_gpu;

/* Measure on device 0 with the model at path (u: its units; us_cpu_unit: the CPU calibration's
 * us_unit_nt, <= 0 when unknown). HM_ERR_UNSUPPORTED "built without CUDA" / "no CUDA device";
 * another error when not even the upload could be measured. Parts that fail later are left out
 * (have_* false) with the reason in out->note; HM_OK then. */
hm_status hm_calib_gpu_measure(const char *path, const hm_units *u, int32_t n_threads, double us_cpu_unit,
                               hm_calib_gpu *out, hm_err *err);

/* Predicted decode milliseconds per token under the model above; layer_hit[i] is the hit rate of
 * the i-th MoE layer (n of them). Needs have_unit and have_decode. */
double hm_calib_gpu_token_ms(const hm_calib_gpu *g, double us_cpu_unit, const double *layer_hit, int32_t n);

#endif
