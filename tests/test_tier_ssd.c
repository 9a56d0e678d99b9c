/* test_tier_ssd.c - the SSD tier and the RAM slot pool on a tiny synthesised model (4 layers x 16
 * experts, units of 108-124.5 KiB, their ranges not 4096-aligned): every unit read through the
 * tier equals its bytes in the file mapping (io_uring and pread, O_DIRECT on and off); LRU and
 * static RAM placement on hand-made routing sequences with reads counted by hand; exclusivity
 * with a (bookkeeping) VRAM store; pins; prefetch precision/recall; injected read failures, short
 * reads and a file truncated while open give an error naming the unit, and the next request works. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "experts/tier_ram.h"
#include "gguf/gguf.h"
#include "hotmoe_tools.h"
#include "test.h"

static char tmpdir[256], model_path[512];
static hm_gguf *g;
static hm_units units;
static size_t slot_bytes;

static hm_ram_tier *open_tier(const char *path, int32_t n_slots, int32_t n_stage, hm_policy_kind kind,
                              const hm_profile *p, const hm_experts *vram, bool pread, bool no_direct) {
    hm_ram_tier_opts o;
    hm_ram_tier_opts_default(&o);
    o.budget = (int64_t)((size_t)(n_slots + n_stage) * slot_bytes);
    o.n_stage = n_stage;
    o.policy.kind = kind;
    o.profile = p;
    o.vram = vram;
    o.io.force_pread = pread;
    o.io.no_direct = no_direct;
    hm_err err = {{0}};
    hm_ram_tier *t = NULL;
    hm_status st = hm_ram_tier_open(&t, path, &units, &o, &err);
    CHECKF(st == HM_OK, "%s", err.msg);
    return t;
}

/* The unit's bytes in the mapping equal what the tier gave. */
static bool same_as_file(int32_t l, int32_t e, const hm_unit_parts *pp) {
    const hm_units_layer *L = &units.layers[l];
    for (int p = 0; p < HM_UNIT_NPART; p++) {
        if (!L->part[p]) {
            if (pp->p[p]) return false;
            continue;
        }
        const char *ref = (const char *)L->part[p]->data + (size_t)e * L->slab_bytes[p];
        if (!pp->p[p] || memcmp(ref, pp->p[p], L->slab_bytes[p]) != 0) return false;
    }
    return true;
}

/* Bytes a read of the unit brings in: its parts' 4096-aligned spans, cut at the end of the file. */
static uint64_t span_bytes(int32_t l, int32_t e) {
    uint64_t n = 0, fsz = hm_gguf_file_size(g);
    for (int p = 0; p < HM_UNIT_NPART; p++) {
        if (!units.layers[l].part[p]) continue;
        uint64_t off = hm_units_offset(&units, l, e, (hm_unit_part)p), len = units.layers[l].slab_bytes[p];
        uint64_t s0 = off / 4096 * 4096, s1 = (off + len + 4095) / 4096 * 4096;
        n += (s1 < fsz ? s1 : fsz) - s0;
    }
    return n;
}

static hm_status get1(hm_ram_tier *t, int32_t l, int32_t e, hm_unit_parts *pp, hm_err *err) {
    int32_t n = 0;
    hm_status st = hm_ram_tier_acquire(t, l, &e, NULL, 1, pp, &n, err);
    if (st == HM_OK) CHECK(n == 1);
    return st;
}

/* One token per step, layer 0, k = 1: acquire, check, release, step end. */
static void feed(hm_ram_tier *t, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) {
        hm_unit_parts pp;
        hm_err err = {{0}};
        CHECKF(get1(t, 0, ids[i], &pp, &err) == HM_OK, "%s", err.msg);
        CHECK(same_as_file(0, ids[i], &pp));
        hm_ram_tier_release(t, 0, &ids[i], 1);
        CHECK(hm_ram_tier_step_end(t, 1, false, &err) == HM_OK);
    }
}

static void test_bytes(bool pread, bool no_direct) {
    /* every unit, one at a time through 16 staging buffers, then one layer's 16 at once */
    hm_ram_tier *t = open_tier(model_path, 0, 16, HM_POLICY_NONE, NULL, NULL, pread, no_direct);
    if (!t) return;
    hm_ram_tier_stats s;
    hm_ram_tier_get_stats(t, &s);
    CHECK(s.uring == !pread);
    uint64_t want = 0;
    for (int32_t l = 0; l < units.n_layer; l++)
        for (int32_t e = 0; e < units.layers[l].n_expert; e++) {
            hm_unit_parts pp;
            hm_err err = {{0}};
            CHECKF(get1(t, l, e, &pp, &err) == HM_OK, "%s", err.msg);
            CHECKF(same_as_file(l, e, &pp), "unit (%d, %d) differs (pread %d, no_direct %d)", l, e, pread, no_direct);
            hm_ram_tier_release(t, l, &e, 1);
            want += span_bytes(l, e);
        }
    hm_ram_tier_get_stats(t, &s);
    CHECK(s.reads == 64 && s.miss == 64 && s.acquired == 64);
    CHECKF(s.read_bytes == want, "read %llu bytes, hand count %llu", (unsigned long long)s.read_bytes,
           (unsigned long long)want);
    /* all 16 of layer 2 at once: the 16 of layer 3 are in staging, so all 16 are read again */
    int32_t all[16];
    hm_unit_parts pp[16];
    for (int i = 0; i < 16; i++) all[i] = 15 - i;
    int32_t n = 0;
    hm_err err = {{0}};
    CHECKF(hm_ram_tier_acquire(t, 2, all, NULL, 16, pp, &n, &err) == HM_OK && n == 16, "%s", err.msg);
    for (int i = 0; i < 16; i++) CHECK(same_as_file(2, all[i], &pp[i]));
    hm_ram_tier_release(t, 2, all, 16);
    hm_ram_tier_get_stats(t, &s);
    CHECK(s.reads == 80 && s.hit_stage == 0);
    /* and again: all hits, no reads */
    CHECK(hm_ram_tier_acquire(t, 2, all, NULL, 16, pp, &n, &err) == HM_OK && n == 16);
    hm_ram_tier_release(t, 2, all, 16);
    hm_ram_tier_get_stats(t, &s);
    CHECK(s.reads == 80 && s.hit_stage == 16);
    hm_ram_tier_close(t);
}

static void test_lru(bool pread) {
    /* 2 policy slots (LRU) + 1 staging buffer, trace 0 1 0 2 1 0 3 0 (as test_experts' LRU case):
     * a miss is read into staging and admitted at step end by swapping buffers (no second read).
     * s0 0 read -> {0}; s1 1 read -> {0,1}; s2 0 slot hit; s3 2 read, evict 1 -> {0,2};
     * s4 1 read, evict 0 -> {2,1}; s5 0 read, evict 2 -> {1,0}; s6 3 read, evict 1 -> {0,3};
     * s7 0 slot hit. Reads: 0,1,2,1,0,3 = 6; hits 2; no fill reads. */
    hm_ram_tier *t = open_tier(model_path, 2, 1, HM_POLICY_LRU, NULL, NULL, pread, false);
    if (!t) return;
    const int32_t trace[] = {0, 1, 0, 2, 1, 0, 3, 0};
    feed(t, trace, 8);
    hm_ram_tier_stats s;
    hm_ram_tier_get_stats(t, &s);
    CHECK(s.reads == 6 && s.miss == 6 && s.hit_slot == 2 && s.hit_stage == 0 && s.fill_reads == 0);
    uint64_t want = 2 * span_bytes(0, 0) + 2 * span_bytes(0, 1) + span_bytes(0, 2) + span_bytes(0, 3);
    CHECK(s.read_bytes == want);
    CHECK(hm_ram_tier_where(t, 0, 0) == 2 && hm_ram_tier_where(t, 0, 3) == 2 && hm_ram_tier_where(t, 0, 1) == 0);
    hm_experts_stats es;
    hm_experts_get_stats(hm_ram_tier_store(t), &es);
    CHECK(es.hits == 2 && es.misses == 6 && es.swaps_in == 6 && es.swaps_out == 4);
    hm_ram_tier_close(t);

    /* no policy, 3 staging buffers: an LRU cache of 3. Reads 0 1 2, hits 1 0, 3 evicts 2, 0 hit: 4 reads */
    t = open_tier(model_path, 0, 3, HM_POLICY_NONE, NULL, NULL, pread, false);
    feed(t, trace, 8);
    hm_ram_tier_get_stats(t, &s);
    CHECK(s.reads == 4 && s.hit_stage == 4);
    hm_ram_tier_close(t);
}

static void test_static(void) {
    /* profile for layer 0: 9 5 4 (others 0); 2 slots -> units 0 and 1 placed at open (2 fill
     * reads). Trace 0 2 1 2 3 0: 0 slot, 2 read, 1 slot, 2 staging hit, 3 read (2 leaves staging),
     * 0 slot. Reads 4, slot hits 3, staging hits 1; static never moves a unit. */
    hm_err err = {{0}};
    hm_profile p;
    CHECK(hm_profile_init(&p, units.n_layer, units.n_expert, &err) == HM_OK);
    p.counts[0] = 9, p.counts[1] = 5, p.counts[2] = 4;
    hm_ram_tier *t = open_tier(model_path, 2, 1, HM_POLICY_STATIC, &p, NULL, false, false);
    if (t) {
        CHECK(hm_ram_tier_where(t, 0, 0) == 2 && hm_ram_tier_where(t, 0, 1) == 2);
        const int32_t trace[] = {0, 2, 1, 2, 3, 0};
        feed(t, trace, 6);
        hm_ram_tier_stats s;
        hm_ram_tier_get_stats(t, &s);
        CHECK(s.fill_reads == 2 && s.reads == 4 && s.hit_slot == 3 && s.hit_stage == 1 && s.miss == 2);
        hm_experts_stats es;
        hm_experts_get_stats(hm_ram_tier_store(t), &es);
        CHECK(es.swaps_in == 2 && es.swaps_out == 0);
        CHECK(hm_ram_tier_where(t, 0, 2) == 0 && hm_ram_tier_where(t, 0, 3) == 1);
        hm_ram_tier_close(t);
    }
    hm_profile_free(&p);
}

/* A VRAM tier for the store: bookkeeping only, fills land at once. */
static hm_experts *open_vram(int64_t slots, hm_policy_kind kind, const hm_profile *p) {
    hm_experts_opts o;
    hm_experts_opts_default(&o);
    o.hot_slots = slots;
    o.policy.kind = kind;
    o.profile = p;
    hm_experts *v = NULL;
    hm_err err = {{0}};
    CHECKF(hm_experts_open(&v, &units, &o, &err) == HM_OK, "%s", err.msg);
    return v;
}

static bool exclusive(const hm_experts *v, const hm_ram_tier *t) {
    for (int32_t l = 0; l < units.n_layer; l++)
        for (int32_t e = 0; e < units.layers[l].n_expert; e++)
            if (hm_experts_unit(v, l, e)->home == HM_TIER_HOT && hm_ram_tier_where(t, l, e) != 0) return false;
    return true;
}

/* One step of the forward pass with both tiers: VRAM hits stay on the GPU, the rest come from RAM. */
static void step2(hm_experts *v, hm_ram_tier *t, int32_t l, const int32_t *ids, int n) {
    hm_err err = {{0}};
    hm_experts_record(v, l, ids, n);
    for (int i = 0; i < n; i++) {
        if (hm_experts_unit(v, l, ids[i])->home == HM_TIER_HOT) continue;
        hm_unit_parts pp;
        CHECKF(get1(t, l, ids[i], &pp, &err) == HM_OK, "%s", err.msg);
        CHECK(same_as_file(l, ids[i], &pp));
        hm_ram_tier_release(t, l, &ids[i], 1);
    }
    CHECK(hm_experts_step_end(v, n, false, &err) == HM_OK);
    CHECK(hm_ram_tier_step_end(t, n, false, &err) == HM_OK);
    CHECK(exclusive(v, t));
}

static void test_exclusive(void) {
    /* VRAM: 1 LRU slot. RAM: 2 LRU slots + 1 staging.
     * s0 route 0: VRAM miss, RAM read 0 (staging). VRAM admits 0; RAM drops its staging copy
     *    (released 1) and does not admit 0 (the route is filtered out: 0 is in VRAM).
     * s1 route 1: RAM read 1. VRAM evicts 0, admits 1. RAM drops 1 (released 2); 0 left VRAM and
     *    RAM has room: admitted, read from the file (fill read 1, demoted to RAM 1).
     * s2 route 0: RAM slot hit. VRAM evicts 1, admits 0. RAM evicts 0 (released 3); 1 left VRAM:
     *    admitted (fill read 2, demoted 2).
     * Reads 2 on demand + 2 fills = 4; never a unit in both. */
    hm_experts *v = open_vram(1, HM_POLICY_LRU, NULL);
    hm_ram_tier *t = open_tier(model_path, 2, 1, HM_POLICY_LRU, NULL, v, false, false);
    if (!v || !t) return;
    const int32_t trace[] = {0, 1, 0};
    for (int i = 0; i < 3; i++) step2(v, t, 0, &trace[i], 1);
    hm_ram_tier_stats s;
    hm_ram_tier_get_stats(t, &s);
    CHECK(s.reads == 4 && s.miss == 2 && s.hit_slot == 1 && s.fill_reads == 2);
    CHECK(s.vram_released == 3 && s.vram_demoted_ram == 2 && s.vram_demoted_ssd == 0);
    CHECK(hm_ram_tier_where(t, 0, 1) == 2 && hm_ram_tier_where(t, 0, 0) == 0);
    /* a longer mixed trace over two layers: the invariant holds at every step end */
    uint64_t x = 12345;
    for (int stp = 0; stp < 200; stp++) {
        for (int32_t l = 0; l < 2; l++) {
            int32_t ids[4];
            for (int k = 0; k < 4; k++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                int32_t e = (int32_t)((x >> 33) % 16);
                e = e < 8 ? e % 3 : e; /* skewed */
                bool dup = false;
                for (int j = 0; j < k; j++) dup |= ids[j] == e;
                ids[k] = dup ? -1 : e;
            }
            int n = 0;
            for (int k = 0; k < 4; k++)
                if (ids[k] >= 0) ids[n++] = ids[k];
            hm_err err = {{0}};
            hm_experts_record(v, l, ids, n);
            for (int i = 0; i < n; i++) {
                if (hm_experts_unit(v, l, ids[i])->home == HM_TIER_HOT) continue;
                hm_unit_parts pp;
                CHECKF(get1(t, l, ids[i], &pp, &err) == HM_OK, "%s", err.msg);
                CHECK(same_as_file(l, ids[i], &pp));
                hm_ram_tier_release(t, l, &ids[i], 1);
            }
        }
        hm_err err = {{0}};
        CHECK(hm_experts_step_end(v, 1, false, &err) == HM_OK);
        CHECK(hm_ram_tier_step_end(t, 1, false, &err) == HM_OK);
        CHECKF(exclusive(v, t), "step %d", stp);
    }
    hm_ram_tier_close(t);
    hm_experts_close(v);

    /* static in both: RAM's static placement skips the units VRAM holds. Layer 0 counts 9 8 7 6:
     * VRAM (2 slots) 0 1, RAM (2 slots) 2 3. */
    hm_err err = {{0}};
    hm_profile p;
    CHECK(hm_profile_init(&p, units.n_layer, units.n_expert, &err) == HM_OK);
    p.counts[0] = 9, p.counts[1] = 8, p.counts[2] = 7, p.counts[3] = 6;
    v = open_vram(2, HM_POLICY_STATIC, &p);
    t = open_tier(model_path, 2, 1, HM_POLICY_STATIC, &p, v, false, false);
    if (v && t) {
        CHECK(hm_experts_unit(v, 0, 0)->home == HM_TIER_HOT && hm_experts_unit(v, 0, 1)->home == HM_TIER_HOT);
        CHECK(hm_ram_tier_where(t, 0, 2) == 2 && hm_ram_tier_where(t, 0, 3) == 2);
        CHECK(hm_ram_tier_where(t, 0, 0) == 0 && hm_ram_tier_where(t, 0, 1) == 0);
        CHECK(exclusive(v, t));
    }
    hm_ram_tier_close(t);
    hm_experts_close(v);
    hm_profile_free(&p);
}

static void test_pins(void) {
    /* 1 LRU slot + 1 staging buffer. s0: 0 read, admitted. s1: 0 acquired (slot) and kept pinned,
     * 1 read and released: LRU wants 1 in and 0 out, but 0 is pinned -> stays; 1 stays in staging. */
    hm_ram_tier *t = open_tier(model_path, 1, 1, HM_POLICY_LRU, NULL, NULL, false, false);
    if (!t) return;
    const int32_t z = 0, one = 1;
    feed(t, &z, 1);
    CHECK(hm_ram_tier_where(t, 0, 0) == 2);
    hm_unit_parts p0, p1;
    hm_err err = {{0}};
    CHECK(get1(t, 0, 0, &p0, &err) == HM_OK);
    CHECK(get1(t, 0, 1, &p1, &err) == HM_OK);
    hm_ram_tier_release(t, 0, &one, 1);
    CHECK(hm_ram_tier_step_end(t, 1, false, &err) == HM_OK);
    CHECK(hm_ram_tier_where(t, 0, 0) == 2 && hm_ram_tier_where(t, 0, 1) == 1);
    CHECK(same_as_file(0, 0, &p0)); /* still valid: pinned */
    /* staging exhausted: 2 and 3 with one staging buffer -> only the first is ready */
    int32_t two[2] = {2, 3}, n = -1;
    hm_unit_parts pp[2];
    CHECK(hm_ram_tier_acquire(t, 1, two, NULL, 2, pp, &n, &err) == HM_OK && n == 1);
    CHECK(same_as_file(1, 2, &pp[0]));
    hm_ram_tier_release(t, 1, two, 1);
    CHECK(hm_ram_tier_acquire(t, 1, two + 1, NULL, 1, pp, &n, &err) == HM_OK && n == 1);
    CHECK(same_as_file(1, 3, &pp[0]));
    hm_ram_tier_release(t, 1, two + 1, 1);
    hm_ram_tier_release(t, 0, &z, 1);
    CHECK(hm_ram_tier_step_end(t, 1, false, &err) == HM_OK);
    hm_ram_tier_close(t);
}

static void test_prefetch(void) {
    /* predict 1 2 3 for layer 1, route 2 3 4: precision 2/3, recall 2/3, 2 prefetch hits, 1 miss */
    hm_ram_tier *t = open_tier(model_path, 0, 8, HM_POLICY_NONE, NULL, NULL, false, false);
    if (!t) return;
    const int32_t pred[3] = {1, 2, 3}, route[3] = {2, 3, 4};
    hm_ram_tier_prefetch(t, 1, pred, 3);
    hm_unit_parts pp[3];
    int32_t n = 0;
    hm_err err = {{0}};
    CHECK(hm_ram_tier_acquire(t, 1, route, NULL, 3, pp, &n, &err) == HM_OK && n == 3);
    for (int i = 0; i < 3; i++) CHECK(same_as_file(1, route[i], &pp[i]));
    hm_ram_tier_release(t, 1, route, 3);
    CHECK(hm_ram_tier_step_end(t, 1, false, &err) == HM_OK);
    hm_ram_tier_stats s;
    hm_ram_tier_get_stats(t, &s);
    CHECK(s.pred == 3 && s.pred_used == 2 && s.acq_predicted == 3 && s.prefetch_reads == 3);
    CHECK(s.hit_prefetch == 2 && s.miss == 1 && s.reads == 4);
    /* the unused prefetch (1) is pushed out by 8 new reads: wasted */
    for (int32_t e = 5; e < 13; e++) {
        CHECK(get1(t, 2, e, pp, &err) == HM_OK);
        hm_ram_tier_release(t, 2, &e, 1);
    }
    hm_ram_tier_get_stats(t, &s);
    CHECK(s.prefetch_wasted == 1);
    hm_ram_tier_close(t);
}

typedef struct fault_ctx {
    int32_t layer, expert;
    int mode; /* errno to fail with, -1 short read, 0 off */
    int fired;
} fault_ctx;

static int fault(void *ctx, int32_t layer, int32_t expert, hm_unit_part part, uint64_t off, uint64_t len) {
    fault_ctx *f = ctx;
    (void)off, (void)len;
    if (!f->mode || layer != f->layer || expert != f->expert || part != HM_UNIT_DOWN) return 0;
    int m = f->mode;
    f->mode = 0; /* once */
    f->fired++;
    return m;
}

static void test_faults(bool pread) {
    fault_ctx f = {.layer = 1, .expert = 5, .mode = EIO};
    hm_ram_tier_opts o;
    hm_ram_tier_opts_default(&o);
    o.budget = (int64_t)(4 * slot_bytes);
    o.io.force_pread = pread;
    o.io.fault = fault;
    o.io.fault_ctx = &f;
    hm_err err = {{0}};
    hm_ram_tier *t = NULL;
    CHECKF(hm_ram_tier_open(&t, model_path, &units, &o, &err) == HM_OK, "%s", err.msg);
    if (!t) return;
    int32_t ids[3] = {4, 5, 6}, n = -1;
    hm_unit_parts pp[3];
    hm_status st = hm_ram_tier_acquire(t, 1, ids, NULL, 3, pp, &n, &err);
    CHECKF(st == HM_ERR_IO && n == 0 && f.fired == 1, "st %d n %d", st, n);
    CHECKF(strstr(err.msg, model_path) && strstr(err.msg, "layer 1, expert 5") && strstr(err.msg, "ffn_down_exps") &&
               strstr(err.msg, "offset") && strstr(err.msg, "Input/output error"), "%s", err.msg);
    /* nothing stayed pinned (all 4 buffers usable) and the failed unit is read again */
    int32_t four[4] = {5, 7, 8, 9};
    hm_unit_parts p4[4];
    CHECKF(hm_ram_tier_acquire(t, 1, four, NULL, 4, p4, &n, &err) == HM_OK && n == 4, "%s", err.msg);
    for (int i = 0; i < 4; i++) CHECK(same_as_file(1, four[i], &p4[i]));
    hm_ram_tier_release(t, 1, four, 4);
    /* a short read */
    f = (fault_ctx){.layer = 2, .expert = 3, .mode = -1};
    memset(&err, 0, sizeof err);
    CHECK(get1(t, 2, 3, pp, &err) == HM_ERR_IO && strstr(err.msg, "short read") && strstr(err.msg, "expert 3"));
    CHECK(get1(t, 2, 3, pp, &err) == HM_OK && same_as_file(2, 3, pp));
    int32_t e3 = 3;
    hm_ram_tier_release(t, 2, &e3, 1);
    hm_ram_tier_stats s;
    hm_ram_tier_get_stats(t, &s);
    CHECK(s.io_errors == 2);
    hm_ram_tier_close(t);
}

static int copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    int rc = a && b ? 0 : -1;
    char buf[65536];
    size_t n;
    while (rc == 0 && (n = fread(buf, 1, sizeof buf, a)) > 0)
        if (fwrite(buf, 1, n, b) != n) rc = -1;
    if (a) fclose(a);
    if (b && fclose(b)) rc = -1;
    return rc;
}

static void test_truncated(bool pread) {
    /* the file shrinks to the start of layer 3's down tensor after the tier opened it */
    char path[600];
    snprintf(path, sizeof path, "%s/trunc.gguf", tmpdir);
    CHECK(copy_file(model_path, path) == 0);
    hm_ram_tier *t = open_tier(path, 0, 4, HM_POLICY_NONE, NULL, NULL, pread, false);
    if (!t) return;
    CHECK(truncate(path, (off_t)hm_units_offset(&units, 3, 0, HM_UNIT_DOWN)) == 0);
    hm_unit_parts pp;
    hm_err err = {{0}};
    CHECK(get1(t, 3, 9, &pp, &err) == HM_ERR_IO);
    CHECKF(strstr(err.msg, "short read") && strstr(err.msg, "layer 3, expert 9") && strstr(err.msg, "trunc.gguf"),
           "%s", err.msg);
    CHECK(get1(t, 0, 2, &pp, &err) == HM_OK && same_as_file(0, 2, &pp));
    int32_t e = 2;
    hm_ram_tier_release(t, 0, &e, 1);
    hm_ram_tier_close(t);
    unlink(path);
}

static void test_open_errors(void) {
    hm_ram_tier_opts o;
    hm_ram_tier_opts_default(&o);
    o.budget = (int64_t)slot_bytes - 1;
    hm_err err = {{0}};
    hm_ram_tier *t = NULL;
    CHECK(hm_ram_tier_open(&t, model_path, &units, &o, &err) == HM_ERR_ARG && !t && strstr(err.msg, "buffers of"));
    o.budget = (int64_t)(8 * slot_bytes);
    CHECK(hm_ram_tier_open(&t, "/nonexistent/x.gguf", &units, &o, &err) == HM_ERR_IO && strstr(err.msg, "x.gguf"));
    /* --mlock: locked, or a message that says how to allow it */
    o.mlock = true;
    hm_status st = hm_ram_tier_open(&t, model_path, &units, &o, &err);
    CHECKF(st == HM_OK || strstr(err.msg, "RLIMIT_MEMLOCK"), "%s", err.msg);
    if (t) {
        hm_ram_tier_stats s;
        hm_ram_tier_get_stats(t, &s);
        CHECK(s.mlocked && s.pool_bytes == 8 * slot_bytes);
    }
    hm_ram_tier_close(t);
    hm_ram_tier_close(NULL);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hm_test_tier_ssd_%d", (int)getpid());
    mkdir(tmpdir, 0700);
    snprintf(model_path, sizeof model_path, "%s/tiny.gguf", tmpdir);
    hm_synth_opts so = {.arch = "qwen3moe", .preset = "tiny", .type = "q4_k_m", .seed = 7, .out_path = model_path,
                        .n_threads = 1};
    hm_err err = {{0}};
    if (hm_synth(&so, &err) != HM_OK || hm_gguf_open(&g, model_path, &err) != HM_OK ||
        hm_units_init(&units, g, &err) != HM_OK) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return 1;
    }
    slot_bytes = hm_ssd_slot_bytes(&units);
    CHECK(slot_bytes % 4096 == 0 && slot_bytes >= units.unit_bytes_max);
    for (int pr = 0; pr < 2; pr++) {
        test_bytes(pr, false);
        test_bytes(pr, true);
        test_lru(pr);
        test_faults(pr);
        test_truncated(pr);
    }
    test_static();
    test_exclusive();
    test_pins();
    test_prefetch();
    test_open_errors();
    hm_units_free(&units);
    hm_gguf_close(g);
    unlink(model_path);
    rmdir(tmpdir);
    return test_done();
}
