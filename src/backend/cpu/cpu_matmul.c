/* cpu_matmul.c - Y = X W^T over any supported weight type, one dispatch per call.
 *
 * Inside the one run: (1) the threads quantise X to each partner type needed (token rows split
 * ith/nth), barrier; (2) rows of W, cut into chunks, are taken from a shared atomic counter
 * (the first nth chunks statically) and each chunk is computed for every token, tokens tiled so
 * the chunk's weight rows stay in cache while the activations stream past. Each y element is one
 * vec_dot by one thread: the result does not depend on the thread count. */
#include "cpu_impl.h"
#include "cpu_kernels.h"

#define MM_MAX_Q 4 /* distinct non-f32 partner types in one call */

typedef struct mm_ctx {
    hm_pool *pool;
    int n_mat;
    const hm_mat *ws[HM_CPU_MATMUL_MAX];
    float *ys[HM_CPU_MATMUL_MAX];
    int qi[HM_CPU_MATMUL_MAX]; /* partner buffer of mat i, -1 = raw f32 x */
    int64_t chunk_end[HM_CPU_MATMUL_MAX]; /* prefix sums of chunks per mat */
    int64_t chunk_rows;
    const float *x;
    int64_t n_tok, ne0;
    int pre_quantized; /* the caller quantised x before the run (few tokens: saves a barrier) */
    int n_q;
    int q_type[MM_MAX_Q];
    char *q_buf[MM_MAX_Q];
    size_t q_stride[MM_MAX_Q];
    _Alignas(64) _Atomic int64_t next;
} mm_ctx;

size_t hm_cpu_matmul_scratch_size(int64_t ne0, int64_t n_tok, int n_threads) {
    (void)n_threads;
    /* worst case: every non-f32 partner type present (<= 1.14 + 1.07 + 2 + 2 bytes/element) */
    return (size_t)n_tok * (size_t)MM_MAX_Q * hm_act_row_bound(ne0) + (MM_MAX_Q + 1) * HM_ALIGN;
}

static void mm_rows(const mm_ctx *c, int m, int64_t r0, int64_t r1) {
    const hm_mat *w = c->ws[m];
    float *y = c->ys[m];
    const int64_t ne1 = w->ne1, ne0 = c->ne0, n_tok = c->n_tok;
    const char *xb;
    size_t xs;
    if (c->qi[m] < 0) {
        xb = (const char *)c->x;
        xs = (size_t)ne0 * sizeof(float);
    } else {
        xb = c->q_buf[c->qi[m]];
        xs = c->q_stride[c->qi[m]];
    }
    hm_cpu_rows(w, r0, r1, xb, xs, NULL, n_tok, y, ne1);
}

static void mm_chunk(const mm_ctx *c, int64_t k) {
    int m = 0;
    while (k >= c->chunk_end[m]) m++;
    int64_t first = m ? c->chunk_end[m - 1] : 0;
    int64_t r0 = (k - first) * c->chunk_rows;
    int64_t r1 = r0 + c->chunk_rows;
    if (r1 > c->ws[m]->ne1) r1 = c->ws[m]->ne1;
    mm_rows(c, m, r0, r1);
}

static void mm_task(void *vctx, int ith, int nth) {
    mm_ctx *c = vctx;
    if (c->n_q && !c->pre_quantized) {
        int64_t lo, hi;
        hm_split(c->n_tok, ith, nth, &lo, &hi);
        for (int q = 0; q < c->n_q; q++) {
            hm_from_float_fn qf = hm_type_get(c->q_type[q])->from_float;
            for (int64_t t = lo; t < hi; t++)
                qf(c->x + t * c->ne0, c->q_buf[q] + (size_t)t * c->q_stride[q], c->ne0);
        }
        hm_pool_barrier(c->pool);
    }
    const int64_t n_chunks = c->chunk_end[c->n_mat - 1];
    for (int64_t k = ith; k < n_chunks;) {
        mm_chunk(c, k);
        k = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
    }
}

static void mm_run(hm_pool *pool, const hm_mat *const *ws, int n_mat, const float *x, int64_t n_tok,
                   float *const *ys, hm_scratch *scratch) {
    HM_ASSERT(n_mat >= 1 && n_mat <= HM_CPU_MATMUL_MAX);
    if (n_tok <= 0) return;
    mm_ctx c;
    memset(&c, 0, sizeof c);
    c.pool = pool;
    c.n_mat = n_mat;
    c.x = x;
    c.n_tok = n_tok;
    c.ne0 = ws[0]->ne0;
    hm_bump bump = hm_bump_init(scratch);
    int64_t rows_total = 0;
    for (int m = 0; m < n_mat; m++) {
        const hm_mat *w = ws[m];
        HM_ASSERT(w->ne0 == c.ne0);
        HM_ASSERT(hm_cpu_type_ok(w->type));
        c.ws[m] = w;
        c.ys[m] = ys[m];
        rows_total += w->ne1;
        int pt = (int)hm_type_get(w->type)->vec_dot_type;
        if (pt == HM_TYPE_F32) {
            c.qi[m] = -1;
            continue;
        }
        int q = 0;
        while (q < c.n_q && c.q_type[q] != pt) q++;
        if (q == c.n_q) {
            HM_ASSERT(c.n_q < MM_MAX_Q);
            c.q_type[q] = pt;
            c.q_stride[q] = hm_row_size(pt, c.ne0);
            HM_ASSERT(c.q_stride[q] > 0);
            c.q_buf[q] = hm_bump_take(&bump, c.q_stride[q] * (size_t)n_tok);
            c.n_q++;
        }
        c.qi[m] = q;
    }
    const int nth = hm_pool_size(pool);
    /* chunks: enough for balance (>= 4 per thread), few enough to amortise the per-chunk cost */
    int64_t cr = rows_total / ((int64_t)nth * 4);
    if (n_tok >= 32) cr = cr > 64 ? 64 : cr;
    else cr = cr > 32 ? 32 : cr;
    if (cr < 4) cr = 4;
    c.chunk_rows = cr;
    int64_t acc = 0;
    for (int m = 0; m < n_mat; m++) {
        acc += (ws[m]->ne1 + cr - 1) / cr;
        c.chunk_end[m] = acc;
    }
    if (n_tok < nth || nth == 1) {
        for (int q = 0; q < c.n_q; q++) {
            hm_from_float_fn qf = hm_type_get(c.q_type[q])->from_float;
            for (int64_t t = 0; t < n_tok; t++) qf(x + t * c.ne0, c.q_buf[q] + (size_t)t * c.q_stride[q], c.ne0);
        }
        c.pre_quantized = 1;
    }
    atomic_init(&c.next, nth);
    hm_pool_run(pool, mm_task, &c);
}

void hm_cpu_matmul(hm_pool *pool, const hm_mat *w, const float *x, int64_t n_tok, float *y,
                   hm_scratch *scratch) {
    mm_run(pool, &w, 1, x, n_tok, &y, scratch);
}

void hm_cpu_matmul_n(hm_pool *pool, const hm_mat *const *ws, int n_mat, const float *x,
                     int64_t n_tok, float *const *ys, hm_scratch *scratch) {
    mm_run(pool, ws, n_mat, x, n_tok, ys, scratch);
}
