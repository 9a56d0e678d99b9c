/* policy.c - where units live: static, online and lru placement over one global pool of fast
 * slots (experts.h). Policies decide; the store (store.c) moves. They run only at open
 * (hm_policy_place) and at a step end (hm_policy_step), never inside a layer.
 *
 *  static  the n_slots units with the highest profile counts (ties: lower layer, lower expert),
 *          so hot layers get more slots; static_per_layer gives each MoE layer the same share
 *          (the top floor(n_slots / layers) of that layer, the remainder to the first layers).
 *          Units never routed in the profile are not placed.
 *  lru     at each step end the units routed in the step and not resident are admitted, each
 *          evicting the least recently used resident unit that was not routed in this step.
 *  online  value = decayed count (score, folded every `window` steps with factor `decay`)
 *          + `recency` when routed in the current window. A unit may enter after `admit_misses`
 *          misses since it last left; free slots are filled at any step end; at a window end
 *          up to update_rate * n_slots (at least 1) swaps replace the lowest-valued residents with
 *          the highest-valued candidates, each only when the newcomer's value exceeds the
 *          victim's by the hysteresis fraction.
 *  elite   hybrid: elite_pct % of the slots hold an elite chosen once, the units with the highest
 *          profile counts (or, without a profile, the highest counts of the first window's
 *          routing), admitted first and never a victim of the online part; the other slots run
 *          online. Before the first window ends (no profile) all slots run online.
 * max_inserts caps the units online, lru and elite admit in one step (0: no cap); a swap whose
 * newcomer may not enter evicts nothing.
 * No policy admits a barred unit (hm_experts_bar): it is not a candidate and costs no victim.
 *
 * Slot groups (several GPUs): a unit goes to its home group's slots, or with allow_peer to another
 * group's when that one is full (hm_experts_admit_group). static places the ranked units as
 * hm_gpu_plan_place_units does (home groups first, then the rest of the hot set to the group with
 * the most room); lru without peer evicts the least recently used resident of the unit's home
 * group; online pairs each candidate with the lowest-valued resident whose slot it may take. One
 * group takes the single-pool paths unchanged. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experts_impl.h"
#include "hotmoe.h"

void hm_policy_opts_default(hm_policy_opts *o) {
    memset(o, 0, sizeof *o);
    o->kind = HM_POLICY_NONE;
    o->window = 16;
    o->decay = 0.7f;
    o->admit_misses = 2;
    o->hysteresis = 0.25f;
    /* 0.5 % of the slots a window: on the seed profile at 12 GiB (`hotmoe plan --policy online
     * --update-rate R`) 0.05 copied 9.4 units a token (17 MB: 3 ms of a 5.5 GB/s upload, and the
     * measured decode halved) for a LOWER hit rate (93.0 %) than 0.005 (2.2 units, 94.2 %) */
    o->update_rate = 0.005f;
    o->recency = 1.0f;
    o->elite_pct = 60.0f; /* the seed-2 fork's GGML_CUDA_MOE_CACHE_ELITE_PCT=60 */
}

static hm_status step_lru(hm_experts *s, bool window_end, hm_err *err);
static hm_status step_online(hm_experts *s, bool window_end, hm_err *err);
static hm_status step_elite(hm_experts *s, bool window_end, hm_err *err);

/* The table (experts.h, hm_policy_def), in hm_policy_kind order. */
static const hm_policy_def policies[] = {
    {HM_POLICY_NONE, "none", "no fast tier: every unit stays in RAM", false, NULL},
    {HM_POLICY_STATIC, "static", "the profile's most-used units, placed once", true, NULL},
    {HM_POLICY_ONLINE, "online", "decayed use and recency, a few swaps per window", false, step_online},
    {HM_POLICY_LRU, "lru", "every routed unit enters, the least recently used leaves", false, step_lru},
    {HM_POLICY_ELITE, "elite", "a static elite share of the slots (profile or first window), the rest online", false,
     step_elite},
};
enum { N_POLICIES = sizeof policies / sizeof policies[0] };

const hm_policy_def *hm_policy_defs(int *n) {
    *n = N_POLICIES;
    return policies;
}

const char *hm_policy_name(hm_policy_kind k) {
    return (unsigned)k < N_POLICIES ? policies[k].name : "unknown";
}

int hm_policy_from_name(const char *name) {
    for (int i = 0; i < N_POLICIES; i++)
        if (strcmp(name, policies[i].name) == 0) return (int)policies[i].kind;
    return -1;
}

/* The names in table order, "none" last (it is the default, not a choice one makes). */
const char *hm_policy_names(char *buf, size_t cap, bool skip_none) {
    size_t at = 0;
    HM_ASSERT(cap > 0);
    buf[0] = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < N_POLICIES; i++) {
            const bool none = policies[i].kind == HM_POLICY_NONE;
            if (none != (pass == 1) || (none && skip_none)) continue;
            const char *sep = at ? ", " : "";
            if (strlen(sep) + strlen(policies[i].name) >= cap - at) return buf; /* cut at a whole name */
            at += (size_t)snprintf(buf + at, cap - at, "%s%s", sep, policies[i].name);
        }
    return buf;
}

/* hotmoe.h's view of the table: the order "none" last, as the names above. */
int hm_policy_count(void) { return N_POLICIES; }

const char *hm_policy_info(int i, const char **what) {
    if (i < 0 || i >= N_POLICIES) return NULL;
    const hm_policy_def *d = &policies[(i + 1) % N_POLICIES]; /* static, online, lru, then none */
    if (what) *what = d->what;
    return d->name;
}

/* ---- static ---- */

typedef struct ranked {
    uint64_t count;
    int32_t ui;
} ranked;

static int cmp_ranked(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return (x->ui > y->ui) - (x->ui < y->ui);
}

/* Static with slot groups: the chosen units that are not pinned residents, in rank order, go to
 * groups by hm_gpu_plan_place_units's rule over each group's room (live slots less its pinned
 * residents). Without peer all of them walk to their home group while it has room; with peer the
 * hot set (the first min(count, room) of them) does, and its rest goes to the group with the
 * most room left (ties: the lower group). Residents in their target group stay; the others leave
 * (unless pinned), then the missing ones are filled in rank order. chosen[] marks the ranking's
 * choice (every ranked unit, or the per-layer quotas' picks) and the pinned residents. */
static hm_status place_groups(hm_experts *s, const ranked *r, int64_t n, uint8_t *chosen, hm_err *err) {
    const int32_t ng = s->n_groups;
    int64_t *left = calloc((size_t)ng, sizeof *left);
    int32_t *target = malloc((size_t)s->n_units * sizeof *target);
    int32_t *list = malloc((size_t)(n ? n : 1) * sizeof *list);
    if (!left || !target || !list) {
        free(left), free(target), free(list);
        return hm_errf(err, HM_ERR_NOMEM, "static policy: out of memory");
    }
    int64_t total = 0, m = 0;
    for (int32_t g = 0; g < ng; g++) left[g] = s->glive[g];
    for (int64_t ui = 0; ui < s->n_units; ui++) {
        target[ui] = -1;
        const hm_unit *u = &s->u[ui];
        if (u->hot_slot >= 0 && u->pin) { /* pinned residents stay where they are */
            const int32_t g = hm_experts_group_of(s, u->hot_slot);
            target[ui] = g;
            left[g]--;
        }
    }
    for (int32_t g = 0; g < ng; g++) total += left[g] > 0 ? left[g] : 0;
    for (int64_t i = 0; i < n; i++) /* the ranked units the ranking chose, pinned residents aside */
        if (chosen[r[i].ui] && target[r[i].ui] < 0) list[m++] = r[i].ui;
    const int64_t first = s->allow_peer ? (m < total ? m : total) : m;
    for (int64_t k = 0; k < first; k++) {
        const int32_t h = hm_experts_home_group(s, list[k]);
        if (left[h] > 0) target[list[k]] = h, left[h]--;
    }
    for (int64_t k = 0; s->allow_peer && k < first; k++) {
        if (target[list[k]] >= 0) continue;
        int32_t best = 0;
        for (int32_t g = 1; g < ng; g++)
            if (left[g] > left[best]) best = g;
        HM_ASSERT(left[best] > 0);
        target[list[k]] = best, left[best]--;
    }
    for (int64_t ui = 0; ui < s->n_units; ui++) { /* make room first */
        const hm_unit *u = &s->u[ui];
        if (u->hot_slot >= 0 && !u->pin && hm_experts_group_of(s, u->hot_slot) != target[ui])
            hm_experts_evict(s, (int32_t)ui);
    }
    hm_status st = HM_OK;
    for (int64_t k = 0; k < m && st == HM_OK; k++) /* rank order: the best first */
        if (target[list[k]] >= 0 && s->u[list[k]].hot_slot < 0) st = hm_experts_admit_to(s, list[k], target[list[k]], err);
    free(left), free(target), free(list);
    return st;
}

hm_status hm_policy_place_static(hm_experts *s, const uint64_t *counts, hm_err *err) {
    ranked *r = malloc((size_t)s->n_units * sizeof *r);
    uint8_t *chosen = calloc((size_t)s->n_units, 1);
    if (!r || !chosen) {
        free(r), free(chosen);
        return hm_errf(err, HM_ERR_NOMEM, "static policy: out of memory");
    }
    int64_t n = 0, pinned = 0;
    for (int64_t ui = 0; ui < s->n_units; ui++) {
        if (counts[ui] && !s->u[ui].barred) r[n++] = (ranked){counts[ui], (int32_t)ui};
        if (s->u[ui].hot_slot >= 0 && s->u[ui].pin) chosen[ui] = 1, pinned++; /* pinned residents stay */
    }
    qsort(r, (size_t)n, sizeof *r, cmp_ranked);
    int64_t room = s->n_live - pinned;
    if (!s->pol.static_per_layer) {
        /* groups: every ranked unit is a candidate (without peer a group takes the hottest of its
         * own layers however far down the global ranking they are); place_groups cuts the hot set */
        for (int64_t i = 0; i < n && (room > 0 || s->n_groups > 1); i++)
            if (!chosen[r[i].ui]) chosen[r[i].ui] = 1, room--;
    } else {
        int32_t n_moe = 0;
        for (int32_t l = 0; l < s->n_layer; l++) n_moe += s->base[l + 1] > s->base[l];
        int64_t share = n_moe ? s->n_live / n_moe : 0, extra = n_moe ? s->n_live % n_moe : 0;
        /* n_layer >= 1 for any open store; the cast through uint32_t tells the compiler so */
        int32_t *quota = calloc((size_t)(uint32_t)s->n_layer, sizeof *quota);
        if (!quota) {
            free(r), free(chosen);
            return hm_errf(err, HM_ERR_NOMEM, "static policy: out of memory");
        }
        for (int32_t l = 0; l < s->n_layer; l++)
            if (s->base[l + 1] > s->base[l]) quota[l] = (int32_t)(share + (extra-- > 0));
        for (int64_t ui = 0; ui < s->n_units; ui++) /* a pinned resident uses its layer's share */
            if (chosen[ui] && quota[s->u[ui].layer] > 0) quota[s->u[ui].layer]--;
        for (int64_t i = 0; i < n && room > 0; i++) {
            int32_t l = s->u[r[i].ui].layer;
            if (quota[l] > 0 && !chosen[r[i].ui]) quota[l]--, chosen[r[i].ui] = 1, room--;
        }
        free(quota);
    }
    if (s->n_groups > 1) {
        hm_status st = place_groups(s, r, n, chosen, err);
        free(r), free(chosen);
        return st;
    }
    for (int64_t ui = 0; ui < s->n_units; ui++) /* make room first: residents not chosen go home */
        if (s->u[ui].hot_slot >= 0 && !chosen[ui]) hm_experts_evict(s, (int32_t)ui);
    hm_status st = HM_OK;
    for (int64_t i = 0; i < n && s->n_free > 0 && st == HM_OK; i++) /* rank order: the best first */
        if (chosen[r[i].ui] && s->u[r[i].ui].hot_slot < 0) st = hm_experts_admit(s, r[i].ui, err);
    free(r), free(chosen);
    return st;
}

/* The policy may admit one more unit in this step (max_inserts); counts it. */
static bool may_insert(hm_experts *s) {
    if (s->insert_left <= 0) return false;
    s->insert_left--;
    return true;
}

static hm_status elite_pick(hm_experts *s, const uint64_t *counts, hm_err *err);

hm_status hm_policy_place(hm_experts *s, bool have_profile, hm_err *err) {
    if (!s->n_live || !have_profile || !s->seed_counts) return HM_OK;
    if (s->pol.kind == HM_POLICY_ELITE) return elite_pick(s, s->seed_counts, err);
    if (policies[s->pol.kind].places_from_profile || s->pol.warm_start)
        return hm_policy_place_static(s, s->seed_counts, err);
    return HM_OK;
}

/* ---- lru ---- */

static hm_status step_lru(hm_experts *s, bool window_end, hm_err *err) {
    (void)window_end;
    for (int64_t i = 0; i < s->n_touched; i++) /* hits first: they become the most recent */
        if (s->u[s->touched[i]].hot_slot >= 0) hm_experts_touch(s, s->touched[i]);
    for (int64_t i = 0; i < s->n_touched; i++) {
        int32_t ui = s->touched[i];
        if (s->u[ui].hot_slot >= 0 || s->u[ui].pin || s->u[ui].barred) continue;
        if (s->insert_left <= 0) break;
        if (s->n_groups > 1 && !s->allow_peer) { /* groups without peer: the home group's LRU goes */
            if (!room_for(s, ui)) {
                const int32_t h = hm_experts_home_group(s, ui);
                int32_t v = s->tail;
                while (v >= 0 && (s->u[v].pin || s->u[v].filling || hm_experts_group_of(s, s->u[v].hot_slot) != h))
                    v = s->prev[v];
                if (v < 0 || s->u[v].last_step == s->step) continue; /* the group's residents were all used */
                hm_experts_evict(s, v);
            }
        } else if (!room_for(s, ui)) {
            int32_t v = s->tail;
            while (v >= 0 && (s->u[v].pin || s->u[v].filling)) v = s->prev[v];
            if (v < 0 || s->u[v].last_step == s->step) break; /* every resident was used this step */
            hm_experts_evict(s, v);
        }
        s->insert_left--;
        hm_status st = hm_experts_admit(s, ui, err);
        if (st) return st;
    }
    return HM_OK;
}

/* ---- online ---- */

static float value(const hm_experts *s, const hm_unit *u) {
    bool recent = u->last_step > s->step - s->pol.window;
    return u->score + (float)u->win + (recent ? s->pol.recency : 0.0f);
}

static int cmp_cand_desc(const void *a, const void *b) {
    const hm_cand *x = a, *y = b;
    if (x->value != y->value) return x->value > y->value ? -1 : 1;
    return (x->ui > y->ui) - (x->ui < y->ui);
}

static int cmp_cand_asc(const void *a, const void *b) { return -cmp_cand_desc(a, b); }

/* Window swaps with slot groups: each candidate (cand[0..nc) best first) takes the lowest-valued
 * evictable resident not yet taken (vict[0..nv) ascending) whose slot it may use: one of its home
 * group without peer (a free slot of that group first, at no victim's cost), any with peer; the
 * hysteresis rule as for the single pool, a candidate that fails it is passed over. At most
 * max_swaps units enter. One cursor per group (without peer) walks vict in order. */
static hm_status swap_groups(hm_experts *s, int64_t nc, int64_t nv, int64_t max_swaps, float gain, hm_err *err) {
    const int32_t ng = s->n_groups;
    int64_t cur_buf[16], *cur = ng <= 16 ? cur_buf : calloc((size_t)ng, sizeof *cur);
    if (!cur) return hm_errf(err, HM_ERR_NOMEM, "online policy: out of memory");
    for (int32_t g = 0; g < ng; g++) cur[g] = 0;
    int64_t any = 0, done = 0;
    hm_status st = HM_OK;
    for (int64_t i = 0; i < nc && done < max_swaps && st == HM_OK; i++) {
        const int32_t ui = s->cand[i].ui;
        if (s->insert_left <= 0) break;
        if (room_for(s, ui)) { /* a free slot it may use (no peer: its home group's) */
            s->insert_left--;
            st = hm_experts_admit(s, ui, err);
            done++;
            continue;
        }
        int64_t *c = &any;
        if (!s->allow_peer) {
            const int32_t h = hm_experts_home_group(s, ui);
            c = &cur[h];
            while (*c < nv && (s->u[s->vict[*c].ui].hot_slot < 0 || /* evicted already (by its group's cursor) */
                               hm_experts_group_of(s, s->u[s->vict[*c].ui].hot_slot) != h))
                (*c)++;
        }
        if (*c >= nv || !(s->cand[i].value > s->vict[*c].value * gain)) continue;
        const int32_t v = s->vict[(*c)++].ui;
        s->insert_left--;
        hm_experts_evict(s, v);
        st = hm_experts_admit(s, ui, err);
        done++;
    }
    if (cur != cur_buf) free(cur);
    return st;
}

static hm_status step_online(hm_experts *s, bool window_end, hm_err *err) {
    hm_status st;
    const uint32_t need = (uint32_t)s->pol.admit_misses;
    /* free slots: the units missed in this step that have earned entry, best first */
    if (s->n_free > 0) {
        int64_t nc = 0;
        for (int64_t i = 0; i < s->n_touched; i++) {
            const hm_unit *u = &s->u[s->touched[i]];
            if (u->hot_slot < 0 && !u->barred && u->misses >= need) s->cand[nc++] = (hm_cand){value(s, u), s->touched[i]};
        }
        qsort(s->cand, (size_t)nc, sizeof *s->cand, cmp_cand_desc);
        for (int64_t i = 0; i < nc && s->n_free > 0; i++)
            if (room_for(s, s->cand[i].ui) && may_insert(s) && (st = hm_experts_admit(s, s->cand[i].ui, err))) return st;
    }
    /* groups without peer: a group may be full while another has free slots nobody may use */
    if (!window_end || (s->n_free > 0 && (s->n_groups == 1 || s->allow_peer))) return HM_OK;
    int64_t max_swaps = (int64_t)((double)s->pol.update_rate * (double)s->n_live);
    if (max_swaps < 1) max_swaps = s->pol.update_rate > 0 ? 1 : 0;
    if (!max_swaps) return HM_OK;
    int64_t nc = 0, nv = 0;
    for (int64_t ui = 0; ui < s->n_units; ui++) {
        const hm_unit *u = &s->u[ui];
        if (u->hot_slot < 0) {
            if (u->misses >= need && u->last_step >= 0 && !u->barred) s->cand[nc++] = (hm_cand){value(s, u), (int32_t)ui};
        } else if (!u->pin && !u->filling && !(u->elite && s->pol.kind == HM_POLICY_ELITE)) {
            s->vict[nv++] = (hm_cand){value(s, u), (int32_t)ui};
        }
    }
    qsort(s->cand, (size_t)nc, sizeof *s->cand, cmp_cand_desc);
    qsort(s->vict, (size_t)nv, sizeof *s->vict, cmp_cand_asc);
    const float gain = 1.0f + s->pol.hysteresis;
    if (s->n_groups > 1) return swap_groups(s, nc, nv, max_swaps, gain, err);
    for (int64_t i = 0; i < nc && i < nv && i < max_swaps; i++) {
        if (!(s->cand[i].value > s->vict[i].value * gain) || !may_insert(s)) break;
        hm_experts_evict(s, s->vict[i].ui);
        if ((st = hm_experts_admit(s, s->cand[i].ui, err))) return st;
    }
    return HM_OK;
}

/* ---- elite ---- */

/* The elite: the n = elite_pct % of the live slots units with the highest counts (ties: lower
 * layer, lower expert; never-routed and barred units are not chosen), marked and admitted, each
 * taking a free slot or the lowest-valued evictable resident outside the elite. Once per store
 * (the profile at open, else the first window end). */
static hm_status elite_pick(hm_experts *s, const uint64_t *counts, hm_err *err) {
    s->elite_chosen = true;
    const int64_t n_elite = (int64_t)((double)s->pol.elite_pct / 100.0 * (double)s->n_live);
    if (n_elite <= 0) return HM_OK;
    ranked *r = malloc((size_t)s->n_units * sizeof *r);
    if (!r) return hm_errf(err, HM_ERR_NOMEM, "elite policy: out of memory");
    int64_t n = 0;
    for (int64_t ui = 0; ui < s->n_units; ui++)
        if (counts[ui] && !s->u[ui].barred) r[n++] = (ranked){counts[ui], (int32_t)ui};
    qsort(r, (size_t)n, sizeof *r, cmp_ranked);
    if (n > n_elite) n = n_elite;
    for (int64_t i = 0; i < n; i++) s->u[r[i].ui].elite = 1;
    int64_t nv = 0; /* victims for elite units without a slot: residents outside the elite, lowest value first */
    for (int64_t ui = 0; ui < s->n_units; ui++) {
        const hm_unit *u = &s->u[ui];
        if (u->hot_slot >= 0 && !u->elite && !u->pin && !u->filling) s->vict[nv++] = (hm_cand){value(s, u), (int32_t)ui};
    }
    qsort(s->vict, (size_t)nv, sizeof *s->vict, cmp_cand_asc);
    hm_status st = HM_OK;
    int64_t v = 0;
    for (int64_t i = 0; i < n && st == HM_OK; i++) {
        const int32_t ui = r[i].ui;
        if (s->u[ui].hot_slot >= 0) continue;
        while (!room_for(s, ui) && v < nv) {
            const int32_t x = s->vict[v++].ui;
            if (s->u[x].hot_slot >= 0) hm_experts_evict(s, x);
        }
        if (room_for(s, ui)) st = hm_experts_admit(s, ui, err);
    }
    free(r);
    return st;
}

static hm_status step_elite(hm_experts *s, bool window_end, hm_err *err) {
    if (!s->elite_chosen && window_end) { /* no profile: the first window's routing chooses */
        uint64_t *c = malloc((size_t)s->n_units * sizeof *c);
        if (!c) return hm_errf(err, HM_ERR_NOMEM, "elite policy: out of memory");
        for (int64_t ui = 0; ui < s->n_units; ui++) c[ui] = s->u[ui].count;
        hm_status st = elite_pick(s, c, err);
        free(c);
        if (st) return st;
    }
    return step_online(s, window_end, err);
}

hm_status hm_policy_step(hm_experts *s, bool window_end, hm_err *err) {
    const hm_policy_def *d = &policies[s->pol.kind];
    s->insert_left = s->pol.max_inserts > 0 ? s->pol.max_inserts : INT64_MAX;
    return d->step ? d->step(s, window_end, err) : HM_OK;
}
