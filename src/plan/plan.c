/* plan.c - `hotmoe plan`: placement, hit rates and predicted speed for a fast-tier budget
 * (hotmoe.h, hm_plan). Every policy runs through the real store with a bookkeeping-only fast tier:
 * static's in-sample rate from the profile's own counts, and every policy replayed on the same
 * routing (the trace, or a synthetic trace sampled from the profile, sim.h). The llama.cpp
 * equivalent is --n-cpu-moe N: the experts of layers 0..N-1 on the CPU, all of the others in
 * VRAM; its hit rate is the share of routed slots in the GPU layers. With a GPU (CUDA build and a
 * device) the GPU side is measured too (calib.h, hm_calib_gpu) and both placements get a predicted
 * decode tok/s from the per-layer hit rates; without one the report says why not.
 *
 * With a RAM budget (--ram-budget, models larger than RAM, tier_ram.h) the RAM tier is planned the
 * same way: its policy slots are the pool's buffers less the staging ones (as hm_ram_tier_open cuts
 * them); the tiers are exclusive, so VRAM and RAM together hold the units of one placement of
 * vram + ram slots and the RAM tier's hits are that placement's hits less the VRAM tier's (exact
 * for static, which fills RAM with the best units not in VRAM; an approximation for online/lru,
 * whose RAM policy sees only the routes VRAM missed). Staging buffers also keep recently read
 * units, which this leaves out (a slight underestimate of the RAM hits). Everything else is read
 * from the file; with the model, a calibration read (hm_calib_ssd_read) prices that. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "calib.h"
#include "experts/experts.h"
#include "experts/tier_ssd.h"
#include "gguf/gguf.h"
#include "hotmoe_tools.h"
#include "exec/gpu_split.h"
#include "sim.h"

/* Units the RAM tier reads at once: its io_uring holds 16 range reads (tier_ssd.c's default),
 * a unit is 3 of them (gate, up, down). */
#define PLAN_SSD_QD_UNITS 5
#define PLAN_SSD_CALIB_UNITS 64

void hm_plan_opts_default(hm_plan_opts *o) {
    memset(o, 0, sizeof *o);
    o->budget = -1;
    o->budget_frac = -1;
    o->ram_budget = -1;
    o->ram_budget_frac = -1;
    o->update_rate = -1;
    o->elite_pct = -1;
    o->seed = 1;
    o->calibrate = true;
    o->ep_redundant = -1;
}

typedef struct pol_run {
    bool done;
    double hit;             /* overall */
    uint64_t *lhit, *ltot;  /* [n_layer] */
    int32_t *resident;      /* [n_layer] at the end */
    uint8_t *chosen;        /* [n_units] HOT at the end (layer-major) */
    uint64_t swaps_in;
} pol_run;

typedef struct plan {
    const hm_plan_opts *o;
    hm_units units;
    hm_gguf *gguf;
    hm_profile prof;        /* the profile, or the trace's counts */
    bool have_prof;
    char model[256], arch[64];
    int32_t k;
    int64_t slots;
    uint64_t budget_bytes;
    hm_policy_kind kind;
    int64_t sim_tokens;
    pol_run in_sample;      /* static from the profile's counts */
    pol_run on[HM_POLICY_COUNT];          /* each policy on the trace / synthetic trace, indexed by kind */
    int32_t ncm;            /* --n-cpu-moe N */
    uint64_t ncm_bytes;
    double ncm_hit;
    bool calibrated;
    hm_calib cal;
    char calib_note[256];
    bool gpu_measured;      /* gcal holds at least the upload */
    hm_calib_gpu gcal;
    char gpu_note[400];     /* why not (or which parts are missing) */
    bool have_vram;         /* a VRAM budget was given (else slots 0 and no VRAM report) */
    /* the RAM tier (--ram-budget) */
    bool have_ram, ram_all;  /* ram_all: the budget holds every unit: plain mmap, no SSD tier */
    uint64_t ram_budget, ram_slot_bytes;
    int64_t ram_slots, ram_stage; /* policy slots; staging buffers */
    pol_run ram_in_sample;  /* static over vram + ram slots, on the profile's counts */
    pol_run ram_on[HM_POLICY_COUNT];      /* each policy over vram + ram slots on the same routing */
    bool ssd_measured;
    hm_calib_ssd ssd;
    char ssd_note[256];
    /* several GPUs (o->n_gpu_budgets > 0): the engine's layer split and slot groups */
    bool have_gpus;
    hm_gpu_plan gp;
    int64_t gslots[HM_MAX_GPUS];     /* units that fit each device's budget */
    int32_t *layer_dev;              /* [n_layer] the device running each layer */
    pol_run gpu_on[2];               /* the policy on the routing: [0] without peer units, [1] with */
    int64_t gused[2][HM_MAX_GPUS], gpeer[2][HM_MAX_GPUS];
} plan;

static void run_free(pol_run *r) {
    free(r->lhit), free(r->ltot), free(r->resident), free(r->chosen);
    memset(r, 0, sizeof *r);
}

static hm_status run_alloc(pol_run *r, const plan *pl, hm_err *err) {
    size_t nl = (size_t)pl->units.n_layer;
    r->lhit = calloc(nl, sizeof *r->lhit);
    r->ltot = calloc(nl, sizeof *r->ltot);
    r->resident = calloc(nl, sizeof *r->resident);
    r->chosen = calloc((size_t)pl->units.n_units, 1);
    if (!r->lhit || !r->ltot || !r->resident || !r->chosen) return hm_errf(err, HM_ERR_NOMEM, "plan: out of memory");
    return HM_OK;
}

/* The store of a plan: one pool of slots, or (groups) one slot group per device of pl->gp, a unit
 * going to its layer's device first and (peer) to another device's free slots after. */
static hm_status open_store_as(const plan *pl, int64_t slots, hm_policy_kind kind, bool groups, bool peer,
                               hm_experts **s, hm_err *err) {
    hm_experts_opts eo;
    hm_experts_opts_default(&eo);
    eo.hot_slots = slots;
    if (groups) {
        eo.n_groups = pl->gp.n_dev;
        eo.group_slots = pl->gslots;
        eo.layer_group = pl->layer_dev;
        eo.allow_peer = peer;
    }
    eo.policy.kind = kind;
    eo.policy.static_per_layer = pl->o->static_per_layer;
    eo.policy.warm_start = pl->o->warm_start;
    if (pl->o->update_rate >= 0) eo.policy.update_rate = pl->o->update_rate;
    if (pl->o->elite_pct >= 0) eo.policy.elite_pct = pl->o->elite_pct;
    eo.profile = pl->have_prof ? &pl->prof : NULL;
    return hm_experts_open(s, &pl->units, &eo, err);
}

static hm_status open_store(const plan *pl, int64_t slots, hm_policy_kind kind, hm_experts **s, hm_err *err) {
    return open_store_as(pl, slots, kind, false, false, s, err);
}

static void harvest(const plan *pl, hm_experts *s, pol_run *r) {
    hm_experts_stats st;
    hm_experts_get_stats(s, &st);
    uint64_t h = 0, t = 0;
    for (int32_t l = 0; l < pl->units.n_layer; l++) {
        r->lhit[l] = st.layer_hits[l];
        r->ltot[l] = st.layer_hits[l] + st.layer_misses[l];
        r->resident[l] = st.layer_resident[l];
        h += r->lhit[l], t += r->ltot[l];
    }
    size_t i = 0;
    for (int32_t l = 0; l < pl->units.n_layer; l++)
        for (int32_t e = 0; e < pl->units.layers[l].n_expert; e++, i++)
            r->chosen[i] = hm_experts_unit(s, l, e)->home == HM_TIER_HOT;
    r->hit = t ? (double)h / (double)t : 0;
    r->swaps_in = st.swaps_in;
    r->done = true;
}

/* Static placement over slots, scored on the profile's own counts. */
static hm_status eval_in_sample(plan *pl, int64_t slots, pol_run *r, hm_err *err) {
    hm_experts *s = NULL;
    hm_status st = run_alloc(r, pl, err);
    if (!st) st = open_store(pl, slots, HM_POLICY_STATIC, &s, err);
    if (st) return st;
    harvest(pl, s, r);
    uint64_t h = 0, t = 0;
    size_t i = 0;
    for (int32_t l = 0; l < pl->units.n_layer; l++) {
        r->lhit[l] = r->ltot[l] = 0;
        for (int32_t e = 0; e < pl->units.layers[l].n_expert; e++, i++) {
            uint64_t c = hm_profile_count(&pl->prof, l, e);
            r->ltot[l] += c;
            if (r->chosen[i]) r->lhit[l] += c;
        }
        h += r->lhit[l], t += r->ltot[l];
    }
    r->hit = t ? (double)h / (double)t : 0;
    hm_experts_close(s);
    return HM_OK;
}

/* The policy on the trace or the synthetic trace; with groups (several GPUs, peer units or not),
 * each device's used and peer slots into used[] / peer[] (may be NULL otherwise). */
static hm_status eval_routing_as(plan *pl, int64_t slots, hm_policy_kind kind, bool groups, bool peer, pol_run *r,
                                 int64_t *used, int64_t *peer_units, hm_err *err) {
    hm_experts *s = NULL;
    hm_sim_gen *g = NULL;
    hm_status st = run_alloc(r, pl, err);
    if (!st) st = open_store_as(pl, slots, kind, groups, peer, &s, err);
    if (!st) {
        if (pl->o->trace_path) {
            st = hm_sim_replay(s, pl->o->trace_path, err);
        } else {
            st = hm_sim_gen_open(&g, &pl->prof, pl->k, pl->o->seed, err);
            if (!st) st = hm_sim_synthetic(s, g, pl->sim_tokens, err);
        }
    }
    if (!st) harvest(pl, s, r);
    for (int32_t d = 0; !st && groups && d < pl->gp.n_dev; d++)
        hm_experts_group_stats(s, d, NULL, &used[d], &peer_units[d]);
    hm_sim_gen_close(g);
    hm_experts_close(s);
    return st;
}

static hm_status eval_on_routing(plan *pl, int64_t slots, hm_policy_kind kind, pol_run *r, hm_err *err) {
    return eval_routing_as(pl, slots, kind, false, false, r, NULL, NULL, err);
}

static const char *human(uint64_t b, char *buf, size_t cap);

/* Several GPUs: the engine's plan (exec/gpu_split.h) of the per-device budgets and -ts for this
 * model, without free-memory figures (equal shares without -ts, as equal GPUs would have); each
 * device's units that fit; pl->slots and budget_bytes become the sum (the one-pool comparison). */
static hm_status plan_gpus(plan *pl, hm_err *err) {
    const hm_plan_opts *o = pl->o;
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    int32_t n_cuda = 1;
    for (int32_t i = 0; i < o->n_gpu_budgets && i < HM_MAX_GPUS; i++) {
        po.vram_budgets[i] = o->gpu_budgets[i];
        if (o->gpu_budgets[i].bytes < 0)
            return hm_errf(err, HM_ERR_ARG, "--budget: device %d: auto needs the device itself (give a size)",
                           (int)o->gpu_budgets[i].device);
        if (o->gpu_budgets[i].device + 1 > n_cuda) n_cuda = o->gpu_budgets[i].device + 1;
    }
    po.n_vram_budgets = o->n_gpu_budgets;
    for (int32_t i = 0; i < o->n_tensor_split && i < HM_MAX_GPUS; i++) po.tensor_split[i] = o->tensor_split[i];
    po.n_tensor_split = o->n_tensor_split;
    if (o->n_tensor_split > n_cuda) n_cuda = o->n_tensor_split;
    hm_status st = hm_gpu_plan_make(&pl->gp, &po, pl->units.n_layer, n_cuda, NULL, err);
    if (st) return st;
    if (!(pl->layer_dev = calloc((size_t)pl->units.n_layer, sizeof *pl->layer_dev)))
        return hm_errf(err, HM_ERR_NOMEM, "plan: out of memory");
    for (int32_t l = 0; l < pl->units.n_layer; l++) pl->layer_dev[l] = hm_gpu_plan_layer_dev(&pl->gp, l);
    pl->slots = 0;
    pl->budget_bytes = 0;
    for (int32_t d = 0; d < pl->gp.n_dev; d++) {
        /* as the engine: a device that runs no layers (its -ts share 0) takes no slots */
        pl->gslots[d] = pl->gp.layer_end[d] > pl->gp.layer_begin[d] ? (int64_t)hm_units_fit(&pl->units, pl->gp.budget[d])
                                                                     : 0;
        pl->slots += pl->gslots[d];
        pl->budget_bytes += (uint64_t)pl->gp.budget[d];
    }
    pl->have_gpus = true;
    return HM_OK;
}

/* Per device: its layers' hit rate in run r (routed units of those layers found in VRAM, on any
 * device). */
static double dev_hit(const plan *pl, const pol_run *r, int32_t d) {
    uint64_t h = 0, t = 0;
    for (int32_t l = 0; l < pl->units.n_layer; l++)
        if (pl->layer_dev[l] == d) h += r->lhit[l], t += r->ltot[l];
    return t ? (double)h / (double)t : 0;
}

static void print_gpus(const plan *pl, FILE *out) {
    char b1[32];
    fprintf(out, "\nseveral GPUs (the engine's layer split%s; policy %s on the same routing):\n",
            pl->o->n_tensor_split > 0 ? " by -ts" : ", equal shares: the engine splits by free VRAM",
            hm_policy_name(pl->kind));
    for (int32_t d = 0; d < pl->gp.n_dev; d++) {
        const int32_t lb = pl->gp.layer_begin[d], le = pl->gp.layer_end[d];
        char layers[48];
        if (le > lb) snprintf(layers, sizeof layers, "layers %d-%d", (int)lb, (int)le - 1);
        else snprintf(layers, sizeof layers, "no layers (its budget unused)");
        fprintf(out, "  gpu %d: %s, %s -> %" PRId64 " units; its layers' hit rate %.1f %% with peer units "
                "(%" PRId64 " of its slots hold other devices' units), %.1f %% without\n", (int)pl->gp.dev[d], layers,
                human((uint64_t)pl->gp.budget[d], b1, sizeof b1), pl->gslots[d], 100.0 * dev_hit(pl, &pl->gpu_on[1], d),
                pl->gpeer[1][d], 100.0 * dev_hit(pl, &pl->gpu_on[0], d));
    }
    fprintf(out, "  all: %.1f %% with peer units, %.1f %% without (--no-peer-experts), %.1f %% in one pool of the same "
            "size\n", 100.0 * pl->gpu_on[1].hit, 100.0 * pl->gpu_on[0].hit, 100.0 * pl->on[pl->kind].hit);
}

static json_t *gpus_json(const plan *pl) {
    if (!pl->have_gpus) return json_null();
    json_t *o = json_object(), *devs = json_array();
    for (int32_t d = 0; d < pl->gp.n_dev; d++)
        json_array_append_new(devs, json_pack("{s:i, s:i, s:i, s:I, s:I, s:I, s:f, s:f}", "device", pl->gp.dev[d],
                                              "layer_begin", pl->gp.layer_begin[d], "layer_end", pl->gp.layer_end[d],
                                              "budget_bytes", (json_int_t)pl->gp.budget[d], "units_fit",
                                              (json_int_t)pl->gslots[d], "peer_units", (json_int_t)pl->gpeer[1][d],
                                              "hit_rate", dev_hit(pl, &pl->gpu_on[1], d), "hit_rate_no_peer",
                                              dev_hit(pl, &pl->gpu_on[0], d)));
    json_object_set_new(o, "devices", devs);
    json_object_set_new(o, "hit_rate", json_real(pl->gpu_on[1].hit));
    json_object_set_new(o, "hit_rate_no_peer", json_real(pl->gpu_on[0].hit));
    json_object_set_new(o, "hit_rate_one_pool", json_real(pl->on[pl->kind].hit));
    return o;
}

/* llama.cpp --n-cpu-moe N: the smallest N whose GPU layers' expert bytes fit the budget. */
static void eval_layer_split(plan *pl) {
    const hm_units *u = &pl->units;
    uint64_t bytes = 0;
    int32_t n = u->n_layer;
    while (n > 0) {
        const hm_units_layer *L = &u->layers[n - 1];
        uint64_t b = L->unit_bytes * (uint64_t)L->n_expert;
        if (bytes + b > pl->budget_bytes) break;
        bytes += b;
        n--;
    }
    pl->ncm = n;
    pl->ncm_bytes = bytes;
    uint64_t h = 0, t = 0;
    for (int32_t l = 0; l < u->n_layer; l++) {
        uint64_t c = hm_profile_layer_total(&pl->prof, l);
        t += c;
        if (l >= n) h += c;
    }
    pl->ncm_hit = t ? (double)h / (double)t : 0;
}

static const char *human(uint64_t b, char *buf, size_t cap) {
    if (b >= (1ull << 30)) snprintf(buf, cap, "%.2f GiB", (double)b / (double)(1ull << 30));
    else if (b >= (1ull << 20)) snprintf(buf, cap, "%.1f MiB", (double)b / (double)(1ull << 20));
    else snprintf(buf, cap, "%.1f KiB", (double)b / 1024.0);
    return buf;
}

static int32_t n_moe_layers(const hm_units *u) {
    int32_t n = 0;
    for (int32_t l = 0; l < u->n_layer; l++) n += u->layers[l].n_expert > 0;
    return n;
}

/* CPU-computed units per decode token at hit rate h, and the tok/s the CPU part alone allows. */
static double cpu_units_per_token(const plan *pl, double h) { return n_moe_layers(&pl->units) * pl->k * (1.0 - h); }
static double cpu_tok_s(const plan *pl, double h) {
    double us = cpu_units_per_token(pl, h) * pl->cal.us_unit_nt;
    return us > 0 ? 1e6 / us : INFINITY;
}

static const pol_run *main_run(const plan *pl) {
    if (pl->kind == HM_POLICY_STATIC && !pl->o->trace_path) return &pl->in_sample;
    return &pl->on[pl->kind];
}

static void source_words(const plan *pl, char *buf, size_t cap) {
    if (pl->o->trace_path) snprintf(buf, cap, "the trace %s", pl->o->trace_path);
    else snprintf(buf, cap, "a synthetic trace of %" PRId64 " tokens sampled from the profile (seed %" PRIu64 ")",
                  pl->sim_tokens, pl->o->seed);
}

/* GPU predictions: decode ms per token from per-layer hit rates (calib.h's cost model). */
typedef struct gpu_pred {
    bool ok;
    double ms, ms_ncm;      /* hotmoe's placement at the budget; llama.cpp's --n-cpu-moe */
    double break_even;      /* lowest uniform hit rate at which hotmoe's placement is at least as fast
                               as the layer split with the same bytes; < 0: none */
    double cpu_units_per_upload; /* one unit's copy time in CPU unit computations */
} gpu_pred;

static double layers_ms(const plan *pl, const pol_run *r, double uniform, int32_t ncm) {
    const hm_units *u = &pl->units;
    double h[4096];
    int32_t n = 0;
    for (int32_t l = 0; l < u->n_layer && n < 4096; l++) {
        if (!u->layers[l].n_expert) continue;
        if (r) h[n++] = r->ltot[l] ? (double)r->lhit[l] / (double)r->ltot[l] : r->hit;
        else if (uniform >= 0) h[n++] = uniform;
        else h[n++] = l >= ncm ? 1.0 : 0.0;
    }
    return hm_calib_gpu_token_ms(&pl->gcal, pl->cal.us_unit_nt, h, n);
}

static gpu_pred predict(const plan *pl) {
    gpu_pred p = {.break_even = -1};
    const hm_calib_gpu *g = &pl->gcal;
    if (!pl->gpu_measured || !pl->calibrated || !g->have_unit || !g->have_decode) return p;
    p.ok = true;
    p.ms = layers_ms(pl, main_run(pl), -1, 0);
    p.ms_ncm = layers_ms(pl, NULL, -1, pl->ncm);
    for (int i = 0; i <= 1000; i++)
        if (layers_ms(pl, NULL, i / 1000.0, 0) <= p.ms_ncm) {
            p.break_even = i / 1000.0;
            break;
        }
    p.cpu_units_per_upload = pl->cal.us_unit_nt > 0 ? g->us_upload_unit / pl->cal.us_unit_nt : 0;
    return p;
}

static void print_gpu(const plan *pl, FILE *out) {
    const hm_calib_gpu *g = &pl->gcal;
    if (!pl->gpu_measured) {
        fprintf(out, "GPU: %s, so no total tok/s and no break-even hit rate.\n", pl->gpu_note);
        return;
    }
    fprintf(out, "\nGPU (%s, measured): upload %.1f GB/s", g->device, g->upload_gbs);
    if (g->have_decode) fprintf(out, ", dense part %.2f ms/token", g->ms_dense);
    if (g->have_unit) fprintf(out, ", hot unit %.1f us", g->us_hot_unit);
    fprintf(out, "\n  upload: %d units from the file mapping into VRAM slots, %.0f us a unit\n", g->upload_units,
            g->us_upload_unit);
    if (g->have_unit)
        fprintf(out, "  hot unit: one grouped launch of %d resident units for one token, per unit\n", g->k);
    if (g->have_decode)
        fprintf(out, "  decode (%d tokens after 3 warm-up): every unit in VRAM %.2f ms/token (hit rate %.1f %%), "
                "--cpu-moe %.2f ms/token;\n  a layer with a CPU part costs %.0f us on top of its units\n",
                g->decode_tokens, g->ms_tok_hot, 100.0 * g->hit_hot, g->ms_tok_cpu_moe, g->us_cold_layer);
    if (g->note[0]) fprintf(out, "  not measured or assumed: %s\n", g->note);
    gpu_pred p = predict(pl);
    if (!p.ok) {
        fprintf(out, "  no total tok/s: %s\n", pl->calibrated ? "the decode runs are missing" : "no CPU calibration");
        return;
    }
    fprintf(out, "predicted decode (per token = dense part + per MoE layer max(GPU hot units, CPU cold units +\n"
                 "the CPU-part cost), with this layer's hit rate):\n");
    fprintf(out, "  hotmoe %s at this budget: %.1f tok/s (%.2f ms)\n", hm_policy_name(pl->kind), 1000.0 / p.ms, p.ms);
    fprintf(out, "  llama.cpp -ngl 99 --n-cpu-moe %d:  %.1f tok/s (%.2f ms)\n", pl->ncm, 1000.0 / p.ms_ncm, p.ms_ncm);
    if (p.break_even >= 0)
        fprintf(out, "  break-even hit rate %.1f %%: below it (the same in every layer) the VRAM units decode slower "
                "than llama.cpp's layer split with the same bytes\n", 100.0 * p.break_even);
    else
        fprintf(out, "  break-even hit rate: none (even 100 %% hits per unit do not beat llama.cpp's layer split)\n");
    fprintf(out, "  an online swap copies a unit in %.0f us on the side stream (= %.1f units of CPU time)\n",
            g->us_upload_unit, p.cpu_units_per_upload);
}

/* The RAM tier: pool cut as hm_ram_tier_open does, then every policy over vram + ram slots. */
static hm_status plan_ram(plan *pl, hm_err *err) {
    const hm_plan_opts *o = pl->o;
    const hm_units *u = &pl->units;
    if (o->ram_budget < 0 && !(o->ram_budget_frac > 0)) return HM_OK;
    if (o->ram_budget < 0 && o->ram_budget_frac > 1)
        return hm_errf(err, HM_ERR_ARG, "--ram-budget: a share must be in (0, 100]%%");
    pl->have_ram = true;
    pl->ram_budget = o->ram_budget >= 0 ? (uint64_t)o->ram_budget
                                        : (uint64_t)llround(o->ram_budget_frac * (double)u->expert_bytes);
    pl->ram_slot_bytes = hm_ssd_slot_bytes(u);
    int64_t left = (int64_t)u->n_units - pl->slots; /* units not in VRAM */
    if (pl->ram_budget >= u->expert_bytes) { /* the engine keeps the plain mmap: no SSD tier */
        pl->ram_all = true;
        pl->ram_slots = left;
        return HM_OK;
    }
    int32_t max_e = 0;
    for (int32_t l = 0; l < u->n_layer; l++)
        if (u->layers[l].n_expert > max_e) max_e = u->layers[l].n_expert;
    int64_t n_buf = (int64_t)(pl->ram_budget / pl->ram_slot_bytes);
    int64_t n_stage = 2 * (int64_t)max_e;
    if (n_stage > n_buf / 2) n_stage = n_buf / 2;
    if (n_stage < 1) n_stage = 1;
    if (n_buf < 1 || n_stage > n_buf)
        return hm_errf(err, HM_ERR_ARG, "--ram-budget %" PRIu64 " bytes holds %" PRId64 " buffers of %" PRIu64
                       " bytes (a unit with alignment) but the RAM tier needs at least 1 (staging)",
                       pl->ram_budget, n_buf, pl->ram_slot_bytes);
    pl->ram_stage = n_stage;
    pl->ram_slots = n_buf - n_stage < left ? n_buf - n_stage : left;
    hm_status st;
    int64_t both = pl->slots + pl->ram_slots;
    if (!o->trace_path && (st = eval_in_sample(pl, both, &pl->ram_in_sample, err))) return st;
    for (int k = HM_POLICY_STATIC; k < HM_POLICY_COUNT; k++)
        if ((st = eval_on_routing(pl, both, (hm_policy_kind)k, &pl->ram_on[k], err))) return st;
    return HM_OK;
}

static const pol_run *ram_main_run(const plan *pl) {
    if (pl->kind == HM_POLICY_STATIC && !pl->o->trace_path) return &pl->ram_in_sample;
    return &pl->ram_on[pl->kind];
}

/* The RAM+SSD numbers of the main policy, per decode token. */
typedef struct ram_pred {
    double hit_total;     /* routed units found in VRAM or RAM */
    double hit_ram;       /* ... in RAM (share of all routed units) */
    double miss;          /* read from the file: 1 - hit_total */
    double routed_mib, ssd_mib;
    bool have_time;       /* CPU and SSD calibrated, no VRAM tier */
    double ms_cpu, ms_ssd, ms_serial, ms_overlap;
} ram_pred;

static double lhit(const pol_run *r, int32_t l) { return r->ltot[l] ? (double)r->lhit[l] / (double)r->ltot[l] : r->hit; }

static ram_pred ram_predict(const plan *pl) {
    ram_pred p = {0};
    const hm_units *u = &pl->units;
    double routed = (double)n_moe_layers(u) * pl->k, unit = (double)u->expert_bytes / (double)u->n_units;
    double v = pl->have_vram ? main_run(pl)->hit : 0;
    p.hit_total = pl->ram_all ? 1.0 : ram_main_run(pl)->hit;
    p.hit_ram = p.hit_total > v ? p.hit_total - v : 0;
    p.miss = 1.0 - p.hit_total;
    p.routed_mib = routed * unit / (double)(1u << 20);
    p.ssd_mib = p.miss * p.routed_mib;
    if (!pl->calibrated || !(pl->ssd_measured || pl->ram_all) || pl->have_vram) return p;
    p.have_time = true;
    p.ms_cpu = routed * pl->cal.us_unit_nt / 1000.0;
    /* a layer's m misses are read together: a lone one costs a qd-1 read, several stream at the
     * queue depth's per-unit rate but take at least one read's latency */
    double us = 0;
    for (int32_t l = 0; !pl->ram_all && l < u->n_layer; l++) {
        if (!u->layers[l].n_expert) continue;
        double m = pl->k * (1.0 - lhit(ram_main_run(pl), l));
        us += m < 1 ? m * pl->ssd.us_unit_qd1 : fmax(pl->ssd.us_unit_qd1, m * pl->ssd.us_unit_qd);
    }
    p.ms_ssd = us / 1000.0;
    p.ms_serial = p.ms_cpu + p.ms_ssd;
    p.ms_overlap = fmax(p.ms_cpu, p.ms_ssd);
    return p;
}

static void print_ram(const plan *pl, FILE *out) {
    char b1[32], b2[32], src[1200];
    const hm_units *u = &pl->units;
    ram_pred p = ram_predict(pl);
    source_words(pl, src, sizeof src);
    fprintf(out, "\nRAM tier (--ram-budget %s, policy %s):", human(pl->ram_budget, b1, sizeof b1), hm_policy_name(pl->kind));
    if (pl->ram_all) {
        fprintf(out, " holds every expert unit (%s) -> plain mmap, no SSD reads\n", human(u->expert_bytes, b2, sizeof b2));
    } else {
        fprintf(out, " %" PRId64 " of %" PRIu64 " units in RAM slots (%.1f %%) + %" PRId64 " staging buffers of %s\n",
                pl->ram_slots, u->n_units, 100.0 * (double)pl->ram_slots / (double)u->n_units, pl->ram_stage,
                human(pl->ram_slot_bytes, b2, sizeof b2));
        if (pl->have_vram)
            fprintf(out, "  exclusive tiers: VRAM %" PRId64 " + RAM %" PRId64 " units, one placement of both "
                    "(exact for static; online/lru approximated)\n", pl->slots, pl->ram_slots);
        if (pl->have_vram)
            fprintf(out, "  expected RAM hit rate %.1f %% of routed units (VRAM + RAM %.1f %%); read from the file %.1f %%\n",
                    100.0 * p.hit_ram, 100.0 * p.hit_total, 100.0 * p.miss);
        else
            fprintf(out, "  expected RAM hit rate %.1f %%; read from the file %.1f %%\n", 100.0 * p.hit_ram, 100.0 * p.miss);
        if (ram_main_run(pl) == &pl->ram_in_sample)
            fprintf(out, "  measured on the profile's own counts (in-sample; staging hits left out)\n");
        else
            fprintf(out, "  measured on %s (staging hits left out)\n", src);
        fprintf(out, "  all policies, %s hit rate:", pl->have_vram ? "VRAM + RAM" : "RAM");
        for (int k = HM_POLICY_STATIC; k < HM_POLICY_COUNT; k++)
            if (pl->ram_on[k].done) fprintf(out, " %s %.1f %%", hm_policy_name((hm_policy_kind)k), 100.0 * pl->ram_on[k].hit);
        if (pl->ram_in_sample.done) fprintf(out, ", static in-sample %.1f %%", 100.0 * pl->ram_in_sample.hit);
        fputc('\n', out);
    }
    fprintf(out, "  SSD read per token: %.1f MiB (%.1f %% of the %.1f MiB routed)\n", p.ssd_mib, 100.0 * p.miss,
            p.routed_mib);
    if (pl->ssd_measured)
        fprintf(out, "  SSD (measured on the model file, %s%s, %d units): %.0f us a unit at queue depth 1 (%.0f MB/s), "
                "%.0f us at %d (%.0f MB/s)\n", pl->ssd.direct ? "O_DIRECT" : "buffered", pl->ssd.uring ? ", io_uring" : "",
                pl->ssd.n_units, pl->ssd.us_unit_qd1, pl->ssd.mbs_qd1, pl->ssd.us_unit_qd, pl->ssd.queue_depth,
                pl->ssd.mbs_qd);
    else if (!pl->ram_all)
        fprintf(out, "  SSD cost: %s\n", pl->ssd_note);
    if (p.have_time) {
        fprintf(out, "  predicted decode, CPU-only engine (expert work only: attention and the dense part on top):\n");
        fprintf(out, "    CPU %.2f ms (%.0f units x %.1f us) + SSD %.2f ms (per layer, its misses read together)\n",
                p.ms_cpu, (double)n_moe_layers(u) * pl->k, pl->cal.us_unit_nt, p.ms_ssd);
        fprintf(out, "    no overlap (reads wait, as without --prefetch): %.2f tok/s (%.2f ms)\n", 1000.0 / p.ms_serial,
                p.ms_serial);
        fprintf(out, "    full overlap (reads hidden behind compute, --prefetch at best): %.2f tok/s (%.2f ms)\n",
                1000.0 / p.ms_overlap, p.ms_overlap);
    } else if (pl->have_vram) {
        fprintf(out, "  no RAM+SSD tok/s with a VRAM budget (the prediction is for the CPU-only engine)\n");
    }
}

static json_t *ram_json(const plan *pl) {
    if (!pl->have_ram) return json_null();
    ram_pred p = ram_predict(pl);
    json_t *o = json_object(), *cmp = json_object();
    json_object_set_new(o, "budget_bytes", json_integer((json_int_t)pl->ram_budget));
    json_object_set_new(o, "plain_mmap", json_boolean(pl->ram_all));
    json_object_set_new(o, "slot_bytes", json_integer((json_int_t)pl->ram_slot_bytes));
    json_object_set_new(o, "units_fit", json_integer(pl->ram_slots));
    json_object_set_new(o, "staging", json_integer(pl->ram_stage));
    json_object_set_new(o, "policy", json_string(hm_policy_name(pl->kind)));
    json_object_set_new(o, "hit_rate", json_real(p.hit_ram));
    json_object_set_new(o, "hit_rate_vram_ram", json_real(p.hit_total));
    json_object_set_new(o, "ssd_rate", json_real(p.miss));
    json_object_set_new(o, "routed_mib_per_token", json_real(p.routed_mib));
    json_object_set_new(o, "ssd_mib_per_token", json_real(p.ssd_mib));
    for (int k = HM_POLICY_STATIC; k < HM_POLICY_COUNT; k++)
        if (pl->ram_on[k].done) json_object_set_new(cmp, hm_policy_name((hm_policy_kind)k), json_real(pl->ram_on[k].hit));
    if (pl->ram_in_sample.done) json_object_set_new(cmp, "static_in_sample", json_real(pl->ram_in_sample.hit));
    json_object_set_new(o, "compare_vram_ram", cmp);
    if (pl->ssd_measured)
        json_object_set_new(o, "ssd", json_pack("{s:i, s:i, s:b, s:b, s:f, s:f, s:f, s:f}", "units", pl->ssd.n_units,
                                                "queue_depth", pl->ssd.queue_depth, "direct", pl->ssd.direct, "uring",
                                                pl->ssd.uring, "us_per_unit_qd1", pl->ssd.us_unit_qd1, "us_per_unit_qd",
                                                pl->ssd.us_unit_qd, "mb_per_s_qd1", pl->ssd.mbs_qd1, "mb_per_s_qd",
                                                pl->ssd.mbs_qd));
    else
        json_object_set_new(o, "ssd", json_null());
    json_object_set_new(o, "ssd_note", json_string(pl->ssd_measured ? "" : pl->ssd_note));
    if (p.have_time)
        json_object_set_new(o, "predicted", json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "ms_cpu", p.ms_cpu, "ms_ssd",
                                                      p.ms_ssd, "tok_s_no_overlap", 1000.0 / p.ms_serial,
                                                      "tok_s_overlap", 1000.0 / p.ms_overlap, "ms_per_token_no_overlap",
                                                      p.ms_serial, "ms_per_token_overlap", p.ms_overlap));
    else
        json_object_set_new(o, "predicted", json_null());
    return o;
}

static void print_text(const plan *pl, FILE *out) {
    const hm_units *u = &pl->units;
    char b1[32], b2[32], b3[32], src[1200];
    const pol_run *r = main_run(pl);
    source_words(pl, src, sizeof src);
    fprintf(out, "model: %s%s%s, %d layers x %d experts, %d per token; %" PRIu64 " expert units of %s (%s in all)\n",
            pl->model[0] ? pl->model : "(unnamed)", pl->arch[0] ? " / " : "", pl->arch, u->n_layer, u->n_expert, pl->k,
            u->n_units, human(u->unit_bytes_max, b1, sizeof b1), human(u->expert_bytes, b2, sizeof b2));
    if (pl->have_prof)
        fprintf(out, "usage: %s (%" PRIu64 " tokens: %" PRIu64 " prompt, %" PRIu64 " decode)\n",
                pl->o->profile_path ? pl->o->profile_path : pl->o->trace_path, pl->prof.tokens, pl->prof.prompt_tokens,
                pl->prof.decode_tokens);
    if (!pl->have_vram) {
        if (pl->calibrated)
            fprintf(out, "\nCPU cost of one unit on this machine (decode, 1 token): %.1f us on 1 thread, %.1f us on %d "
                    "threads (%.1f GB/s)\n", pl->cal.us_unit_1t, pl->cal.us_unit_nt, pl->cal.n_threads, pl->cal.gbs_nt);
        else
            fprintf(out, "\nCPU cost: %s\n", pl->calib_note);
        print_ram(pl, out);
        fprintf(out, "\nto run it: --ram-budget %" PRIu64 "MiB --policy %s%s%s%s\n", (pl->ram_budget + (1u << 20) - 1) >> 20,
                hm_policy_name(pl->kind), pl->o->profile_path ? " --profile " : "",
                pl->o->profile_path ? pl->o->profile_path : "", pl->kind == HM_POLICY_STATIC ? " --prefetch" : "");
        return;
    }
    fprintf(out, "\nbudget %s -> %" PRId64 " of %" PRIu64 " units fit (%.1f %%)\n", human(pl->budget_bytes, b1, sizeof b1),
            pl->slots, u->n_units, 100.0 * (double)pl->slots / (double)u->n_units);
    fprintf(out, "policy %s: expected hit rate %.1f %% (routed units computed from the fast tier)\n",
            hm_policy_name(pl->kind), 100.0 * r->hit);
    if (r == &pl->in_sample)
        fprintf(out, "  measured on the profile's own counts (in-sample: a new workload will do somewhat worse)\n");
    else
        fprintf(out, "  measured on %s; %" PRIu64 " units copied in over the run\n", src, r->swaps_in);
    fprintf(out, "\nunits in the fast tier and hit rate, per layer:\n");
    for (int32_t l = 0; l < u->n_layer; l++) {
        double h = r->ltot[l] ? 100.0 * (double)r->lhit[l] / (double)r->ltot[l] : 0;
        fprintf(out, "  L%-3d %4d %5.1f %%%s", l, r->resident[l], h, (l % 4 == 3 || l == u->n_layer - 1) ? "\n" : "   |");
    }
    fprintf(out, "\nall policies on the same routing (%s):\n", src);
    for (int k = HM_POLICY_STATIC; k < HM_POLICY_COUNT; k++)
        if (pl->on[k].done) fprintf(out, "  %-7s %5.1f %%\n", hm_policy_name((hm_policy_kind)k), 100.0 * pl->on[k].hit);
    if (pl->in_sample.done) fprintf(out, "  static on the profile's own counts: %.1f %%\n", 100.0 * pl->in_sample.hit);
    fprintf(out, "\nllama.cpp with the same bytes: -ngl 99 --n-cpu-moe %d (experts of layers %d..%d in VRAM, %s): "
            "hit rate %.1f %%\n", pl->ncm, pl->ncm, u->n_layer - 1, human(pl->ncm_bytes, b3, sizeof b3), 100.0 * pl->ncm_hit);
    if (pl->calibrated) {
        double cu = cpu_units_per_token(pl, r->hit), cl = cpu_units_per_token(pl, pl->ncm_hit);
        fprintf(out, "\nCPU cost of one unit on this machine (decode, 1 token): %.1f us on 1 thread, %.1f us on %d "
                "threads (%.1f GB/s)\n", pl->cal.us_unit_1t, pl->cal.us_unit_nt, pl->cal.n_threads, pl->cal.gbs_nt);
        fprintf(out, "  hotmoe %s: %.1f units per token on the CPU -> %.2f ms -> the CPU part allows %.1f tok/s\n",
                hm_policy_name(pl->kind), cu, cu * pl->cal.us_unit_nt / 1000.0, cpu_tok_s(pl, r->hit));
        fprintf(out, "  llama.cpp --n-cpu-moe %d: %.1f units per token on the CPU -> %.2f ms -> %.1f tok/s\n", pl->ncm, cl,
                cl * pl->cal.us_unit_nt / 1000.0, cpu_tok_s(pl, pl->ncm_hit));
        fprintf(out, "  (CPU expert time only: attention, the dense part and the GPU's own time come on top)\n");
    } else {
        fprintf(out, "\nCPU cost: %s\n", pl->calib_note);
    }
    print_gpu(pl, out);
    if (pl->have_gpus) print_gpus(pl, out);
    if (pl->have_ram) print_ram(pl, out);
    char ram[48] = "";
    if (pl->have_ram) snprintf(ram, sizeof ram, " --ram-budget %" PRIu64 "MiB", (pl->ram_budget + (1u << 20) - 1) >> 20);
    char vram[320];
    int at = 0;
    if (pl->have_gpus) { /* the per-device form, and -ts as given */
        for (int32_t d = 0; d < pl->gp.n_dev && at < (int)sizeof vram - 40; d++)
            at += snprintf(vram + at, sizeof vram - (size_t)at, "%s%d:%" PRIu64 "MiB", d ? "," : "", (int)pl->gp.dev[d],
                           ((uint64_t)pl->gp.budget[d] + (1u << 20) - 1) >> 20);
        for (int32_t i = 0; i < pl->o->n_tensor_split && at < (int)sizeof vram - 20; i++)
            at += snprintf(vram + at, sizeof vram - (size_t)at, "%s%g", i ? "," : " -ts ", (double)pl->o->tensor_split[i]);
    } else {
        snprintf(vram, sizeof vram, "%" PRIu64 "MiB", (pl->budget_bytes + (1u << 20) - 1) >> 20);
    }
    fprintf(out, "\nto run it: -ngl 99 --vram-budget %s%s --policy %s%s%s\n", vram, ram, hm_policy_name(pl->kind),
            pl->o->profile_path ? " --profile " : "", pl->o->profile_path ? pl->o->profile_path : "");
}

static json_t *num_or_null(bool have, double v) { return have ? json_real(v) : json_null(); }

static json_t *gpu_json(const plan *pl) {
    const hm_calib_gpu *g = &pl->gcal;
    json_t *o = json_object();
    json_object_set_new(o, "measured", json_boolean(pl->gpu_measured));
    json_object_set_new(o, "note", json_string(pl->gpu_measured ? g->note : pl->gpu_note));
    if (!pl->gpu_measured) return o;
    json_object_set_new(o, "device", json_string(g->device));
    json_object_set_new(o, "upload_units", json_integer(g->upload_units));
    json_object_set_new(o, "upload_gb_per_s", json_real(g->upload_gbs));
    json_object_set_new(o, "us_per_upload_unit", json_real(g->us_upload_unit));
    json_object_set_new(o, "us_per_hot_unit", num_or_null(g->have_unit, g->us_hot_unit));
    json_object_set_new(o, "decode_tokens", json_integer(g->decode_tokens));
    json_object_set_new(o, "ms_per_token_all_hot", num_or_null(g->have_decode, g->ms_tok_hot));
    json_object_set_new(o, "hit_rate_all_hot", num_or_null(g->have_decode, g->hit_hot));
    json_object_set_new(o, "ms_per_token_cpu_moe", num_or_null(g->have_decode, g->ms_tok_cpu_moe));
    json_object_set_new(o, "ms_per_token_dense", num_or_null(g->have_decode, g->ms_dense));
    json_object_set_new(o, "us_per_cold_layer", num_or_null(g->have_decode, g->us_cold_layer));
    gpu_pred p = predict(pl);
    if (p.ok)
        json_object_set_new(o, "predicted", json_pack("{s:f, s:f, s:f, s:f, s:o, s:f}", "tok_s", 1000.0 / p.ms,
                                                      "ms_per_token", p.ms, "n_cpu_moe_tok_s", 1000.0 / p.ms_ncm,
                                                      "n_cpu_moe_ms_per_token", p.ms_ncm, "break_even_hit_rate",
                                                      p.break_even >= 0 ? json_real(p.break_even) : json_null(),
                                                      "cpu_units_per_upload", p.cpu_units_per_upload));
    else
        json_object_set_new(o, "predicted", json_null());
    return o;
}

static hm_status print_json(const plan *pl, FILE *out) {
    const hm_units *u = &pl->units;
    const pol_run *r = main_run(pl);
    char src[1200];
    source_words(pl, src, sizeof src);
    json_t *j = json_object(), *layers = json_array(), *cmp = json_object();
    if (!j || !layers || !cmp) {
        json_decref(j), json_decref(layers), json_decref(cmp);
        return HM_ERR_NOMEM;
    }
    json_object_set_new(j, "model", json_string(pl->model));
    json_object_set_new(j, "arch", json_string(pl->arch));
    json_object_set_new(j, "n_layer", json_integer(u->n_layer));
    json_object_set_new(j, "n_expert", json_integer(u->n_expert));
    json_object_set_new(j, "k", json_integer(pl->k));
    json_object_set_new(j, "n_units", json_integer((json_int_t)u->n_units));
    json_object_set_new(j, "unit_bytes", json_integer((json_int_t)u->unit_bytes_max));
    json_object_set_new(j, "expert_bytes", json_integer((json_int_t)u->expert_bytes));
    json_object_set_new(j, "budget_bytes", json_integer((json_int_t)pl->budget_bytes));
    json_object_set_new(j, "units_fit", json_integer(pl->slots));
    json_object_set_new(j, "units_fraction", json_real((double)pl->slots / (double)u->n_units));
    json_object_set_new(j, "policy", json_string(hm_policy_name(pl->kind)));
    json_object_set_new(j, "hit_rate", json_real(r->hit));
    json_object_set_new(j, "evaluated_on", json_string(r == &pl->in_sample ? "profile counts (in-sample)" : src));
    size_t i = 0;
    for (int32_t l = 0; l < u->n_layer; l++) {
        json_t *lo = json_object(), *ex = json_array();
        for (int32_t e = 0; e < u->layers[l].n_expert; e++, i++)
            if (r->chosen[i]) json_array_append_new(ex, json_integer(e));
        json_object_set_new(lo, "layer", json_integer(l));
        json_object_set_new(lo, "resident", json_integer(r->resident[l]));
        json_object_set_new(lo, "hit_rate", json_real(r->ltot[l] ? (double)r->lhit[l] / (double)r->ltot[l] : 0));
        json_object_set_new(lo, "experts", ex);
        json_array_append_new(layers, lo);
    }
    json_object_set_new(j, "layers", layers);
    for (int k = HM_POLICY_STATIC; k < HM_POLICY_COUNT; k++)
        if (pl->on[k].done) json_object_set_new(cmp, hm_policy_name((hm_policy_kind)k), json_real(pl->on[k].hit));
    if (pl->in_sample.done) json_object_set_new(cmp, "static_in_sample", json_real(pl->in_sample.hit));
    json_object_set_new(cmp, "routing", json_string(src));
    json_object_set_new(j, "compare", cmp);
    json_object_set_new(j, "n_cpu_moe", json_pack("{s:i, s:I, s:f}", "n", pl->ncm, "gpu_bytes", (json_int_t)pl->ncm_bytes,
                                                  "hit_rate", pl->ncm_hit));
    if (pl->calibrated)
        json_object_set_new(j, "cpu", json_pack("{s:f, s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "us_per_unit_1t",
                                                pl->cal.us_unit_1t, "threads", pl->cal.n_threads, "us_per_unit",
                                                pl->cal.us_unit_nt, "gb_per_s", pl->cal.gbs_nt, "cpu_units_per_token",
                                                cpu_units_per_token(pl, r->hit), "cpu_tok_s", cpu_tok_s(pl, r->hit),
                                                "n_cpu_moe_units_per_token", cpu_units_per_token(pl, pl->ncm_hit),
                                                "n_cpu_moe_tok_s", cpu_tok_s(pl, pl->ncm_hit)));
    else
        json_object_set_new(j, "cpu", json_null());
    json_object_set_new(j, "gpu", gpu_json(pl));
    json_object_set_new(j, "ram", ram_json(pl));
    json_object_set_new(j, "gpus", gpus_json(pl));
    int rc = json_dumpf(j, out, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    fputc('\n', out);
    json_decref(j);
    return rc ? HM_ERR_IO : HM_OK;
}

static hm_status load_inputs(plan *pl, hm_err *err) {
    const hm_plan_opts *o = pl->o;
    hm_status st;
    if (!o->profile_path && !o->trace_path)
        return hm_errf(err, HM_ERR_ARG, "plan needs usage data: --profile FILE or --trace FILE");
    /* the model first: the usage data's dimensions are checked against it before anything is
     * sized from them (a profile naming expert 65535 or layer 1999 is an error, not a 64 GiB
     * allocation or minutes of simulating empty layers) */
    if (o->model_path) {
        if ((st = hm_gguf_open(&pl->gguf, o->model_path, err))) return st;
        if ((st = hm_units_init(&pl->units, pl->gguf, err))) return st;
        if (!pl->units.n_units)
            return hm_errf(err, HM_ERR_ARG, "%s: the model has no expert tensors (not an MoE model?)", o->model_path);
    }
    int32_t want_layers = o->model_path ? pl->units.n_layer : 0, want_experts = o->model_path ? pl->units.n_expert : 0;
    if (o->profile_path) {
        if ((st = hm_profile_read_for(&pl->prof, o->profile_path, want_layers, want_experts, err))) return st;
    } else if ((st = hm_sim_trace_profile(o->trace_path, want_layers, want_experts, &pl->prof, err))) {
        return st;
    }
    pl->have_prof = true;
    snprintf(pl->model, sizeof pl->model, "%s", pl->prof.model);
    snprintf(pl->arch, sizeof pl->arch, "%s", pl->prof.arch);
    if (o->model_path) {
        hm_gguf_str s;
        if (hm_gguf_get_str(pl->gguf, "general.name", &s) && s.len < 256)
            snprintf(pl->model, sizeof pl->model, "%.*s", (int)s.len, s.ptr);
        if (hm_gguf_get_str(pl->gguf, "general.architecture", &s) && s.len < 64)
            snprintf(pl->arch, sizeof pl->arch, "%.*s", (int)s.len, s.ptr);
        if (pl->units.n_layer != pl->prof.n_layer || pl->units.n_expert != pl->prof.n_expert)
            return hm_errf(err, HM_ERR_ARG, "%s has %d layers x %d experts but the model %s has %d x %d",
                           o->profile_path ? o->profile_path : o->trace_path, pl->prof.n_layer, pl->prof.n_expert,
                           o->model_path, pl->units.n_layer, pl->units.n_expert);
    } else {
        uint64_t ub = o->unit_bytes ? o->unit_bytes : pl->prof.unit_bytes;
        if (!ub)
            return hm_errf(err, HM_ERR_ARG, "the size of a unit is unknown: give the model (-m MODEL.gguf) or "
                           "--unit-bytes SIZE");
        int32_t k = pl->prof.k;
        if ((st = hm_units_init_geom(&pl->units, pl->prof.n_layer, pl->prof.n_expert, k, ub, err))) return st;
    }
    pl->k = pl->units.n_expert_used ? pl->units.n_expert_used : pl->prof.k;
    if (pl->k <= 0) return hm_errf(err, HM_ERR_ARG, "experts per token unknown (neither the model nor the usage data say)");
    if (!pl->model[0] && o->model_path) snprintf(pl->model, sizeof pl->model, "%s", o->model_path);
    return HM_OK;
}

hm_status hm_plan(const hm_plan_opts *o, FILE *out, hm_err *err) {
    hm_plan_opts dflt;
    if (!o) hm_plan_opts_default(&dflt), o = &dflt;
    plan *pl = calloc(1, sizeof *pl);
    if (!pl) return hm_errf(err, HM_ERR_NOMEM, "plan: out of memory");
    pl->o = o;
    hm_status st = load_inputs(pl, err);
    if (st) goto done;
    const hm_units *u = &pl->units;
    pl->have_vram = o->budget >= 0 || o->budget_frac > 0 || o->n_gpu_budgets > 0;
    if (o->n_gpu_budgets > 0) {
        if ((st = plan_gpus(pl, err))) goto done;
    } else if (!pl->have_vram && (o->ram_budget >= 0 || o->ram_budget_frac > 0)) {
        pl->slots = 0; /* RAM+SSD only: no VRAM tier */
    } else if (o->budget >= 0) {
        pl->slots = (int64_t)hm_units_fit(u, o->budget);
        pl->budget_bytes = (uint64_t)o->budget;
    } else if (o->budget_frac > 0 && o->budget_frac <= 1) {
        pl->slots = (int64_t)llround(o->budget_frac * (double)u->n_units);
        pl->budget_bytes = (uint64_t)pl->slots * u->unit_bytes_max;
    } else {
        st = hm_errf(err, HM_ERR_ARG, "plan needs a budget: --budget SIZE (e.g. 12GiB) or a share of the units (e.g. 20%%), "
                     "and/or --ram-budget SIZE|N%%");
        goto done;
    }
    int kind = o->policy ? hm_policy_from_name(o->policy) : (o->profile_path ? HM_POLICY_STATIC : HM_POLICY_ONLINE);
    if (kind <= HM_POLICY_NONE) {
        char names[96];
        st = hm_errf(err, HM_ERR_ARG, "unknown policy '%s' (%s)", o->policy, hm_policy_names(names, sizeof names, true));
        goto done;
    }
    pl->kind = (hm_policy_kind)kind;
    if (!o->trace_path) {
        int64_t n = o->sim_tokens > 0 ? o->sim_tokens : (int64_t)pl->prof.decode_tokens;
        if (o->sim_tokens <= 0) n = n < 2000 ? 2000 : n > 20000 ? 20000 : n;
        pl->sim_tokens = n;
        if ((st = eval_in_sample(pl, pl->slots, &pl->in_sample, err))) goto done;
    }
    for (int k = HM_POLICY_STATIC; k < HM_POLICY_COUNT; k++)
        if ((st = eval_on_routing(pl, pl->slots, (hm_policy_kind)k, &pl->on[k], err))) goto done;
    for (int peer = 0; pl->have_gpus && peer < 2; peer++)
        if ((st = eval_routing_as(pl, pl->slots, pl->kind, true, peer, &pl->gpu_on[peer], pl->gused[peer],
                                  pl->gpeer[peer], err)))
            goto done;
    if ((st = plan_ram(pl, err))) goto done;
    eval_layer_split(pl);
    if (o->model_path && o->calibrate) {
        int32_t nt = o->n_threads > 0 ? o->n_threads : (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
        if (nt < 1) nt = 1;
        hm_err cerr = {{0}}, gerr = {{0}};
        if (hm_calib_cpu(u, nt, &pl->cal, &cerr) == HM_OK) pl->calibrated = true;
        else snprintf(pl->calib_note, sizeof pl->calib_note, "not measured (%.200s)", cerr.msg);
        /* never fatal: without a GPU (or when it fails) the report says why and goes on */
        if (!pl->have_vram)
            snprintf(pl->gpu_note, sizeof pl->gpu_note, "not measured (no VRAM budget)");
        else if (hm_calib_gpu_measure(o->model_path, u, nt, pl->calibrated ? pl->cal.us_unit_nt : 0, &pl->gcal, &gerr) == HM_OK)
            pl->gpu_measured = true;
        else snprintf(pl->gpu_note, sizeof pl->gpu_note, "not measured (%.300s)", gerr.msg);
        hm_err serr = {{0}};
        if (pl->have_ram && !pl->ram_all) {
            if (hm_calib_ssd_read(o->model_path, u, PLAN_SSD_CALIB_UNITS, PLAN_SSD_QD_UNITS, false, &pl->ssd, &serr) == HM_OK)
                pl->ssd_measured = true;
            else snprintf(pl->ssd_note, sizeof pl->ssd_note, "not measured (%.200s)", serr.msg);
        }
    } else {
        snprintf(pl->calib_note, sizeof pl->calib_note, "not measured (%s)",
                 o->model_path ? "--no-calibrate" : "needs the model file, -m MODEL.gguf");
        snprintf(pl->gpu_note, sizeof pl->gpu_note, "%s", pl->calib_note);
        snprintf(pl->ssd_note, sizeof pl->ssd_note, "%s", pl->calib_note);
    }
    if (o->json) {
        if ((st = print_json(pl, out))) hm_errf(err, st, "plan: could not write the JSON report");
    } else {
        print_text(pl, out);
    }
done:
    run_free(&pl->in_sample), run_free(&pl->ram_in_sample), run_free(&pl->gpu_on[0]), run_free(&pl->gpu_on[1]);
    free(pl->layer_dev);
    for (int k = 0; k < HM_POLICY_COUNT; k++) run_free(&pl->on[k]), run_free(&pl->ram_on[k]);
    hm_units_free(&pl->units);
    hm_gguf_close(pl->gguf);
    hm_profile_free(&pl->prof);
    free(pl);
    return st;
}
