/* plan_ep.c - `hotmoe plan --ep N` (hm_plan_ep, hotmoe_tools.h): the step from one box to a
 * cluster. From a profile alone, each MoE layer's experts over N devices three ways (ep.h): a
 * contiguous split, balanced packing, and balanced with replicas as SGLang's EPLB places them from
 * the same counts exported with `--export sglang`; printed as per-device loads and imbalance. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "ep.h"
#include "experts/profile.h"
#include "hotmoe_tools.h"
#include "sim.h"

enum { EP_CONTIG, EP_PACKED, EP_EPLB, EP_N };
static const char *const ep_label[EP_N] = {"contiguous split", "balanced, no replicas", "balanced + replicas (EPLB)"};
static const char *const ep_key[EP_N] = {"contiguous", "balanced", "eplb"};

typedef struct ep_run {
    bool ok;
    char why[256]; /* when !ok */
    hm_ep_layout lay;
    hm_ep_summary sum;
    double *dev_total; /* [n_dev]: load summed over layers */
} ep_run;

static void run_one(ep_run *r, hm_ep_kind kind, const hm_profile *p, int32_t n_dev, int32_t n_red) {
    hm_err e = {{0}};
    if (hm_ep_place(&r->lay, kind, p->counts, p->n_layer, p->n_expert, n_dev, n_red, &e) != HM_OK) {
        snprintf(r->why, sizeof r->why, "%s", e.msg);
        return;
    }
    if (!(r->dev_total = calloc((size_t)n_dev, sizeof *r->dev_total))) {
        snprintf(r->why, sizeof r->why, "out of memory");
        return;
    }
    for (int32_t l = 0; l < p->n_layer; l++)
        for (int32_t d = 0; d < n_dev; d++) r->dev_total[d] += r->lay.dev_load[(size_t)l * (size_t)n_dev + (size_t)d];
    hm_ep_summarize(&r->lay, &r->sum);
    r->ok = true;
}

static void print_text(FILE *out, const char *src, const hm_profile *p, int32_t n_dev, int32_t n_red, const ep_run *r) {
    double all = 0;
    for (size_t i = 0; i < (size_t)p->n_layer * (size_t)p->n_expert; i++) all += (double)p->counts[i];
    fprintf(out, "Expert parallelism over %d devices: %s (%d of %d layers with routed load, %d experts)\n", n_dev, src,
            r[EP_PACKED].ok ? r[EP_PACKED].sum.n_moe_layers : 0, p->n_layer, p->n_expert);
    fprintf(out, "Each layer waits for its busiest device: imbalance = the busiest device's routed tokens / the mean\n"
                 "(1.00 = even), averaged over the layers with load.\n\n");
    fprintf(out, "  %-30s %12s %10s %22s\n", "placement", "slots/device", "imbalance", "worst layer");
    for (int k = 0; k < EP_N; k++) {
        char label[64];
        if (k == EP_EPLB) snprintf(label, sizeof label, "balanced + %d replicas (EPLB)", n_red);
        else snprintf(label, sizeof label, "%s", ep_label[k]);
        if (!r[k].ok) {
            fprintf(out, "  %-30s  n/a: %s\n", label, r[k].why);
            continue;
        }
        char worst[48];
        snprintf(worst, sizeof worst, "%.3f (layer %d)", r[k].sum.worst_imbalance, r[k].sum.worst_layer);
        fprintf(out, "  %-30s %12d %10.3f %22s\n", label, r[k].lay.n_phys / n_dev, r[k].sum.mean_imbalance, worst);
    }
    fprintf(out, "\nPer device, all layers summed (share of the %.0f routed tokens; even = %.2f%%):\n", all,
            100.0 / n_dev);
    fprintf(out, "  %-7s", "device");
    for (int k = 0; k < EP_N; k++) fprintf(out, " %14s", ep_key[k]);
    fprintf(out, "\n");
    for (int32_t d = 0; d < n_dev; d++) {
        fprintf(out, "  %-7d", d);
        for (int k = 0; k < EP_N; k++) {
            if (r[k].ok && all > 0) fprintf(out, " %13.2f%%", 100.0 * r[k].dev_total[d] / all);
            else fprintf(out, " %14s", "n/a");
        }
        fprintf(out, "\n");
    }
    fprintf(out, "\nhotmoe itself splits layers, not experts, over several GPUs (-ts, per-device --vram-budget):\n"
                 "each device runs whole layers in turn. Under expert parallelism every layer is spread over all\n"
                 "devices. SGLang places the same counts: `hotmoe profile -i PROFILE --export sglang -o F.json`, then\n"
                 "`--ep-size %d --ep-num-redundant-experts %d --init-expert-location F.json` (docs/CLUSTER.md).\n",
            n_dev, n_red);
}

static json_t *run_json(const ep_run *r, const hm_profile *p, int32_t n_dev) {
    if (!r->ok) return json_pack("{s:s}", "error", r->why);
    json_t *o = json_object(), *tot = json_array(), *layers = json_array();
    for (int32_t d = 0; d < n_dev; d++) json_array_append_new(tot, json_real(r->dev_total[d]));
    for (int32_t l = 0; l < p->n_layer; l++) {
        json_t *a = json_array();
        for (int32_t d = 0; d < n_dev; d++)
            json_array_append_new(a, json_real(r->lay.dev_load[(size_t)l * (size_t)n_dev + (size_t)d]));
        json_array_append_new(layers, a);
    }
    json_object_set_new(o, "slots_per_device", json_integer(r->lay.n_phys / n_dev));
    json_object_set_new(o, "replicas", json_integer(r->lay.n_phys - p->n_expert));
    json_object_set_new(o, "mean_imbalance", json_real(r->sum.mean_imbalance));
    json_object_set_new(o, "worst_imbalance", json_real(r->sum.worst_imbalance));
    json_object_set_new(o, "worst_layer", json_integer(r->sum.worst_layer));
    json_object_set_new(o, "step_cost", json_real(r->sum.step_cost));
    json_object_set_new(o, "device_load", tot);
    json_object_set_new(o, "layer_device_load", layers);
    return o;
}

hm_status hm_plan_ep(const hm_plan_opts *o, FILE *out, hm_err *err) {
    const char *src = o->profile_path ? o->profile_path : o->trace_path;
    if (!src) return hm_errf(err, HM_ERR_ARG, "--ep needs usage data: --profile FILE or --trace FILE");
    hm_profile p;
    hm_status st = o->profile_path ? hm_profile_read(&p, o->profile_path, err)
                                   : hm_sim_trace_profile(o->trace_path, 0, 0, &p, err);
    if (st != HM_OK) return st;
    const int32_t n_dev = o->ep_devices, E = p.n_expert;
    if (n_dev < 1 || n_dev > E) {
        hm_profile_free(&p);
        return hm_errf(err, HM_ERR_ARG, "--ep %d: give 1 to %d devices (the profile has %d experts per layer)", n_dev, E,
                       E);
    }
    int32_t n_red = o->ep_redundant;
    if (n_red < 0) n_red = n_dev + (n_dev - (E + n_dev) % n_dev) % n_dev; /* one per device, evened up */
    ep_run r[EP_N];
    memset(r, 0, sizeof r);
    run_one(&r[EP_CONTIG], HM_EP_CONTIGUOUS, &p, n_dev, 0);
    run_one(&r[EP_PACKED], HM_EP_BALANCED, &p, n_dev, 0);
    run_one(&r[EP_EPLB], HM_EP_BALANCED, &p, n_dev, n_red);
    if (!r[EP_EPLB].ok && (E + n_red) % n_dev) {
        st = hm_errf(err, HM_ERR_ARG, "--ep-redundant %d: %d experts + %d replicas do not split evenly over %d devices",
                     n_red, E, n_red, n_dev);
    } else if (o->json) {
        json_t *j = json_pack("{s:s, s:i, s:i, s:i, s:i}", "profile", src, "devices", n_dev, "n_layer", p.n_layer,
                              "n_expert", E, "moe_layers", r[EP_PACKED].ok ? r[EP_PACKED].sum.n_moe_layers : 0);
        if (!j) { /* a path that is not UTF-8 */
            st = hm_errf(err, HM_ERR_ARG, "--json: the profile's path is not UTF-8 text");
        } else {
            for (int k = 0; k < EP_N; k++) json_object_set_new(j, ep_key[k], run_json(&r[k], &p, n_dev));
            json_dumpf(j, out, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
            fputc('\n', out);
            json_decref(j);
        }
    } else {
        print_text(out, src, &p, n_dev, n_red, r);
    }
    for (int k = 0; k < EP_N; k++) {
        hm_ep_layout_free(&r[k].lay);
        free(r[k].dev_total);
    }
    hm_profile_free(&p);
    return st;
}
