/* tier_ram.c - the RAM slot pool, the acquire/release seam, prefetch and VRAM exclusivity
 * (tier_ram.h).
 *
 * Buffer b is pool + b * slot_bytes and is request b of the hm_ssd. Roles: slot_buf[s] for the
 * inner store's slot s, stage_buf[i] for staging entry i; swapping the two moves a unit between
 * roles without a copy. A buffer is labelled with the unit whose bytes it holds or is reading
 * (buf_unit); a label on a slot the inner store freed is stale and ignored (the store does not
 * tell its tier about evictions: reachability goes through the store's hot_slot, see find_buf). */
#include "tier_ram.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "experts_impl.h"

enum { BUF_EMPTY = 0, BUF_READING = 1, BUF_READY = 2, BUF_BAD = 3 };

struct hm_ram_tier {
    const hm_units *units;
    const hm_experts *vram;
    hm_ssd *io;
    hm_experts *store; /* inner: its slots are the policy slots */
    hm_tier tier;
    int32_t n_layer;
    int32_t *base;     /* [n_layer + 1] unit index of (layer, 0) */
    int64_t n_units;
    size_t slot_bytes, pool_bytes;
    char *pool;
    bool mlocked;
    int32_t n_buf, n_slots, n_stage;
    int32_t *buf_unit;   /* [n_buf] */
    uint8_t *buf_state;  /* [n_buf] */
    uint8_t *buf_pref;   /* [n_buf] read started by prefetch, not acquired since */
    int32_t *buf_pin;    /* [n_buf] */
    int32_t *slot_buf;   /* [n_slots] */
    int32_t *stage_buf;  /* [n_stage] */
    uint64_t *stage_tick;/* [n_stage] last use, for LRU reuse */
    int32_t *unit_stage; /* [n_units] staging entry or -1 */
    int64_t *pred_step;  /* [n_units] step it was predicted in, -1 */
    int64_t *layer_pred; /* [n_layer] step its layer had a prediction in, -1 */
    uint8_t *was_vram;   /* [n_units] held a VRAM slot at the last step end */
    int32_t *left;       /* [n_units] units that left VRAM, placed after the RAM policy's step */
    int64_t n_left;
    int32_t *acq_cnt;    /* [n_units] tokens routed to it through acquire in this step */
    int32_t *acq_list;   /* [n_units] units with acq_cnt > 0 */
    int64_t n_acq;
    int32_t *rec;        /* [REC] scratch ids for hm_experts_record */
    int32_t *call_buf;   /* [max layer experts] buffers pinned by the running acquire */
    uint8_t *call_kind;  /* [max layer experts] how each was found (K_*) */
    int64_t step;
    uint64_t tick;
    hm_ram_tier_stats st;
};

#define REC 256

void hm_ram_tier_opts_default(hm_ram_tier_opts *o) {
    memset(o, 0, sizeof *o);
    hm_policy_opts_default(&o->policy);
    hm_ssd_opts_default(&o->io);
}

static char *buf_ptr(const hm_ram_tier *t, int32_t b) { return t->pool + (size_t)b * t->slot_bytes; }

static int32_t unit_index(const hm_ram_tier *t, int32_t layer, int32_t expert) {
    HM_ASSERT(layer >= 0 && layer < t->n_layer && expert >= 0 && expert < t->base[layer + 1] - t->base[layer]);
    return t->base[layer] + expert;
}

/* The buffer unit ui is reachable through, or -1 (SSD only). *slot: its policy slot or -1. */
static int32_t find_buf(const hm_ram_tier *t, int32_t ui, int32_t *slot) {
    *slot = -1;
    const hm_unit *u = &t->store->u[ui];
    if (u->hot_slot >= 0) {
        int32_t b = t->slot_buf[u->hot_slot];
        HM_ASSERT(t->buf_unit[b] == ui);
        *slot = u->hot_slot;
        return b;
    }
    int32_t i = t->unit_stage[ui];
    return i >= 0 ? t->stage_buf[i] : -1;
}

/* Collect buffer b's read (if any): state becomes READY or BAD. Error message into err. */
static hm_status settle(hm_ram_tier *t, int32_t b, hm_err *err) {
    if (!hm_ssd_busy(t->io, b)) return t->buf_state[b] == BUF_BAD ? HM_ERR_IO : HM_OK;
    hm_status st = hm_ssd_wait(t->io, b, err);
    t->buf_state[b] = st == HM_OK ? BUF_READY : BUF_BAD;
    if (st != HM_OK) t->st.io_errors++;
    return st;
}

/* Forget b's contents (it is about to be reused). */
static void scrub(hm_ram_tier *t, int32_t b) {
    HM_ASSERT(t->buf_pin[b] == 0);
    if (hm_ssd_busy(t->io, b)) settle(t, b, NULL);
    if (t->buf_pref[b]) t->st.prefetch_wasted++;
    t->buf_pref[b] = 0;
    t->buf_unit[b] = -1;
    t->buf_state[b] = BUF_EMPTY;
}

static void start_read(hm_ram_tier *t, int32_t b, int32_t layer, int32_t expert) {
    HM_ASSERT(!hm_ssd_busy(t->io, b));
    t->buf_unit[b] = t->base[layer] + expert;
    t->buf_state[b] = BUF_READING;
    hm_ssd_start(t->io, b, layer, expert, buf_ptr(t, b));
    t->st.reads++;
}

/* A staging entry for a new unit: an unpinned one, empty first, else least recently used; with
 * no_wait, never one whose read is still in flight. -1 when all are pinned. */
static int32_t grab_stage(hm_ram_tier *t, bool no_wait) {
    int32_t best = -1;
    for (int32_t i = 0; i < t->n_stage; i++) {
        int32_t b = t->stage_buf[i];
        if (t->buf_pin[b]) continue;
        if (t->buf_unit[b] < 0) return i;
        if (no_wait && t->buf_state[b] == BUF_READING && !hm_ssd_done(t->io, b)) continue;
        if (best < 0 || t->stage_tick[i] < t->stage_tick[best]) best = i;
    }
    if (best >= 0) {
        int32_t b = t->stage_buf[best];
        t->unit_stage[t->buf_unit[b]] = -1;
        scrub(t, b);
    }
    return best;
}

/* ---- the inner store's tier: policy slots ---- */

static hm_status tier_fill(void *ctx, const hm_unit_ref *r, int32_t slot, hm_err *err) {
    hm_ram_tier *t = ctx;
    int32_t ui = unit_index(t, r->layer, r->expert);
    int32_t old = t->slot_buf[slot]; /* free slot: unpinned, maybe a stale label */
    scrub(t, old);
    int32_t i = t->unit_stage[ui];
    if (i >= 0) { /* already in staging: the buffers swap roles */
        int32_t b = t->stage_buf[i];
        t->slot_buf[slot] = b;
        t->stage_buf[i] = old;
        t->stage_tick[i] = 0;
        t->unit_stage[ui] = -1;
        for (int32_t k = 0; k < t->buf_pin[b]; k++) hm_experts_pin(t->store, r->layer, r->expert);
        if (t->buf_state[b] != BUF_BAD) return HM_OK;
        if (t->buf_pin[b]) return HM_OK; /* cannot be: a failed acquire unpins; re-read on acquire */
        scrub(t, b);
        old = b;
    }
    start_read(t, old, r->layer, r->expert);
    t->st.fill_reads++;
    (void)err;
    return HM_OK;
}

static bool tier_ready(void *ctx, int32_t slot) {
    hm_ram_tier *t = ctx;
    int32_t b = t->slot_buf[slot];
    if (t->buf_state[b] == BUF_READING) {
        if (!hm_ssd_done(t->io, b)) return false;
        settle(t, b, NULL); /* BAD lands too: the next acquire re-reads it and reports */
    }
    return true;
}

static const void *tier_part(void *ctx, int32_t slot, hm_unit_part p) {
    hm_ram_tier *t = ctx;
    int32_t b = t->slot_buf[slot];
    if (t->buf_unit[b] < 0) return NULL;
    const hm_unit *u = &t->store->u[t->buf_unit[b]];
    const void *parts[HM_UNIT_NPART];
    hm_ssd_layout(t->units, u->layer, u->expert, buf_ptr(t, b), parts);
    return parts[p];
}

/* ---- open / close ---- */

static hm_status lock_pool(hm_ram_tier *t, hm_err *err) {
    hm_status st = hm_mlock_range(t->pool, t->pool_bytes, "the RAM slot pool", err);
    t->mlocked = st == HM_OK;
    return st;
}

hm_status hm_ram_tier_open(hm_ram_tier **out, const char *path, const hm_units *units, const hm_ram_tier_opts *o,
                           hm_err *err) {
    *out = NULL;
    if (!units->n_units || units->n_units > INT32_MAX / 2)
        return hm_errf(err, HM_ERR_ARG, "%s: RAM tier: the model has %" PRIu64 " expert units", path, units->n_units);
    for (int32_t l = 0; l < units->n_layer; l++)
        if (units->layers[l].n_expert && !units->layers[l].part[HM_UNIT_DOWN])
            return hm_errf(err, HM_ERR_ARG, "%s: RAM tier: needs a unit table from the file (layer %d has no tensors)",
                           path, l);
    size_t slot_bytes = hm_ssd_slot_bytes(units);
    int64_t n_buf64 = o->budget > 0 ? o->budget / (int64_t)slot_bytes : 0;
    if (n_buf64 > (int64_t)units->n_units + 4 * (int64_t)units->n_expert) /* no use for more */
        n_buf64 = (int64_t)units->n_units + 4 * (int64_t)units->n_expert;
    int32_t n_buf = (int32_t)n_buf64;
    int32_t max_e = 0;
    for (int32_t l = 0; l < units->n_layer; l++)
        if (units->layers[l].n_expert > max_e) max_e = units->layers[l].n_expert;
    int32_t n_stage = o->n_stage;
    if (o->policy.kind == HM_POLICY_NONE) n_stage = n_buf;
    else if (n_stage <= 0) {
        n_stage = 2 * max_e;
        if (n_stage > n_buf / 2) n_stage = n_buf / 2;
        if (n_stage < 1) n_stage = 1;
    }
    if (n_buf < 1 || n_stage > n_buf)
        return hm_errf(err, HM_ERR_ARG, "%s: RAM budget %" PRId64 " bytes holds %d buffers of %zu bytes (one expert "
                       "unit with alignment) but needs at least %d (staging)", path, o->budget, n_buf, slot_bytes,
                       n_stage > 1 ? n_stage : 1);

    if (n_buf - n_stage > (int32_t)units->n_units) n_buf = (int32_t)units->n_units + n_stage;
    if (o->vram) {
        const hm_units *vu = hm_experts_units(o->vram);
        bool same = vu->n_layer == units->n_layer;
        for (int32_t l = 0; same && l < units->n_layer; l++) same = vu->layers[l].n_expert == units->layers[l].n_expert;
        if (!same) return hm_errf(err, HM_ERR_ARG, "%s: RAM tier: the VRAM store has another unit table", path);
    }
    hm_ram_tier *t = calloc(1, sizeof *t);
    if (!t) return hm_errf(err, HM_ERR_NOMEM, "RAM tier: out of memory");
    hm_status st;
    hm_profile filtered = {0};
    t->units = units;
    t->vram = o->vram;
    t->n_layer = units->n_layer;
    t->n_units = (int64_t)units->n_units;
    t->slot_bytes = slot_bytes;
    t->n_buf = n_buf, t->n_stage = n_stage, t->n_slots = n_buf - n_stage;
    t->pool_bytes = (size_t)n_buf * slot_bytes;
    size_t nu = (size_t)t->n_units, nb = (size_t)n_buf;
    t->base = calloc((size_t)t->n_layer + 1, sizeof *t->base);
    t->buf_unit = malloc(nb * sizeof *t->buf_unit);
    t->buf_state = calloc(nb, 1);
    t->buf_pref = calloc(nb, 1);
    t->buf_pin = calloc(nb, sizeof *t->buf_pin);
    t->slot_buf = malloc((t->n_slots ? (size_t)t->n_slots : 1) * sizeof *t->slot_buf);
    t->stage_buf = malloc((size_t)n_stage * sizeof *t->stage_buf);
    t->stage_tick = calloc((size_t)n_stage, sizeof *t->stage_tick);
    t->unit_stage = malloc(nu * sizeof *t->unit_stage);
    t->pred_step = malloc(nu * sizeof *t->pred_step);
    t->layer_pred = malloc((size_t)t->n_layer * sizeof *t->layer_pred);
    t->was_vram = calloc(nu, 1);
    t->left = malloc(nu * sizeof *t->left);
    t->acq_cnt = calloc(nu, sizeof *t->acq_cnt);
    t->acq_list = malloc(nu * sizeof *t->acq_list);
    t->rec = malloc(REC * sizeof *t->rec);
    t->call_buf = malloc((size_t)max_e * sizeof *t->call_buf);
    t->call_kind = malloc((size_t)max_e);
    if (!t->base || !t->buf_unit || !t->buf_state || !t->buf_pref || !t->buf_pin || !t->slot_buf || !t->stage_buf ||
        !t->stage_tick || !t->unit_stage || !t->pred_step || !t->layer_pred || !t->was_vram || !t->left || !t->acq_cnt ||
        !t->acq_list || !t->rec || !t->call_buf || !t->call_kind) {
        st = hm_errf(err, HM_ERR_NOMEM, "RAM tier: out of memory for %" PRId64 " units", t->n_units);
        goto fail;
    }
    for (int32_t l = 0, ui = 0; l < t->n_layer; l++) {
        t->base[l] = ui;
        ui += units->layers[l].n_expert;
        t->base[l + 1] = ui;
        t->layer_pred[l] = -1;
    }
    for (size_t i = 0; i < nb; i++) t->buf_unit[i] = -1;
    for (int32_t i = 0; i < t->n_slots; i++) t->slot_buf[i] = i;
    for (int32_t i = 0; i < n_stage; i++) t->stage_buf[i] = t->n_slots + i;
    for (size_t i = 0; i < nu; i++) t->unit_stage[i] = -1, t->pred_step[i] = -1;

    t->pool = mmap(NULL, t->pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (t->pool == MAP_FAILED) {
        t->pool = NULL;
        st = hm_errf(err, HM_ERR_NOMEM, "RAM tier: cannot map the %zu MiB slot pool: %s", t->pool_bytes >> 20,
                     strerror(errno));
        goto fail;
    }
    if (o->mlock && (st = lock_pool(t, err)) != HM_OK) goto fail;
    if ((st = hm_ssd_open(&t->io, path, units, n_buf, &o->io, err)) != HM_OK) goto fail;

    /* the inner store; static placement skips units the VRAM tier holds (exclusive tiers) */
    const hm_profile *prof = o->profile;
    if (prof && t->vram) {
        if ((st = hm_profile_init(&filtered, prof->n_layer, prof->n_expert, err)) != HM_OK) goto fail;
        memcpy(filtered.counts, prof->counts, (size_t)prof->n_layer * (size_t)prof->n_expert * sizeof *prof->counts);
        for (int32_t l = 0; l < prof->n_layer && l < t->n_layer; l++)
            for (int32_t e = 0; e < prof->n_expert && e < t->base[l + 1] - t->base[l]; e++) {
                if (hm_experts_unit(t->vram, l, e)->hot_slot >= 0) filtered.counts[(size_t)l * (size_t)prof->n_expert + (size_t)e] = 0;
            }
        prof = &filtered;
    }
    t->tier = (hm_tier){.name = "ram", .ctx = t, .fill = tier_fill, .ready = tier_ready, .part = tier_part};
    hm_experts_opts so;
    hm_experts_opts_default(&so);
    so.hot_slots = t->n_slots;
    so.policy = o->policy;
    so.profile = prof;
    so.hot_tier = &t->tier;
    if ((st = hm_experts_open(&t->store, units, &so, err)) != HM_OK) goto fail;
    hm_profile_free(&filtered);
    if (t->vram) /* the units in VRAM now: barred from RAM slots, and known as such at the first step end */
        for (int32_t l = 0; l < t->n_layer; l++)
            for (int32_t e = 0, ne = t->base[l + 1] - t->base[l]; e < ne; e++) {
                bool in = hm_experts_unit(t->vram, l, e)->hot_slot >= 0;
                t->was_vram[t->base[l] + e] = in;
                hm_experts_bar(t->store, l, e, in);
            }
    hm_ssd_stats ss;
    hm_ssd_get_stats(t->io, &ss);
    t->st.uring = ss.uring, t->st.direct = ss.direct, t->st.queue_depth = ss.queue_depth;
    *out = t;
    return HM_OK;
fail:
    hm_profile_free(&filtered);
    hm_ram_tier_close(t);
    return st;
}

void hm_ram_tier_close(hm_ram_tier *t) {
    if (!t) return;
    hm_ssd_close(t->io); /* before the pool goes: reads in flight write into it */
    hm_experts_close(t->store);
    if (t->pool) munmap(t->pool, t->pool_bytes);
    free(t->base), free(t->buf_unit), free(t->buf_state), free(t->buf_pref), free(t->buf_pin);
    free(t->slot_buf), free(t->stage_buf), free(t->stage_tick), free(t->unit_stage), free(t->pred_step);
    free(t->layer_pred), free(t->was_vram), free(t->left), free(t->acq_cnt), free(t->acq_list), free(t->rec), free(t->call_buf);
    free(t->call_kind);
    free(t);
}

/* ---- the seam ---- */

static void pin_buf(hm_ram_tier *t, int32_t b, int32_t slot, int32_t ui) {
    t->buf_pin[b]++;
    if (slot >= 0) hm_experts_pin(t->store, t->store->u[ui].layer, t->store->u[ui].expert);
}

static void unpin_unit(hm_ram_tier *t, int32_t layer, int32_t expert) {
    int32_t ui = unit_index(t, layer, expert), slot;
    int32_t b = find_buf(t, ui, &slot);
    HM_ASSERT(b >= 0 && t->buf_pin[b] > 0);
    t->buf_pin[b]--;
    if (slot >= 0) hm_experts_unpin(t->store, layer, expert);
}

enum { K_SLOT = 0, K_STAGE = 1, K_PREF = 2, K_READ = 3 };

static hm_status acquire(hm_ram_tier *t, int32_t layer, const int32_t *experts, const int32_t *n_tok, int32_t n,
                         bool route, hm_unit_parts *parts, int32_t *n_ready, hm_err *err) {
    *n_ready = 0;
    HM_ASSERT(n >= 0 && n <= t->base[layer + 1] - t->base[layer]);
    /* 1: pin the units already in RAM first, so that finding staging for the others cannot
     * push out one of them (a prefetched unit later in the list) */
    for (int32_t i = 0; i < n; i++) {
        int32_t ui = unit_index(t, layer, experts[i]), slot;
        int32_t b = find_buf(t, ui, &slot);
        t->call_buf[i] = -1;
        if (b < 0 || t->buf_state[b] == BUF_BAD) continue;
        t->call_kind[i] = t->buf_pref[b] ? K_PREF : slot >= 0 ? K_SLOT : K_STAGE;
        t->buf_pref[b] = 0;
        pin_buf(t, b, slot, ui);
        t->call_buf[i] = b;
    }
    /* 2: start reads for the rest, all before waiting for any */
    int32_t got = n;
    for (int32_t i = 0; i < n; i++) {
        if (t->call_buf[i] >= 0) continue;
        int32_t ui = unit_index(t, layer, experts[i]), slot;
        int32_t b = find_buf(t, ui, &slot);
        if (b >= 0) { /* its last read failed: read it again in place */
            HM_ASSERT(t->buf_pin[b] == 0);
            settle(t, b, NULL);
        } else {
            int32_t si = grab_stage(t, false);
            if (si < 0) { /* every staging buffer is pinned: the first i units are ready */
                got = i;
                break;
            }
            b = t->stage_buf[si];
            t->unit_stage[ui] = si;
        }
        start_read(t, b, layer, experts[i]);
        t->call_kind[i] = K_READ;
        pin_buf(t, b, slot, ui);
        t->call_buf[i] = b;
    }
    for (int32_t i = got; i < n; i++)
        if (t->call_buf[i] >= 0) unpin_unit(t, layer, experts[i]);
    if (got == 0 && n > 0)
        return hm_errf(err, HM_ERR_INTERNAL, "RAM tier: all %d staging buffers are pinned (release units first)",
                       t->n_stage);
    /* 3: wait for them */
    hm_status st = HM_OK;
    int64_t t0 = hm_time_us();
    for (int32_t i = 0; i < got; i++) {
        int32_t b = t->call_buf[i];
        hm_err e2 = {{0}};
        hm_status s2 = settle(t, b, &e2);
        if (s2 != HM_OK && st == HM_OK)
            st = e2.msg[0] ? hm_errf(err, s2, "%s", e2.msg)
                           : hm_errf(err, s2, "%s: expert unit (layer %d, expert %d) could not be read",
                                     hm_ssd_path(t->io), layer, experts[i]);
        hm_ssd_layout(t->units, layer, experts[i], buf_ptr(t, b), parts[i].p);
    }
    t->st.wait_us += (double)(hm_time_us() - t0);
    if (st != HM_OK) { /* nothing stays pinned; the failed buffer is BAD and re-read next time */
        for (int32_t i = 0; i < got; i++) unpin_unit(t, layer, experts[i]);
        return st;
    }
    bool predicted_layer = t->layer_pred[layer] == t->step;
    for (int32_t i = 0; i < got; i++) {
        int32_t ui = unit_index(t, layer, experts[i]);
        if (t->unit_stage[ui] >= 0) t->stage_tick[t->unit_stage[ui]] = ++t->tick;
        if (!route) continue;
        t->st.acquired++;
        switch (t->call_kind[i]) {
        case K_SLOT: t->st.hit_slot++; break;
        case K_STAGE: t->st.hit_stage++; break;
        case K_PREF: t->st.hit_prefetch++; break;
        default: t->st.miss++; break;
        }
        if (predicted_layer) {
            t->st.acq_predicted++;
            if (t->pred_step[ui] == t->step) t->st.pred_used++;
        }
        if (!t->acq_cnt[ui]) t->acq_list[t->n_acq++] = ui;
        t->acq_cnt[ui] += n_tok ? n_tok[i] : 1;
    }
    *n_ready = got;
    return HM_OK;
}

hm_status hm_ram_tier_acquire(hm_ram_tier *t, int32_t layer, const int32_t *experts, const int32_t *n_tok, int32_t n,
                              hm_unit_parts *parts, int32_t *n_ready, hm_err *err) {
    return acquire(t, layer, experts, n_tok, n, true, parts, n_ready, err);
}

hm_status hm_ram_tier_hold(hm_ram_tier *t, int32_t layer, int32_t expert, hm_unit_parts *parts, hm_err *err) {
    int32_t got;
    return acquire(t, layer, &expert, NULL, 1, false, parts, &got, err);
}

void hm_ram_tier_release(hm_ram_tier *t, int32_t layer, const int32_t *experts, int32_t n) {
    for (int32_t i = 0; i < n; i++) unpin_unit(t, layer, experts[i]);
}

void hm_ram_tier_prefetch(hm_ram_tier *t, int32_t layer, const int32_t *experts, int32_t n) {
    t->layer_pred[layer] = t->step;
    for (int32_t i = 0; i < n; i++) {
        int32_t ui = unit_index(t, layer, experts[i]), slot;
        if (t->vram && hm_experts_unit(t->vram, layer, experts[i])->home == HM_TIER_HOT) continue;
        if (t->pred_step[ui] == t->step) continue; /* predicted twice (several tokens) */
        t->pred_step[ui] = t->step;
        t->st.pred++;
        int32_t b = find_buf(t, ui, &slot);
        if (b >= 0) {
            if (t->unit_stage[ui] >= 0) t->stage_tick[t->unit_stage[ui]] = ++t->tick;
            continue;
        }
        int32_t s = grab_stage(t, true);
        if (s < 0) continue;
        b = t->stage_buf[s];
        t->unit_stage[ui] = s;
        t->stage_tick[s] = ++t->tick;
        start_read(t, b, layer, experts[i]);
        t->buf_pref[b] = 1;
        t->st.prefetch_reads++;
    }
}

/* ---- step end ---- */

static void sync_vram(hm_ram_tier *t) {
    hm_experts *s = t->store;
    for (int32_t l = 0; l < t->n_layer; l++)
        for (int32_t e = 0, ne = t->base[l + 1] - t->base[l]; e < ne; e++) {
            int32_t ui = t->base[l] + e;
            const hm_unit *v = hm_experts_unit(t->vram, l, e);
            bool in = v->hot_slot >= 0;
            /* a unit with a VRAM slot (landed or filling) is never admitted to a RAM slot */
            if (s->u[ui].barred != in) hm_experts_bar(s, l, e, in);
            if (v->home == HM_TIER_HOT) {
                hm_unit *u = &s->u[ui];
                if (u->hot_slot >= 0 && u->pin == 0) {
                    scrub(t, t->slot_buf[u->hot_slot]);
                    hm_experts_evict(s, ui);
                    t->st.vram_released++;
                }
                int32_t i = t->unit_stage[ui];
                if (i >= 0 && !t->buf_pin[t->stage_buf[i]]) {
                    scrub(t, t->stage_buf[i]);
                    t->unit_stage[ui] = -1;
                    t->stage_tick[i] = 0;
                    t->st.vram_released++;
                }
            } else if (t->was_vram[ui] && !in) { /* left VRAM: placed after the RAM policy's step */
                t->left[t->n_left++] = ui;
            }
            t->was_vram[ui] = in;
        }
}

/* After the RAM policy's step: each unit that left VRAM keeps the RAM slot the policy gave it, or
 * takes one the policy left free (a read from the file), else it is SSD-only. After the policy, so
 * that it never evicts a unit just read for this (no read wasted). */
static void place_left(hm_ram_tier *t) {
    hm_experts *s = t->store;
    for (int64_t i = 0; i < t->n_left; i++) {
        int32_t ui = t->left[i];
        if (s->u[ui].hot_slot >= 0 || (s->n_free > 0 && !s->u[ui].barred && hm_experts_admit(s, ui, NULL) == HM_OK))
            t->st.vram_demoted_ram++;
        else
            t->st.vram_demoted_ssd++;
    }
    t->n_left = 0;
}

hm_status hm_ram_tier_step_end(hm_ram_tier *t, int32_t n_tok, bool prompt, hm_err *err) {
    if (t->vram) sync_vram(t);
    for (int64_t i = 0; i < t->n_acq; i++) { /* the routes this tier served, minus units now in VRAM */
        int32_t ui = t->acq_list[i], cnt = t->acq_cnt[ui];
        t->acq_cnt[ui] = 0;
        const hm_unit *u = &t->store->u[ui];
        if (t->vram && hm_experts_unit(t->vram, u->layer, u->expert)->hot_slot >= 0) continue;
        for (int32_t k = 0; k < REC && k < cnt; k++) t->rec[k] = u->expert;
        for (int32_t left = cnt; left > 0; left -= REC)
            hm_experts_record(t->store, u->layer, t->rec, left < REC ? left : REC);
    }
    t->n_acq = 0;
    t->step++;
    t->st.steps++;
    t->st.tokens += (uint64_t)n_tok;
    hm_status st = hm_experts_step_end(t->store, n_tok, prompt, err);
    if (t->vram) place_left(t);
    return st;
}

void hm_ram_tier_drain(hm_ram_tier *t) {
    for (int32_t b = 0; b < t->n_buf; b++)
        if (hm_ssd_busy(t->io, b)) settle(t, b, NULL);
}

/* ---- queries ---- */

void hm_ram_tier_get_stats(const hm_ram_tier *t, hm_ram_tier_stats *out) {
    *out = t->st;
    out->n_buf = t->n_buf, out->n_slots = t->n_slots, out->n_stage = t->n_stage;
    out->slot_bytes = t->slot_bytes, out->pool_bytes = t->pool_bytes;
    out->mlocked = t->mlocked;
    hm_ssd_stats ss;
    hm_ssd_get_stats(t->io, &ss);
    out->read_bytes = ss.bytes;
    hm_experts_stats es;
    hm_experts_get_stats(t->store, &es);
    out->n_used = es.n_used;
}

const hm_experts *hm_ram_tier_store(const hm_ram_tier *t) { return t->store; }

int hm_ram_tier_where(const hm_ram_tier *t, int32_t layer, int32_t expert) {
    int32_t slot, b = find_buf(t, unit_index(t, layer, expert), &slot);
    if (b < 0 || t->buf_state[b] == BUF_BAD) return 0;
    return slot >= 0 ? 2 : 1;
}
