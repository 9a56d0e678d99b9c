/* srv_store.c - the expert store as the server shows it: GET /experts, the hotmoe_expert_*
 * metrics, POST /profile/save and POST /experts/policy.
 *
 * This file is the only one in the server that knows about the expert store (experts/). The store
 * exists (src/experts/experts.h: hm_experts_get_stats, hm_experts_unit, hm_experts_to_profile,
 * hm_policy_from_name) but is not yet attached to sessions nor reachable through hotmoe.h, so
 * today this reports what the model says (layers, experts, k) with "available": false, and the
 * write/switch calls answer HM_ERR_UNSUPPORTED (HTTP 501). When hotmoe.h gains the store's view
 * (e.g. hm_model_experts(m) or a JSON snapshot), each function below is filled in and nothing else
 * in the server moves:
 *   layers[l].counts[e] = unit(l, e)->count      layers[l].tier[e] = hm_tier_name(unit->home)
 *   layers[l].hit_rate  = layer_hits / (layer_hits + layer_misses)   (hm_experts_stats)
 *   units{vram,ram,ssd} = counts of unit->home   bytes moved = stats.fill_bytes, swaps_in/out
 *   /profile/save       = hm_experts_to_profile + hm_profile_write (tmp + rename)
 * srv_store_experts_json and the profile/policy calls already run on the engine thread between
 * rounds (srv_sched_call): the store's rule is that residency is read and changed between steps. */
#include <stdio.h>
#include <string.h>

#include "server/server.h"

static const char *const policies[] = {"static", "online", "lru"};

json_t *srv_store_experts_json(srv_sched *s) {
    const hm_model_info *mi = hm_model_get_info(s->model);
    json_t *pol = json_array();
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++) json_array_append_new(pol, json_string(policies[i]));
    /* layers[]: {"counts": [n_expert], "tier": [n_expert] ("vram"|"ram"|"ssd"), "hit_rate"} once the
     * store publishes them; tiers[] and the hit-rate history come with it. */
    return json_pack("{s:b, s:s, s:i, s:i, s:i, s:n, s:o, s:[], s:I, s:{s:i, s:i, s:i}, s:s}", "available", 0,
                     "model", s->model_id, "n_layer", mi->n_layer, "n_expert", mi->n_expert, "n_expert_used",
                     mi->n_expert_used, "policy", "policies", pol, "layers", "tokens", (json_int_t)0, "units",
                     "vram", 0, "ram", mi->n_layer * mi->n_expert, "ssd", 0, "note",
                     "the expert store does not publish usage counts yet (hotmoe.h has no stats API); "
                     "this view fills in when it does");
}

void srv_store_metrics(srv_sched *s, srv_buf *o) {
    const hm_model_info *mi = hm_model_get_info(s->model);
    /* Every unit is in RAM (the file mapping) until the store places units in other tiers. */
    srv_buf_str(o, "# HELP hotmoe_expert_units Expert units (layer, expert) by home tier.\n"
                   "# TYPE hotmoe_expert_units gauge\n");
    srv_buf_printf(o, "hotmoe_expert_units{tier=\"vram\"} 0\nhotmoe_expert_units{tier=\"ram\"} %d\n"
                      "hotmoe_expert_units{tier=\"ssd\"} 0\n", mi->n_layer * mi->n_expert);
    srv_buf_str(o, "# HELP hotmoe_expert_stats_available 1 when the expert store publishes usage counts.\n"
                   "# TYPE hotmoe_expert_stats_available gauge\nhotmoe_expert_stats_available 0\n");
    /* hotmoe_expert_hit_rate{layer="L"} and hotmoe_expert_bytes_moved_total{direction=...} come
     * from the store's stats once its API lands. */
}

hm_status srv_store_profile_save(srv_sched *s, const char *path, hm_err *err) {
    snprintf(err->msg, sizeof err->msg,
             "the expert store does not count expert use yet, so there is no profile to write to %s", path);
    return HM_ERR_UNSUPPORTED;
}

hm_status srv_store_set_policy(srv_sched *s, const char *name, hm_err *err) {
    bool known = false;
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++) known |= strcmp(name, policies[i]) == 0;
    if (!known) {
        snprintf(err->msg, sizeof err->msg, "unknown policy '%s' (static, online, lru)", name);
        return HM_ERR_ARG;
    }
    snprintf(err->msg, sizeof err->msg, "the expert store has no placement policies yet; '%s' cannot be set", name);
    return HM_ERR_UNSUPPORTED;
}
