/* srv_store.c - the expert store as the server shows it: GET /experts, the hotmoe_expert_*
 * metrics, POST /profile/save and POST /experts/policy.
 *
 * This file is the only one in the server that knows about the expert store, and it sees it only
 * through hotmoe.h: the model owns one store shared by every slot's session (the engine thread
 * steps them one at a time, which is the store's single-writer rule), and
 *   layers[l].counts[e] = usage.counts[l * n_expert + e]   layers[l].tier[e] = hm_unit_home_name
 *   layers[l].hit_rate  = layer_hits / (layer_hits + layer_misses), null before any selection
 *   units{vram,ram,ssd} = usage.units[]      bytes moved = bytes_to_vram, bytes_from_ssd; swaps
 *   mlocked_bytes       = usage.mlocked_bytes (--mlock)
 *   gpu                 = null without a GPU placement, else {devices: [{ordinal, slots, slots_used,
 *                         peer}], layer_device: [device index of each layer], prefill_stream:
 *                         {units, bytes, ahead, ahead_used}, pinned_bytes, direct_fills} from
 *                         usage.gpu_*, layer_gpu, stream_* (pinned: --mlock's expert bytes
 *                         registered with CUDA; direct fills: copies to VRAM straight from them)
 *   /profile/save       = hm_model_profile_save (tmp + rename; ?format=hotmoe|seed1|sglang)
 *   policy switch       = hm_model_set_policy
 * Every function here runs on the engine thread between rounds (srv_sched_call), because the
 * store's residency is only read and changed between steps. A model without expert tensors
 * answers "available": false and 501 for the write/switch calls. */
#include <stdio.h>
#include <string.h>

#include "server/server.h"

static json_t *policy_list(void) { /* hotmoe.h's table: static, online, lru, none */
    json_t *pol = json_array();
    for (int i = 0; i < hm_policy_count(); i++) json_array_append_new(pol, json_string(hm_policy_info(i, NULL)));
    return pol;
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

/* The "gpu" member of /experts: null without a GPU placement. */
static json_t *gpu_json(const hm_usage *u) {
    if (u->n_gpus <= 0) return json_null();
    json_t *devs = json_array(), *ld = json_array();
    for (int32_t d = 0; d < u->n_gpus && d < HM_MAX_GPUS; d++)
        json_array_append_new(devs, json_pack("{s:i, s:I, s:I, s:I}", "ordinal", u->gpu_ordinal[d], "slots",
                                              (json_int_t)u->gpu_slots[d], "slots_used",
                                              (json_int_t)u->gpu_slots_used[d], "peer", (json_int_t)u->gpu_peer[d]));
    for (int32_t l = 0; u->layer_gpu && l < u->n_layer; l++) json_array_append_new(ld, json_integer(u->layer_gpu[l]));
    return json_pack("{s:o, s:o, s:{s:I, s:I, s:I, s:I}, s:I, s:I}", "devices", devs, "layer_device", ld,
                     "prefill_stream", "units", (json_int_t)u->stream_units, "bytes", (json_int_t)u->stream_bytes,
                     "ahead", (json_int_t)u->stream_ahead, "ahead_used", (json_int_t)u->stream_ahead_used,
                     "pinned_bytes", (json_int_t)u->gpu_pinned_bytes, "direct_fills",
                     (json_int_t)u->gpu_direct_fills);
}

json_t *srv_store_experts_json(srv_sched *s) {
    const hm_model_info *mi = hm_model_get_info(s->model);
    hm_usage u;
    hm_err err;
    if (hm_model_usage(s->model, &u, &err) != HM_OK)
        return json_pack("{s:b, s:s, s:i, s:i, s:i, s:n, s:o, s:[], s:I, s:{s:i, s:i, s:i}, s:s}", "available", 0,
                         "model", s->model_id, "n_layer", mi->n_layer, "n_expert", mi->n_expert, "n_expert_used",
                         mi->n_expert_used, "policy", "policies", policy_list(), "layers", "tokens", (json_int_t)0,
                         "units", "vram", 0, "ram", 0, "ssd", 0, "note", err.msg);
    json_t *layers = json_array();
    for (int32_t l = 0; l < u.n_layer; l++) {
        json_t *counts = json_array(), *tier = json_array();
        uint64_t total = 0;
        for (int32_t e = 0; e < u.n_expert; e++) {
            size_t i = (size_t)l * (size_t)u.n_expert + (size_t)e;
            total += u.counts[i];
            json_array_append_new(counts, json_integer((json_int_t)u.counts[i]));
            json_array_append_new(tier, json_string(hm_unit_home_name((hm_unit_home)u.home[i])));
        }
        uint64_t sel = u.layer_hits[l] + u.layer_misses[l];
        json_array_append_new(layers, json_pack("{s:i, s:I, s:o, s:o, s:I, s:I, s:o}", "layer", l, "total",
                                                (json_int_t)total, "counts", counts, "tier", tier, "hits",
                                                (json_int_t)u.layer_hits[l], "misses", (json_int_t)u.layer_misses[l],
                                                "hit_rate", sel ? json_real(ratio(u.layer_hits[l], sel)) : json_null()));
    }
    uint64_t sel = u.hits + u.misses;
    json_t *j = json_pack(
        "{s:b, s:s, s:i, s:i, s:i, s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:I, s:I, s:I,"
        " s:{s:I, s:I, s:I}, s:{s:I, s:I}, s:{s:I, s:I}, s:o}",
        "available", 1, "model", s->model_id, "n_layer", u.n_layer, "n_expert", u.n_expert, "n_expert_used",
        u.n_expert_used, "policy", u.policy, "policies", policy_list(), "tokens", (json_int_t)u.tokens,
        "prompt_tokens", (json_int_t)u.prompt_tokens, "decode_tokens", (json_int_t)u.decode_tokens, "steps",
        (json_int_t)u.steps, "hits", (json_int_t)u.hits, "misses", (json_int_t)u.misses, "hit_rate",
        sel ? json_real(ratio(u.hits, sel)) : json_null(), "vram_slots", (json_int_t)u.vram_slots, "vram_slots_used",
        (json_int_t)u.vram_slots_used, "unit_bytes", (json_int_t)u.unit_bytes, "units", "vram",
        (json_int_t)u.units[HM_HOME_VRAM], "ram", (json_int_t)u.units[HM_HOME_RAM], "ssd",
        (json_int_t)u.units[HM_HOME_SSD], "bytes_moved", "to_vram", (json_int_t)u.bytes_to_vram, "from_ssd",
        (json_int_t)u.bytes_from_ssd, "swaps", "in", (json_int_t)u.swaps_in, "out", (json_int_t)u.swaps_out, "layers",
        layers);
    if (j) {
        json_object_set_new(j, "mlocked_bytes", json_integer((json_int_t)u.mlocked_bytes));
        json_object_set_new(j, "gpu", gpu_json(&u));
    }
    if (j && u.vram_slots == 0)
        json_object_set_new(j, "note", json_string("no VRAM expert slots: every expert unit runs on the CPU from RAM (start the server with "
                                                   "-ngl 99 and --vram-budget on a CUDA build to place hot units on the GPU)"));
    hm_usage_free(&u);
    return j;
}

void srv_store_metrics(srv_sched *s, srv_buf *o) {
    hm_usage u;
    bool ok = hm_model_usage(s->model, &u, NULL) == HM_OK;
    srv_buf_str(o, "# HELP hotmoe_expert_stats_available 1 when the expert store publishes usage counts.\n"
                   "# TYPE hotmoe_expert_stats_available gauge\n");
    srv_buf_printf(o, "hotmoe_expert_stats_available %d\n", ok ? 1 : 0);
    if (!ok) return;
    srv_buf_str(o, "# HELP hotmoe_expert_units Expert units (layer, expert) by home tier.\n"
                   "# TYPE hotmoe_expert_units gauge\n");
    srv_buf_printf(o, "hotmoe_expert_units{tier=\"vram\"} %llu\nhotmoe_expert_units{tier=\"ram\"} %llu\n"
                      "hotmoe_expert_units{tier=\"ssd\"} %llu\n",
                   (unsigned long long)u.units[HM_HOME_VRAM], (unsigned long long)u.units[HM_HOME_RAM],
                   (unsigned long long)u.units[HM_HOME_SSD]);
    srv_buf_str(o, "# HELP hotmoe_expert_tokens_total Tokens routed through the experts, by phase.\n"
                   "# TYPE hotmoe_expert_tokens_total counter\n");
    srv_buf_printf(o, "hotmoe_expert_tokens_total{phase=\"prompt\"} %llu\nhotmoe_expert_tokens_total{phase=\"decode\"} %llu\n",
                   (unsigned long long)u.prompt_tokens, (unsigned long long)u.decode_tokens);
    srv_buf_str(o, "# HELP hotmoe_expert_selections_total Routed (token, unit) selections, by where the unit was "
                   "computed (hit = VRAM).\n# TYPE hotmoe_expert_selections_total counter\n");
    srv_buf_printf(o, "hotmoe_expert_selections_total{result=\"hit\"} %llu\n"
                      "hotmoe_expert_selections_total{result=\"miss\"} %llu\n",
                   (unsigned long long)u.hits, (unsigned long long)u.misses);
    srv_buf_str(o, "# HELP hotmoe_expert_hit_rate Fraction of a layer's routed selections computed from VRAM.\n"
                   "# TYPE hotmoe_expert_hit_rate gauge\n");
    for (int32_t l = 0; l < u.n_layer; l++) {
        uint64_t sel = u.layer_hits[l] + u.layer_misses[l];
        srv_buf_printf(o, "hotmoe_expert_hit_rate{layer=\"%d\"} %.6f\n", l, ratio(u.layer_hits[l], sel));
    }
    srv_buf_str(o, "# HELP hotmoe_expert_bytes_moved_total Expert bytes copied between tiers.\n"
                   "# TYPE hotmoe_expert_bytes_moved_total counter\n");
    srv_buf_printf(o, "hotmoe_expert_bytes_moved_total{direction=\"to_vram\"} %llu\n"
                      "hotmoe_expert_bytes_moved_total{direction=\"from_ssd\"} %llu\n",
                   (unsigned long long)u.bytes_to_vram, (unsigned long long)u.bytes_from_ssd);
    srv_buf_str(o, "# HELP hotmoe_expert_swaps_total Units moved into / out of VRAM slots.\n"
                   "# TYPE hotmoe_expert_swaps_total counter\n");
    srv_buf_printf(o, "hotmoe_expert_swaps_total{direction=\"in\"} %llu\nhotmoe_expert_swaps_total{direction=\"out\"} %llu\n",
                   (unsigned long long)u.swaps_in, (unsigned long long)u.swaps_out);
    srv_buf_str(o, "# HELP hotmoe_expert_elite_units Units of policy elite's static elite holding a VRAM slot.\n"
                   "# TYPE hotmoe_expert_elite_units gauge\n");
    srv_buf_printf(o, "hotmoe_expert_elite_units %lld\n", (long long)u.elite_units);
    srv_buf_str(o, "# HELP hotmoe_expert_vram_slots VRAM slots for expert units.\n"
                   "# TYPE hotmoe_expert_vram_slots gauge\n");
    srv_buf_printf(o, "hotmoe_expert_vram_slots{state=\"total\"} %lld\nhotmoe_expert_vram_slots{state=\"used\"} %lld\n",
                   (long long)u.vram_slots, (long long)u.vram_slots_used);
    srv_buf_str(o, "# HELP hotmoe_expert_mlocked_bytes Expert bytes of the model mapping locked in RAM (--mlock).\n"
                   "# TYPE hotmoe_expert_mlocked_bytes gauge\n");
    srv_buf_printf(o, "hotmoe_expert_mlocked_bytes %llu\n", (unsigned long long)u.mlocked_bytes);
    if (u.n_gpus > 0) {
        srv_buf_str(o, "# HELP hotmoe_gpu_expert_slots Expert slots per GPU: all, holding a unit, holding another "
                       "device's unit (peer).\n# TYPE hotmoe_gpu_expert_slots gauge\n");
        for (int32_t d = 0; d < u.n_gpus && d < HM_MAX_GPUS; d++)
            srv_buf_printf(o, "hotmoe_gpu_expert_slots{device=\"%d\",state=\"total\"} %lld\n"
                              "hotmoe_gpu_expert_slots{device=\"%d\",state=\"used\"} %lld\n"
                              "hotmoe_gpu_expert_slots{device=\"%d\",state=\"peer\"} %lld\n",
                           (int)u.gpu_ordinal[d], (long long)u.gpu_slots[d], (int)u.gpu_ordinal[d],
                           (long long)u.gpu_slots_used[d], (int)u.gpu_ordinal[d], (long long)u.gpu_peer[d]);
        srv_buf_str(o, "# HELP hotmoe_prefill_stream_units_total Cold units copied to the GPU for one prefill "
                       "layer (prefill streaming).\n# TYPE hotmoe_prefill_stream_units_total counter\n");
        srv_buf_printf(o, "hotmoe_prefill_stream_units_total %llu\n", (unsigned long long)u.stream_units);
        srv_buf_str(o, "# HELP hotmoe_prefill_stream_bytes_total Bytes those copies moved.\n"
                       "# TYPE hotmoe_prefill_stream_bytes_total counter\n");
        srv_buf_printf(o, "hotmoe_prefill_stream_bytes_total %llu\n", (unsigned long long)u.stream_bytes);
        srv_buf_str(o, "# HELP hotmoe_gpu_pinned_bytes Expert bytes of the model mapping registered with CUDA "
                       "(--mlock): copies to VRAM come straight from them.\n# TYPE hotmoe_gpu_pinned_bytes gauge\n");
        srv_buf_printf(o, "hotmoe_gpu_pinned_bytes %llu\n", (unsigned long long)u.gpu_pinned_bytes);
        srv_buf_str(o, "# HELP hotmoe_gpu_direct_fills_total Copies of units to VRAM made straight from those bytes "
                       "(no staging).\n# TYPE hotmoe_gpu_direct_fills_total counter\n");
        srv_buf_printf(o, "hotmoe_gpu_direct_fills_total %llu\n", (unsigned long long)u.gpu_direct_fills);
    }
    if (u.ram_budget > 0) { /* the SSD tier (--ram-budget below the experts' size) */
        srv_buf_str(o, "# HELP hotmoe_ssd_tier_budget_bytes RAM pool of the SSD tier (slots + staging).\n"
                       "# TYPE hotmoe_ssd_tier_budget_bytes gauge\n");
        srv_buf_printf(o, "hotmoe_ssd_tier_budget_bytes %lld\n", (long long)u.ram_budget);
        srv_buf_str(o, "# HELP hotmoe_ssd_tier_acquired_total Routed units computed through the RAM tier, by "
                       "whether they were in RAM already (hit) or read from the file (miss).\n"
                       "# TYPE hotmoe_ssd_tier_acquired_total counter\n");
        srv_buf_printf(o, "hotmoe_ssd_tier_acquired_total{result=\"hit\"} %llu\n"
                          "hotmoe_ssd_tier_acquired_total{result=\"miss\"} %llu\n",
                       (unsigned long long)u.ram_hits, (unsigned long long)(u.ram_acquired - u.ram_hits));
        srv_buf_str(o, "# HELP hotmoe_ssd_tier_hit_rate Fraction of RAM-tier units found in RAM.\n"
                       "# TYPE hotmoe_ssd_tier_hit_rate gauge\n");
        srv_buf_printf(o, "hotmoe_ssd_tier_hit_rate %.6f\n", ratio(u.ram_hits, u.ram_acquired));
        srv_buf_str(o, "# HELP hotmoe_ssd_bytes_per_token Bytes read from the file per token since open.\n"
                       "# TYPE hotmoe_ssd_bytes_per_token gauge\n");
        srv_buf_printf(o, "hotmoe_ssd_bytes_per_token %.1f\n",
                       u.tokens ? (double)u.bytes_from_ssd / (double)u.tokens : 0.0);
        srv_buf_str(o, "# HELP hotmoe_ssd_reads_total Unit reads from the file, by outcome.\n"
                       "# TYPE hotmoe_ssd_reads_total counter\n");
        srv_buf_printf(o, "hotmoe_ssd_reads_total{result=\"ok\"} %llu\nhotmoe_ssd_reads_total{result=\"error\"} %llu\n",
                       (unsigned long long)(u.ssd_reads - u.ssd_errors), (unsigned long long)u.ssd_errors);
        srv_buf_str(o, "# HELP hotmoe_prefetch_precision Predicted units that were then routed / predicted.\n"
                       "# TYPE hotmoe_prefetch_precision gauge\n");
        srv_buf_printf(o, "hotmoe_prefetch_precision %.6f\n", ratio(u.prefetch_used, u.prefetch_pred));
        srv_buf_str(o, "# HELP hotmoe_prefetch_recall Routed units that had been predicted / routed (layers "
                       "with a prediction).\n# TYPE hotmoe_prefetch_recall gauge\n");
        srv_buf_printf(o, "hotmoe_prefetch_recall %.6f\n", ratio(u.prefetch_used, u.prefetch_acq));
    }
    hm_usage_free(&u);
}

hm_status srv_store_profile_save(srv_sched *s, const char *path, hm_profile_fmt fmt, hm_err *err) {
    return hm_model_profile_save(s->model, path, fmt, err);
}

hm_status srv_store_set_policy(srv_sched *s, const char *name, hm_err *err) {
    bool known = false;
    char names[96] = "";
    for (int i = 0; i < hm_policy_count(); i++) {
        const char *p = hm_policy_info(i, NULL);
        known |= strcmp(name, p) == 0;
        const size_t at = strlen(names);
        snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "", p);
    }
    if (!known) {
        char shown[256];
        srv_text(shown, sizeof shown, name, strlen(name), 64);
        snprintf(err->msg, sizeof err->msg, "unknown policy '%s' (%s)", shown, names);
        return HM_ERR_ARG;
    }
    return hm_model_set_policy(s->model, name, err);
}
