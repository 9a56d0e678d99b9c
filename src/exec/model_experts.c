/* model_experts.c - a model's expert store: opening it from the placement options, and the public
 * view of it (hotmoe.h, "Expert store of a model").
 *
 * One store per model, not per session. The store's counting has one writer, the thread that
 * drives the forward pass; the server steps all its sessions on one engine thread, so the sessions
 * of a model share the model's store and the profile it writes covers every request. The session
 * enforces "one eval at a time per model" (hm_model.busy), so a caller that breaks the rule gets
 * an error, not torn counters.
 *
 * Tiers. Without a GPU placement the store runs with zero fast slots (the policy is only a name)
 * and every unit is computed by the CPU. With one (CUDA builds, hm_model_gpu_open) the store's fast
 * tier is the VRAM slot pool. With a --ram-budget below the experts' bytes the RAM tier
 * (experts/tier_ram.h, m->ram) holds units in a RAM slot pool and reads the others from the file
 * (SSD) when routed; with a VRAM pool too, the three tiers are exclusive: a unit in a VRAM slot is
 * barred from the RAM slots and loses its RAM copy once its VRAM copy has landed, a unit that leaves
 * VRAM takes a free RAM slot when the RAM policy keeps slots, else it is SSD-only. The VRAM store
 * places units by the placement flags; the RAM tier's policy is the one asked for (--policy, or
 * static with --profile; none = staging only), not the one a VRAM budget picks for VRAM.
 *
 * Invariants: m->experts != NULL exactly when the model has expert units; m->policy is the kind
 * the store was opened with or last switched to. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "experts/profile.h"
#include "model/model.h"
#include "model_gpu.h"
#ifdef HM_HAVE_CUDA
#include "experts/tier_vram.h"
#include "backend/cuda/cuda_device.h"
#endif

void hm_placement_opts_default(hm_placement_opts *o) {
    memset(o, 0, sizeof *o);
    o->update_rate = -1.0f;
    o->vram_reserve = -1;
    o->n_cpu_moe = -1;
    o->flash_attn = -1;
    o->admit_misses = -1;
    o->elite_pct = -1.0f;
}

int hm_profile_fmt_from_name(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "hotmoe")) return HM_PROFILE_FMT_HOTMOE;
    if (!strcmp(name, "seed1")) return HM_PROFILE_FMT_SEED1;
    if (!strcmp(name, "sglang")) return HM_PROFILE_FMT_SGLANG;
    return -1;
}

const char *hm_profile_fmt_name(hm_profile_fmt fmt) {
    switch (fmt) {
    case HM_PROFILE_FMT_HOTMOE: return "hotmoe";
    case HM_PROFILE_FMT_SEED1: return "seed1";
    case HM_PROFILE_FMT_SGLANG: return "sglang";
    }
    return "?";
}

/* The public format as the profile writer's (-1 for an unknown value). */
static int profile_format(hm_profile_fmt fmt) {
    switch (fmt) {
    case HM_PROFILE_FMT_HOTMOE: return HM_PROFILE_HOTMOE;
    case HM_PROFILE_FMT_SEED1: return HM_PROFILE_SEED1;
    case HM_PROFILE_FMT_SGLANG: return HM_PROFILE_SGLANG;
    }
    return -1;
}

hm_status hm_profile_convert(const char *in, const char *out, hm_profile_fmt fmt, int32_t n_layer, int32_t n_expert,
                             hm_err *err) {
    int wf = profile_format(fmt);
    if (wf < 0) return hm_errf(err, HM_ERR_ARG, "unknown profile format %d", (int)fmt);
    hm_profile p;
    hm_status st = hm_profile_read_for(&p, in, n_layer, n_expert, err);
    if (st != HM_OK) return st;
    st = hm_profile_write(&p, out, (hm_profile_format)wf, err);
    hm_profile_free(&p);
    return st;
}

const char *hm_unit_home_name(hm_unit_home h) {
    switch (h) {
    case HM_HOME_SSD: return "ssd";
    case HM_HOME_RAM: return "ram";
    case HM_HOME_VRAM: return "vram";
    }
    return "unknown";
}

static hm_ssd_fault_fn test_fault;
static void *test_fault_ctx;
void hm_model_test_io_fault(hm_ssd_fault_fn fn, void *ctx) {
    test_fault = fn;
    test_fault_ctx = ctx;
}

hm_status hm_model_experts_open(hm_model *m, const hm_placement_opts *po, hm_err *err) {
    hm_placement_opts dflt;
    if (!po) hm_placement_opts_default(&dflt), po = &dflt;
#ifndef HM_HAVE_CUDA
    if (hm_placement_wants_gpu(po))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "this hotmoe was built without CUDA, so -ngl / --vram-budget / -ts "
                       "cannot be used (rebuild with nvcc installed, or drop them to run on the CPU)");
#endif
    if (po->ram_budget < 0) return hm_errf(err, HM_ERR_ARG, "the RAM budget must not be negative");
    if (po->io_depth < 0 || po->io_depth > 4096)
        return hm_errf(err, HM_ERR_ARG, "--io-depth %d outside [1, 4096]", (int)po->io_depth);
    int kind = HM_POLICY_NONE;
    if (po->policy) {
        kind = hm_policy_from_name(po->policy);
        char names[96];
        if (kind < 0)
            return hm_errf(err, HM_ERR_ARG, "unknown placement policy '%s' (%s)", po->policy,
                           hm_policy_names(names, sizeof names, false));
    } else if (po->profile) {
        kind = po->no_preload ? HM_POLICY_ONLINE : HM_POLICY_STATIC; /* no preload: learn from an empty pool */
    }
    if (po->admit_misses < -1 || po->max_inserts < 0 || !(po->demand_half_life >= 0) || po->stats_every < 0 ||
        !(po->elite_pct <= 100))
        return hm_errf(err, HM_ERR_ARG, "expert cache options out of range (admission misses, inserts per step, "
                       "demand half-life and stats cadence >= 0, elite share <= 100 %%)");
    int ram_kind = kind; /* the RAM tier's policy: what was asked, before a GPU placement's choice */
    bool ram_profile = po->profile != NULL; /* the user's profile still in prof for the RAM tier */

    hm_status st = hm_units_init(&m->units, m->gguf, err);
    if (st != HM_OK) return st;
    if (m->units.n_units == 0) { /* a dense model: nothing to count */
        if (po->profile || po->policy)
            return hm_errf(err, HM_ERR_ARG, "the model has no expert tensors, so --profile/--policy do not apply");
        return HM_OK;
    }

    hm_profile prof;
    memset(&prof, 0, sizeof prof);
    if (po->profile && (st = hm_profile_read_for(&prof, po->profile, m->units.n_layer, m->units.n_expert, err)) != HM_OK)
        return st;

    hm_experts_opts eo;
    hm_experts_opts_default(&eo);
    eo.profile = po->profile ? &prof : NULL;
    eo.hot_slots = 0;
    eo.hot_tier = NULL;
    bool store_failed = false; /* the one failure a --profile can cause (geometry, policy): named after it */
#ifdef HM_HAVE_CUDA
    int64_t group_slots[HM_MAX_GPUS];
    if (hm_placement_wants_gpu(po)) {
        int64_t slots = 0;
        int32_t layer_from = -1;
        if ((st = hm_model_gpu_open(m, po, &slots, &layer_from, err)) != HM_OK) goto done;
        eo.hot_slots = slots;
        eo.hot_tier = slots > 0 ? &m->gpu->hot : NULL;
        if (m->gpu->n_dev > 1) { /* one slot group per device; a unit stays on its layer's device */
            for (int32_t d = 0; d < m->gpu->n_dev; d++) group_slots[d] = m->gpu->dev[d].n_slots;
            eo.n_groups = m->gpu->n_dev;
            eo.group_slots = group_slots;
            eo.layer_group = m->gpu->layer_dev;
            eo.allow_peer = !po->no_peer;
        }
        if (layer_from >= 0 && slots > 0) {
            /* layer placement (-ngl alone, --n-cpu-moe): a static placement from a profile that
             * counts exactly the units of layers >= layer_from */
            if (po->policy || po->profile)
                hm_log_printf(&m->log, HM_LOG_WARN, "%s places experts by layer: --profile/--policy are ignored "
                              "(give --vram-budget to place units by use)",
                              po->n_cpu_moe >= 0 ? "--n-cpu-moe" : "-ngl without --cpu-moe");
            hm_profile_free(&prof);
            ram_profile = false;
            if ((st = hm_profile_init(&prof, m->units.n_layer, m->units.n_expert, err)) != HM_OK) goto done;
            for (int32_t l = layer_from; l < m->units.n_layer; l++)
                for (int32_t e = 0; e < m->units.layers[l].n_expert && e < prof.n_expert; e++)
                    prof.counts[(size_t)l * (size_t)prof.n_expert + (size_t)e] = 1;
            eo.profile = &prof;
            kind = HM_POLICY_STATIC;
        } else if (slots > 0 && kind == HM_POLICY_NONE && !po->policy) {
            kind = HM_POLICY_ONLINE; /* a budget without a profile: learn the hot units while running */
        }
    }
#endif
    eo.policy.kind = (hm_policy_kind)kind;
    if (po->admit_misses >= 0) eo.policy.admit_misses = po->admit_misses;
    eo.policy.max_inserts = po->max_inserts;
    if (po->demand_half_life > 0) /* per window of `window` steps: 0.5^(window / half-life) */
        eo.policy.decay = (float)pow(0.5, (double)eo.policy.window / (double)po->demand_half_life);
    if (po->elite_pct >= 0) eo.policy.elite_pct = po->elite_pct;
    m->stats_every = po->stats_every;
    m->stats_tokens = 0;
    if (po->update_rate >= 0) eo.policy.update_rate = po->update_rate;
    st = hm_experts_open(&m->experts, &m->units, &eo, err);
    store_failed = st != HM_OK;
#ifdef HM_HAVE_CUDA
    if (st == HM_OK && m->gpu && m->gpu->n_slots > 0) { /* the initial placement's copies, before step 0 */
        if ((st = hm_model_gpu_wait_fills(m, err)) == HM_OK) hm_experts_land(m->experts);
    }
#endif
    /* The SSD tier: only when the RAM budget is below the expert bytes (else the plain mmap). */
    if (st == HM_OK && po->ram_budget > 0 && (uint64_t)po->ram_budget < m->units.expert_bytes) {
        const char *path = hm_gguf_path(m->gguf);
        if (!path || !*path) {
            st = hm_errf(err, HM_ERR_ARG, "--ram-budget needs a model file (this one is an in-memory image)");
        } else {
            hm_experts_stats es;
            hm_experts_get_stats(m->experts, &es);
            hm_ram_tier_opts ro;
            hm_ram_tier_opts_default(&ro);
            ro.budget = po->ram_budget;
            ro.mlock = po->mlock;
            ro.policy = eo.policy;
            ro.policy.kind = (hm_policy_kind)ram_kind;
            ro.profile = ram_profile ? &prof : NULL;
            if (ram_kind == HM_POLICY_STATIC && !ro.profile) /* its profile was the layer placement's */
                ro.policy.kind = HM_POLICY_NONE;
            ro.vram = es.n_slots > 0 ? m->experts : NULL; /* the VRAM store, when it has slots */
            if (po->io_depth > 0) ro.io.queue_depth = po->io_depth;
            ro.io.force_pread = po->io_pread;
            ro.io.fault = test_fault;
            ro.io.fault_ctx = test_fault_ctx;
            st = hm_ram_tier_open(&m->ram, path, &m->units, &ro, err);
            if (st == HM_OK) m->prefetch = po->prefetch;
        }
    }
    /* --mlock with the plain mapping: the experts stay in RAM (as llama.cpp's --mlock keeps the
     * model); with the SSD tier it locked that tier's pool above */
    if (st == HM_OK && po->mlock && !m->ram) {
        const int64_t t0 = hm_time_us();
        size_t total = 0;
        for (int32_t f = 0; f < m->units.n_files && st == HM_OK; f++) { /* a split model: each file's mapping */
            const char *lo;
            size_t len;
            hm_units_span(&m->units, f, &lo, &len);
            if (len && (st = hm_mlock_range(lo, len, "the experts of the model mapping", err)) == HM_OK) total += len;
        }
        if (st == HM_OK && total) {
            m->mlocked_bytes = total;
            hm_log_printf(&m->log, HM_LOG_INFO, "--mlock: %.2f GiB of expert weights locked in RAM (%.1f s)",
                          (double)total / (1024.0 * 1024.0 * 1024.0), (double)(hm_time_us() - t0) * 1e-6);
        }
    }
#ifdef HM_HAVE_CUDA
done:
#endif
    if (st != HM_OK && po->profile && store_failed) {
        char tmp[sizeof err->msg];
        if (err) {
            snprintf(tmp, sizeof tmp, "%s", err->msg);
            hm_errf(err, st, "%s: %s", po->profile, tmp);
        }
    }
    hm_profile_free(&prof);
    if (st != HM_OK) {
        hm_model_experts_close(m);
        return st;
    }
    m->policy = (hm_policy_kind)kind;
    return HM_OK;
}

void hm_model_experts_tick(hm_model *m, int32_t n_tok) {
    if (m->stats_every <= 0 || !m->experts || n_tok <= 0) return;
    const uint64_t every = (uint64_t)m->stats_every, before = m->stats_tokens;
    m->stats_tokens += (uint64_t)n_tok;
    if (m->stats_tokens / every == before / every) return;
    hm_experts_stats es;
    hm_experts_get_stats(m->experts, &es);
    const hm_log lg = {HM_LOG_INFO}; /* asked for: printed whatever the verbosity */
    const uint64_t routed = es.hits + es.misses;
    hm_log_printf(&lg, HM_LOG_INFO, "expert cache @ %" PRIu64 " tokens: policy %s, %" PRId64 "/%" PRId64
                  " slots used, hit rate %.1f %% (%" PRIu64 " of %" PRIu64 "), %" PRIu64 " units in, %" PRIu64
                  " out, %.1f MiB copied, %" PRId64 " elite units", m->stats_tokens, hm_policy_name(m->policy), es.n_used, es.n_slots,
                  routed ? 100.0 * (double)es.hits / (double)routed : 0.0, es.hits, routed, es.swaps_in, es.swaps_out,
                  (double)es.fill_bytes / (1024.0 * 1024.0), es.elite_units);
}

int hm_gpu_count(void) {
#ifdef HM_HAVE_CUDA
    int n = hm_cuda_device_count();
    return n > 0 ? n : 0;
#else
    return 0;
#endif
}

bool hm_placement_wants_gpu(const hm_placement_opts *o) {
    bool ts = false;
    for (int32_t i = 0; i < o->n_tensor_split && i < HM_MAX_GPUS; i++) ts = ts || o->tensor_split[i] != 0.0f;
    return o->n_gpu_layers > 0 || o->vram_budget != 0 || o->n_vram_budgets > 0 || ts;
}

void hm_model_experts_close(hm_model *m) {
    hm_ram_tier_close(m->ram); /* waits for reads in flight; before the store it may borrow */
    m->ram = NULL;
    hm_experts_close(m->experts);
    m->experts = NULL;
#ifdef HM_HAVE_CUDA
    hm_model_gpu_close(m); /* after the store, which borrows its tier */
#endif
    hm_units_free(&m->units);
    m->mlocked_bytes = 0; /* the lock goes with the mapping */
}

static hm_status no_experts(const hm_model *m, hm_err *err) {
    return hm_errf(err, HM_ERR_UNSUPPORTED, "the model (%s) has no expert tensors", m->arch_name);
}

bool hm_model_has_experts(const hm_model *m) { return m->experts != NULL; }

hm_status hm_model_profile_save(const hm_model *m, const char *path, hm_profile_fmt fmt, hm_err *err) {
    if (!m->experts) return no_experts(m, err);
    int wf = profile_format(fmt);
    if (wf < 0) return hm_errf(err, HM_ERR_ARG, "unknown profile format %d", (int)fmt);
    hm_profile p;
    hm_status st = hm_experts_to_profile(m->experts, &p, m->name, m->arch_name, err);
    if (st != HM_OK) return st;
    st = hm_profile_write(&p, path, (hm_profile_format)wf, err);
    hm_profile_free(&p);
    return st;
}

hm_status hm_model_trace_out(hm_model *m, const char *path, hm_err *err) {
    if (!m->experts) return no_experts(m, err);
    return hm_experts_trace_out(m->experts, path, err);
}

hm_status hm_model_trace_close(hm_model *m, hm_err *err) {
    return m->experts ? hm_experts_trace_close(m->experts, err) : HM_OK;
}

const char *hm_model_policy(const hm_model *m) { return hm_policy_name(m->policy); }

hm_status hm_model_set_policy(hm_model *m, const char *policy, hm_err *err) {
    if (!m->experts) return no_experts(m, err);
    int kind = hm_policy_from_name(policy);
    char names[96];
    if (kind < 0)
        return hm_errf(err, HM_ERR_ARG, "unknown placement policy '%s' (%s)", policy,
                       hm_policy_names(names, sizeof names, false));
    /* the store re-plans its fast slots (static: from the profile or the live counts; online, lru:
     * from the live counters); without slots only the name changes. A fill error still leaves
     * the new policy in force, so the name follows the store either way. */
    hm_status st = hm_experts_set_policy(m->experts, (hm_policy_kind)kind, NULL, err);
    m->policy = hm_experts_policy(m->experts);
    return st;
}

void hm_usage_free(hm_usage *u) {
    if (!u) return;
    free(u->counts);
    free(u->home);
    free(u->layer_hits);
    free(u->layer_misses);
    free(u->layer_gpu);
    u->counts = NULL, u->home = NULL, u->layer_hits = u->layer_misses = NULL, u->layer_gpu = NULL;
}

hm_status hm_model_usage(const hm_model *m, hm_usage *u, hm_err *err) {
    memset(u, 0, sizeof *u);
    if (!m->experts) return no_experts(m, err);
    const hm_units *un = &m->units;
    hm_experts_stats es;
    hm_experts_get_stats(m->experts, &es);
    const size_t nl = (size_t)un->n_layer, nu = nl * (size_t)un->n_expert;
    u->counts = calloc(nu, sizeof *u->counts);
    u->home = calloc(nu, sizeof *u->home);
    u->layer_hits = calloc(nl, sizeof *u->layer_hits);
    u->layer_misses = calloc(nl, sizeof *u->layer_misses);
    if (!u->counts || !u->home || !u->layer_hits || !u->layer_misses) {
        hm_usage_free(u);
        return hm_errf(err, HM_ERR_NOMEM, "usage snapshot: out of memory");
    }
    u->n_layer = un->n_layer, u->n_expert = un->n_expert, u->n_expert_used = un->n_expert_used;
    u->policy = hm_policy_name(m->policy);
    u->tokens = es.tokens, u->prompt_tokens = es.prompt_tokens, u->decode_tokens = es.decode_tokens;
    u->steps = (uint64_t)es.steps;
    u->hits = es.hits, u->misses = es.misses;
    u->vram_slots = es.n_slots, u->vram_slots_used = es.n_used;
    u->unit_bytes = un->unit_bytes_max;
    u->swaps_in = es.swaps_in, u->swaps_out = es.swaps_out, u->bytes_to_vram = es.fill_bytes;
    u->elite_units = es.elite_units;
    u->bytes_from_ssd = 0;
    if (m->ram) {
        hm_ram_tier_stats rs;
        hm_ram_tier_get_stats(m->ram, &rs);
        u->bytes_from_ssd = rs.read_bytes;
        u->ram_budget = (int64_t)rs.pool_bytes;
        u->ram_slots = rs.n_slots, u->ram_stage = rs.n_stage;
        u->ram_acquired = rs.acquired;
        u->ram_hits = rs.hit_slot + rs.hit_stage + rs.hit_prefetch;
        u->ram_hit_prefetch = rs.hit_prefetch;
        u->ssd_reads = rs.reads, u->ssd_errors = rs.io_errors;
        u->prefetch_pred = rs.pred, u->prefetch_used = rs.pred_used, u->prefetch_acq = rs.acq_predicted;
        u->ssd_wait_us = rs.wait_us;
        u->io_uring = rs.uring, u->io_direct = rs.direct, u->ram_mlocked = rs.mlocked;
    }
    u->mlocked_bytes = m->mlocked_bytes;
#ifdef HM_HAVE_CUDA
    if (m->gpu) {
        const hm_gpu *g = m->gpu;
        if (!(u->layer_gpu = malloc(nl * sizeof *u->layer_gpu))) {
            hm_usage_free(u);
            return hm_errf(err, HM_ERR_NOMEM, "usage snapshot: out of memory");
        }
        u->n_gpus = g->n_dev;
        u->stream_units = g->stream_units;
        u->stream_bytes = g->stream_bytes;
        u->stream_ahead = g->stream_ahead;
        u->stream_ahead_used = g->stream_ahead_used;
        u->gpu_pinned_bytes = g->pinned_bytes;
        for (int32_t d = 0; d < g->n_dev; d++) {
            hm_vram_tier_stats ts;
            if (g->dev[d].vram) hm_vram_tier_get_stats(g->dev[d].vram, &ts), u->gpu_direct_fills += ts.direct;
            if (g->dev[d].stream) hm_vram_tier_get_stats(g->dev[d].stream, &ts), u->gpu_direct_fills += ts.direct;
        }
        for (int32_t d = 0; d < g->n_dev; d++) {
            u->gpu_ordinal[d] = g->dev[d].ordinal;
            if (hm_experts_n_groups(m->experts) > 1) {
                hm_experts_group_stats(m->experts, d, &u->gpu_slots[d], &u->gpu_slots_used[d], &u->gpu_peer[d]);
            } else {
                u->gpu_slots[d] = es.n_slots;
                u->gpu_slots_used[d] = es.n_used;
            }
        }
        for (size_t l = 0; l < nl; l++) u->layer_gpu[l] = hm_gpu_layer_dev(g, (int32_t)l);
    }
#endif
    memcpy(u->layer_hits, es.layer_hits, nl * sizeof *u->layer_hits);
    memcpy(u->layer_misses, es.layer_misses, nl * sizeof *u->layer_misses);
    for (int32_t l = 0; l < un->n_layer; l++) {
        for (int32_t e = 0; e < un->n_expert; e++) {
            size_t i = (size_t)l * (size_t)un->n_expert + (size_t)e;
            if (e >= un->layers[l].n_expert) { /* a dense layer: no unit */
                u->home[i] = HM_HOME_RAM;
                continue;
            }
            const hm_unit *x = hm_experts_unit(m->experts, l, e);
            u->counts[i] = x->count;
            hm_unit_home h = x->home == HM_TIER_HOT ? HM_HOME_VRAM : x->home == HM_TIER_SSD ? HM_HOME_SSD : HM_HOME_RAM;
            if (m->ram && h == HM_HOME_RAM && hm_ram_tier_where(m->ram, l, e) == 0) h = HM_HOME_SSD;
            u->home[i] = (uint8_t)h;
            u->units[h]++;
        }
    }
    return HM_OK;
}
