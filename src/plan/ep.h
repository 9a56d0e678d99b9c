/* ep.h - expert-parallel placement of a usage profile over N devices (`hotmoe plan --ep N`).
 *
 * Under expert parallelism every device holds a share of each MoE layer's experts and a layer
 * waits for its busiest device, so what matters is each layer's per-device load (routed tokens)
 * against the mean. Three placements of the same profile:
 *   - contiguous: experts [d*E/N, (d+1)*E/N) on device d, no replicas (SGLang's "trivial" start);
 *   - balanced, no replicas: each layer's experts packed onto the devices by load;
 *   - balanced with R replicas (EPLB): the R extra physical slots go one at a time to the expert
 *     with the most load per copy (a copy takes load / copies), then the E + R physical experts are
 *     packed, heaviest first, each onto the least-loaded device that still has a free slot, every
 *     device ending with exactly (E + R) / N. That is DeepSeek's EPLB global policy (one group,
 *     one node) as SGLang runs it for --init-expert-location; ties go to the lower expert id and the
 *     lower device, equal loads being interchangeable so the loads do not depend on how ties fall.
 * Loads are doubles (a replicated expert's count divided by its copies). Layers whose counts are
 * all zero (dense layers) have no imbalance and are left out of the means. */
#ifndef HM_PLAN_EP_H
#define HM_PLAN_EP_H

#include <stdint.h>

#include "core/status.h"

typedef struct hm_ep_layout {
    int32_t n_layer, n_expert, n_dev, n_phys; /* n_phys = n_expert + replicas, a multiple of n_dev */
    int32_t *phys_to_log; /* [n_layer * n_phys]: physical slot p of a layer lives on device
                             p / (n_phys / n_dev); owned */
    int32_t *copies;      /* [n_layer * n_expert]: physical copies of each expert (>= 1); owned */
    double *dev_load;     /* [n_layer * n_dev]: routed tokens each device computes; owned */
} hm_ep_layout;

typedef enum hm_ep_kind { HM_EP_CONTIGUOUS = 0, HM_EP_BALANCED = 1 } hm_ep_kind;

/* Place counts [n_layer * n_expert] (row = layer) over n_dev devices with n_redundant replicas
 * (balanced only; contiguous takes 0). HM_ERR_ARG (message says why) when n_dev < 1, n_redundant
 * < 0, (n_expert + n_redundant) % n_dev != 0 for balanced, or n_dev > n_expert for contiguous.
 * out is owned by the caller (hm_ep_layout_free) and empty on failure. */
hm_status hm_ep_place(hm_ep_layout *out, hm_ep_kind kind, const uint64_t *counts, int32_t n_layer, int32_t n_expert,
                      int32_t n_dev, int32_t n_redundant, hm_err *err);
void hm_ep_layout_free(hm_ep_layout *l); /* NULL-safe, idempotent */

/* Layer l's max / mean device load (1 = perfect); 0 for a layer without load. */
double hm_ep_layer_imbalance(const hm_ep_layout *l, int32_t layer);

typedef struct hm_ep_summary {
    int32_t n_moe_layers;    /* layers with load */
    double mean_imbalance;   /* mean of the per-layer max/mean over those layers */
    double worst_imbalance;  /* the largest, at worst_layer (-1 when none) */
    int32_t worst_layer;
    double step_cost;        /* sum over layers of the busiest device's load / sum of the mean
                                loads: how much longer the layers take than perfectly balanced */
} hm_ep_summary;
void hm_ep_summarize(const hm_ep_layout *l, hm_ep_summary *s);

#endif
