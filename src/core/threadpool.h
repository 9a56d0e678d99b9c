/* threadpool.h - the engine's fork-join thread pool.
 *
 * One pool per engine (no globals). hm_pool_run(pool, fn, ctx) calls fn(ctx, ith, nth) once on each
 * of the nth = hm_pool_size(pool) threads, the caller being thread 0, and returns when all calls
 * have returned. Workers are persistent: between runs they spin briefly on a generation counter,
 * then sleep on a futex, so a dispatch that follows another costs about a microsecond.
 *
 * Invariants: runs do not overlap (one caller thread at a time drives a pool; a run must not call
 * hm_pool_run on the same pool); every thread of a run sees the writes the caller made before the
 * run, and the caller sees every write the threads made when the run returns. */
#ifndef HM_CORE_THREADPOOL_H
#define HM_CORE_THREADPOOL_H

#include <stdbool.h>

#include "hotmoe.h"

typedef struct hm_pool hm_pool;

/* Work function: ith in [0, nth), nth = hm_pool_size(pool). */
typedef void (*hm_pool_fn)(void *ctx, int ith, int nth);

/* Start n_threads - 1 workers (the caller is the n_threads-th). n_threads >= 1, else HM_ERR_ARG.
 * *out is owned by the caller, released with hm_pool_close. */
hm_status hm_pool_open(hm_pool **out, int n_threads, hm_err *err);

/* Stop and join the workers, free the pool. NULL is a no-op. */
void hm_pool_close(hm_pool *pool);

/* Number of threads a run uses (including the caller); 1 for a NULL pool. */
int hm_pool_size(const hm_pool *pool);

/* Run fn(ctx, ith, nth) on every thread and wait for all. A NULL pool runs fn(ctx, 0, 1) inline. */
void hm_pool_run(hm_pool *pool, hm_pool_fn fn, void *ctx);

/* Keep the workers polling (no futex sleep between runs) while held: for a caller that will
 * dispatch short runs at irregular gaps of tens to hundreds of microseconds (the GPU decode
 * step's cold units), where a wake-up would cost more than the run. Calls nest; every
 * hm_pool_hold(pool, true) needs its hm_pool_hold(pool, false). Burns the workers' cores while
 * held. NULL or a one-thread pool: no-op. */
void hm_pool_hold(hm_pool *pool, bool on);

/* Inside a run only: every thread of the run must call it; returns when all have arrived. Orders
 * memory like a run boundary (writes before the barrier are visible after it on every thread). */
void hm_pool_barrier(hm_pool *pool);

#endif
