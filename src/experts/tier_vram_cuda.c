/* tier_vram_cuda.c - the VRAM expert slot pool (tier_vram.h): slots in device memory, filled by a
 * copier thread through a ring of pinned staging buffers on the context's upload stream.
 *
 * fill() (engine thread) checks the request, gives the slot a new sequence number (want[slot]),
 * sets part[slot] to the new unit's pointers and appends the request to a bounded FIFO; it blocks
 * only while the FIFO is full. The copier takes requests in order. One whose slot has been asked
 * for again since (seq != want[slot]) is dropped uncopied: a later request overwrites the slot
 * anyway. For the others it lays the unit out as one byte image (present parts back to back in
 * part order, each at a multiple of 256) and streams it through the ring: memcpy a piece from the
 * mapping into the current buffer, queue the async copy of the piece into the slot, record the
 * buffer's event; the next piece goes on in the same buffer or the next one, so the memcpy of one
 * piece overlaps the DMA of the previous ones. Before the copier writes into a buffer again after
 * the ring wrapped, it waits for that buffer's event. After the last piece it records the slot's
 * event and publishes have[slot] = seq. ready(slot) = have[slot] == want[slot] and that event ran.
 * A unit inside the registered host range the options name (o->direct: page-locked already) skips
 * the ring: one async copy per part straight from the mapping, then the slot's event. The memcpy
 * of a large piece is split over a small fork-join pool the copier drives (o->copy_threads): one
 * thread's memcpy from the mapping into pinned memory runs at ~5 GB/s, a DMA at ~50.
 *
 * Ownership between the two threads: the engine thread alone writes part[], stats.fills/bytes and
 * want[] (want under mu); the copier alone touches buf[], buf_ev[], cur/used and records events,
 * and writes have[], the sticky error and copy_seconds under mu. The engine queries or waits on a
 * slot event only when have == want for that slot (the copier is done with it until the engine
 * itself fills the slot again) or when the FIFO is drained and the copier idle (wait, close).
 *
 * Invariants: every buffer region the copier writes is either never queued or behind an event it
 * waited for; slot_ev[s] is recorded after the last piece of the fill have[s] names; requests of
 * one slot are copied in the order of their sequence numbers (one FIFO, one in-order stream), so
 * the slot ends with the bytes of its latest request. After a copy failure (a sticky error) the
 * copier copies nothing more, drains the FIFO, and fill / wait report the error; the slots it did
 * not finish never become ready, so the store keeps computing those units from RAM. */
#include "experts/tier_vram.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "core/timer.h"

#define TIER_ALIGN 256u
#define CHUNK_SLOTS 64
#define CHUNK_BYTES (1ull << 30)
#define DEFAULT_STAGING (64ull << 20)
#define DEFAULT_N_STAGING 4
#define DEFAULT_QUEUE 1024
/* A piece smaller than this (and than what is left of the unit) moves to the next buffer first:
 * the tail of a nearly full buffer is not worth a copy of its own. */
#define MIN_PIECE (64u << 10)
#define DEFAULT_COPY_THREADS 4
/* A piece is staged by several threads only when each gets at least this much. */
#define MIN_SLICE (128u << 10)

/* One fill waiting for the copier: the unit (pointers into the mapping, valid for the model's
 * life), its image layout, the slot and the slot's sequence number at fill time. */
typedef struct fill_req {
    hm_unit_ref u;
    uint64_t off[HM_UNIT_NPART];
    uint64_t len;
    int32_t slot;
    uint64_t seq;
} fill_req;

struct hm_vram_tier {
    hm_cuda_ctx *c;                         /* borrowed */
    uint64_t slot_bytes;                    /* as asked: the largest unit image a slot takes */
    uint64_t stride;                        /* slot_bytes rounded up to 256 */
    int64_t n_slots;                        /* allocated */
    int64_t per_chunk;                      /* slots per chunk (the last chunk may hold fewer) */
    int64_t n_chunks;
    void **chunk;                           /* [n_chunks] device memory, owned */
    hm_cuda_event **slot_ev;                /* [n_slots] owned */
    const void *(*part)[HM_UNIT_NPART];     /* [n_slots] device pointers of the latest fill */
    uint64_t *want;                         /* [n_slots] seq of the latest fill (engine, under mu) */
    uint64_t *have;                         /* [n_slots] seq of the latest copy issued (copier, under mu) */
    int64_t cap;                            /* capacity of slot_ev, part, want, have */
    /* copier-owned staging ring */
    int n_staging;
    size_t buf_bytes;                       /* bytes of one staging buffer */
    void **buf;                             /* [n_staging] pinned, owned */
    hm_cuda_event **buf_ev;                 /* [n_staging] owned */
    hm_pool *stagers;                       /* the copier + helpers that memcpy a piece; NULL = alone */
    const char *direct;                     /* registered host range (opts), NULL = none */
    uint64_t direct_bytes;
    int cur;                                /* buffer being written */
    size_t used;                            /* bytes of buf[cur] already handed to copies */
    /* the FIFO and its thread; everything below is under mu */
    pthread_mutex_t mu;
    pthread_cond_t work;                    /* signalled: a request arrived, or stop */
    pthread_cond_t done;                    /* broadcast: the copier finished a request */
    bool sync_ok, thread_ok, stop;
    fill_req *q;                            /* [q_cap] ring: q[head % q_cap] .. q[(tail - 1) % q_cap] */
    uint64_t q_cap, head, tail;             /* head: taken by the copier and finished */
    hm_status failed;                       /* sticky copy error */
    hm_err fail_err;
    pthread_t thread;
    hm_vram_tier_stats stats;               /* fills, fill_bytes, fill_seconds: engine; the rest under mu */
};

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t hm_vram_tier_slot_bytes(const hm_units *u) {
    uint64_t best = 0;
    for (int32_t l = 0; l < u->n_layer; l++) {
        const hm_units_layer *L = &u->layers[l];
        if (L->n_expert <= 0) continue;
        uint64_t b = 0;
        for (int p = 0; p < HM_UNIT_NPART; p++)
            if (L->slab_bytes[p]) b += round_up(L->slab_bytes[p], TIER_ALIGN);
        if (!b) b = round_up(L->unit_bytes, TIER_ALIGN); /* a geometry-only table: no parts */
        if (b > best) best = b;
    }
    return best;
}

static char *slot_base(const hm_vram_tier *t, int64_t slot) {
    return (char *)t->chunk[slot / t->per_chunk] + (uint64_t)(slot % t->per_chunk) * t->stride;
}

/* Grow the per-slot arrays to hold at least n slots (before the copier exists). */
static hm_status grow(hm_vram_tier *t, int64_t n, hm_err *err) {
    if (n <= t->cap) return HM_OK;
    int64_t cap = t->cap ? t->cap : 64;
    while (cap < n) cap *= 2;
    size_t nc = (size_t)cap;
    hm_cuda_event **ev = realloc(t->slot_ev, nc * sizeof *ev);
    if (ev) t->slot_ev = ev;
    const void *(*pt)[HM_UNIT_NPART] = ev ? realloc(t->part, nc * sizeof *pt) : NULL;
    if (pt) t->part = pt;
    uint64_t *w = pt ? realloc(t->want, nc * sizeof *w) : NULL;
    if (w) t->want = w;
    uint64_t *h = w ? realloc(t->have, nc * sizeof *h) : NULL;
    if (!h) return hm_errf(err, HM_ERR_NOMEM, "vram tier: out of host memory for %" PRId64 " slots", cap);
    t->have = h;
    t->cap = cap;
    return HM_OK;
}

/* Allocate slots in chunks until n_want or the first out-of-memory of the device. */
static hm_status alloc_slots(hm_vram_tier *t, int64_t n_want, hm_err *err) {
    t->per_chunk = (int64_t)(CHUNK_BYTES / t->stride);
    if (t->per_chunk > CHUNK_SLOTS) t->per_chunk = CHUNK_SLOTS;
    if (t->per_chunk < 1) t->per_chunk = 1;
    int64_t max_chunks = (n_want + t->per_chunk - 1) / t->per_chunk;
    if (!(t->chunk = calloc((size_t)(max_chunks ? max_chunks : 1), sizeof *t->chunk)))
        return hm_errf(err, HM_ERR_NOMEM, "vram tier: out of host memory for %" PRId64 " chunks", max_chunks);
    while (t->n_slots < n_want) {
        int64_t n = n_want - t->n_slots;
        if (n > t->per_chunk) n = t->per_chunk;
        size_t bytes = (size_t)((uint64_t)n * t->stride);
        void *d = NULL;
        hm_err aerr = {{0}};
        hm_status st = hm_cuda_alloc(t->c, bytes, &d, &aerr);
        if (st == HM_ERR_NOMEM) break; /* the device is full: the pool is what fitted */
        if (st) return hm_errf(err, st, "vram tier: slots %" PRId64 "..%" PRId64 ": %s", t->n_slots,
                               t->n_slots + n - 1, aerr.msg);
        t->chunk[t->n_chunks++] = d;
        if ((st = grow(t, t->n_slots + n, err)) != HM_OK) return st;
        for (int64_t i = 0; i < n; i++) {
            int64_t s = t->n_slots;
            if ((st = hm_cuda_event_create(t->c, &t->slot_ev[s], &aerr)) != HM_OK)
                return hm_errf(err, st, "vram tier: event of slot %" PRId64 ": %s", s, aerr.msg);
            memset(t->part[s], 0, sizeof t->part[s]);
            t->want[s] = t->have[s] = 0;
            t->n_slots++;
        }
    }
    return HM_OK;
}

/* ---- the copier ---- */

/* Copy bytes [a, a + n) of u's image into dst (the padding between parts is left as it was). */
static void stage(const hm_unit_ref *u, const uint64_t off[HM_UNIT_NPART], uint64_t a, size_t n, char *dst) {
    uint64_t b = a + n;
    for (int p = 0; p < HM_UNIT_NPART; p++) {
        if (off[p] == UINT64_MAX) continue;
        uint64_t lo = off[p] > a ? off[p] : a, hi = off[p] + u->part_bytes[p];
        if (hi > b) hi = b;
        if (lo < hi) memcpy(dst + (lo - a), (const char *)u->src[p] + (lo - off[p]), (size_t)(hi - lo));
    }
}

/* One piece staged by the pool: thread ith of nth copies its slice of [a, a + n), cut at 64 bytes. */
typedef struct stage_job {
    const hm_unit_ref *u;
    const uint64_t *off;
    uint64_t a;
    size_t n;
    char *dst;
} stage_job;

static void stage_slice(void *ctx, int ith, int nth) {
    const stage_job *j = ctx;
    const uint64_t lo = ith == 0 ? 0 : (uint64_t)j->n * (uint64_t)ith / (uint64_t)nth / 64 * 64;
    const uint64_t hi = ith == nth - 1 ? j->n : (uint64_t)j->n * (uint64_t)(ith + 1) / (uint64_t)nth / 64 * 64;
    if (lo < hi) stage(j->u, j->off, j->a + lo, (size_t)(hi - lo), j->dst + lo);
}

/* Stage bytes [a, a + n) of u's image into dst, on the pool when the piece is worth splitting. */
static void stage_piece(hm_vram_tier *t, const hm_unit_ref *u, const uint64_t off[HM_UNIT_NPART], uint64_t a,
                        size_t n, char *dst) {
    if (!t->stagers || n < 2 * (size_t)MIN_SLICE) {
        stage(u, off, a, n, dst);
        return;
    }
    stage_job j = {u, off, a, n, dst};
    hm_pool_run(t->stagers, stage_slice, &j);
}

/* Make buf[cur] the next buffer of the ring, once the copies reading it have run. */
static hm_status next_buffer(hm_vram_tier *t, hm_err *err) {
    int next = (t->cur + 1) % t->n_staging;
    hm_status st = hm_cuda_event_wait(t->buf_ev[next], err);
    if (st) return st;
    t->cur = next;
    t->used = 0;
    return HM_OK;
}

/* Whether every present part of u lies in the registered host range. */
static bool in_direct(const hm_vram_tier *t, const hm_unit_ref *u, const uint64_t off[HM_UNIT_NPART]) {
    if (!t->direct) return false;
    for (int p = 0; p < HM_UNIT_NPART; p++) {
        if (off[p] == UINT64_MAX) continue;
        const char *s = (const char *)u->src[p];
        if (s < t->direct || u->part_bytes[p] > t->direct_bytes || (uint64_t)(s - t->direct) > t->direct_bytes - u->part_bytes[p])
            return false;
    }
    return true;
}

/* Copy r's image into its slot (straight from registered memory, else through the ring) and
 * record the slot's event. */
static hm_status copy_unit(hm_vram_tier *t, const fill_req *r, bool *direct_out, hm_err *err) {
    char *dst = slot_base(t, r->slot);
    hm_status st = HM_OK;
    const bool direct = *direct_out = in_direct(t, &r->u, r->off);
    for (int p = 0; direct && p < HM_UNIT_NPART && !st; p++)
        if (r->off[p] != UINT64_MAX) st = hm_cuda_upload_async(t->c, dst + r->off[p], r->u.src[p], r->u.part_bytes[p], err);
    for (uint64_t done = 0; !direct && done < r->len;) {
        uint64_t left = r->len - done;
        size_t room = t->buf_bytes - t->used;
        if (room < left && room < MIN_PIECE && t->used > 0 && (st = next_buffer(t, err)) != HM_OK) break;
        room = t->buf_bytes - t->used;
        size_t n = left < room ? (size_t)left : room;
        char *b = (char *)t->buf[t->cur] + t->used;
        stage_piece(t, &r->u, r->off, done, n, b);
        if ((st = hm_cuda_upload_async(t->c, dst + done, b, n, err)) != HM_OK) break;
        if ((st = hm_cuda_event_record(t->c, t->buf_ev[t->cur], true, err)) != HM_OK) break;
        t->used = (size_t)round_up(t->used + n, TIER_ALIGN);
        if (t->used > t->buf_bytes) t->used = t->buf_bytes;
        done += n;
    }
    if (!st) st = hm_cuda_event_record(t->c, t->slot_ev[r->slot], true, err);
    if (st) {
        hm_err what;
        snprintf(what.msg, sizeof what.msg, "%s", err->msg);
        return hm_errf(err, st, "vram tier: filling slot %d with unit (%d, %d) (%" PRIu64 " bytes): %s", r->slot,
                       r->u.layer, r->u.expert, r->len, what.msg);
    }
    return HM_OK;
}

static void *copier_main(void *arg) {
    hm_vram_tier *t = arg;
    hm_err cerr = {{0}};
    /* CUDA's current device is per thread: this one must be the context's too (mem_info sets it) */
    size_t fr, tot;
    hm_status bind = hm_cuda_mem_info(t->c, &fr, &tot, &cerr);
    pthread_mutex_lock(&t->mu);
    if (bind && !t->failed) t->failed = bind, t->fail_err = cerr;
    for (;;) {
        while (t->head == t->tail && !t->stop) pthread_cond_wait(&t->work, &t->mu);
        if (t->stop) break; /* close: what is still queued is dropped */
        fill_req r = t->q[t->head % t->q_cap];
        bool skip = t->failed || r.seq != t->want[r.slot];
        pthread_mutex_unlock(&t->mu);
        hm_status st = HM_OK;
        bool direct = false;
        int64_t t0 = hm_time_us();
        if (!skip) st = copy_unit(t, &r, &direct, &cerr);
        double dt = (double)(hm_time_us() - t0) * 1e-6;
        pthread_mutex_lock(&t->mu);
        t->head++;
        t->stats.copy_seconds += dt;
        if (skip) {
            t->stats.skipped++;
        } else if (st == HM_OK) {
            t->have[r.slot] = r.seq;
            t->stats.direct += direct;
            if (!direct) t->stats.staged_bytes += r.len, t->stats.staged_seconds += dt;
        } else if (!t->failed) {
            t->failed = st, t->fail_err = cerr;
        }
        pthread_cond_broadcast(&t->done);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* ---- open / close / wait ---- */

hm_status hm_vram_tier_open(hm_vram_tier **out, hm_cuda_ctx *c, const hm_vram_tier_opts *o, hm_err *err) {
    *out = NULL;
    if (o->n_slots < 0 || o->n_staging < 0 || o->max_queued < 0 || (o->n_slots > 0 && o->slot_bytes == 0) ||
        o->copy_threads < 0 || o->copy_threads > 64)
        return hm_errf(err, HM_ERR_ARG, "vram tier: bad options (%" PRId64 " slots of %" PRIu64
                       " bytes, %d staging buffers, %d queued fills, %d copy threads)", o->n_slots, o->slot_bytes,
                       o->n_staging, o->max_queued, o->copy_threads);
    int n_staging = o->n_staging ? o->n_staging : DEFAULT_N_STAGING;
    size_t staging = o->staging_bytes ? o->staging_bytes : (size_t)DEFAULT_STAGING;
    size_t buf_bytes = staging / (size_t)n_staging / TIER_ALIGN * TIER_ALIGN;
    if (buf_bytes == 0)
        return hm_errf(err, HM_ERR_ARG, "vram tier: %zu staging bytes in %d buffers: under %u bytes each",
                       staging, n_staging, TIER_ALIGN);
    hm_vram_tier *t = calloc(1, sizeof *t);
    if (!t) return hm_errf(err, HM_ERR_NOMEM, "vram tier: out of host memory");
    hm_status st;
    t->c = c;
    t->slot_bytes = o->slot_bytes;
    t->stride = round_up(o->slot_bytes ? o->slot_bytes : 1, TIER_ALIGN);
    t->n_staging = n_staging;
    t->buf_bytes = buf_bytes;
    t->q_cap = (uint64_t)(o->max_queued ? o->max_queued : DEFAULT_QUEUE);
    t->direct = o->direct_bytes ? (const char *)o->direct : NULL;
    t->direct_bytes = o->direct_bytes;
    const int copy_threads = o->copy_threads > 0 ? o->copy_threads : DEFAULT_COPY_THREADS;
    if (copy_threads > 1 && o->n_slots > 0 && (st = hm_pool_open(&t->stagers, copy_threads, err)) != HM_OK) {
        hm_err what = *err;
        st = hm_errf(err, st, "vram tier: the staging threads: %s", what.msg);
        goto fail;
    }
    t->buf = calloc((size_t)n_staging, sizeof *t->buf);
    t->buf_ev = calloc((size_t)n_staging, sizeof *t->buf_ev);
    t->q = calloc((size_t)t->q_cap, sizeof *t->q);
    if (!t->buf || !t->buf_ev || !t->q) {
        st = hm_errf(err, HM_ERR_NOMEM, "vram tier: out of host memory");
        goto fail;
    }
    for (int i = 0; i < n_staging; i++) {
        if ((st = hm_cuda_host_alloc(c, buf_bytes, &t->buf[i], err)) != HM_OK) goto fail;
        if ((st = hm_cuda_event_create(c, &t->buf_ev[i], err)) != HM_OK) goto fail;
    }
    if ((st = alloc_slots(t, o->n_slots, err)) != HM_OK) goto fail;
    if (pthread_mutex_init(&t->mu, NULL)) {
        st = hm_errf(err, HM_ERR_NOMEM, "vram tier: cannot make a mutex");
        goto fail;
    }
    if (pthread_cond_init(&t->work, NULL)) {
        pthread_mutex_destroy(&t->mu);
        st = hm_errf(err, HM_ERR_NOMEM, "vram tier: cannot make a condition variable");
        goto fail;
    }
    if (pthread_cond_init(&t->done, NULL)) {
        pthread_cond_destroy(&t->work), pthread_mutex_destroy(&t->mu);
        st = hm_errf(err, HM_ERR_NOMEM, "vram tier: cannot make a condition variable");
        goto fail;
    }
    t->sync_ok = true;
    if (t->n_slots > 0) { /* an empty pool takes no fills: no copier */
        int e = pthread_create(&t->thread, NULL, copier_main, t);
        if (e) {
            st = hm_errf(err, HM_ERR_NOMEM, "vram tier: cannot start the copier thread (%s)", strerror(e));
            goto fail;
        }
        t->thread_ok = true;
    }
    *out = t;
    return HM_OK;
fail:
    hm_vram_tier_close(t);
    return st;
}

/* The sticky copy error as a status with a message (under mu). */
static hm_status failed_locked(const hm_vram_tier *t, hm_err *err) {
    return hm_errf(err, t->failed, "vram tier: a fill failed earlier: %s", t->fail_err.msg);
}

hm_status hm_vram_tier_wait(hm_vram_tier *t, hm_err *err) {
    hm_status st = HM_OK;
    if (t->sync_ok) {
        pthread_mutex_lock(&t->mu);
        while (t->head != t->tail) pthread_cond_wait(&t->done, &t->mu);
        if (t->failed) st = failed_locked(t, err);
        pthread_mutex_unlock(&t->mu);
        if (st) return st;
    }
    /* the copier is idle and only this thread can give it work: its events are ours to wait on */
    for (int i = 0; t->buf_ev && i < t->n_staging; i++)
        if (t->buf_ev[i] && (st = hm_cuda_event_wait(t->buf_ev[i], err)) != HM_OK) return st;
    for (int64_t s = 0; s < t->n_slots; s++)
        if ((st = hm_cuda_event_wait(t->slot_ev[s], err)) != HM_OK) return st;
    return HM_OK;
}

void hm_vram_tier_close(hm_vram_tier *t) {
    if (!t) return;
    if (t->thread_ok) { /* cancel what is queued, let the copier finish the unit it is on */
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_cond_signal(&t->work);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->thread, NULL);
        t->thread_ok = false;
        t->head = t->tail; /* dropped */
    }
    /* nothing may still read a buffer or write a slot when they are freed */
    for (int i = 0; t->buf_ev && i < t->n_staging; i++)
        if (t->buf_ev[i]) (void)hm_cuda_event_wait(t->buf_ev[i], NULL);
    for (int64_t s = 0; s < t->n_slots; s++) (void)hm_cuda_event_wait(t->slot_ev[s], NULL);
    if (t->sync_ok) pthread_cond_destroy(&t->done), pthread_cond_destroy(&t->work), pthread_mutex_destroy(&t->mu);
    for (int64_t s = 0; s < t->n_slots; s++) hm_cuda_event_destroy(t->slot_ev[s]);
    for (int64_t i = 0; i < t->n_chunks; i++) hm_cuda_free(t->c, t->chunk[i]);
    for (int i = 0; t->buf && i < t->n_staging; i++) hm_cuda_host_free(t->c, t->buf[i]);
    for (int i = 0; t->buf_ev && i < t->n_staging; i++) hm_cuda_event_destroy(t->buf_ev[i]);
    hm_pool_close(t->stagers);
    free(t->slot_ev), free(t->part), free(t->want), free(t->have), free(t->chunk), free(t->buf), free(t->buf_ev);
    free(t->q);
    free(t);
}

int64_t hm_vram_tier_n_slots(const hm_vram_tier *t) { return t->n_slots; }
int64_t hm_vram_tier_chunk_slots(const hm_vram_tier *t) { return t->per_chunk > 0 ? t->per_chunk : 1; }

int64_t hm_vram_tier_shrink(hm_vram_tier *t, int64_t keep_slots, hm_err *err) {
    if (keep_slots < 0)
        return hm_errf(err, HM_ERR_ARG, "vram tier: shrink to %" PRId64 " slots", keep_slots);
    const int64_t pc = hm_vram_tier_chunk_slots(t);
    int64_t keep_chunks = (keep_slots + pc - 1) / pc;
    if (keep_chunks >= t->n_chunks) return t->n_slots; /* nothing whole to give back */
    const int64_t n_new = keep_chunks * pc;             /* < n_slots: a whole chunk goes */
    /* the copier idle and every fill so far issued: nothing is queued for a slot about to go */
    if (t->sync_ok) {
        pthread_mutex_lock(&t->mu);
        while (t->head != t->tail) pthread_cond_wait(&t->done, &t->mu);
        pthread_mutex_unlock(&t->mu);
    }
    /* the copies into the freed slots have run (cudaFree would wait for the device anyway) */
    for (int64_t s = n_new; s < t->n_slots; s++) (void)hm_cuda_event_wait(t->slot_ev[s], NULL);
    for (int i = 0; t->buf_ev && i < t->n_staging; i++)
        if (t->buf_ev[i]) (void)hm_cuda_event_wait(t->buf_ev[i], NULL);
    if (t->sync_ok) pthread_mutex_lock(&t->mu); /* the copier reads chunk[] for the requests it takes */
    for (int64_t s = n_new; s < t->n_slots; s++) {
        hm_cuda_event_destroy(t->slot_ev[s]);
        t->slot_ev[s] = NULL;
        memset(t->part[s], 0, sizeof t->part[s]);
    }
    for (int64_t i = keep_chunks; i < t->n_chunks; i++) {
        hm_cuda_free(t->c, t->chunk[i]);
        t->chunk[i] = NULL;
    }
    t->n_chunks = keep_chunks;
    t->n_slots = n_new;
    if (t->sync_ok) pthread_mutex_unlock(&t->mu);
    return n_new;
}
uint64_t hm_vram_tier_bytes(const hm_vram_tier *t) { return (uint64_t)t->n_slots * t->stride; }

void hm_vram_tier_get_stats(const hm_vram_tier *t, hm_vram_tier_stats *out) {
    hm_vram_tier *m = (hm_vram_tier *)t; /* the lock only: the stats are not changed */
    if (m->sync_ok) pthread_mutex_lock(&m->mu);
    *out = t->stats;
    out->queued = t->tail - t->head;
    if (m->sync_ok) pthread_mutex_unlock(&m->mu);
}

/* ---- the store's view (engine thread) ---- */

/* The image layout of u: off[p] for present parts (UINT64_MAX absent), returns its length. */
static uint64_t layout(const hm_unit_ref *u, uint64_t off[HM_UNIT_NPART]) {
    uint64_t pos = 0, end = 0;
    for (int p = 0; p < HM_UNIT_NPART; p++) {
        if (!u->src[p] || !u->part_bytes[p]) {
            off[p] = UINT64_MAX;
            continue;
        }
        off[p] = pos;
        end = pos + u->part_bytes[p];
        pos = round_up(end, TIER_ALIGN);
    }
    return end;
}

static hm_status tier_fill(void *ctx, const hm_unit_ref *u, int32_t slot, hm_err *err) {
    hm_vram_tier *t = ctx;
    if (slot < 0 || slot >= t->n_slots)
        return hm_errf(err, HM_ERR_ARG, "vram tier: unit (%d, %d) into slot %d: the pool has %" PRId64 " slots",
                       u->layer, u->expert, slot, t->n_slots);
    fill_req r = {.u = *u, .slot = slot};
    r.len = layout(u, r.off);
    if (r.len > t->slot_bytes)
        return hm_errf(err, HM_ERR_ARG, "vram tier: unit (%d, %d) needs %" PRIu64 " bytes, slot %d holds %" PRIu64,
                       u->layer, u->expert, r.len, slot, t->slot_bytes);
    int64_t t0 = hm_time_us();
    hm_status st = HM_OK;
    pthread_mutex_lock(&t->mu);
    while (!t->failed && t->tail - t->head == t->q_cap) pthread_cond_wait(&t->done, &t->mu); /* full */
    if (t->failed) {
        st = failed_locked(t, err);
    } else {
        r.seq = ++t->want[slot];
        t->q[t->tail++ % t->q_cap] = r;
        pthread_cond_signal(&t->work);
    }
    pthread_mutex_unlock(&t->mu);
    t->stats.fill_seconds += (double)(hm_time_us() - t0) * 1e-6;
    if (st) return st;
    char *dst = slot_base(t, slot);
    for (int p = 0; p < HM_UNIT_NPART; p++) t->part[slot][p] = r.off[p] == UINT64_MAX ? NULL : dst + r.off[p];
    t->stats.fills++;
    t->stats.fill_bytes += r.len;
    return HM_OK;
}

static bool tier_ready(void *ctx, int32_t slot) {
    hm_vram_tier *t = ctx;
    if (slot < 0 || slot >= t->n_slots) return true;
    pthread_mutex_lock(&t->mu);
    bool issued = t->have[slot] == t->want[slot];
    pthread_mutex_unlock(&t->mu);
    /* issued: the copier is done with this slot until this thread fills it again */
    return issued && hm_cuda_event_done(t->slot_ev[slot]);
}

static const void *tier_part(void *ctx, int32_t slot, hm_unit_part p) {
    hm_vram_tier *t = ctx;
    if (slot < 0 || slot >= t->n_slots || (unsigned)p >= HM_UNIT_NPART) return NULL;
    return t->part[slot][p];
}

void hm_vram_tier_as_hot(hm_vram_tier *t, hm_tier *out) {
    memset(out, 0, sizeof *out);
    out->name = "vram";
    out->ctx = t;
    out->fill = tier_fill;
    out->ready = tier_ready;
    out->part = tier_part;
}
