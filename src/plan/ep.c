/* ep.c - expert-parallel placements of a profile and their load imbalance (see ep.h).
 *
 * Per layer, O(R * E) for the replicas (a scan for the most load per copy, as the algorithm is
 * stated) and O(P log P + P * N) for the packing; for 256 experts, 8 devices and 61 layers that is
 * well under a millisecond, so no heap. */
#include "ep.h"

#include <stdlib.h>
#include <string.h>

void hm_ep_layout_free(hm_ep_layout *l) {
    if (!l) return;
    free(l->phys_to_log);
    free(l->copies);
    free(l->dev_load);
    memset(l, 0, sizeof *l);
}

typedef struct phys_item {
    double load;
    int32_t phys;
} phys_item;

/* Heaviest first; equal loads by the lower physical index (a stable order). */
static int by_load_desc(const void *a, const void *b) {
    const phys_item *x = a, *y = b;
    if (x->load != y->load) return x->load < y->load ? 1 : -1;
    return (x->phys > y->phys) - (x->phys < y->phys);
}

/* One layer, balanced: replicas, then packing. w [E]; p2l [P], copies [E], load [N] out; scratch
 * items [P], fill [N], log_of [P] (the logical expert of each physical one before packing). */
static void balance_layer(const uint64_t *w, int32_t E, int32_t N, int32_t P, int32_t *p2l, int32_t *copies,
                          double *load, phys_item *items, int32_t *fill, int32_t *log_of) {
    for (int32_t e = 0; e < E; e++) copies[e] = 1, log_of[e] = e;
    for (int32_t p = E; p < P; p++) { /* each replica to the most load per copy, lowest id on ties */
        int32_t best = 0;
        double best_r = -1;
        for (int32_t e = 0; e < E; e++) {
            double r = (double)w[e] / copies[e];
            if (r > best_r) best_r = r, best = e;
        }
        log_of[p] = best;
        copies[best]++;
    }
    for (int32_t p = 0; p < P; p++) items[p] = (phys_item){(double)w[log_of[p]] / copies[log_of[p]], p};
    qsort(items, (size_t)P, sizeof *items, by_load_desc);
    const int32_t per = P / N;
    for (int32_t d = 0; d < N; d++) load[d] = 0, fill[d] = 0;
    for (int32_t i = 0; i < P; i++) { /* onto the least-loaded device with a free slot, lowest on ties */
        int32_t best = -1;
        for (int32_t d = 0; d < N; d++)
            if (fill[d] < per && (best < 0 || load[d] < load[best])) best = d;
        p2l[best * per + fill[best]] = log_of[items[i].phys];
        fill[best]++;
        load[best] += items[i].load;
    }
}

hm_status hm_ep_place(hm_ep_layout *out, hm_ep_kind kind, const uint64_t *counts, int32_t n_layer, int32_t n_expert,
                      int32_t n_dev, int32_t n_redundant, hm_err *err) {
    memset(out, 0, sizeof *out);
    if (n_layer < 1 || n_expert < 1) return hm_errf(err, HM_ERR_ARG, "ep: no experts to place");
    if (n_dev < 1 || n_dev > 65536) return hm_errf(err, HM_ERR_ARG, "ep: %d devices is out of range [1, 65536]", n_dev);
    if (n_redundant < 0 || n_redundant > 1 << 20)
        return hm_errf(err, HM_ERR_ARG, "ep: %d replicas is out of range", n_redundant);
    if (kind == HM_EP_CONTIGUOUS && n_redundant)
        return hm_errf(err, HM_ERR_ARG, "ep: the contiguous split has no replicas");
    const int32_t P = n_expert + n_redundant;
    if (P % n_dev)
        return hm_errf(err, HM_ERR_ARG, "ep: %d experts + %d replicas do not split evenly over %d devices "
                       "(SGLang needs the physical experts to be a multiple of the EP size)", n_expert, n_redundant,
                       n_dev);
    const size_t L = (size_t)n_layer;
    out->phys_to_log = malloc(L * (size_t)P * sizeof *out->phys_to_log);
    out->copies = malloc(L * (size_t)n_expert * sizeof *out->copies);
    out->dev_load = calloc(L * (size_t)n_dev, sizeof *out->dev_load);
    phys_item *items = malloc((size_t)P * sizeof *items);
    int32_t *fill = malloc((size_t)n_dev * sizeof *fill), *log_of = malloc((size_t)P * sizeof *log_of);
    if (!out->phys_to_log || !out->copies || !out->dev_load || !items || !fill || !log_of) {
        free(items), free(fill), free(log_of);
        hm_ep_layout_free(out);
        return hm_errf(err, HM_ERR_NOMEM, "ep: out of memory for %d layers x %d slots", n_layer, P);
    }
    out->n_layer = n_layer, out->n_expert = n_expert, out->n_dev = n_dev, out->n_phys = P;
    const int32_t per = P / n_dev;
    for (size_t l = 0; l < L; l++) {
        const uint64_t *w = counts + l * (size_t)n_expert;
        int32_t *p2l = out->phys_to_log + l * (size_t)P, *cp = out->copies + l * (size_t)n_expert;
        double *load = out->dev_load + l * (size_t)n_dev;
        if (kind == HM_EP_BALANCED) {
            balance_layer(w, n_expert, n_dev, P, p2l, cp, load, items, fill, log_of);
        } else {
            for (int32_t p = 0; p < P; p++) p2l[p] = p, load[p / per] += (double)w[p];
            for (int32_t e = 0; e < n_expert; e++) cp[e] = 1;
        }
    }
    free(items), free(fill), free(log_of);
    return HM_OK;
}

double hm_ep_layer_imbalance(const hm_ep_layout *l, int32_t layer) {
    const double *load = l->dev_load + (size_t)layer * (size_t)l->n_dev;
    double mx = 0, sum = 0;
    for (int32_t d = 0; d < l->n_dev; d++) {
        sum += load[d];
        if (load[d] > mx) mx = load[d];
    }
    return sum > 0 ? mx / (sum / l->n_dev) : 0.0;
}

void hm_ep_summarize(const hm_ep_layout *l, hm_ep_summary *s) {
    memset(s, 0, sizeof *s);
    s->worst_layer = -1;
    double sum_max = 0, sum_mean = 0;
    for (int32_t i = 0; i < l->n_layer; i++) {
        double im = hm_ep_layer_imbalance(l, i);
        if (im <= 0) continue;
        const double *load = l->dev_load + (size_t)i * (size_t)l->n_dev;
        double mx = 0, sum = 0;
        for (int32_t d = 0; d < l->n_dev; d++) sum += load[d], mx = load[d] > mx ? load[d] : mx;
        sum_max += mx, sum_mean += sum / l->n_dev;
        s->n_moe_layers++;
        s->mean_imbalance += im;
        if (im > s->worst_imbalance) s->worst_imbalance = im, s->worst_layer = i;
    }
    if (s->n_moe_layers) s->mean_imbalance /= s->n_moe_layers;
    s->step_cost = sum_mean > 0 ? sum_max / sum_mean : 0.0;
}
