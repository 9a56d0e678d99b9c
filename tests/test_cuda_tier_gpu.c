/* test_cuda_tier_gpu.c - the VRAM expert slot pool (experts/tier_vram.h) on a real device.
 *
 * Every check compares device bytes (downloaded) with the host bytes they were filled from:
 *  - slot size from a unit table (host only, also runs without a GPU);
 *  - units with gate/up/down and with the fused gate_up land byte-exact at part(), each part at a
 *    multiple of 256 and right after the previous one; absent parts are NULL; refilling a slot
 *    with another unit (of the other form) replaces what part() says;
 *  - errors: a slot out of range, a unit larger than a slot (the slot keeps its unit), bad options;
 *  - a small staging ring (pieces of 64 KiB): units larger than one buffer and than the whole
 *    ring, many fills in a row while the ring wraps, ready() true after wait;
 *  - asynchronous fills (the copier thread): 160 fills queued back to back through a FIFO of 8
 *    (fill blocks while it is full) into 24 slots, each slot filled several times: after wait every
 *    slot holds its latest unit; a slot filled three times quickly (18 MB, 12 MB, 6 KB) is ready
 *    only with the last unit's bytes, and a landed slot filled again is never ready with the old
 *    bytes (checked the moment ready() says true); ready() right after a big fill is printed, not
 *    asserted (timing); closing pools with 400 fills queued does not hang and frees the device
 *    memory;
 *  - 0 slots is a valid pool; asking for 4x the free device memory gives a smaller pool that
 *    works (fills at its first, middle and last slot) and frees everything at close;
 *  - end to end: a small GGUF written here (random f32 experts: a gate/up/down layer, a dense
 *    layer, a gate_up layer), an expert store with this pool as its hot tier (static placement,
 *    then lru swaps landed by polling hm_experts_land without a wait, then an lru step whose
 *    fills are still queued when policy none evicts them and static re-places into the same
 *    slots): every HOT unit's parts (hm_experts_where) equal the file's bytes, also while other
 *    fills are still in flight.
 *  - direct copies (opts.direct): a file written here, mapped read-only and shared (the driver
 *    never returns from registering a private file mapping: docs/PERFORMANCE.md) and registered
 *    with CUDA (hm_cuda_host_register): units inside the range land byte-exact (one
 *    DMA per part), a unit with one part outside it goes through the ring as before, refills of
 *    the same slots from both kinds hold the latest unit; registering a range that is not all
 *    mapped fails with HM_ERR_NOMEM and leaves nothing registered.
 * Prints the fill bandwidth of 1.7 MB units from pageable memory and from a registered file
 * mapping, and the engine's time inside fill (HM_NO_BENCH=1 skips it).
 * Exits 77 ("skipped: no GPU") where there is no CUDA device. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "experts/tier_vram.h"
#include "cuda_test.h"
#include "experts/experts.h"
#include "experts/profile.h"
#include "experts/units.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "test.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { return xorshift64(&rng_state); }
static void fill_random(void *p, size_t n) {
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(rnd() >> 24);
}
static uint64_t r256(uint64_t x) { return (x + 255) / 256 * 256; }

/* ---- host units: parts of random bytes ---- */

typedef struct hunit {
    hm_unit_ref r;
    void *mem[HM_UNIT_NPART];
} hunit;

/* bytes[p] == 0: part p absent. */
static void hunit_make(hunit *h, int32_t layer, int32_t expert, const uint64_t bytes[HM_UNIT_NPART]) {
    memset(h, 0, sizeof *h);
    h->r.layer = layer, h->r.expert = expert;
    for (int p = 0; p < HM_UNIT_NPART; p++) {
        if (!bytes[p]) continue;
        h->mem[p] = xmalloc(bytes[p]);
        fill_random(h->mem[p], bytes[p]);
        h->r.src[p] = h->mem[p];
        h->r.part_bytes[p] = bytes[p];
        h->r.bytes += bytes[p];
    }
}
static void hunit_free(hunit *h) {
    for (int p = 0; p < HM_UNIT_NPART; p++) free(h->mem[p]);
    memset(h, 0, sizeof *h);
}
/* Bytes of the unit's slot image: parts back to back, each at a multiple of 256. */
static uint64_t image_bytes(const hm_unit_ref *r) {
    uint64_t pos = 0, end = 0;
    for (int p = 0; p < HM_UNIT_NPART; p++)
        if (r->src[p] && r->part_bytes[p]) end = pos + r->part_bytes[p], pos = r256(end);
    return end;
}

/* The slot's parts equal r's: present ones byte-exact at 256-aligned pointers, each right after
 * the previous present part; absent ones NULL. */
static void check_slot(const hm_tier *h, int32_t slot, const hm_unit_ref *r, const char *what) {
    const char *prev = NULL;
    uint64_t prev_bytes = 0;
    for (int p = 0; p < HM_UNIT_NPART; p++) {
        const char *d = h->part(h->ctx, slot, (hm_unit_part)p);
        if (!r->src[p] || !r->part_bytes[p]) {
            CHECKF(d == NULL, "%s: slot %d part %d should be absent", what, slot, p);
            continue;
        }
        CHECKF(d != NULL, "%s: slot %d part %d missing", what, slot, p);
        if (!d) continue;
        CHECKF((uintptr_t)d % 256 == 0, "%s: slot %d part %d at %p", what, slot, p, (const void *)d);
        if (prev) CHECKF(d == prev + r256(prev_bytes), "%s: slot %d part %d not right after the previous part", what, slot, p);
        prev = d, prev_bytes = r->part_bytes[p];
        void *got = xmalloc(r->part_bytes[p]);
        CK(hm_cuda_download(ctx, got, d, r->part_bytes[p], &err));
        CHECKF(memcmp(got, r->src[p], r->part_bytes[p]) == 0, "%s: slot %d part %d (%llu bytes) differs", what, slot,
               p, (unsigned long long)r->part_bytes[p]);
        free(got);
    }
}

/* ---- slot size (host only) ---- */

static void test_slot_bytes(void) {
    hm_units_layer L[3];
    memset(L, 0, sizeof L);
    L[0].n_expert = 4, L[0].slab_bytes[HM_UNIT_GATE] = 100, L[0].slab_bytes[HM_UNIT_UP] = 100;
    L[0].slab_bytes[HM_UNIT_DOWN] = 300; /* 256 + 256 + 512 = 1024 */
    L[2].n_expert = 4, L[2].slab_bytes[HM_UNIT_GATE_UP] = 1000, L[2].slab_bytes[HM_UNIT_DOWN] = 10; /* 1024 + 256 */
    hm_units u = {.n_layer = 3, .layers = L};
    CHECK(hm_vram_tier_slot_bytes(&u) == 1280);
    L[2].n_expert = 0; /* a dense layer does not count */
    CHECK(hm_vram_tier_slot_bytes(&u) == 1024);
}

/* ---- fills, refills, errors ---- */

static void test_basic(void) {
    const uint64_t a_b[HM_UNIT_NPART] = {100003, 100003, 77777, 0};
    const uint64_t b_b[HM_UNIT_NPART] = {0, 0, 77777, 200006};
    const uint64_t c_b[HM_UNIT_NPART] = {256, 1, 5000, 0};
    hunit A, B, C, D, big;
    hunit_make(&A, 0, 1, a_b);
    hunit_make(&B, 2, 3, b_b);
    hunit_make(&C, 5, 0, c_b);
    hunit_make(&D, 2, 7, b_b);
    uint64_t slot_bytes = image_bytes(&A.r);
    if (image_bytes(&B.r) > slot_bytes) slot_bytes = image_bytes(&B.r);
    const uint64_t big_b[HM_UNIT_NPART] = {slot_bytes, 1, 1, 0};
    hunit_make(&big, 9, 9, big_b);

    hm_vram_tier *t = NULL;
    hm_vram_tier_opts o = {.n_slots = 6, .slot_bytes = slot_bytes};
    CK(hm_vram_tier_open(&t, ctx, &o, &err));
    CHECK(hm_vram_tier_n_slots(t) == 6);
    CHECK(hm_vram_tier_bytes(t) == 6 * r256(slot_bytes));
    hm_tier h;
    hm_vram_tier_as_hot(t, &h);
    CHECK(h.name && strcmp(h.name, "vram") == 0 && h.ctx == t && h.fill && h.ready && h.part);
    CHECK(h.ready(h.ctx, 2)); /* never filled */
    for (int p = 0; p < HM_UNIT_NPART; p++) CHECK(h.part(h.ctx, 2, (hm_unit_part)p) == NULL);

    CK(h.fill(h.ctx, &A.r, 0, &err));
    CK(h.fill(h.ctx, &B.r, 1, &err));
    CK(h.fill(h.ctx, &C.r, 5, &err));
    CK(hm_vram_tier_wait(t, &err));
    for (int32_t s = 0; s < 6; s++) CHECKF(h.ready(h.ctx, s), "slot %d not ready after wait", s);
    check_slot(&h, 0, &A.r, "3 parts");
    check_slot(&h, 1, &B.r, "gate_up");
    check_slot(&h, 5, &C.r, "small parts");

    /* refill slot 0 with a fused unit: gate and up go away */
    CK(h.fill(h.ctx, &D.r, 0, &err));
    CK(hm_vram_tier_wait(t, &err));
    check_slot(&h, 0, &D.r, "refill");
    check_slot(&h, 1, &B.r, "neighbour of a refill");

    /* errors: nothing changes */
    const void *before[HM_UNIT_NPART];
    for (int p = 0; p < HM_UNIT_NPART; p++) before[p] = h.part(h.ctx, 1, (hm_unit_part)p);
    err.msg[0] = 0;
    CHECK(h.fill(h.ctx, &A.r, 6, &err) == HM_ERR_ARG && strstr(err.msg, "slot 6"));
    CHECK(h.fill(h.ctx, &A.r, -1, &err) == HM_ERR_ARG);
    err.msg[0] = 0;
    CHECK(h.fill(h.ctx, &big.r, 1, &err) == HM_ERR_ARG && strstr(err.msg, "slot 1") && strstr(err.msg, "bytes"));
    printf("error messages: %s\n", err.msg);
    for (int p = 0; p < HM_UNIT_NPART; p++) CHECK(h.part(h.ctx, 1, (hm_unit_part)p) == before[p]);
    check_slot(&h, 1, &B.r, "after a failed fill");

    hm_vram_tier_stats st;
    hm_vram_tier_get_stats(t, &st);
    CHECK(st.fills == 4);
    CHECK(st.fill_bytes == image_bytes(&A.r) + image_bytes(&B.r) + image_bytes(&C.r) + image_bytes(&D.r));
    CHECK(st.fill_seconds >= 0);
    hm_vram_tier_close(t);
    hm_vram_tier_close(NULL);
    hunit_free(&A), hunit_free(&B), hunit_free(&C), hunit_free(&D), hunit_free(&big);
}

static void test_options(void) {
    hm_vram_tier *t = NULL;
    hm_vram_tier_opts o = {.n_slots = 0};
    CK(hm_vram_tier_open(&t, ctx, &o, &err)); /* 0 slots, slot_bytes 0: a valid empty pool */
    CHECK(hm_vram_tier_n_slots(t) == 0 && hm_vram_tier_bytes(t) == 0);
    hm_tier h;
    hm_vram_tier_as_hot(t, &h);
    const uint64_t b[HM_UNIT_NPART] = {1000, 1000, 1000, 0};
    hunit u;
    hunit_make(&u, 0, 0, b);
    CHECK(h.fill(h.ctx, &u.r, 0, &err) == HM_ERR_ARG);
    CHECK(h.part(h.ctx, 0, HM_UNIT_GATE) == NULL);
    CK(hm_vram_tier_wait(t, &err));
    hm_vram_tier_close(t);

    t = NULL;
    o = (hm_vram_tier_opts){.n_slots = 3, .slot_bytes = 0};
    CHECK(hm_vram_tier_open(&t, ctx, &o, &err) == HM_ERR_ARG && t == NULL);
    o = (hm_vram_tier_opts){.n_slots = -1, .slot_bytes = 4096};
    CHECK(hm_vram_tier_open(&t, ctx, &o, &err) == HM_ERR_ARG && t == NULL);
    o = (hm_vram_tier_opts){.n_slots = 1, .slot_bytes = 4096, .staging_bytes = 100, .n_staging = 4};
    CHECK(hm_vram_tier_open(&t, ctx, &o, &err) == HM_ERR_ARG && t == NULL);
    o = (hm_vram_tier_opts){.n_slots = 1, .slot_bytes = 4096, .copy_threads = -1};
    CHECK(hm_vram_tier_open(&t, ctx, &o, &err) == HM_ERR_ARG && t == NULL && strstr(err.msg, "-1 copy threads"));
    o = (hm_vram_tier_opts){.n_slots = 1, .slot_bytes = 4096, .copy_threads = 65};
    CHECK(hm_vram_tier_open(&t, ctx, &o, &err) == HM_ERR_ARG && t == NULL);
    hunit_free(&u);
}

/* After a wait: each of slots [0, n_slots) is ready and holds u[last[slot]], the unit filled into
 * it last. */
static void check_latest(const hm_tier *h, int32_t n_slots, const hunit *u, const int *last, const char *label) {
    for (int32_t s = 0; s < n_slots; s++) {
        CHECKF(h->ready(h->ctx, s), "slot %d not ready after wait", s);
        char what[64];
        snprintf(what, sizeof what, "%s fill %d", label, last[s]);
        check_slot(h, s, &u[last[s]].r, what);
    }
}

/* ---- a small ring: pieces, wrap-around, many fills ---- */

/* Sizes are x at scale 1 (3 buffers of 66560 bytes: 200000 / 3 rounded down to 256); at a larger
 * scale the pieces pass the tier's 256 KiB split threshold and copy_threads threads stage each
 * one, slices cut at 64 bytes (3 threads: cuts inside parts, not at part edges). */
static void test_ring(const char *label, uint64_t x, int copy_threads) {
    enum { N_SLOTS = 5, N_FILL = 48 };
    const uint64_t slot_bytes = 3 * r256(150000 * x);
    hm_vram_tier *t = NULL;
    hm_vram_tier_opts o = {.n_slots = N_SLOTS, .slot_bytes = slot_bytes, .staging_bytes = 200000 * x, .n_staging = 3,
                           .copy_threads = copy_threads};
    CK(hm_vram_tier_open(&t, ctx, &o, &err));
    CHECK(hm_vram_tier_n_slots(t) == N_SLOTS);
    hm_tier h;
    hm_vram_tier_as_hot(t, &h);
    hunit *u = xmalloc(N_FILL * sizeof *u);
    int last[N_SLOTS];
    uint64_t total = 0;
    for (int i = 0; i < N_FILL; i++) {
        uint64_t b[HM_UNIT_NPART] = {0, 0, 0, 0};
        if (i == 0) { /* larger than the whole ring (199680 bytes at scale 1) */
            b[0] = b[1] = b[2] = 150000 * x;
        } else if (i % 3 == 0) { /* fused */
            b[HM_UNIT_GATE_UP] = 1 + rnd() % (200000 * x);
            b[HM_UNIT_DOWN] = 1 + rnd() % (100000 * x);
        } else {
            b[0] = b[1] = 1 + rnd() % (140000 * x);
            b[2] = 1 + rnd() % (140000 * x);
        }
        hunit_make(&u[i], i % 7, i, b);
        total += image_bytes(&u[i].r);
        int32_t slot = (int32_t)((i * 3) % N_SLOTS);
        CK(h.fill(h.ctx, &u[i].r, slot, &err));
        last[slot] = i;
        (void)h.ready(h.ctx, slot); /* may be either; must not disturb anything */
    }
    CK(hm_vram_tier_wait(t, &err));
    check_latest(&h, N_SLOTS, u, last, label);
    hm_vram_tier_stats st;
    hm_vram_tier_get_stats(t, &st);
    CHECK(st.fills == N_FILL && st.fill_bytes == total);
    /* one more unit larger than the ring, alone, and its neighbours stay */
    hunit w;
    const uint64_t wb[HM_UNIT_NPART] = {0, 0, 150000 * x, 300000 * x};
    hunit_make(&w, 1, 1, wb);
    CK(h.fill(h.ctx, &w.r, 2, &err));
    CK(hm_vram_tier_wait(t, &err));
    check_slot(&h, 2, &w.r, "unit larger than the ring");
    check_slot(&h, 1, &u[last[1]].r, "neighbour");
    check_slot(&h, 3, &u[last[3]].r, "neighbour");
    hm_vram_tier_close(t);
    for (int i = 0; i < N_FILL; i++) hunit_free(&u[i]);
    hunit_free(&w);
    free(u);
}

/* ---- asynchronous fills: the copier thread ---- */

/* Poll ready(slot) for up to 10 s (the copier has to get there; nothing else is asserted about
 * time). Returns whether it became ready. */
static bool poll_ready(const hm_tier *h, int32_t slot) {
    double t0 = now_s();
    while (!h->ready(h->ctx, slot)) {
        if (now_s() - t0 > 10) return false;
        usleep(50);
    }
    return true;
}

/* Many fills queued back to back into a small FIFO (fill blocks while it is full), slots filled
 * several times over: after wait every slot holds its latest unit exactly. */
static void test_async_many(void) {
    enum { N_SLOTS = 24, N_FILL = 160 };
    const uint64_t slot_bytes = 3 * r256(400000);
    hm_vram_tier *t = NULL;
    hm_vram_tier_opts o = {.n_slots = N_SLOTS, .slot_bytes = slot_bytes, .staging_bytes = 4 << 20, .max_queued = 8};
    CK(hm_vram_tier_open(&t, ctx, &o, &err));
    CHECK(hm_vram_tier_n_slots(t) == N_SLOTS);
    hm_tier h;
    hm_vram_tier_as_hot(t, &h);
    hunit *u = xmalloc(N_FILL * sizeof *u);
    int last[N_SLOTS];
    uint64_t total = 0;
    int not_ready = 0;
    for (int i = 0; i < N_FILL; i++) {
        uint64_t b[HM_UNIT_NPART] = {0, 0, 0, 0};
        if (i % 4 == 0) {
            b[HM_UNIT_GATE_UP] = 1 + rnd() % 800000;
            b[HM_UNIT_DOWN] = 1 + rnd() % 400000;
        } else {
            b[0] = b[1] = b[2] = 1 + rnd() % 400000;
        }
        hunit_make(&u[i], i % 5, i, b);
        total += image_bytes(&u[i].r);
    }
    double t0 = now_s();
    for (int i = 0; i < N_FILL; i++) {
        int32_t slot = (int32_t)((i * 7) % N_SLOTS);
        CK(h.fill(h.ctx, &u[i].r, slot, &err));
        last[slot] = i;
        not_ready += !h.ready(h.ctx, slot);
    }
    double t_queue = now_s() - t0;
    CK(hm_vram_tier_wait(t, &err));
    hm_vram_tier_stats st;
    hm_vram_tier_get_stats(t, &st);
    printf("async: %d fills (%.1f MB) queued in %.3f s, landed in %.3f s; ready false right after fill %d times; "
           "%llu dropped as overtaken\n", N_FILL, (double)total / 1e6, t_queue, now_s() - t0, not_ready,
           (unsigned long long)st.skipped);
    check_latest(&h, N_SLOTS, u, last, "async");
    CHECK(st.fills == N_FILL && st.fill_bytes == total && st.queued == 0);
    CHECK(st.skipped < N_FILL);
    hm_vram_tier_close(t);
    for (int i = 0; i < N_FILL; i++) hunit_free(&u[i]);
    free(u);
}

/* A slot filled again before its earlier fill landed: ready() only once the latest copy landed,
 * and then the bytes are the latest unit's. Also: a landed slot filled again is not ready with
 * the old fill's event (checked by reading the bytes the moment ready() says true). */
static void test_async_refill(void) {
    const uint64_t big_b[HM_UNIT_NPART] = {6000000, 6000000, 6000000, 0};  /* 18 MB: takes the copier a while */
    const uint64_t mid_b[HM_UNIT_NPART] = {0, 0, 3000000, 9000000};
    const uint64_t small_b[HM_UNIT_NPART] = {1000, 2000, 3000, 0};
    hunit A, B, C;
    hunit_make(&A, 0, 0, big_b);
    hunit_make(&B, 0, 1, mid_b);
    hunit_make(&C, 0, 2, small_b);
    hm_vram_tier *t = NULL;
    hm_vram_tier_opts o = {.n_slots = 4, .slot_bytes = 3 * r256(6000000)};
    CK(hm_vram_tier_open(&t, ctx, &o, &err));
    hm_tier h;
    hm_vram_tier_as_hot(t, &h);
    int early = 0;
    for (int round = 0; round < 4; round++) {
        /* A, B, C into slot 1 back to back: only C may ever be reported */
        CK(h.fill(h.ctx, &A.r, 1, &err));
        early += !h.ready(h.ctx, 1);
        CK(h.fill(h.ctx, &B.r, 1, &err));
        CK(h.fill(h.ctx, &C.r, 1, &err));
        CHECK(h.part(h.ctx, 1, HM_UNIT_GATE_UP) == NULL && h.part(h.ctx, 1, HM_UNIT_GATE) != NULL); /* C's, at once */
        CHECKF(poll_ready(&h, 1), "round %d: slot 1 never ready", round);
        check_slot(&h, 1, &C.r, "latest of three quick fills");
        /* a landed slot filled again: whenever ready() says true, the bytes are the new unit's */
        const hunit *X = round % 2 ? &A : &B;
        CK(h.fill(h.ctx, &X->r, 1, &err));
        CHECKF(poll_ready(&h, 1), "round %d: slot 1 never ready after a refill", round);
        check_slot(&h, 1, &X->r, "refill of a landed slot");
        /* neighbours filled in between do not make slot 2's older fill count */
        CK(h.fill(h.ctx, &A.r, 2, &err));
        CK(h.fill(h.ctx, &C.r, 3, &err));
        CK(h.fill(h.ctx, &B.r, 2, &err));
        CHECKF(poll_ready(&h, 3), "round %d: slot 3 never ready", round);
        check_slot(&h, 3, &C.r, "small fill behind a big one");
        CHECKF(poll_ready(&h, 2), "round %d: slot 2 never ready", round);
        check_slot(&h, 2, &B.r, "latest of two fills around a neighbour");
    }
    printf("refill: ready() false right after an 18 MB fill in %d of 4 rounds\n", early);
    CK(hm_vram_tier_wait(t, &err));
    hm_vram_tier_close(t);
    hunit_free(&A), hunit_free(&B), hunit_free(&C);
}

/* Close while fills are queued and copying: no hang, no device or pinned memory left behind. */
static void test_async_close(void) {
    const uint64_t b[HM_UNIT_NPART] = {2000000, 2000000, 2000000, 0};
    hunit A;
    hunit_make(&A, 0, 0, b);
    size_t free0 = 0, total = 0;
    CK(hm_cuda_mem_info(ctx, &free0, &total, &err));
    double t0 = now_s();
    for (int round = 0; round < 5; round++) {
        hm_vram_tier *t = NULL;
        hm_vram_tier_opts o = {.n_slots = 64, .slot_bytes = 3 * r256(2000000), .max_queued = 512};
        CK(hm_vram_tier_open(&t, ctx, &o, &err));
        hm_tier h;
        hm_vram_tier_as_hot(t, &h);
        for (int i = 0; i < 400; i++) CK(h.fill(h.ctx, &A.r, i % 64, &err)); /* 2.4 GB queued */
        hm_vram_tier_stats st;
        hm_vram_tier_get_stats(t, &st);
        if (round == 0) printf("close: %llu of 400 fills still queued at close\n", (unsigned long long)st.queued);
        hm_vram_tier_close(t);
    }
    printf("close: 5 pools closed with fills queued in %.3f s\n", now_s() - t0);
    size_t free1 = 0;
    CK(hm_cuda_mem_info(ctx, &free1, &total, &err));
    CHECKF(free1 + (64u << 20) >= free0, "free %zu before, %zu after 5 closes with fills queued", free0, free1);
    hunit_free(&A);
}

/* ---- more slots than the device holds ---- */

static void test_degrade(void) {
    size_t free0 = 0, total = 0;
    CK(hm_cuda_mem_info(ctx, &free0, &total, &err));
    const uint64_t slot_bytes = 64ull << 20;
    int64_t want = (int64_t)(4 * (uint64_t)free0 / slot_bytes);
    hm_vram_tier *t = NULL;
    hm_vram_tier_opts o = {.n_slots = want, .slot_bytes = slot_bytes};
    double t0 = now_s();
    CK(hm_vram_tier_open(&t, ctx, &o, &err));
    int64_t n = hm_vram_tier_n_slots(t);
    printf("degrade: asked %lld slots of 64 MiB (%.1f GiB free), got %lld (%.1f GiB) in %.2f s\n", (long long)want,
           (double)free0 / (1 << 30), (long long)n, (double)hm_vram_tier_bytes(t) / (1 << 30), now_s() - t0);
    CHECK(n > 0 && n < want);
    CHECK(hm_vram_tier_bytes(t) <= free0);
    hm_tier h;
    hm_vram_tier_as_hot(t, &h);
    /* larger than one default staging buffer (16 MiB) */
    const uint64_t b1[HM_UNIT_NPART] = {9000001, 9000001, 9000001, 0};
    const uint64_t b2[HM_UNIT_NPART] = {0, 0, 12345, 23456};
    hunit u1, u2;
    hunit_make(&u1, 0, 0, b1);
    hunit_make(&u2, 0, 1, b2);
    int32_t s_first = 0, s_mid = (int32_t)(n / 2), s_last = (int32_t)(n - 1);
    CK(h.fill(h.ctx, &u1.r, s_last, &err));
    CK(h.fill(h.ctx, &u2.r, s_mid, &err));
    CK(h.fill(h.ctx, &u1.r, s_first, &err));
    CHECK(h.fill(h.ctx, &u2.r, (int32_t)n, &err) == HM_ERR_ARG);
    CK(hm_vram_tier_wait(t, &err));
    check_slot(&h, s_last, &u1.r, "last slot of a degraded pool");
    check_slot(&h, s_mid, &u2.r, "middle slot of a degraded pool");
    check_slot(&h, s_first, &u1.r, "first slot of a degraded pool");
    hm_vram_tier_close(t);
    size_t free1 = 0;
    CK(hm_cuda_mem_info(ctx, &free1, &total, &err));
    CHECKF(free1 + (256u << 20) >= free0, "free %zu before, %zu after close", free0, free1);
    hunit_free(&u1), hunit_free(&u2);
}

/* ---- end to end through the expert store, on a GGUF written here ---- */

typedef struct tdesc {
    const char *name;
    uint32_t n_dims;
    int64_t ne[3];
} tdesc;

static int write_model(const char *path) {
    /* f32; 8 experts; slabs of 300 * 37 * 4 = 44400 bytes (not a multiple of 256) */
    const tdesc t[] = {
        {"token_embd.weight", 2, {16, 10, 1}},
        {"blk.0.ffn_gate_inp.weight", 2, {300, 8, 1}},
        {"blk.0.ffn_gate_exps.weight", 3, {300, 37, 8}},
        {"blk.0.ffn_up_exps.weight", 3, {300, 37, 8}},
        {"blk.0.ffn_down_exps.weight", 3, {37, 300, 8}},
        {"blk.1.attn_q.weight", 2, {16, 16, 1}},
        {"blk.2.ffn_gate_inp.weight", 2, {300, 8, 1}},
        {"blk.2.ffn_gate_up_exps.weight", 3, {300, 74, 8}},
        {"blk.2.ffn_down_exps.weight", 3, {37, 300, 8}},
    };
    const int n = (int)(sizeof t / sizeof t[0]);
    hm_gguf_writer *w = NULL;
    hm_status st = hm_gguf_writer_open(&w, path, 0, &err);
    if (!st) st = hm_gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    if (!st) st = hm_gguf_writer_set_u32(w, "qwen3moe.block_count", 3);
    if (!st) st = hm_gguf_writer_set_u32(w, "qwen3moe.expert_count", 8);
    if (!st) st = hm_gguf_writer_set_u32(w, "qwen3moe.expert_used_count", 2);
    for (int i = 0; !st && i < n; i++) st = hm_gguf_writer_add_tensor(w, t[i].name, HM_TYPE_F32, t[i].n_dims, t[i].ne);
    if (!st) st = hm_gguf_writer_begin_data(w);
    float buf[4096];
    for (int i = 0; !st && i < n; i++) {
        int64_t left = 1;
        for (uint32_t d = 0; d < t[i].n_dims; d++) left *= t[i].ne[d];
        while (!st && left > 0) {
            int64_t k = left < 4096 ? left : 4096;
            for (int64_t j = 0; j < k; j++) buf[j] = (float)((double)(rnd() >> 11) / 9007199254740992.0 - 0.5);
            st = hm_gguf_writer_write(w, buf, (size_t)k * sizeof(float));
            left -= k;
        }
    }
    if (!st) st = hm_gguf_writer_finish(w);
    else hm_gguf_writer_abort(w);
    CHECKF(st == HM_OK, "writing %s: %s", path, err.msg);
    return st == HM_OK;
}

/* Every HOT unit's parts equal the file's bytes; RAM units point into the mapping. Returns the
 * number of HOT units. */
static int64_t check_store(const hm_experts *s, const hm_units *units, const char *what) {
    int64_t n_hot = 0;
    for (int32_t l = 0; l < units->n_layer; l++) {
        const hm_units_layer *L = &units->layers[l];
        for (int32_t e = 0; e < L->n_expert; e++) {
            hm_unit_loc loc;
            hm_experts_where(s, l, e, &loc);
            for (int p = 0; p < HM_UNIT_NPART; p++) {
                const char *file = L->part[p] ? (const char *)L->part[p]->data + (size_t)e * L->slab_bytes[p] : NULL;
                if (!file) {
                    CHECKF(loc.data[p] == NULL, "%s: unit (%d, %d) part %d should be absent", what, l, e, p);
                    continue;
                }
                if (loc.tier != HM_TIER_HOT) {
                    CHECKF(loc.data[p] == file, "%s: RAM unit (%d, %d) part %d not the mapping", what, l, e, p);
                    continue;
                }
                CHECKF(loc.data[p] && (uintptr_t)loc.data[p] % 256 == 0, "%s: unit (%d, %d) part %d at %p", what, l,
                       e, p, loc.data[p]);
                if (!loc.data[p]) continue;
                void *got = xmalloc(L->slab_bytes[p]);
                CK(hm_cuda_download(ctx, got, loc.data[p], L->slab_bytes[p], &err));
                CHECKF(memcmp(got, file, L->slab_bytes[p]) == 0, "%s: HOT unit (%d, %d) part %d differs from the file",
                       what, l, e, p);
                free(got);
            }
            n_hot += loc.tier == HM_TIER_HOT;
        }
    }
    return n_hot;
}

/* Land fills as the engine does, between steps, without hm_vram_tier_wait: until a fill is
 * ready() its unit is RAM; every landed unit must already be exact. Up to 10 s. */
static void land_all(hm_experts *s) {
    const hm_units *un = hm_experts_units(s);
    for (double t0 = now_s(); now_s() - t0 < 10;) {
        hm_experts_land(s);
        int filling = 0;
        for (int32_t l = 0; l < un->n_layer; l++)
            for (int32_t e = 0; e < un->layers[l].n_expert; e++) filling += hm_experts_unit(s, l, e)->filling;
        if (!filling) return;
        check_store(s, un, "while filling"); /* landed ones exact, the rest RAM */
        usleep(100);
    }
    CHECKF(0, "fills did not land in 10 s");
}

static void test_store(void) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/hm_test_cuda_tier.%d.gguf", (int)getpid());
    if (!write_model(path)) return;
    hm_gguf *g = NULL;
    hm_units units;
    memset(&units, 0, sizeof units);
    CK(hm_gguf_open(&g, path, &err));
    CK(hm_units_init(&units, g, &err));
    CHECK(units.n_units == 16);
    uint64_t slot_bytes = hm_vram_tier_slot_bytes(&units);
    CHECK(slot_bytes == 3 * r256(44400)); /* layer 0; layer 2 is r256(88800) + r256(44400) */

    hm_vram_tier *t = NULL;
    hm_vram_tier_opts o = {.n_slots = 10, .slot_bytes = slot_bytes, .staging_bytes = 3 * 40000, .n_staging = 3};
    CK(hm_vram_tier_open(&t, ctx, &o, &err));
    hm_tier hot;
    hm_vram_tier_as_hot(t, &hot);

    hm_profile prof;
    CK(hm_profile_init(&prof, 3, 8, &err));
    for (int32_t e = 0; e < 8; e++) { /* top 10: experts 3..7 of layers 0 and 2 */
        prof.counts[0 * 8 + e] = 100 + 3 * (uint64_t)e;
        prof.counts[2 * 8 + e] = 101 + 3 * (uint64_t)e;
    }
    hm_experts_opts eo;
    hm_experts_opts_default(&eo);
    eo.hot_slots = hm_vram_tier_n_slots(t);
    eo.policy.kind = HM_POLICY_STATIC;
    eo.profile = &prof;
    eo.hot_tier = &hot;
    hm_experts *s = NULL;
    CK(hm_experts_open(&s, &units, &eo, &err));
    hm_profile_free(&prof);
    CK(hm_vram_tier_wait(t, &err));
    hm_experts_land(s);
    hm_experts_stats es;
    hm_experts_get_stats(s, &es);
    CHECK(es.n_slots == 10 && es.n_used == 10);
    CHECK(check_store(s, &units, "static") == 10);
    for (int32_t e = 3; e < 8; e++)
        CHECK(hm_experts_unit(s, 0, e)->home == HM_TIER_HOT && hm_experts_unit(s, 2, e)->home == HM_TIER_HOT);

    /* lru: experts 0..2 of both layers are routed, admitted into slots of evicted units */
    CK(hm_experts_set_policy(s, HM_POLICY_LRU, NULL, &err));
    const int32_t ids[3] = {0, 1, 2};
    hm_experts_record(s, 0, ids, 3);
    hm_experts_record(s, 2, ids, 3);
    CK(hm_experts_step_end(s, 1, false, &err));
    land_all(s); /* no wait: the store lands each fill when ready() says so */
    hm_experts_get_stats(s, &es);
    CHECK(es.swaps_in == 16 && es.swaps_out == 6 && es.n_used == 10);
    CHECK(check_store(s, &units, "lru") == 10);
    for (int32_t e = 0; e < 3; e++)
        CHECK(hm_experts_unit(s, 0, e)->home == HM_TIER_HOT && hm_experts_unit(s, 2, e)->home == HM_TIER_HOT);
    hm_vram_tier_stats ts;
    hm_vram_tier_get_stats(t, &ts);
    CHECK(ts.fills == 16);

    /* an lru step queues fills; at once the pool empties (policy none evicts units still filling)
     * and static re-places into the same slots: the slots' older fills must never land instead */
    const int32_t ids2[3] = {3, 4, 5};
    hm_experts_record(s, 0, ids2, 3);
    hm_experts_record(s, 2, ids2, 3);
    CK(hm_experts_step_end(s, 1, false, &err));
    CK(hm_experts_set_policy(s, HM_POLICY_NONE, NULL, &err));
    CK(hm_experts_set_policy(s, HM_POLICY_STATIC, NULL, &err));
    land_all(s);
    hm_experts_get_stats(s, &es);
    CHECK(es.n_used == 10);
    CHECK(check_store(s, &units, "static after a cancelled lru step") == 10);
    for (int32_t e = 3; e < 8; e++)
        CHECK(hm_experts_unit(s, 0, e)->home == HM_TIER_HOT && hm_experts_unit(s, 2, e)->home == HM_TIER_HOT);
    hm_vram_tier_get_stats(t, &ts);
    printf("store: %llu fills, %llu dropped as overtaken\n", (unsigned long long)ts.fills,
           (unsigned long long)ts.skipped);
    CK(hm_vram_tier_wait(t, &err));

    hm_experts_close(s);
    hm_vram_tier_close(t);
    hm_units_free(&units);
    hm_gguf_close(g);
    unlink(path);
}

/* ---- direct copies from a registered read-only file mapping ---- */

/* A file of n random bytes, mapped read-only and shared (registrable, unlike a private mapping). */
static const char *map_random_file(const char *path, size_t n) {
    char *tmp = xmalloc(n);
    fill_random(tmp, n);
    FILE *f = fopen(path, "wb");
    CHECKF(f && fwrite(tmp, 1, n, f) == n && fclose(f) == 0, "writing %s", path);
    free(tmp);
    int fd = open(path, O_RDONLY);
    CHECKF(fd >= 0, "opening %s", path);
    void *p = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    CHECKF(p != MAP_FAILED, "mapping %s", path);
    return p == MAP_FAILED ? NULL : p;
}

static void test_direct(void) {
    const size_t n = 48u << 20; /* 15 parts of 3 MiB and their gaps */
    char path[] = "/tmp/hm_tier_direct_XXXXXX";
    int fd = mkstemp(path);
    CHECKF(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);
    const char *map = map_random_file(path, n);
    if (!map) return;
    /* the registered span starts and ends off page boundaries (the experts' span in a model) */
    const size_t lo = 1000, len = n - 5000;
    CK(hm_cuda_host_register(ctx, map + lo, len, &err));
    const uint64_t pb = 3u << 20;
    hm_vram_tier *t = NULL;
    hm_vram_tier_opts o = {.n_slots = 4, .slot_bytes = 3 * pb, .staging_bytes = 1u << 20, .n_staging = 2,
                           .direct = map + lo, .direct_bytes = len};
    CK(hm_vram_tier_open(&t, ctx, &o, &err));
    hm_tier h;
    hm_vram_tier_as_hot(t, &h);
    /* units of the mapping: 3 parts at odd offsets; the last one ends at the span's last byte */
    hm_unit_ref in[5];
    for (int i = 0; i < 5; i++) {
        memset(&in[i], 0, sizeof in[i]);
        in[i].layer = 1, in[i].expert = i;
        const uint64_t part = i == 4 ? pb - 3 : pb - (uint64_t)i * 4097;
        for (int p = 0; p < 3; p++) {
            in[i].src[p] = map + lo + 7 + (uint64_t)(i * 3 + p) * (pb + 11);
            in[i].part_bytes[p] = part;
            in[i].bytes += part;
        }
    }
    in[4].src[2] = map + lo + len - in[4].part_bytes[2];
    /* a unit with its down part on the heap: outside the span, staged */
    hunit mixed;
    const uint64_t mb[HM_UNIT_NPART] = {0, 0, pb / 2, 0};
    hunit_make(&mixed, 2, 0, mb);
    mixed.r.src[HM_UNIT_GATE] = map + lo + 3 * pb, mixed.r.part_bytes[HM_UNIT_GATE] = pb / 3;
    mixed.r.bytes += pb / 3;
    /* and one that starts a byte before the span */
    hm_unit_ref edge = in[0];
    edge.expert = 9, edge.src[HM_UNIT_GATE] = map + lo - 1;
    for (int s = 0; s < 4; s++) CK(h.fill(h.ctx, &in[s], s, &err));
    CK(hm_vram_tier_wait(t, &err));
    for (int s = 0; s < 4; s++) {
        CHECKF(h.ready(h.ctx, s), "direct: slot %d not ready after wait", s);
        check_slot(&h, s, &in[s], "direct");
    }
    CK(h.fill(h.ctx, &mixed.r, 1, &err));
    CK(h.fill(h.ctx, &edge, 2, &err));
    CK(h.fill(h.ctx, &in[4], 3, &err));
    CK(h.fill(h.ctx, &in[1], 0, &err));
    CK(hm_vram_tier_wait(t, &err));
    for (int s = 0; s < 4; s++) CHECKF(h.ready(h.ctx, s), "direct refills: slot %d not ready after wait", s);
    check_slot(&h, 0, &in[1], "direct refill");
    check_slot(&h, 1, &mixed.r, "a part outside the span (staged)");
    check_slot(&h, 2, &edge, "a part a byte before the span (staged)");
    check_slot(&h, 3, &in[4], "the span's last byte");
    hm_vram_tier_stats ts;
    hm_vram_tier_get_stats(t, &ts);
    CHECKF(ts.fills == 8 && ts.direct == 6, "direct: %llu fills, %llu direct (want 8, 6)", (unsigned long long)ts.fills,
           (unsigned long long)ts.direct);
    hm_vram_tier_close(t);
    hm_cuda_host_unregister(ctx, map + lo);
    hunit_free(&mixed);
    /* a range whose second half is not mapped: refused, nothing stays registered */
    munmap((void *)(map + n / 2), n - n / 2);
    hm_status st = hm_cuda_host_register(ctx, map, n, &err);
    CHECKF(st == HM_ERR_NOMEM && strstr(err.msg, "cudaHostRegister"), "registering a half-unmapped range: %d (%s)",
           (int)st, err.msg);
    CK(hm_cuda_host_register(ctx, map, n / 2, &err)); /* the mapped half still can be: none was left */
    hm_cuda_host_unregister(ctx, map);
    munmap((void *)map, n / 2);
    unlink(path);
}

/* ---- fill bandwidth (a print, not a check) ---- */

static void bench_fill(void) {
    const uint64_t part = 589824; /* a Qwen3-30B-A3B Q4_K gate slab */
    const uint64_t b[HM_UNIT_NPART] = {part, part, part, 0};
    const int n_units = 160;      /* 270 MiB */
    char *src = xmalloc((size_t)(n_units * 3 * part));
    memset(src, 0x5a, (size_t)(n_units * 3 * part)); /* pageable, touched */
    hm_unit_ref r = {0};
    for (int p = 0; p < 3; p++) r.part_bytes[p] = b[p];
    hm_vram_tier *t = NULL;
    hm_vram_tier_opts o = {.n_slots = n_units, .slot_bytes = 3 * part}; /* part is a multiple of 256 */
    hm_tier h;
    double t0, dt;
    /* staged: the memcpy into the pinned ring by 1 thread, the default (0: 4) and 8 */
    const int threads[] = {1, 0, 8};
    for (int k = 0; k < 3; k++) {
        o.copy_threads = threads[k];
        CK(hm_vram_tier_open(&t, ctx, &o, &err));
        hm_vram_tier_as_hot(t, &h);
        t0 = now_s();
        for (int i = 0; i < n_units; i++) {
            for (int p = 0; p < 3; p++) r.src[p] = src + ((size_t)i * 3 + (size_t)p) * part;
            CK(h.fill(h.ctx, &r, i, &err));
        }
        CK(hm_vram_tier_wait(t, &err));
        dt = now_s() - t0;
        hm_vram_tier_stats st;
        hm_vram_tier_get_stats(t, &st);
        printf("fill, staged by %d thread%s: %d units of %.2f MB in %.3f s: %.2f GB/s (engine time in fill %.3f s, "
               "copier %.3f s)\n", threads[k] ? threads[k] : 4, threads[k] == 1 ? "" : "s", n_units,
               (double)(3 * part) / 1e6, dt, (double)st.fill_bytes / dt / 1e9, st.fill_seconds, st.copy_seconds);
        hm_vram_tier_close(t);
    }
    o.copy_threads = 0;
    free(src);
    /* the same from a registered file mapping (--mlock): one DMA per part */
    char path[] = "/tmp/hm_tier_bench_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    close(fd);
    const size_t n = (size_t)n_units * 3 * part;
    const char *map = map_random_file(path, n);
    if (!map) return;
    double tr = now_s();
    CK(hm_cuda_host_register(ctx, map, n, &err));
    tr = now_s() - tr;
    o.direct = map, o.direct_bytes = n;
    CK(hm_vram_tier_open(&t, ctx, &o, &err));
    hm_vram_tier_as_hot(t, &h);
    t0 = now_s();
    for (int i = 0; i < n_units; i++) {
        for (int p = 0; p < 3; p++) r.src[p] = map + ((size_t)i * 3 + (size_t)p) * part;
        CK(h.fill(h.ctx, &r, i, &err));
    }
    CK(hm_vram_tier_wait(t, &err));
    dt = now_s() - t0;
    printf("fill from a registered file mapping: %.2f GB/s, %.1f us per MiB (registering %.0f MiB took %.3f s)\n",
           (double)n / dt / 1e9, dt * 1e6 / ((double)n / 1048576.0), (double)n / 1048576.0, tr);
    hm_vram_tier_close(t);
    hm_cuda_host_unregister(ctx, map);
    munmap((void *)map, n);
    unlink(path);
}

int main(void) {
    test_slot_bytes();
    int rc = cuda_test_open("the host slot-size check passed");
    if (rc >= 0) return rc;
    test_basic();
    test_options();
    test_ring("ring", 1, 0);
    test_ring("ring x8, 3 staging threads", 8, 3);
    test_ring("ring x8, 1 staging thread", 8, 1);
    test_async_many();
    test_async_refill();
    test_async_close();
    test_store();
    test_degrade();
    test_direct();
    if (!getenv("HM_NO_BENCH")) bench_fill();
    hm_cuda_close(ctx);
    return test_done();
}
