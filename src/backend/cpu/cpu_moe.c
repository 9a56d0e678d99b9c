/* cpu_moe.c - all expert units of a layer in one dispatch.
 *
 * Pairs (token, job) are numbered job by job, so job j owns pairs [off[j], off[j+1]). One run, with
 * barriers between its phases:
 *   1. quantise every token of x to the gate/up partner types          (tokens split ith/nth)
 *   2. g = gate x, u = up x for each pair                               ((job, row chunk) items)
 *   3. h = act(g) * u, quantised to the down partner type               (pairs split ith/nth)
 *      (act: SiLU, Gemma's GELU-tanh or gpt-oss's clamped SwiGLU; gpt-oss's gate / up biases first;
 *      with a limit L > 0 DeepSeek-V4's clamped SwiGLU silu(min(g, L)) * clamp(u, -L, L))
 *   4. o = down h for each pair                                         ((job, row chunk) items)
 *   5. out[t] += w * o over t's pairs in job order (o + down bias)      (tokens split ith/nth)
 * Items of 2 and 4 come from shared atomic counters, so busy threads take fewer; every element is
 * still computed by one thread in a fixed order, and phase 5's order is fixed: deterministic.
 * One token (decode) takes moe_one_token below: the same values, static row ranges, two barriers. */
#include "cpu_impl.h"
#include "cpu_kernels.h"

#define MOE_MAX_Q 2 /* distinct gate/up partner types in one call */

typedef struct moe_ctx {
    hm_pool *pool;
    const hm_moe_job *jobs;
    const int32_t *active; /* [n_active] indices of jobs with tokens */
    int32_t n_active;
    const int32_t *off;    /* [n_active + 1] pair offsets of the active jobs */
    const float *x;
    float *out;
    int64_t n_batch, n_embd, n_ff, n_pairs;
    hm_cpu_act act;        /* h = act(g) * u */
    float limit;           /* > 0: the SwiGLU clamp */
    int pre_quantized;
    int n_q;
    int q_type[MOE_MAX_Q];
    char *xq[MOE_MAX_Q];
    size_t xq_stride[MOE_MAX_Q];
    float *g, *u;          /* [n_pairs, n_ff] */
    char *hq;              /* [n_pairs] rows of hq_stride bytes */
    size_t hq_stride;
    float *o;              /* [n_pairs, n_embd] */
    const int32_t *tok_start; /* [n_batch + 1] CSR: pairs of token t, in job order */
    const int32_t *tok_pairs; /* [n_pairs] */
    const float *pair_w;      /* [n_pairs] routing weight of each pair */
    const float *const *pair_db; /* [n_pairs] the pair's job's down bias, or NULL: no job has one */
    int64_t cr_a, cr_b, items_a_per_job, items_b_per_job;
    _Alignas(64) _Atomic int64_t next_a;
    _Alignas(64) _Atomic int64_t next_b;
} moe_ctx;

size_t hm_cpu_moe_scratch_size(int64_t n_batch, int64_t n_pairs, int64_t n_embd, int64_t n_ff,
                               int n_threads) {
    (void)n_threads;
    size_t s = 16 * HM_ALIGN;
    s += (size_t)MOE_MAX_Q * (size_t)n_batch * hm_act_row_bound(n_embd);
    s += 2 * hm_align_up((uint64_t)n_pairs * (uint64_t)n_ff * sizeof(float), HM_ALIGN);
    s += (size_t)n_pairs * hm_act_row_bound(n_ff);
    s += hm_align_up((uint64_t)n_pairs * (uint64_t)n_embd * sizeof(float), HM_ALIGN);
    s += 4 * hm_align_up(((uint64_t)n_pairs + 1) * sizeof(int32_t), HM_ALIGN);
    s += 2 * hm_align_up(((uint64_t)n_batch + 1) * sizeof(int32_t), HM_ALIGN);
    s += hm_align_up(((uint64_t)n_pairs + 1) * sizeof(float *), HM_ALIGN); /* pair_db */
    return s;
}

/* g[i] = act(g[i]) * u[i]; limit > 0: g clamped above at limit, u to [-limit, limit] first (u is
 * the call's own scratch row) */
static void act_mul(hm_cpu_act act, float limit, float *g, float *u, int64_t n) {
    if (limit > 0.0f)
        for (int64_t i = 0; i < n; i++) {
            g[i] = g[i] > limit ? limit : g[i];
            u[i] = u[i] > limit ? limit : u[i] < -limit ? -limit : u[i];
        }
    if (act == HM_CPU_ACT_GELU) {
        for (int64_t i = 0; i < n; i++) g[i] = hm_gelu_tanh(g[i]) * u[i];
    } else if (act == HM_CPU_ACT_SWIGLU_OAI) {
        for (int64_t i = 0; i < n; i++) {
            const float a = g[i] < HM_SWIGLU_OAI_LIMIT ? g[i] : HM_SWIGLU_OAI_LIMIT;
            const float b = u[i] < -HM_SWIGLU_OAI_LIMIT ? -HM_SWIGLU_OAI_LIMIT
                            : u[i] > HM_SWIGLU_OAI_LIMIT ? HM_SWIGLU_OAI_LIMIT : u[i];
            g[i] = a / (1.0f + expf(-HM_SWIGLU_OAI_ALPHA * a)) * (b + 1.0f);
        }
    } else {
        hm_swiglu_vec(g, u, g, n);
    }
}

/* act_mul of a job's rows [lo, lo + n) with its gate / up biases first (u: work space when it has them) */
static void act_mul_job(hm_cpu_act act, float limit, const hm_moe_job *j, int64_t lo, float *g, float *u,
                        int64_t n) {
    if (j->gate_b)
        for (int64_t i = 0; i < n; i++) g[i] += j->gate_b[lo + i];
    if (j->up_b)
        for (int64_t i = 0; i < n; i++) u[i] += j->up_b[lo + i];
    act_mul(act, limit, g, u, n);
}

static int q_index(const moe_ctx *c, int type) {
    int pt = (int)hm_type_get(type)->vec_dot_type;
    for (int q = 0; q < c->n_q; q++)
        if (c->q_type[q] == pt) return q;
    return -1; /* f32 partner: raw x */
}

static void gate_up_item(moe_ctx *c, int64_t item) {
    const int64_t a = item / c->items_a_per_job;
    const hm_moe_job *j = &c->jobs[c->active[a]];
    const int64_t r0 = (item % c->items_a_per_job) * c->cr_a;
    const int64_t r1 = r0 + c->cr_a < c->n_ff ? r0 + c->cr_a : c->n_ff;
    const int64_t p0 = c->off[a];
    const hm_mat *m[2] = {&j->gate, &j->up};
    float *y[2] = {c->g + p0 * c->n_ff, c->u + p0 * c->n_ff};
    for (int k = 0; k < 2; k++) {
        int q = q_index(c, m[k]->type);
        const char *xb = q < 0 ? (const char *)c->x : c->xq[q];
        size_t xs = q < 0 ? (size_t)c->n_embd * sizeof(float) : c->xq_stride[q];
        hm_cpu_rows(m[k], r0, r1, xb, xs, j->tok, j->n_tok, y[k], c->n_ff);
    }
}

static void down_item(moe_ctx *c, int64_t item) {
    const int64_t a = item / c->items_b_per_job;
    const hm_moe_job *j = &c->jobs[c->active[a]];
    const int64_t r0 = (item % c->items_b_per_job) * c->cr_b;
    const int64_t r1 = r0 + c->cr_b < c->n_embd ? r0 + c->cr_b : c->n_embd;
    const int64_t p0 = c->off[a];
    int pt = (int)hm_type_get(j->down.type)->vec_dot_type;
    const char *hb = pt == HM_TYPE_F32 ? (const char *)(c->g + p0 * c->n_ff) : c->hq + (size_t)p0 * c->hq_stride;
    size_t hs = pt == HM_TYPE_F32 ? (size_t)c->n_ff * sizeof(float) : c->hq_stride;
    hm_cpu_rows(&j->down, r0, r1, hb, hs, NULL, j->n_tok, c->o + p0 * c->n_embd, c->n_embd);
}

static void quantize_x(const moe_ctx *c, int64_t lo, int64_t hi) {
    for (int q = 0; q < c->n_q; q++) {
        hm_from_float_fn qf = hm_type_get(c->q_type[q])->from_float;
        for (int64_t t = lo; t < hi; t++)
            qf(c->x + t * c->n_embd, c->xq[q] + (size_t)t * c->xq_stride[q], c->n_embd);
    }
}

static void moe_task(void *vctx, int ith, int nth) {
    moe_ctx *c = vctx;
    int64_t lo, hi;
    /* 1 (done by the caller when there are fewer tokens than threads) */
    if (!c->pre_quantized) {
        hm_split(c->n_batch, ith, nth, &lo, &hi);
        quantize_x(c, lo, hi);
        hm_pool_barrier(c->pool);
    }
    /* 2 */
    const int64_t n_a = c->n_active * c->items_a_per_job;
    for (int64_t k = ith; k < n_a;) {
        gate_up_item(c, k);
        k = atomic_fetch_add_explicit(&c->next_a, 1, memory_order_relaxed);
    }
    hm_pool_barrier(c->pool);
    /* 3: h overwrites g; the pair's job decides the down partner type */
    hm_split(c->n_pairs, ith, nth, &lo, &hi);
    int32_t a = 0;
    for (int64_t p = lo; p < hi; p++) {
        while (p >= c->off[a + 1]) a++;
        float *g = c->g + p * c->n_ff, *u = c->u + p * c->n_ff;
        act_mul_job(c->act, c->limit, &c->jobs[c->active[a]], 0, g, u, c->n_ff);
        const hm_type_traits *dt = hm_type_get(c->jobs[c->active[a]].down.type);
        if (dt->vec_dot_type != HM_TYPE_F32)
            hm_type_get((int)dt->vec_dot_type)->from_float(g, c->hq + (size_t)p * c->hq_stride, c->n_ff);
    }
    hm_pool_barrier(c->pool);
    /* 4 */
    const int64_t n_b = c->n_active * c->items_b_per_job;
    for (int64_t k = ith; k < n_b;) {
        down_item(c, k);
        k = atomic_fetch_add_explicit(&c->next_b, 1, memory_order_relaxed);
    }
    hm_pool_barrier(c->pool);
    /* 5 */
    hm_split(c->n_batch, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *dst = c->out + t * c->n_embd;
        for (int32_t i = c->tok_start[t]; i < c->tok_start[t + 1]; i++) {
            int32_t p = c->tok_pairs[i];
            const float wgt = c->pair_w[p];
            const float *src = c->o + (int64_t)p * c->n_embd;
            const float *db = c->pair_db ? c->pair_db[p] : NULL;
            if (db)
                for (int64_t e = 0; e < c->n_embd; e++) dst[e] += wgt * (src[e] + db[e]);
            else
                for (int64_t e = 0; e < c->n_embd; e++) dst[e] += wgt * src[e];
        }
    }
}

/* Job jb of a call (active: n_tok > 0): check its shapes and types, add its gate / up partner types
 * to c's quantised inputs, and raise *hq_stride to its down partner's row (of n_ff) when that
 * partner is quantised (not f32): *hq_stride stays 0 while every down partner is f32. */
static void note_job(moe_ctx *c, const hm_moe_job *jb, int64_t n_embd, int64_t n_ff, size_t *hq_stride) {
    HM_ASSERT(jb->gate.ne0 == n_embd && jb->gate.ne1 == n_ff && jb->up.ne0 == n_embd && jb->up.ne1 == n_ff &&
              jb->down.ne0 == n_ff && jb->down.ne1 == n_embd);
    HM_ASSERT(hm_cpu_type_ok(jb->gate.type) && hm_cpu_type_ok(jb->up.type) && hm_cpu_type_ok(jb->down.type));
    const int types[2] = {jb->gate.type, jb->up.type};
    for (int k = 0; k < 2; k++) {
        int pt = (int)hm_type_get(types[k])->vec_dot_type;
        if (pt == HM_TYPE_F32) continue;
        int q = 0;
        while (q < c->n_q && c->q_type[q] != pt) q++;
        if (q == c->n_q) {
            HM_ASSERT(c->n_q < MOE_MAX_Q);
            c->q_type[c->n_q++] = pt;
        }
    }
    int dpt = (int)hm_type_get(jb->down.type)->vec_dot_type;
    if (dpt == HM_TYPE_F32) return;
    size_t rs = hm_row_size(dpt, n_ff);
    HM_ASSERT(rs > 0); /* n_ff is a multiple of the partner's block (the weight's too) */
    if (rs > *hq_stride) *hq_stride = rs;
}

/* c's work buffers from b, once its jobs are noted: the quantised inputs (n_rows of n_embd each),
 * g and u and o of n_pairs rows, and hq when some down partner is quantised (hq_stride > 0). */
static void take_buffers(moe_ctx *c, hm_bump *b, int64_t n_rows, int64_t n_pairs, size_t hq_stride) {
    for (int q = 0; q < c->n_q; q++) {
        c->xq_stride[q] = hm_row_size(c->q_type[q], c->n_embd);
        HM_ASSERT(c->xq_stride[q] > 0);
        c->xq[q] = hm_bump_take(b, c->xq_stride[q] * (size_t)n_rows);
    }
    c->g = hm_bump_take(b, (size_t)n_pairs * (size_t)c->n_ff * sizeof(float));
    c->u = hm_bump_take(b, (size_t)n_pairs * (size_t)c->n_ff * sizeof(float));
    if (hq_stride > 0) {
        c->hq_stride = hq_stride;
        c->hq = hm_bump_take(b, hq_stride * (size_t)n_pairs);
    }
    c->o = hm_bump_take(b, (size_t)n_pairs * (size_t)c->n_embd * sizeof(float));
}

/* ---- one token (decode) ------------------------------------------------------------------------
 * Same values as the general path, fewer and better balanced phases. Every active job has one pair
 * (token 0), pair a = active job a; x was quantised by the caller. One run, two barriers:
 *   A. rows [lo, hi) of every job's gate and up, then h = silu(g) * u on those rows  (static rows)
 *   B. h quantised to the job's down partner type                                     (pairs split)
 *   C. rows [lo, hi) of every job's down, then out[e] += w_a * o_a[e] in job order   (static rows)
 * Row ranges are whole 16-row groups: h's SIMD/tail split per element is the one of a whole-row
 * hm_swiglu_vec, and each dot product is the same vec_dot call, so the result is bit-identical. */

#define MOE_ROW_GROUP 16

static bool one_token_path = true;
void hm_cpu_moe_set_one_token_path(bool on) { one_token_path = on; }

static void row_range(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    hm_split((n + MOE_ROW_GROUP - 1) / MOE_ROW_GROUP, ith, nth, lo, hi);
    *lo *= MOE_ROW_GROUP;
    *hi = *hi * MOE_ROW_GROUP < n ? *hi * MOE_ROW_GROUP : n;
}

static void moe_one_task(void *vctx, int ith, int nth) {
    moe_ctx *c = vctx;
    const int64_t n_ff = c->n_ff, n_embd = c->n_embd;
    int64_t lo, hi;
    /* A */
    row_range(n_ff, ith, nth, &lo, &hi);
    if (lo < hi) {
        for (int32_t a = 0; a < c->n_active; a++) {
            const hm_moe_job *j = &c->jobs[c->active[a]];
            const hm_mat *m[2] = {&j->gate, &j->up};
            float *y[2] = {c->g + a * n_ff, c->u + a * n_ff};
            for (int k = 0; k < 2; k++) {
                int q = q_index(c, m[k]->type);
                const char *xb = q < 0 ? (const char *)c->x : c->xq[q];
                size_t xs = q < 0 ? (size_t)n_embd * sizeof(float) : c->xq_stride[q];
                hm_cpu_rows(m[k], lo, hi, xb, xs, j->tok, 1, y[k], n_ff);
            }
            act_mul_job(c->act, c->limit, j, lo, y[0] + lo, y[1] + lo, hi - lo);
        }
    }
    hm_pool_barrier(c->pool);
    /* B */
    hm_split(c->n_active, ith, nth, &lo, &hi);
    for (int64_t a = lo; a < hi; a++) {
        const hm_type_traits *dt = hm_type_get(c->jobs[c->active[a]].down.type);
        if (dt->vec_dot_type != HM_TYPE_F32)
            hm_type_get((int)dt->vec_dot_type)->from_float(c->g + a * n_ff, c->hq + (size_t)a * c->hq_stride, n_ff);
    }
    hm_pool_barrier(c->pool);
    /* C */
    row_range(n_embd, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    for (int32_t a = 0; a < c->n_active; a++) {
        const hm_moe_job *j = &c->jobs[c->active[a]];
        int pt = (int)hm_type_get(j->down.type)->vec_dot_type;
        const char *hb = pt == HM_TYPE_F32 ? (const char *)(c->g + a * n_ff) : c->hq + (size_t)a * c->hq_stride;
        size_t hs = pt == HM_TYPE_F32 ? (size_t)n_ff * sizeof(float) : c->hq_stride;
        hm_cpu_rows(&j->down, lo, hi, hb, hs, NULL, 1, c->o + a * n_embd, n_embd);
    }
    /* the general path's phase 5 for token 0 over rows [lo, hi): pairs in job order */
    float *dst = c->out;
    for (int32_t a = 0; a < c->n_active; a++) {
        const float wgt = c->pair_w[a];
        const float *src = c->o + (int64_t)a * n_embd;
        const float *db = c->jobs[c->active[a]].down_b;
        if (db)
            for (int64_t e = lo; e < hi; e++) dst[e] += wgt * (src[e] + db[e]);
        else
            for (int64_t e = lo; e < hi; e++) dst[e] += wgt * src[e];
    }
}

static void moe_one_token(hm_pool *pool, hm_cpu_act act, float limit, const hm_moe_job *jobs, int n_jobs,
                          const float *x, int64_t n_embd, int64_t n_ff, float *out, hm_scratch *scratch,
                          int64_t n_pairs) {
    moe_ctx c;
    memset(&c, 0, sizeof c);
    c.act = act;
    c.limit = limit;
    hm_bump b = hm_bump_init(scratch);
    int32_t *active = hm_bump_take(&b, ((size_t)n_pairs + 1) * sizeof(int32_t));
    float *pair_w = hm_bump_take(&b, ((size_t)n_pairs + 1) * sizeof(float));
    c.pool = pool;
    c.jobs = jobs;
    c.x = x;
    c.out = out;
    c.n_batch = 1;
    c.n_embd = n_embd;
    c.n_ff = n_ff;
    c.n_pairs = n_pairs;
    int32_t na = 0;
    size_t hq_stride = 0;
    for (int j = 0; j < n_jobs; j++) {
        const hm_moe_job *jb = &jobs[j];
        if (jb->n_tok <= 0) continue;
        HM_ASSERT(jb->n_tok == 1 && jb->tok[0] == 0);
        pair_w[na] = jb->w[0];
        active[na++] = j;
        note_job(&c, jb, n_embd, n_ff, &hq_stride);
    }
    c.active = active;
    c.n_active = na;
    c.pair_w = pair_w;
    take_buffers(&c, &b, 1, n_pairs, hq_stride);
    quantize_x(&c, 0, 1);
    hm_pool_run(pool, moe_one_task, &c);
}

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

void hm_cpu_moe_act(hm_pool *pool, hm_cpu_act act, const hm_moe_job *jobs, int n_jobs, const float *x,
                    int64_t n_batch, int64_t n_embd, int64_t n_ff, float *out, hm_scratch *scratch) {
    hm_cpu_moe_act_lim(pool, act, 0.0f, jobs, n_jobs, x, n_batch, n_embd, n_ff, out, scratch);
}

void hm_cpu_moe_act_lim(hm_pool *pool, hm_cpu_act act, float limit, const hm_moe_job *jobs, int n_jobs,
                        const float *x, int64_t n_batch, int64_t n_embd, int64_t n_ff, float *out,
                        hm_scratch *scratch) {
    moe_ctx c;
    memset(&c, 0, sizeof c);
    c.act = act;
    c.limit = limit;
    int64_t n_pairs = 0;
    bool one_pair_each = true;
    for (int j = 0; j < n_jobs; j++) {
        n_pairs += jobs[j].n_tok;
        one_pair_each &= jobs[j].n_tok <= 1;
    }
    if (n_pairs == 0) return;
    if (n_batch == 1 && one_pair_each && one_token_path) {
        moe_one_token(pool, act, limit, jobs, n_jobs, x, n_embd, n_ff, out, scratch, n_pairs);
        return;
    }
    hm_bump b = hm_bump_init(scratch);
    int32_t *active = hm_bump_take(&b, ((size_t)n_pairs + 1) * sizeof(int32_t));
    int32_t *off = hm_bump_take(&b, ((size_t)n_pairs + 1) * sizeof(int32_t));
    int32_t *tok_pairs = hm_bump_take(&b, ((size_t)n_pairs + 1) * sizeof(int32_t));
    float *pair_w = hm_bump_take(&b, ((size_t)n_pairs + 1) * sizeof(float));
    const float **pair_db = hm_bump_take(&b, ((size_t)n_pairs + 1) * sizeof(float *));
    bool any_db = false;
    int32_t *tok_start = hm_bump_take(&b, ((size_t)n_batch + 1) * sizeof(int32_t));
    c.pool = pool;
    c.jobs = jobs;
    c.x = x;
    c.out = out;
    c.n_batch = n_batch;
    c.n_embd = n_embd;
    c.n_ff = n_ff;
    c.n_pairs = n_pairs;
    /* active jobs, pair offsets, partner types, per-token pair lists (counting sort by token) */
    memset(tok_start, 0, ((size_t)n_batch + 1) * sizeof(int32_t));
    int32_t na = 0, acc = 0;
    size_t hq_stride = 0;
    for (int j = 0; j < n_jobs; j++) {
        const hm_moe_job *jb = &jobs[j];
        if (jb->n_tok <= 0) continue;
        note_job(&c, jb, n_embd, n_ff, &hq_stride);
        active[na] = j;
        off[na++] = acc;
        acc += jb->n_tok;
        for (int32_t i = 0; i < jb->n_tok; i++) {
            HM_ASSERT(jb->tok[i] >= 0 && jb->tok[i] < n_batch);
            tok_start[jb->tok[i] + 1]++;
        }
    }
    off[na] = acc;
    c.active = active;
    c.off = off;
    c.n_active = na;
    for (int64_t t = 0; t < n_batch; t++) tok_start[t + 1] += tok_start[t];
    {
        int32_t *cur = hm_bump_take(&b, ((size_t)n_batch + 1) * sizeof(int32_t));
        memcpy(cur, tok_start, ((size_t)n_batch + 1) * sizeof(int32_t));
        for (int32_t a = 0; a < na; a++) {
            const hm_moe_job *jb = &jobs[active[a]];
            for (int32_t i = 0; i < jb->n_tok; i++) {
                tok_pairs[cur[jb->tok[i]]++] = off[a] + i;
                pair_w[off[a] + i] = jb->w[i];
                pair_db[off[a] + i] = jb->down_b;
                any_db |= jb->down_b != NULL;
            }
        }
    }
    c.tok_start = tok_start;
    c.tok_pairs = tok_pairs;
    c.pair_w = pair_w;
    c.pair_db = any_db ? pair_db : NULL;
    take_buffers(&c, &b, n_batch, n_pairs, hq_stride);
    /* row chunks: >= ~4 items per thread overall, more rows per item when a job has many tokens */
    const int nth = hm_pool_size(pool);
    int64_t want = (int64_t)nth * 4;
    c.cr_a = clamp64(n_ff * na / want, 8, n_pairs / na >= 16 ? 64 : 32);
    c.cr_b = clamp64(n_embd * na / want, 8, n_pairs / na >= 16 ? 64 : 32);
    c.items_a_per_job = (n_ff + c.cr_a - 1) / c.cr_a;
    c.items_b_per_job = (n_embd + c.cr_b - 1) / c.cr_b;
    if (n_batch < nth || nth == 1) {
        quantize_x(&c, 0, n_batch);
        c.pre_quantized = 1;
    }
    atomic_init(&c.next_a, nth);
    atomic_init(&c.next_b, nth);
    hm_pool_run(pool, moe_task, &c);
}

void hm_cpu_moe(hm_pool *pool, const hm_moe_job *jobs, int n_jobs, const float *x, int64_t n_batch,
                int64_t n_embd, int64_t n_ff, float *out, hm_scratch *scratch) {
    hm_cpu_moe_act(pool, HM_CPU_ACT_SILU, jobs, n_jobs, x, n_batch, n_embd, n_ff, out, scratch);
}
