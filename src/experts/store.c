/* store.c - the expert store: unit table, fast-tier slots, counters, step boundary (experts.h).
 *
 * Invariants kept here: slot_unit[s] == ui <=> u[ui].hot_slot == s; slot_map[ui] == hot_slot
 * exactly when the fill landed (home == HOT); free_slots holds every slot with slot_unit -1;
 * the recency list holds exactly the units with a hot slot; every slot index is < n_slots (a
 * shrink empties the slots past the new count and drops them from free_slots first).
 *
 * Slot groups (experts_impl.h): every unit is in at most one slot; group g's free stack holds
 * exactly its live free slots (so free_slots holds exactly the live free slots, n_free their
 * number), and its dead slots (past glive[g], given up by hm_experts_shrink_group) hold no unit,
 * so no group holds more units than its live slots; without allow_peer every resident is in a
 * slot of its home group. One group is the single pool: its stack is today's free stack. */
#include "experts_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *hm_tier_name(hm_tier_id t) {
    switch (t) {
    case HM_TIER_SSD: return "ssd";
    case HM_TIER_RAM: return "ram";
    case HM_TIER_HOT: return "hot";
    }
    return "unknown";
}

void hm_experts_opts_default(hm_experts_opts *o) {
    memset(o, 0, sizeof *o);
    o->hot_slots = 0;
    o->hot_budget = 0;
    hm_policy_opts_default(&o->policy);
}

/* ---- recency list ---- */

static void list_unlink(hm_experts *s, int32_t ui) {
    int32_t p = s->prev[ui], n = s->next[ui];
    if (p >= 0) s->next[p] = n;
    else s->head = n;
    if (n >= 0) s->prev[n] = p;
    else s->tail = p;
    s->prev[ui] = s->next[ui] = -1;
}

static void list_push_front(hm_experts *s, int32_t ui) {
    s->prev[ui] = -1;
    s->next[ui] = s->head;
    if (s->head >= 0) s->prev[s->head] = ui;
    s->head = ui;
    if (s->tail < 0) s->tail = ui;
}

void hm_experts_touch(hm_experts *s, int32_t ui) {
    if (s->head == ui) return;
    list_unlink(s, ui);
    list_push_front(s, ui);
}

/* ---- open / close ---- */

hm_unit_ref hm_unit_ref_of(const hm_units *units, int32_t layer, int32_t expert) {
    const hm_units_layer *l = &units->layers[layer];
    hm_unit_ref r = {.layer = layer, .expert = expert, .bytes = l->unit_bytes};
    for (int p = 0; p < HM_UNIT_NPART; p++) {
        r.part_bytes[p] = l->slab_bytes[p];
        r.src[p] = l->part[p] ? (const char *)l->part[p]->data + (size_t)expert * l->slab_bytes[p] : NULL;
    }
    return r;
}

static hm_unit_ref unit_ref(const hm_experts *s, int32_t ui) {
    return hm_unit_ref_of(s->units, s->u[ui].layer, s->u[ui].expert);
}

static hm_status check_policy(const hm_policy_opts *p, hm_err *err) {
    if (p->kind < HM_POLICY_NONE || p->kind >= HM_POLICY_COUNT || p->window < 1 || !(p->decay >= 0 && p->decay <= 1) ||
        !(p->update_rate >= 0) || !(p->hysteresis >= 0) || p->admit_misses < 0 || p->max_inserts < 0 ||
        !(p->elite_pct >= 0 && p->elite_pct <= 100))
        return hm_errf(err, HM_ERR_ARG, "policy options out of range (window >= 1, 0 <= decay <= 1, update rate, "
                       "hysteresis, admission misses and inserts per step >= 0, elite share 0..100 %%)");
    return HM_OK;
}

hm_status hm_experts_open(hm_experts **out, const hm_units *units, const hm_experts_opts *o, hm_err *err) {
    *out = NULL;
    hm_experts_opts dflt;
    if (!o) hm_experts_opts_default(&dflt), o = &dflt;
    if (units->n_units == 0 || units->n_units > INT32_MAX / 2)
        return hm_errf(err, HM_ERR_ARG, "expert store: the model has %" PRIu64 " expert units", units->n_units);
    int64_t n_slots = o->hot_slots;
    if (n_slots < 0) n_slots = (int64_t)hm_units_fit(units, o->hot_budget < 0 ? 0 : o->hot_budget);
    if (n_slots > (int64_t)units->n_units) n_slots = (int64_t)units->n_units;
    if (o->policy.kind == HM_POLICY_NONE) n_slots = 0;
    const hm_profile *p = o->profile;
    if (o->policy.kind == HM_POLICY_STATIC && !p)
        return hm_errf(err, HM_ERR_ARG, "policy static needs a profile (--profile FILE)");
    if (p && (p->n_layer != units->n_layer || p->n_expert != units->n_expert))
        return hm_errf(err, HM_ERR_ARG, "the profile has %d layers x %d experts but the model %d x %d", p->n_layer,
                       p->n_expert, units->n_layer, units->n_expert);
    if (check_policy(&o->policy, err) != HM_OK) return HM_ERR_ARG;
    const int32_t n_groups = o->n_groups > 1 ? o->n_groups : 1;
    if (o->n_groups < 0) return hm_errf(err, HM_ERR_ARG, "expert store: %d slot groups", (int)o->n_groups);
    if (n_groups > 1) { /* the pool is exactly the groups' slots (not clamped: the split is the caller's) */
        if (!o->group_slots || !o->layer_group)
            return hm_errf(err, HM_ERR_ARG, "expert store: %d slot groups without their %s", (int)n_groups,
                           o->group_slots ? "layers' home groups" : "slot counts");
        int64_t sum = 0;
        for (int32_t g = 0; g < n_groups; g++) {
            if (o->group_slots[g] < 0 || o->group_slots[g] > INT32_MAX / 2)
                return hm_errf(err, HM_ERR_ARG, "expert store: slot group %d has %lld slots", (int)g,
                               (long long)o->group_slots[g]);
            sum += o->group_slots[g];
        }
        if (sum != o->hot_slots || sum > INT32_MAX / 2)
            return hm_errf(err, HM_ERR_ARG, "expert store: the %d slot groups hold %lld slots but the pool %lld",
                           (int)n_groups, (long long)sum, (long long)o->hot_slots);
        for (int32_t l = 0; l < units->n_layer; l++)
            if (o->layer_group[l] < 0 || o->layer_group[l] >= n_groups)
                return hm_errf(err, HM_ERR_ARG, "expert store: layer %d's home group %d is not one of the %d slot "
                               "groups", (int)l, (int)o->layer_group[l], (int)n_groups);
        n_slots = o->policy.kind == HM_POLICY_NONE ? 0 : sum;
    }

    hm_experts *s = calloc(1, sizeof *s);
    if (!s) return hm_errf(err, HM_ERR_NOMEM, "expert store: out of memory");
    hm_status st;
    s->units = units;
    s->n_layer = units->n_layer;
    s->n_units = (int64_t)units->n_units;
    s->n_slots = n_slots;
    s->n_live = n_slots;
    s->n_groups = n_groups;
    s->allow_peer = n_groups > 1 && o->allow_peer;
    s->pol = o->policy;
    if (o->hot_tier) s->tier = *o->hot_tier;
    else s->tier.name = "sim";
    size_t nu = (size_t)s->n_units, ns = (size_t)(n_slots ? n_slots : 1), nl = (size_t)s->n_layer;
    s->base = calloc(nl + 1, sizeof *s->base);
    s->u = calloc(nu, sizeof *s->u);
    s->slot_map = malloc(nu * sizeof *s->slot_map);
    s->slot_unit = malloc(ns * sizeof *s->slot_unit);
    s->free_slots = malloc(ns * sizeof *s->free_slots);
    s->touched = malloc(nu * sizeof *s->touched);
    s->filling = malloc(ns * sizeof *s->filling);
    s->prev = malloc(nu * sizeof *s->prev);
    s->next = malloc(nu * sizeof *s->next);
    s->cand = malloc(nu * sizeof *s->cand);
    s->vict = malloc(ns * sizeof *s->vict);
    s->layer_hits = calloc(nl, sizeof *s->layer_hits);
    s->layer_misses = calloc(nl, sizeof *s->layer_misses);
    s->layer_resident = calloc(nl, sizeof *s->layer_resident);
    s->goff = calloc((size_t)n_groups + 1, sizeof *s->goff);
    s->glive = calloc((size_t)n_groups, sizeof *s->glive);
    s->gfree = calloc((size_t)n_groups, sizeof *s->gfree);
    if (n_groups > 1) s->layer_group = malloc(nl * sizeof *s->layer_group);
    if (!s->base || !s->u || !s->slot_map || !s->slot_unit || !s->free_slots || !s->touched || !s->filling ||
        !s->prev || !s->next || !s->cand || !s->vict || !s->layer_hits || !s->layer_misses || !s->layer_resident ||
        !s->goff || !s->glive || !s->gfree || (n_groups > 1 && !s->layer_group)) {
        st = hm_errf(err, HM_ERR_NOMEM, "expert store: out of memory for %" PRId64 " units", s->n_units);
        goto fail;
    }
    int32_t ui = 0;
    for (int32_t l = 0; l < s->n_layer; l++) {
        s->base[l] = ui;
        const hm_units_layer *L = &units->layers[l];
        for (int32_t e = 0; e < L->n_expert; e++, ui++) {
            hm_unit *u = &s->u[ui];
            u->layer = l, u->expert = e, u->bytes = L->unit_bytes;
            u->home = HM_TIER_RAM;
            u->hot_slot = u->ram_slot = -1;
            u->last_step = -1;
            s->slot_map[ui] = -1;
            s->prev[ui] = s->next[ui] = -1;
        }
    }
    s->base[s->n_layer] = ui;
    s->head = s->tail = -1;
    for (int32_t g = 0; g < n_groups; g++) { /* each group's stack pops its slots in order */
        const int64_t n = n_groups > 1 ? (n_slots ? o->group_slots[g] : 0) : n_slots, off = s->goff[g];
        for (int64_t i = 0; i < n; i++) {
            s->slot_unit[off + i] = -1;
            s->free_slots[off + i] = (int32_t)(off + n - 1 - i); /* pop order off, off + 1, ... */
        }
        s->glive[g] = s->gfree[g] = n;
        s->goff[g + 1] = off + n;
    }
    if (n_groups > 1) memcpy(s->layer_group, o->layer_group, nl * sizeof *s->layer_group);
    s->n_free = n_slots;
    if (p) { /* kept for a later switch to static (hm_experts_set_policy) */
        if (!(s->seed_counts = malloc(nu * sizeof *s->seed_counts))) {
            st = hm_errf(err, HM_ERR_NOMEM, "expert store: out of memory for the profile's counts");
            goto fail;
        }
        for (int64_t i = 0; i < s->n_units; i++) s->seed_counts[i] = hm_profile_count(p, s->u[i].layer, s->u[i].expert);
    }
    if ((st = hm_policy_place(s, p != NULL, err)) != HM_OK) goto fail;
    *out = s;
    return HM_OK;
fail:
    hm_experts_close(s);
    return st;
}

void hm_experts_close(hm_experts *s) {
    if (!s) return;
    hm_trace_writer_close(s->trace, NULL);
    free(s->base), free(s->u), free(s->slot_map), free(s->slot_unit), free(s->free_slots);
    free(s->touched), free(s->filling), free(s->prev), free(s->next), free(s->cand), free(s->vict);
    free(s->layer_hits), free(s->layer_misses), free(s->layer_resident), free(s->seed_counts);
    free(s->goff), free(s->glive), free(s->gfree), free(s->layer_group);
    free(s);
}

/* ---- slots ---- */

static void land(hm_experts *s, int32_t ui) {
    hm_unit *u = &s->u[ui];
    u->filling = 0;
    u->home = HM_TIER_HOT;
    s->slot_map[ui] = u->hot_slot;
    s->layer_resident[u->layer]++;
}

int32_t hm_experts_group_of(const hm_experts *s, int64_t sl) {
    int32_t g = 0;
    while (g + 1 < s->n_groups && sl >= s->goff[g + 1]) g++;
    return g;
}

hm_status hm_experts_admit(hm_experts *s, int32_t ui, hm_err *err) {
    const int32_t g = hm_experts_admit_group(s, ui);
    HM_ASSERT(g >= 0);
    return hm_experts_admit_to(s, ui, g, err);
}

hm_status hm_experts_admit_to(hm_experts *s, int32_t ui, int32_t g, hm_err *err) {
    hm_unit *u = &s->u[ui];
    HM_ASSERT(g >= 0 && g < s->n_groups && s->gfree[g] > 0 && u->hot_slot < 0 && !u->barred);
    int32_t slot = s->free_slots[s->goff[g] + s->gfree[g] - 1];
    if (s->tier.fill) {
        hm_unit_ref r = unit_ref(s, ui);
        hm_status st = s->tier.fill(s->tier.ctx, &r, slot, err);
        if (st != HM_OK) return st;
    }
    s->gfree[g]--;
    s->n_free--;
    s->slot_unit[slot] = ui;
    u->hot_slot = slot;
    u->misses = 0;
    list_push_front(s, ui);
    s->swaps_in++;
    s->fill_bytes += u->bytes;
    if (s->tier.ready && !s->tier.ready(s->tier.ctx, slot)) {
        u->filling = 1;
        s->filling[s->n_filling++] = ui;
    } else {
        land(s, ui);
    }
    return HM_OK;
}

void hm_experts_evict(hm_experts *s, int32_t ui) {
    hm_unit *u = &s->u[ui];
    HM_ASSERT(u->hot_slot >= 0 && u->pin == 0);
    if (u->filling) {
        for (int64_t i = 0; i < s->n_filling; i++)
            if (s->filling[i] == ui) {
                s->filling[i] = s->filling[--s->n_filling];
                break;
            }
        u->filling = 0;
    } else {
        s->layer_resident[u->layer]--;
    }
    s->slot_unit[u->hot_slot] = -1;
    const int32_t g = hm_experts_group_of(s, u->hot_slot);
    s->free_slots[s->goff[g] + s->gfree[g]++] = u->hot_slot;
    s->n_free++;
    u->hot_slot = -1;
    u->home = HM_TIER_RAM;
    u->misses = 0;
    s->slot_map[ui] = -1;
    list_unlink(s, ui);
    s->swaps_out++;
}

/* ---- hot path ---- */

void hm_experts_record(hm_experts *s, int32_t layer, const int32_t *ids, int32_t n) {
    HM_ASSERT(layer >= 0 && layer < s->n_layer);
    const int32_t b = s->base[layer], ne = s->base[layer + 1] - b;
    hm_unit *lu = s->u + b;
    const int64_t step = s->step;
    uint64_t hit = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t e = ids[i];
        HM_ASSERT((uint32_t)e < (uint32_t)ne);
        hm_unit *u = &lu[e];
        u->count++;
        u->win++;
        if (u->home == HM_TIER_HOT) {
            u->hits++;
            hit++;
        } else if (u->misses != UINT32_MAX) {
            u->misses++;
        }
        if (u->last_step != step) {
            u->last_step = step;
            s->touched[s->n_touched++] = b + e;
        }
    }
    s->layer_hits[layer] += hit;
    s->layer_misses[layer] += (uint64_t)n - hit;
    if (s->trace) hm_trace_write_route(s->trace, layer, ids, n);
}

void hm_experts_land(hm_experts *s) {
    for (int64_t i = 0; i < s->n_filling;) {
        int32_t ui = s->filling[i];
        if (!s->tier.ready || s->tier.ready(s->tier.ctx, s->u[ui].hot_slot)) {
            land(s, ui);
            s->filling[i] = s->filling[--s->n_filling];
        } else {
            i++;
        }
    }
}

hm_status hm_experts_step_end(hm_experts *s, int32_t n_tok, bool prompt, hm_err *err) {
    s->tokens += (uint64_t)n_tok;
    if (prompt) s->prompt_tokens += (uint64_t)n_tok;
    else s->decode_tokens += (uint64_t)n_tok;
    if (s->trace) hm_trace_write_step(s->trace, n_tok, prompt);
    hm_experts_land(s);
    bool window_end = (s->step + 1) % s->pol.window == 0;
    if (window_end) /* fold the window's counts into the decayed scores */
        for (int64_t i = 0; i < s->n_units; i++) {
            hm_unit *u = &s->u[i];
            u->score = u->score * s->pol.decay + (float)u->win;
            u->win = 0;
        }
    hm_status st = s->n_live ? hm_policy_step(s, window_end, err) : HM_OK;
    s->n_touched = 0;
    s->step++;
    return st;
}

/* ---- queries ---- */

void hm_experts_where(const hm_experts *s, int32_t layer, int32_t expert, hm_unit_loc *loc) {
    int32_t ui = s->base[layer] + expert;
    const hm_unit *u = &s->u[ui];
    memset(loc, 0, sizeof *loc);
    if (u->home == HM_TIER_HOT) {
        loc->tier = HM_TIER_HOT;
        loc->slot = u->hot_slot;
        for (int p = 0; p < HM_UNIT_NPART; p++)
            loc->data[p] = s->tier.part && s->units->layers[layer].part[p] ? s->tier.part(s->tier.ctx, u->hot_slot, (hm_unit_part)p)
                                                                          : NULL;
        return;
    }
    hm_unit_ref r = unit_ref(s, ui);
    loc->tier = HM_TIER_RAM;
    loc->slot = -1;
    for (int p = 0; p < HM_UNIT_NPART; p++) loc->data[p] = r.src[p];
}

const int32_t *hm_experts_slot_map(const hm_experts *s, int32_t layer) { return s->slot_map + s->base[layer]; }

const hm_unit *hm_experts_unit(const hm_experts *s, int32_t layer, int32_t expert) {
    return &s->u[s->base[layer] + expert];
}

const hm_units *hm_experts_units(const hm_experts *s) { return s->units; }

void hm_experts_pin(hm_experts *s, int32_t layer, int32_t expert) { s->u[s->base[layer] + expert].pin++; }

void hm_experts_bar(hm_experts *s, int32_t layer, int32_t expert, bool barred) {
    s->u[s->base[layer] + expert].barred = barred;
}

void hm_experts_unpin(hm_experts *s, int32_t layer, int32_t expert) {
    hm_unit *u = &s->u[s->base[layer] + expert];
    HM_ASSERT(u->pin > 0);
    u->pin--;
}

void hm_experts_get_stats(const hm_experts *s, hm_experts_stats *o) {
    memset(o, 0, sizeof *o);
    o->n_layer = s->n_layer;
    o->n_slots = s->n_live;
    o->n_used = s->n_live - s->n_free;
    o->steps = s->step;
    o->tokens = s->tokens, o->prompt_tokens = s->prompt_tokens, o->decode_tokens = s->decode_tokens;
    for (int32_t l = 0; l < s->n_layer; l++) o->hits += s->layer_hits[l], o->misses += s->layer_misses[l];
    o->layer_hits = s->layer_hits;
    o->layer_misses = s->layer_misses;
    o->layer_resident = s->layer_resident;
    o->swaps_in = s->swaps_in, o->swaps_out = s->swaps_out, o->fill_bytes = s->fill_bytes;
    if (s->pol.kind == HM_POLICY_ELITE)
        for (int64_t i = 0; i < s->n_units; i++) o->elite_units += s->u[i].elite && s->u[i].hot_slot >= 0;
}

void hm_experts_reset_stats(hm_experts *s) {
    memset(s->layer_hits, 0, (size_t)s->n_layer * sizeof *s->layer_hits);
    memset(s->layer_misses, 0, (size_t)s->n_layer * sizeof *s->layer_misses);
    s->swaps_in = s->swaps_out = s->fill_bytes = 0;
}

hm_status hm_experts_to_profile(const hm_experts *s, hm_profile *p, const char *model, const char *arch,
                                hm_err *err) {
    const hm_units *un = s->units;
    hm_status st = hm_profile_init(p, un->n_layer, un->n_expert, err);
    if (st) return st;
    snprintf(p->model, sizeof p->model, "%s", model ? model : "");
    snprintf(p->arch, sizeof p->arch, "%s", arch ? arch : "");
    p->k = un->n_expert_used;
    p->tokens = s->tokens, p->prompt_tokens = s->prompt_tokens, p->decode_tokens = s->decode_tokens;
    p->steps = (uint64_t)s->step;
    p->unit_bytes = un->unit_bytes_max;
    for (int64_t i = 0; i < s->n_units; i++) {
        const hm_unit *u = &s->u[i];
        if (u->expert >= p->n_expert) continue;
        size_t j = (size_t)u->layer * (size_t)p->n_expert + (size_t)u->expert;
        p->counts[j] = u->count;
        p->hot[j] = u->hits;
    }
    return HM_OK;
}

hm_status hm_experts_trace_out(hm_experts *s, const char *path, hm_err *err) {
    if (s->trace) return hm_errf(err, HM_ERR_ARG, "%s: a trace is already being written", path);
    return hm_trace_writer_open(&s->trace, path, s->n_layer, s->units->n_expert, s->units->n_expert_used, err);
}

hm_status hm_experts_trace_close(hm_experts *s, hm_err *err) {
    hm_trace_writer *w = s->trace;
    s->trace = NULL;
    return hm_trace_writer_close(w, err);
}

/* ---- shrinking the pool ---- */

/* Move resident, pinned ui into the free slot free_slots[fi] of its group g's stack (through the
 * tier's fill). Its old slot (in g too) goes on top of that stack; until the new fill lands the
 * unit is computed from RAM. */
static hm_status move_unit(hm_experts *s, int32_t ui, int32_t g, int64_t fi, hm_err *err) {
    hm_unit *u = &s->u[ui];
    const int32_t fs = s->free_slots[fi], hs = u->hot_slot;
    if (s->tier.fill) {
        hm_unit_ref r = unit_ref(s, ui);
        hm_status st = s->tier.fill(s->tier.ctx, &r, fs, err);
        if (st != HM_OK) return st;
    }
    const int64_t top = s->goff[g] + s->gfree[g]; /* one past the group's stack top */
    memmove(s->free_slots + fi, s->free_slots + fi + 1, (size_t)(top - fi - 1) * sizeof *s->free_slots);
    s->free_slots[top - 1] = hs; /* the stack keeps its size: one slot out, one in */
    s->slot_unit[hs] = -1;
    s->slot_unit[fs] = ui;
    u->hot_slot = fs;
    s->fill_bytes += u->bytes;
    const bool landed = !s->tier.ready || s->tier.ready(s->tier.ctx, fs);
    if (u->filling) { /* still in the filling list: it lands on the new slot */
        if (landed) {
            for (int64_t i = 0; i < s->n_filling; i++)
                if (s->filling[i] == ui) {
                    s->filling[i] = s->filling[--s->n_filling];
                    break;
                }
            land(s, ui);
        }
    } else if (landed) {
        s->slot_map[ui] = fs;
    } else { /* was HOT: RAM until the new copy lands */
        u->home = HM_TIER_RAM;
        s->slot_map[ui] = -1;
        s->layer_resident[u->layer]--;
        u->filling = 1;
        s->filling[s->n_filling++] = ui;
    }
    return HM_OK;
}

/* Give up group g's live slots past its first keep (< glive[g]; the callers checked the rest).
 * One group: the pool itself shrinks (n_slots = keep), as it always did. */
static hm_status shrink_range(hm_experts *s, int32_t g, int64_t keep, hm_err *err) {
    const int64_t cut = s->goff[g] + keep, end = s->goff[g] + s->glive[g], fb = s->goff[g];
    int64_t pinned = 0, free_low = 0;
    for (int64_t sl = cut; sl < end; sl++)
        if (s->slot_unit[sl] >= 0 && s->u[s->slot_unit[sl]].pin) pinned++;
    for (int64_t i = fb; i < fb + s->gfree[g]; i++) free_low += s->free_slots[i] < cut;
    if (pinned > free_low) {
        if (s->n_groups > 1)
            return hm_errf(err, HM_ERR_ARG, "expert store: cannot shrink slot group %d to %lld slots: %lld pinned "
                           "units in the slots past it, %lld free slots of the group below it", (int)g,
                           (long long)keep, (long long)pinned, (long long)free_low);
        return hm_errf(err, HM_ERR_ARG, "expert store: cannot shrink the pool to %lld slots: %lld pinned units "
                       "in the slots past it, %lld free slots below it", (long long)keep, (long long)pinned,
                       (long long)free_low);
    }
    hm_status st;
    for (int64_t sl = cut; sl < end; sl++) { /* pinned ones first: a failure changes nothing else */
        const int32_t ui = s->slot_unit[sl];
        if (ui < 0 || !s->u[ui].pin) continue;
        int64_t fi = fb + s->gfree[g] - 1; /* the free slot below the cut nearest the top of the stack */
        while (s->free_slots[fi] >= cut) fi--;
        if ((st = move_unit(s, ui, g, fi, err)) != HM_OK) return st;
    }
    for (int64_t sl = cut; sl < end; sl++)
        if (s->slot_unit[sl] >= 0) hm_experts_evict(s, s->slot_unit[sl]);
    int64_t n = 0; /* the group's stack without the slots that go, in its order */
    for (int64_t i = fb; i < fb + s->gfree[g]; i++)
        if (s->free_slots[i] < cut) s->free_slots[fb + n++] = s->free_slots[i];
    s->n_free -= s->gfree[g] - n;
    s->gfree[g] = n;
    s->n_live -= s->glive[g] - keep;
    s->glive[g] = keep;
    if (s->n_groups == 1) s->n_slots = s->goff[1] = keep;
    return HM_OK;
}

hm_status hm_experts_shrink(hm_experts *s, int64_t keep, hm_err *err) {
    if (keep < 0) return hm_errf(err, HM_ERR_ARG, "expert store: shrink to %lld slots", (long long)keep);
    if (s->n_touched > 0)
        return hm_errf(err, HM_ERR_ARG, "the expert pool can shrink only between steps (%lld units were routed "
                       "since the last step end)", (long long)s->n_touched);
    if (s->n_groups > 1)
        return hm_errf(err, HM_ERR_ARG, "expert store: the pool has %d slot groups: shrink each one "
                       "(hm_experts_shrink_group)", (int)s->n_groups);
    if (keep >= s->n_slots) return HM_OK;
    return shrink_range(s, 0, keep, err);
}

hm_status hm_experts_shrink_group(hm_experts *s, int32_t g, int64_t keep, hm_err *err) {
    if (g < 0 || g >= s->n_groups)
        return hm_errf(err, HM_ERR_ARG, "expert store: no slot group %d (%d groups)", (int)g, (int)s->n_groups);
    if (s->n_groups == 1) return hm_experts_shrink(s, keep, err);
    if (keep < 0)
        return hm_errf(err, HM_ERR_ARG, "expert store: shrink slot group %d to %lld slots", (int)g, (long long)keep);
    if (s->n_touched > 0)
        return hm_errf(err, HM_ERR_ARG, "a slot group can shrink only between steps (%lld units were routed "
                       "since the last step end)", (long long)s->n_touched);
    if (keep >= s->glive[g]) return HM_OK;
    return shrink_range(s, g, keep, err);
}

/* ---- slot groups ---- */

int32_t hm_experts_n_groups(const hm_experts *s) { return s->n_groups; }

int32_t hm_experts_slot_group(const hm_experts *s, int64_t slot) {
    return slot >= 0 && slot < s->n_slots ? hm_experts_group_of(s, slot) : 0;
}

void hm_experts_group_stats(const hm_experts *s, int32_t g, int64_t *slots, int64_t *used, int64_t *peer) {
    int64_t n = 0, nu = 0, np = 0;
    if (g >= 0 && g < s->n_groups) {
        n = s->glive[g];
        for (int64_t sl = s->goff[g]; sl < s->goff[g] + s->glive[g]; sl++) {
            const int32_t ui = s->slot_unit[sl];
            if (ui < 0) continue;
            nu++;
            np += hm_experts_home_group(s, ui) != g;
        }
    }
    if (slots) *slots = n;
    if (used) *used = nu;
    if (peer) *peer = np;
}

/* ---- policy switch ---- */

hm_policy_kind hm_experts_policy(const hm_experts *s) { return s->pol.kind; }

hm_status hm_experts_set_policy(hm_experts *s, hm_policy_kind kind, const hm_policy_opts *opts, hm_err *err) {
    hm_policy_opts pol = opts ? *opts : s->pol;
    pol.kind = kind;
    if (check_policy(&pol, err) != HM_OK) return HM_ERR_ARG;
    if (s->n_touched > 0)
        return hm_errf(err, HM_ERR_ARG, "the placement policy can change only between steps (%lld units were "
                       "routed since the last step end)", (long long)s->n_touched);
    uint64_t *live = NULL;
    if (kind == HM_POLICY_STATIC && s->n_live && !s->seed_counts) { /* re-seed from what was counted */
        if (!(live = malloc((size_t)s->n_units * sizeof *live)))
            return hm_errf(err, HM_ERR_NOMEM, "policy switch: out of memory");
        for (int64_t i = 0; i < s->n_units; i++) live[i] = s->u[i].count;
    }
    s->pol = pol;
    if (kind != HM_POLICY_ELITE) /* a later switch back to elite picks a new elite */
        for (int64_t ui = 0; ui < s->n_units; ui++) s->u[ui].elite = 0;
    s->elite_chosen = false;
    hm_status st = HM_OK;
    if (kind == HM_POLICY_NONE) { /* the pool empties (pinned units stay) */
        for (int64_t ui = 0; ui < s->n_units; ui++)
            if (s->u[ui].hot_slot >= 0 && !s->u[ui].pin) hm_experts_evict(s, (int32_t)ui);
    } else if (kind == HM_POLICY_STATIC && s->n_live) {
        st = hm_policy_place_static(s, live ? live : s->seed_counts, err);
    } else if (kind == HM_POLICY_ELITE && s->n_live && s->seed_counts) {
        st = hm_policy_place(s, true, err);
    } /* online, lru: the residents stay; scores, misses and recency go on */
    free(live);
    return st;
}
