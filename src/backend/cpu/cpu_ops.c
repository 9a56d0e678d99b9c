/* cpu_ops.c - the row and elementwise ops: norms, RoPE, softmax, embedding lookup.
 *
 * Each op splits rows (or element ranges) over the pool; small inputs run on the caller to
 * save the dispatch. Every output element is produced by one thread in a fixed order, so the
 * results do not depend on the thread count. */
#include "cpu_impl.h"

/* Below this many elements an elementwise op is not worth a dispatch. */
#define HM_PAR_MIN 16384

bool hm_cpu_type_ok(int type) {
    const hm_type_traits *tr = hm_type_get(type);
    if (!tr || !tr->supported) return false;
    const hm_type_traits *pt = hm_type_get((int)tr->vec_dot_type);
    return pt && pt->from_float;
}

/* ---- elementwise ---- */

typedef enum { EW_ADD, EW_MUL, EW_SCALE, EW_SILU, EW_SWIGLU } ew_op;

typedef struct {
    ew_op op;
    const float *a, *b;
    float s;
    float *out;
    int64_t n;
} ew_ctx;

static void ew_range(const ew_ctx *c, int64_t lo, int64_t hi) {
    const float *a = c->a, *b = c->b;
    float *o = c->out;
    switch (c->op) {
    case EW_ADD: for (int64_t i = lo; i < hi; i++) o[i] = a[i] + b[i]; break;
    case EW_MUL: for (int64_t i = lo; i < hi; i++) o[i] = a[i] * b[i]; break;
    case EW_SCALE: for (int64_t i = lo; i < hi; i++) o[i] = a[i] * c->s; break;
    case EW_SILU: for (int64_t i = lo; i < hi; i++) o[i] = hm_silu(a[i]); break;
    case EW_SWIGLU: hm_swiglu_vec(a + lo, b + lo, o + lo, hi - lo); break;
    }
}

static void ew_task(void *vctx, int ith, int nth) {
    const ew_ctx *c = vctx;
    int64_t lo, hi;
    hm_split(c->n, ith, nth, &lo, &hi);
    ew_range(c, lo, hi);
}

static void ew_run(hm_pool *pool, ew_ctx *c) {
    if (c->n < HM_PAR_MIN) ew_range(c, 0, c->n);
    else hm_pool_run(pool, ew_task, c);
}

void hm_cpu_add(hm_pool *pool, const float *a, const float *b, float *out, int64_t n) {
    ew_ctx c = {EW_ADD, a, b, 0, out, n};
    ew_run(pool, &c);
}
void hm_cpu_mul(hm_pool *pool, const float *a, const float *b, float *out, int64_t n) {
    ew_ctx c = {EW_MUL, a, b, 0, out, n};
    ew_run(pool, &c);
}
void hm_cpu_scale(hm_pool *pool, const float *a, float s, float *out, int64_t n) {
    ew_ctx c = {EW_SCALE, a, NULL, s, out, n};
    ew_run(pool, &c);
}
void hm_cpu_silu(hm_pool *pool, const float *x, float *out, int64_t n) {
    ew_ctx c = {EW_SILU, x, NULL, 0, out, n};
    ew_run(pool, &c);
}
void hm_cpu_swiglu(hm_pool *pool, const float *gate, const float *up, float *out, int64_t n) {
    ew_ctx c = {EW_SWIGLU, gate, up, 0, out, n};
    ew_run(pool, &c);
}

/* ---- row ops: one generic row-split driver ---- */

typedef struct row_ctx row_ctx;
typedef void (*row_fn)(const row_ctx *c, int64_t r);
struct row_ctx {
    row_fn fn;
    int64_t n_rows, n;
    const float *x, *w;
    float *out;
    float eps;
    int n_head, head_dim, n_rot;
    const int32_t *pos;
    float theta_base;
};

static void row_task(void *vctx, int ith, int nth) {
    const row_ctx *c = vctx;
    int64_t lo, hi;
    hm_split(c->n_rows, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) c->fn(c, r);
}

static void row_run(hm_pool *pool, row_ctx *c, int64_t work) {
    if (work < HM_PAR_MIN || c->n_rows < 2) {
        for (int64_t r = 0; r < c->n_rows; r++) c->fn(c, r);
    } else {
        hm_pool_run(pool, row_task, c);
    }
}

static void rmsnorm_vec(const float *x, const float *w, float *o, int64_t n, float eps) {
    float ss = hm_dot_f32(x, x, n);
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    if (w) for (int64_t i = 0; i < n; i++) o[i] = x[i] * scale * w[i];
    else for (int64_t i = 0; i < n; i++) o[i] = x[i] * scale;
}

static void rmsnorm_row(const row_ctx *c, int64_t r) {
    rmsnorm_vec(c->x + r * c->n, c->w, c->out + r * c->n, c->n, c->eps);
}

void hm_cpu_rmsnorm(hm_pool *pool, const float *x, const float *w, float *out, int64_t n_rows,
                    int64_t n, float eps) {
    row_ctx c = {.fn = rmsnorm_row, .n_rows = n_rows, .n = n, .x = x, .w = w, .out = out, .eps = eps};
    row_run(pool, &c, n_rows * n);
}

static void rmsnorm_heads_row(const row_ctx *c, int64_t r) {
    /* r indexes (token, head) */
    float *p = c->out + r * c->head_dim;
    rmsnorm_vec(p, c->w, p, c->head_dim, c->eps);
}

void hm_cpu_rmsnorm_heads(hm_pool *pool, float *x, const float *w, int64_t n_tok, int n_head,
                          int head_dim, float eps) {
    row_ctx c = {.fn = rmsnorm_heads_row, .n_rows = n_tok * n_head, .w = w, .out = x, .eps = eps,
                 .n_head = n_head, .head_dim = head_dim};
    row_run(pool, &c, n_tok * n_head * head_dim);
}

static void rope_row(const row_ctx *c, int64_t t) {
    /* t indexes tokens: the angles are shared by all heads. Double precision for the angles so
     * large positions keep their accuracy. */
    const int half = c->n_rot / 2;
    float cs[512], sn[512];
    HM_ASSERT(half <= 512);
    const double p = (double)c->pos[t];
    for (int i = 0; i < half; i++) {
        double a = p * pow((double)c->theta_base, -2.0 * i / c->n_rot);
        cs[i] = (float)cos(a);
        sn[i] = (float)sin(a);
    }
    for (int h = 0; h < c->n_head; h++) {
        float *v = c->out + (t * c->n_head + h) * c->head_dim;
        for (int i = 0; i < half; i++) {
            float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * cs[i] - x1 * sn[i];
            v[i + half] = x0 * sn[i] + x1 * cs[i];
        }
    }
}

void hm_cpu_rope_neox(hm_pool *pool, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot,
                      const int32_t *pos, float theta_base) {
    HM_ASSERT(n_rot <= head_dim && n_rot % 2 == 0);
    row_ctx c = {.fn = rope_row, .n_rows = n_tok, .out = x, .n_head = n_head, .head_dim = head_dim,
                 .n_rot = n_rot, .pos = pos, .theta_base = theta_base};
    row_run(pool, &c, n_tok * n_head * head_dim * 4);
}

static void softmax_vec(float *x, int64_t n) {
    const float m = hm_max_f32(x, n);
    float s = hm_exp_sub_sum(x, n, m);
    float inv = 1.0f / s;
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

static void softmax_row(const row_ctx *c, int64_t r) { softmax_vec(c->out + r * c->n, c->n); }

void hm_cpu_softmax(hm_pool *pool, float *x, int64_t n_rows, int64_t n) {
    row_ctx c = {.fn = softmax_row, .n_rows = n_rows, .n = n, .out = x};
    row_run(pool, &c, n_rows * n * 8);
}

/* ---- embedding lookup ---- */

typedef struct {
    const hm_mat *table;
    const int32_t *ids;
    int64_t n_ids;
    float *out;
} get_rows_ctx;

static void get_rows_task(void *vctx, int ith, int nth) {
    const get_rows_ctx *c = vctx;
    const hm_type_traits *tr = hm_type_get(c->table->type);
    int64_t lo, hi;
    hm_split(c->n_ids, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const char *row = (const char *)c->table->data + (size_t)c->ids[i] * c->table->nb1;
        tr->to_float(row, c->out + i * c->table->ne0, c->table->ne0);
    }
}

void hm_cpu_get_rows(hm_pool *pool, const hm_mat *table, const int32_t *ids, int64_t n_ids,
                     float *out) {
    HM_ASSERT(hm_cpu_type_ok(table->type) || hm_type_get(table->type)->to_float);
    get_rows_ctx c = {table, ids, n_ids, out};
    if (n_ids * table->ne0 < HM_PAR_MIN) get_rows_task(&c, 0, 1);
    else hm_pool_run(pool, get_rows_task, &c);
}
