/* threadpool.c - persistent fork-join pool: a generation counter, brief spinning, futex sleep.
 *
 * Dispatch: the caller publishes (fn, ctx), sets `pending` to nth - 1 and bumps `gen`; a worker
 * that sees gen change runs fn and decrements `pending`; the caller runs its own share and then
 * spins until pending is 0 (workers are running, so this wait is short).
 * Sleeping: a worker that saw no new generation for SPIN_ITERS polls announces itself in `sleepers`
 * and futex-waits on gen; the caller wakes only when sleepers > 0. Both sides use seq_cst on
 * (sleepers, gen), so either the caller sees the sleeper or the sleeper's futex_wait sees the new
 * gen (no lost wake-up). */
#include "threadpool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* ~50-100 us of polling before sleeping: back-to-back decode dispatches stay on the fast path,
 * an idle engine stops burning its cores quickly. */
#define SPIN_ITERS 2000
/* Waits inside a run (for the other threads) poll this long, then yield: on an oversubscribed
 * machine the thread we wait for may need our core. */
#define YIELD_AFTER 1024

typedef struct hm_worker {
    hm_pool *pool;
    pthread_t tid;
    int ith;
} hm_worker;

struct hm_pool {
    int n;
    hm_worker *workers; /* [n - 1] */
    hm_pool_fn fn;
    void *ctx;
    _Alignas(64) _Atomic uint32_t gen;
    _Atomic int stop;
    _Alignas(64) _Atomic int pending;
    _Alignas(64) _Atomic int sleepers;
    _Atomic int hold;       /* > 0: workers keep polling instead of sleeping (hm_pool_hold) */
    _Alignas(64) _Atomic int bar_count;
    _Atomic uint32_t bar_gen;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

static void *worker_main(void *arg) {
    hm_worker *w = arg;
    hm_pool *p = w->pool;
    /* gen is 0 until hm_pool_open returns; reading it here instead could skip a first run that
     * was published before this thread got scheduled */
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ITERS || atomic_load_explicit(&p->hold, memory_order_relaxed) > 0) {
                CPU_RELAX();
                continue;
            }
            atomic_fetch_add(&p->sleepers, 1);
            if (atomic_load(&p->gen) == seen) futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
            spins = 0;
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        p->fn(p->ctx, w->ith, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
    return NULL;
}

static void publish(hm_pool *p) {
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: release of fn/ctx/pending + Dekker with sleepers */
    if (atomic_load(&p->sleepers) > 0) futex_wake_all(&p->gen);
}

hm_status hm_pool_open(hm_pool **out, int n_threads, hm_err *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return hm_errf(err, HM_ERR_ARG, "thread count %d out of range [1, 1024]", n_threads);
    hm_pool *p = calloc(1, sizeof *p);
    if (!p) return hm_errf(err, HM_ERR_NOMEM, "thread pool: out of memory");
    p->n = n_threads;
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) {
            free(p);
            return hm_errf(err, HM_ERR_NOMEM, "thread pool: out of memory");
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        hm_worker *w = &p->workers[i];
        w->pool = p;
        w->ith = i + 1;
        if (pthread_create(&w->tid, NULL, worker_main, w) != 0) {
            p->n = i + 1; /* workers 0..i-1 exist */
            hm_pool_close(p);
            return hm_errf(err, HM_ERR_INTERNAL, "thread pool: pthread_create failed for thread %d", i + 1);
        }
    }
    *out = p;
    return HM_OK;
}

void hm_pool_close(hm_pool *pool) {
    if (!pool) return;
    if (pool->n > 1) {
        atomic_store(&pool->stop, 1);
        publish(pool);
        for (int i = 0; i < pool->n - 1; i++) pthread_join(pool->workers[i].tid, NULL);
    }
    free(pool->workers);
    free(pool);
}

int hm_pool_size(const hm_pool *pool) { return pool ? pool->n : 1; }

void hm_pool_hold(hm_pool *pool, bool on) {
    if (!pool || pool->n == 1) return;
    atomic_fetch_add(&pool->hold, on ? 1 : -1);
    /* sleepers wake on the next run's publish as before; no wake needed here */
}

void hm_pool_run(hm_pool *pool, hm_pool_fn fn, void *ctx) {
    if (!pool || pool->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    publish(pool);
    fn(ctx, 0, pool->n);
    int spins = 0;
    while (atomic_load_explicit(&pool->pending, memory_order_acquire) != 0) {
        if (++spins < YIELD_AFTER) CPU_RELAX();
        else sched_yield(); /* a worker was descheduled (oversubscribed machine) */
    }
}

void hm_pool_barrier(hm_pool *pool) {
    if (!pool || pool->n == 1) return;
    uint32_t g = atomic_load_explicit(&pool->bar_gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&pool->bar_count, 1, memory_order_acq_rel) == pool->n - 1) {
        atomic_store_explicit(&pool->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&pool->bar_gen, 1, memory_order_release);
        return;
    }
    int spins = 0;
    while (atomic_load_explicit(&pool->bar_gen, memory_order_acquire) == g) {
        if (++spins < YIELD_AFTER) CPU_RELAX();
        else sched_yield();
    }
}
