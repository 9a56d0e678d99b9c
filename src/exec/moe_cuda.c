/* moe_cuda.c - the hybrid MoE step of a GPU placement (moe.h, hm_moe_forward_gpu): the layer's
 * HOT units (landed in a VRAM slot) in one grouped GPU launch, the others on the CPU threads at
 * the same time, their sum added on the device. CUDA builds only.
 *
 * Prefill streaming (below stream_pick): the heaviest cold units of a prefill layer are copied up
 * into a small pool of the device while the CPU computes the rest, then run in a second launch.
 *
 * Order of work (the overlap is the point): the hot launch is queued first (hm_cuda_moe stages
 * its routing tables on the host and returns), then the CPU threads compute the cold units while
 * the GPU runs, then the cold sum goes up on the compute stream (after the hot launch) and is
 * added into the residual. Nothing here waits for the device.
 *
 * Decode (n_tok <= 8) splits the step in two (hm_moe_forward_gpu_dev / _cold): the hot units run
 * from the router's ids on the device through a per-layer slot table (hm_moe_gpu_slot_table,
 * refreshed when the store's slot map changes), so a layer with no cold unit needs no host round
 * trip at all; the cold units then run here as above from the downloaded routing.
 *
 * Several devices (model_gpu.h): everything for a layer runs on the device of that layer, and a
 * unit counts as hot only in a slot of that device (hm_gpu_slot_local). A unit in another
 * device's slot (a peer unit) is computed there at the same time as the CPU's cold units: the
 * layer's input rows (already in pinned host memory for the CPU) go up to it, its grouped launch
 * sums them, the sum comes down and joins the CPU's cold sum, which the layer's device adds as
 * before (also inside the decode graph: hm_moe_gpu_cold_host). */
#include <stddef.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_gemma.h"
#include "backend/cuda/cuda_ops.h"
#include "experts/tier_vram.h"
#include "core/timer.h"
#include "model/model.h"
#include "exec_cuda_impl.h"
#include "model_gpu.h"
#include "moe.h"
#include "quant/quant.h"

const char *hm_moe_gpu_unfit(const hm_moe_weights *mw) {
    if (mw->act != HM_MOE_ACT_SILU && mw->act != HM_MOE_ACT_GELU && mw->act != HM_MOE_ACT_SWIGLU_OAI)
        return "an activation the CUDA kernels do not compute";
    if (mw->act_limit > 0.0f && mw->act != HM_MOE_ACT_SILU)
        return "a clamp on an activation other than SiLU (the CUDA kernels clamp SwiGLU only)";
    if (mw->gate.type != mw->up.type || !hm_cuda_type_ok(mw->gate.type) || !hm_cuda_type_ok(mw->down.type))
        return "an expert tensor type the CUDA kernels do not compute";
    /* what the grouped kernels take (cuda_moe.cu, moe_widths_ok): widths in multiples of 32 (a
     * lane's groups of 8, float4 rows) and of each part's block; the int8 paths that need rows of
     * whole Q8_K blocks only run for the K-quants, whose block is 256 anyway (gpt-oss: 2880) */
    if (mw->n_embd % 32 || mw->n_embd % hm_type_get(mw->gate.type)->blck_size)
        return "n_embd is not a multiple of 32 and of the gate/up parts' block";
    if (mw->n_ff % 32 || mw->n_ff % hm_type_get(mw->down.type)->blck_size)
        return "n_ff is not a multiple of 32 and of the down part's block";
    return NULL;
}

/* Whether the grouped kernel can compute this layer's units (else every unit is cold). */
static bool gpu_computes(const hm_gpu *g, const hm_moe_weights *mw) { return g->hot.part && !hm_moe_gpu_unfit(mw); }

/* The kernels' activation flag of mw's units. */
static int cuda_act(const hm_moe_weights *mw) {
    return mw->act == HM_MOE_ACT_GELU ? HM_CUDA_ACT_GELU : mw->act == HM_MOE_ACT_SWIGLU_OAI ? HM_CUDA_ACT_SWIGLU_OAI
                                                                                           : HM_CUDA_ACT_SILU;
}

/* The slot of a unit of mw's layer as that layer's device computes it: its store slot when it is on
 * that device (model_gpu.h, hm_gpu_slot_local), else -1 (computed as a cold unit). */
static int32_t local_slot(const hm_gpu *g, const hm_moe_weights *mw, int32_t slot) {
    return slot >= 0 && hm_gpu_slot_local(g, mw->layer, slot) ? slot : -1;
}

/* The context of the device that runs mw's layer. */
static hm_cuda_ctx *layer_ctx(const hm_gpu *g, const hm_moe_weights *mw) {
    return g->dev[hm_gpu_layer_dev(g, mw->layer)].ctx;
}

bool hm_moe_gpu_all_hot(const hm_model *m, const hm_moe_weights *mw) {
    if (!m->gpu || !m->experts || !gpu_computes(m->gpu, mw)) return false;
    const int32_t *smap = hm_experts_slot_map(m->experts, mw->layer);
    if (!smap) return false;
    for (int32_t e = 0; e < mw->n_expert; e++)
        if (local_slot(m->gpu, mw, smap[e]) < 0) return false;
    return true;
}

/* The parts of the unit in slot `slot` of tier t as the kernels take them. */
static void tier_parts(const hm_tier *t, int32_t slot, ptrdiff_t up_off, const void **gate, const void **up,
                       const void **down) {
    const void *gu = t->part(t->ctx, slot, HM_UNIT_GATE_UP);
    if (gu) {
        *gate = gu;
        *up = (const char *)gu + up_off;
    } else {
        *gate = t->part(t->ctx, slot, HM_UNIT_GATE);
        *up = t->part(t->ctx, slot, HM_UNIT_UP);
    }
    *down = t->part(t->ctx, slot, HM_UNIT_DOWN);
}

/* The hot part of unit (store slot) as the kernels take it. */
static void slot_parts(const hm_gpu *g, int32_t slot, ptrdiff_t up_off, const void **gate, const void **up,
                       const void **down) {
    tier_parts(&g->hot, slot, up_off, gate, up, down);
}

static bool has_bias(const hm_moe_weights *mw) { return mw->gate_b || mw->up_b || mw->down_b; }

/* Expert e's biases on its layer's device (the upload pass put them there, exec_upload_cuda.c's
 * experts op), NULL where mw has none. */
static void unit_bias(const hm_gpu *g, const hm_moe_weights *mw, int32_t e, const float **gb, const float **ub,
                      const float **db) {
    const int32_t dev = hm_gpu_layer_dev(g, mw->layer);
    const float *v[3] = {mw->gate_b, mw->up_b, mw->down_b};
    const float **out[3] = {gb, ub, db};
    const int64_t w[3] = {mw->n_ff, mw->n_ff, mw->n_embd};
    for (int i = 0; i < 3; i++) {
        const hm_xw *x = v[i] ? hm_xmap_find(g->arch, v[i], dev) : NULL;
        HM_ASSERT(!v[i] || x);
        *out[i] = x ? x->v + (size_t)e * (size_t)w[i] : NULL;
    }
}

/* The cost rule for a peer unit: the peer path costs a fixed round trip (the layer's rows up to
 * its device, a launch, the sum down, a sync: tens of microseconds, paid once per layer and device)
 * while the CPU's cost of a unit grows with the tokens routed to it. Measured on two H200s
 * (bench/multi_gpu.sh, qwen36-geom Q4_K_M, 6 + 6 GiB): at one token a unit (decode) the peer path
 * LOST (tg128 242 t/s vs 254 with every such unit on the CPU), at a 512-token prefill it won (pp512
 * 1816 vs 1688). So a peer unit runs on its device when at least this many tokens route to it,
 * else on the CPU like a cold one. */
#define HM_PEER_MIN_TOK 2

/* The route's units, split three ways: hot ones (in a slot of the layer's device) into b->units
 * (when want_hot) and the count *n_hot; peer ones (in another device's slot) into
 * g->peer_work[0..*n_peer) with their device in g->peer_work_dev; cold ones as CPU jobs into
 * r->jobs (from the file mapping), their experts and token counts into r->tier_unit / r->tier_ntok
 * in the same order (for the RAM tier: hm_moe_run_cold), returned. A peer unit with fewer than
 * HM_PEER_MIN_TOK tokens is a cold one. */
static int32_t split_units(const hm_model *m, const hm_moe_weights *mw, hm_moe_route *r, const hm_moe_gpu_buf *b,
                           bool want_hot, int *n_hot_out, int *n_peer_out) {
    const hm_gpu *g = m->gpu;
    const int32_t *smap = m->experts && gpu_computes(g, mw) ? hm_experts_slot_map(m->experts, mw->layer) : NULL;
    /* a fused gate_up part: up lies this far into it (as in the file) */
    const ptrdiff_t up_off = (const char *)mw->up.data - (const char *)mw->gate.data;
    int n_hot = 0, n_peer = 0;
    int32_t n_cold = 0;
    for (int32_t i = 0; i < r->n_units; i++) {
        const int32_t e = r->unit[i], any = smap ? smap[e] : -1, slot = local_slot(g, mw, any);
        const int32_t *tok = r->tok + r->start[i];
        const float *w = r->w + r->start[i];
        const int32_t nt = r->start[i + 1] - r->start[i];
        /* (the biases live on the layer's device only: a biased layer's peer units run on the CPU) */
        const int32_t peer_dev = slot < 0 && any >= 0 && g->peer_units && nt >= HM_PEER_MIN_TOK && !has_bias(mw)
                                     ? hm_gpu_slot_dev(g, any)
                                     : -1;
        if (slot >= 0 || peer_dev >= 0) {
            if (slot >= 0 && !want_hot) continue;
            hm_cuda_moe_unit *u = slot >= 0 ? &b->units[n_hot++] : &g->peer_work[n_peer];
            if (slot < 0) g->peer_work_dev[n_peer++] = peer_dev;
            slot_parts(g, any, up_off, &u->gate, &u->up, &u->down);
            unit_bias(g, mw, e, &u->gate_b, &u->up_b, &u->down_b);
            u->tok_host = tok;
            u->w_host = w;
            u->n_tok = nt;
        } else {
            r->tier_unit[n_cold] = e;
            r->tier_ntok[n_cold] = nt;
            hm_moe_job *j = &r->jobs[n_cold++];
            hm_moe_job_unit(mw, e, j);
            j->tok = tok;
            j->w = w;
            j->n_tok = nt;
        }
    }
    *n_hot_out = n_hot;
    *n_peer_out = n_peer;
    return n_cold;
}

/* Queue device d's share of the n_peer peer units found (grouped into g->peer_work + n_expert):
 * x_host's n_tok rows up, the grouped launch, the sum down into its pinned peer_out_h. Leaves d's
 * device current. *queued: something was queued (the caller collects it). */
static hm_status peer_queue(const hm_model *m, const hm_moe_weights *mw, int32_t d, int n_peer, const float *x_host,
                            int64_t n_tok, bool *queued, hm_err *err) {
    hm_gpu *g = m->gpu;
    hm_gpu_dev *dv = &g->dev[d];
    hm_cuda_moe_unit *grp = g->peer_work + mw->n_expert;
    int n = 0;
    for (int i = 0; i < n_peer; i++)
        if (g->peer_work_dev[i] == d) grp[n++] = g->peer_work[i];
    *queued = false;
    if (n == 0) return HM_OK;
    if (n_tok > dv->peer_rows)
        return hm_errf(err, HM_ERR_ARG, "gpu %d: %lld rows for peer units, room for %lld (hm_gpu_peer_reserve)",
                       (int)dv->ordinal, (long long)n_tok, (long long)dv->peer_rows);
    const size_t bytes = (size_t)n_tok * (size_t)mw->n_embd * sizeof(float);
    hm_status st;
    if ((st = hm_cuda_make_current(dv->ctx, err)) != HM_OK) return st;
    *queued = true;
    if ((st = hm_cuda_upload_compute(dv->ctx, dv->peer_x, x_host, bytes, err)) != HM_OK) return st;
    if ((st = hm_cuda_memset(dv->ctx, dv->peer_out, 0, bytes, err)) != HM_OK) return st;
    if ((st = hm_cuda_moe_act_lim(dv->ctx, grp, n, mw->gate.type, mw->down.type, cuda_act(mw), mw->act_limit,
                                  dv->peer_x, n_tok, mw->n_embd, mw->n_ff, dv->peer_out, dv->peer_scratch,
                                  dv->peer_scratch_size, err)) != HM_OK)
        return st;
    return hm_cuda_download_async(dv->ctx, dv->peer_out_h, dv->peer_out, bytes, err);
}

/* Everything but the hot launch: cold_host = the n_cold CPU jobs of r on x_host (through the RAM
 * tier when there is one: hm_moe_run_cold) + the n_peer peer units, computed on their devices
 * while the CPU works. Ends with the layer's device current. */
static hm_status cold_and_peer(const hm_model *m, hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *r,
                               int32_t n_cold, int n_peer, const float *x_host, float *cold_host, hm_scratch *scratch,
                               hm_err *err) {
    hm_gpu *g = m->gpu;
    const size_t n = (size_t)r->n_tok * (size_t)mw->n_embd;
    bool queued[HM_MAX_GPUS] = {false};
    hm_status st = HM_OK;
    for (int32_t d = 0; n_peer > 0 && st == HM_OK && d < g->n_dev; d++)
        st = peer_queue(m, mw, d, n_peer, x_host, r->n_tok, &queued[d], err);
    memset(cold_host, 0, n * sizeof(float));
    if (st == HM_OK && n_cold > 0) st = hm_moe_run_cold(m, pool, mw, r, n_cold, x_host, cold_host, scratch, err);
    for (int32_t d = 0; d < g->n_dev; d++) { /* every queued share is waited for, also after a failure */
        if (!queued[d]) continue;
        hm_err e;
        const hm_status ws = hm_cuda_sync(g->dev[d].ctx, &e);
        if (ws != HM_OK && st == HM_OK) {
            st = ws;
            if (err) *err = e;
        }
        if (st != HM_OK) continue;
        const float *p = g->dev[d].peer_out_h;
        for (size_t i = 0; i < n; i++) cold_host[i] += p[i];
    }
    hm_err e;
    const hm_status cs = hm_cuda_make_current(layer_ctx(g, mw), &e);
    if (cs != HM_OK && st == HM_OK) {
        st = cs;
        if (err) *err = e;
    }
    return st;
}

/* The CPU part and the peer units: their sum (cold_and_peer) up and added into b->out_dev. */
static hm_status cold_part(const hm_model *m, hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *r,
                           int32_t n_cold, int n_peer, const hm_moe_gpu_buf *b, hm_scratch *scratch, hm_err *err) {
    hm_cuda_ctx *c = layer_ctx(m->gpu, mw);
    if (n_cold == 0 && n_peer == 0) return HM_OK;
    HM_ASSERT(b->x_host);
    const size_t n = (size_t)r->n_tok * (size_t)mw->n_embd;
    hm_status st = cold_and_peer(m, pool, mw, r, n_cold, n_peer, b->x_host, b->cold_host, scratch, err);
    if (st != HM_OK) return st;
    if ((st = hm_cuda_upload_compute(c, b->cold_dev, b->cold_host, n * sizeof(float), err)) != HM_OK) return st;
    return hm_cuda_add(c, b->out_dev, b->cold_dev, b->out_dev, (int64_t)n, err);
}

/* ---- prefill streaming (model_gpu.h: hm_gpu_dev.stream) ----
 *
 * A prefill layer's cold units could each run on the CPU or be copied up and run on the GPU. The
 * copies go through the streaming pool's copier thread (staging memcpy from the file mapping, then
 * the upload) while the CPU threads compute the units that stay, so the layer takes about
 * max(copy time of the streamed units, CPU time of the rest). The cost model picks the units in
 * order of routed tokens, most first, while the copies so far still end before the CPU's share
 * does. Its two rates, measured on the H200 box (16 threads; qwen36-geom Q4_K_M units of 1.95 MiB):
 *   - copy: the rate the pool's copier has sustained so far (its staged bytes over its time, once
 *     it has moved HM_STREAM_RATE_MIN_MIB), until then 164 us per MiB (the VRAM tier moved 102.7 MB
 *     in 16 ms with one staging thread, test_cuda_tier_gpu); with --mlock 40 us per MiB (below);
 *   - CPU: pp512 with every expert on the CPU, 265.9 t/s over 40 layers of 4096 routed pairs
 *     (docs/PERFORMANCE.md): 11.8 us a (token, unit) pair, 6.05 us per token per MiB.
 * Both scale with the unit's bytes, so the choice depends only on the token counts. The copies
 * start behind the copier's backlog (what was queued before, at the same rate: streaming ahead
 * queues the next layer's units behind this layer's), so a full queue takes fewer units.
 *
 * Double-buffered: layer il uses half il & 1 of the pool. When the arch predicts layer il+1's
 * routing on layer il's input (its router applied one layer early, b->next_ids), the next layer's
 * heavy cold units are queued behind this layer's copies into the other half (stream_ahead), so
 * the copier keeps working through this layer's CPU work and the next layer's attention; at layer
 * il+1 those that were routed cost no copy (stream_pick). A half is refilled only two layers
 * later, after the prefill path's routing waits of the layers between: no launch still reads it. */
#define HM_STREAM_COPY_US_PER_MIB 164.0
/* With --mlock (model_gpu.h's pinned) a copy is one DMA from the mapping: PCIe 4.0 x16 moves about
 * 25 GB/s (40 us per MiB); faster links only make the model conservative. */
#define HM_STREAM_COPY_DIRECT_US_PER_MIB 40.0
#define HM_STREAM_RATE_MIN_MIB 64.0
#define HM_STREAM_CPU_US_PER_TOK_MIB 6.05
#define HM_STREAM_MAX_UNITS 1024 /* the CUDA router's expert bound */

/* Sort idx[0..n) by tok[idx[i]], most first (insertion sort: one layer's units). */
static void by_tokens(int32_t *idx, int32_t n, const int32_t *tok) {
    for (int32_t i = 1; i < n; i++) {
        const int32_t v = idx[i];
        int32_t j = i;
        while (j > 0 && tok[idx[j - 1]] < tok[v]) idx[j] = idx[j - 1], j--;
        idx[j] = v;
    }
}

/* The copy rate of dv's pool for the cost model (above). Direct copies are asynchronous DMAs the
 * copier only queues, so its time says nothing about them: those keep the constant. */
static double copy_us_per_mib(const hm_gpu *g, const hm_gpu_dev *dv) {
    if (g->pinned) return HM_STREAM_COPY_DIRECT_US_PER_MIB;
    hm_vram_tier_stats ts;
    hm_vram_tier_get_stats(dv->stream, &ts);
    const double mib = (double)ts.staged_bytes / (1024.0 * 1024.0);
    return mib >= HM_STREAM_RATE_MIN_MIB ? ts.staged_seconds * 1e6 / mib : HM_STREAM_COPY_US_PER_MIB;
}

/* The copier's queue of dv, by the model's rate: us until the copies queued so far have landed. */
static double copy_backlog(const hm_gpu_dev *dv) {
    const double left = (double)(dv->stream_busy_until - hm_time_us());
    return left > 0 ? left : 0;
}

/* n copies of mib each were queued on dv's copier now, at copy_us per MiB. */
static void copy_queued(hm_gpu_dev *dv, int32_t n, double mib, double copy_us) {
    const int64_t now = hm_time_us(), start = dv->stream_busy_until > now ? dv->stream_busy_until : now;
    dv->stream_busy_until = start + (int64_t)((double)n * mib * copy_us);
}

/* How many of the n units idx[] (sorted by tok, most first) to copy up, at most cap: while the
 * copies (copy_us per MiB), behind the copier's backlog (us), end before the CPU's share of the
 * rest (mode 1, 3), or as many as fit (mode 2). */
static int32_t stream_count(const hm_gpu *g, const int32_t *idx, int32_t n, const int32_t *tok, double mib,
                            int32_t cap, double backlog, double copy_us) {
    const int32_t mode = g->stream_mode;
    double cpu = 0, copy = backlog;
    for (int32_t i = 0; i < n; i++) cpu += tok[idx[i]] * mib * HM_STREAM_CPU_US_PER_TOK_MIB;
    int32_t k = 0;
    for (; k < n && k < cap; k++) {
        const double c_cpu = tok[idx[k]] * mib * HM_STREAM_CPU_US_PER_TOK_MIB, c_copy = mib * copy_us;
        if (mode != 2 && copy + c_copy > cpu - c_cpu) break;
        copy += c_copy;
        cpu -= c_cpu;
    }
    return k;
}

/* Queue expert e of mw's layer into slot `slot` of dv's pool. */
static hm_status stream_fill(const hm_model *m, hm_gpu_dev *dv, const hm_moe_weights *mw, int32_t e, int32_t slot,
                             hm_err *err) {
    const hm_unit_ref ref = hm_unit_ref_of(&m->units, mw->layer, e);
    hm_status st = dv->stream_t.fill(dv->stream_t.ctx, &ref, slot, err);
    if (st != HM_OK) return st;
    dv->stream_expert[slot] = e;
    m->gpu->stream_units++;
    m->gpu->stream_bytes += ref.bytes;
    return HM_OK;
}

bool hm_moe_gpu_streams(const hm_model *m, int32_t il) {
    const hm_gpu *g = m->gpu;
    return g && (g->stream_mode == 1 || g->stream_mode == 2) && g->dev[hm_gpu_layer_dev(g, il)].stream;
}

/* The units to stream of layer mw->layer: out of the *n_cold cold jobs of r (the rest keep their
 * order; *n_cold becomes their count), those copied ahead into the layer's half (free) and, by the
 * cost model, more into the half's free slots (queued now); put, as the kernels take them, into
 * units[0..*n_str), their slots into slots[0..*n_str). */
static hm_status stream_pick(const hm_model *m, hm_gpu_dev *dv, const hm_moe_weights *mw, hm_moe_route *r,
                             int32_t *n_cold_io, hm_cuda_moe_unit *units, int32_t *slots, int *n_str, hm_err *err) {
    const int32_t n_cold = *n_cold_io < HM_STREAM_MAX_UNITS ? *n_cold_io : HM_STREAM_MAX_UNITS;
    const int32_t half = mw->layer & 1, base = half * dv->stream_half;
    *n_str = 0;
    if (dv->stream_layer[half] != mw->layer) { /* nothing came ahead for this layer */
        dv->stream_layer[half] = mw->layer;
        dv->stream_n[half] = 0;
    }
    const int32_t n_pre = dv->stream_n[half];
    int32_t slot_of[HM_STREAM_MAX_UNITS], idx[HM_STREAM_MAX_UNITS], n_new_cand = 0;
    for (int32_t i = 0; i < n_cold; i++) {
        slot_of[i] = -1;
        for (int32_t s = base; s < base + n_pre; s++)
            if (dv->stream_expert[s] == r->tier_unit[i]) slot_of[i] = s;
        if (slot_of[i] < 0) idx[n_new_cand++] = i;
    }
    by_tokens(idx, n_new_cand, r->tier_ntok);
    const double mib = (double)m->units.layers[mw->layer].unit_bytes / (1024.0 * 1024.0);
    const double copy_us = copy_us_per_mib(m->gpu, dv);
    const int32_t n_new = stream_count(m->gpu, idx, n_new_cand, r->tier_ntok, mib, dv->stream_half - n_pre,
                                       copy_backlog(dv), copy_us);
    copy_queued(dv, n_new, mib, copy_us);
    hm_status st;
    for (int32_t j = 0; j < n_new; j++) { /* queued first: the copier starts on them now */
        const int32_t i = idx[j], s = base + dv->stream_n[half]++;
        if ((st = stream_fill(m, dv, mw, r->tier_unit[i], s, err)) != HM_OK) return st;
        slot_of[i] = s;
    }
    const ptrdiff_t up_off = (const char *)mw->up.data - (const char *)mw->gate.data;
    int32_t left = 0;
    for (int32_t i = 0; i < *n_cold_io; i++) {
        if (i < n_cold && slot_of[i] >= 0) {
            hm_cuda_moe_unit *u = &units[*n_str];
            slots[(*n_str)++] = slot_of[i];
            tier_parts(&dv->stream_t, slot_of[i], up_off, &u->gate, &u->up, &u->down);
            unit_bias(m->gpu, mw, r->tier_unit[i], &u->gate_b, &u->up_b, &u->down_b);
            u->tok_host = r->jobs[i].tok;
            u->w_host = r->jobs[i].w;
            u->n_tok = r->jobs[i].n_tok;
            continue;
        }
        r->jobs[left] = r->jobs[i];
        r->tier_unit[left] = r->tier_unit[i];
        r->tier_ntok[left] = r->tier_ntok[i];
        left++;
    }
    m->gpu->stream_ahead_used += (uint64_t)(*n_str - n_new);
    *n_cold_io = left;
    return HM_OK;
}

/* Queue the copies of layer next's predicted heavy cold units (ids: its routing predicted on this
 * layer's n_tok rows, k each) into its half of dv's pool, behind this layer's own copies. */
static hm_status stream_ahead(const hm_model *m, hm_gpu_dev *dv, const hm_moe_weights *next, const int32_t *ids,
                              int64_t n_tok, int k, hm_err *err) {
    const hm_gpu *g = m->gpu;
    const int32_t ne = next->n_expert < HM_STREAM_MAX_UNITS ? next->n_expert : HM_STREAM_MAX_UNITS;
    int32_t count[HM_STREAM_MAX_UNITS] = {0}, idx[HM_STREAM_MAX_UNITS], n = 0;
    for (int64_t i = 0; i < n_tok * k; i++)
        if (ids[i] >= 0 && ids[i] < ne) count[ids[i]]++;
    /* units with any store slot are the store's (hot here, or peer units) */
    const int32_t *smap = m->experts ? hm_experts_slot_map(m->experts, next->layer) : NULL;
    for (int32_t e = 0; e < ne; e++)
        if (count[e] > 0 && (!smap || smap[e] < 0)) idx[n++] = e;
    by_tokens(idx, n, count);
    const double mib = (double)m->units.layers[next->layer].unit_bytes / (1024.0 * 1024.0);
    const double copy_us = copy_us_per_mib(g, dv);
    const int32_t take = stream_count(g, idx, n, count, mib, dv->stream_half, copy_backlog(dv), copy_us);
    copy_queued(dv, take, mib, copy_us);
    const int32_t half = next->layer & 1;
    dv->stream_layer[half] = next->layer;
    dv->stream_n[half] = 0;
    for (int32_t j = 0; j < take; j++) {
        hm_status st = stream_fill(m, dv, next, idx[j], half * dv->stream_half + dv->stream_n[half]++, err);
        if (st != HM_OK) return st;
    }
    m->gpu->stream_ahead += (uint64_t)take;
    return HM_OK;
}

/* Block until the n slots' copies have landed. A copy error never lands: after a while the tier's
 * own wait, which reports it (and otherwise waits for every copy queued), decides. */
static hm_status stream_wait(hm_gpu_dev *dv, const int32_t *slots, int n, hm_err *err) {
    const struct timespec pause = {0, 20000};
    for (int i = 0, spins = 0; i < n; i++)
        while (!dv->stream_t.ready(dv->stream_t.ctx, slots[i])) {
            if (++spins > 10000) return hm_vram_tier_wait(dv->stream, err); /* ~0.2 s */
            nanosleep(&pause, NULL);
        }
    return HM_OK;
}

hm_status hm_moe_forward_gpu(const hm_model *m, hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *r,
                             const hm_moe_gpu_buf *b, hm_scratch *scratch, hm_err *err) {
    hm_gpu *g = m->gpu;
    HM_ASSERT(g);
    int n_hot = 0, n_peer = 0, n_str = 0;
    int32_t n_cold = split_units(m, mw, r, b, true, &n_hot, &n_peer);
    hm_gpu_dev *dv = &g->dev[hm_gpu_layer_dev(g, mw->layer)];
    hm_cuda_ctx *c = dv->ctx;
    hm_status st;
    const bool streams = dv->stream && g->stream_mode && gpu_computes(g, mw);
    int32_t str_slots[HM_STREAM_MAX_UNITS];
    /* this layer's heaviest cold units first, then the next layer's predicted ones (the copier
     * takes them in that order) */
    if (streams && n_cold > 0 &&
        (st = stream_pick(m, dv, mw, r, &n_cold, b->units + n_hot, str_slots, &n_str, err)) != HM_OK)
        return st;
    if (streams && b->next_mw && b->next_ids && (g->stream_mode == 1 || g->stream_mode == 2) &&
        hm_gpu_layer_dev(g, b->next_mw->layer) == hm_gpu_layer_dev(g, mw->layer) &&
        (st = stream_ahead(m, dv, b->next_mw, b->next_ids, r->n_tok, r->k, err)) != HM_OK)
        return st;
    if (n_hot > 0 &&
        (st = hm_cuda_moe_act_lim(c, b->units, n_hot, mw->gate.type, mw->down.type, cuda_act(mw), mw->act_limit,
                                  b->x_dev, r->n_tok, mw->n_embd, mw->n_ff, b->out_dev, b->scratch_dev,
                                  b->scratch_dev_size, err)) != HM_OK)
        return st;
    /* the CPU part and the peer units, while the hot launch runs and the streamed units go up */
    if ((st = cold_part(m, pool, mw, r, n_cold, n_peer, b, scratch, err)) != HM_OK || n_str == 0) return st;
    /* the streamed units, once landed, in a second launch (after the first on the same stream) */
    if ((st = stream_wait(dv, str_slots, n_str, err)) != HM_OK) return st;
    if (g->stream_mode == 3) dv->stream_busy_until = hm_time_us(); /* nothing queued behind them */
    return hm_cuda_moe_act_lim(c, b->units + n_hot, n_str, mw->gate.type, mw->down.type, cuda_act(mw), mw->act_limit,
                               b->x_dev, r->n_tok, mw->n_embd, mw->n_ff, b->out_dev, b->scratch_dev,
                               b->scratch_dev_size, err);
}

bool hm_moe_gpu_slot_table(const hm_model *m, const hm_moe_weights *mw, int32_t *seen, hm_cuda_moe_slot *slots,
                           bool *all_hot, bool *any_hot) {
    const hm_gpu *g = m->gpu;
    HM_ASSERT(g);
    const int32_t *smap = m->experts && gpu_computes(g, mw) ? hm_experts_slot_map(m->experts, mw->layer) : NULL;
    const ptrdiff_t up_off = (const char *)mw->up.data - (const char *)mw->gate.data;
    bool changed = false, all = true, any = false;
    for (int32_t e = 0; e < mw->n_expert; e++) {
        const int32_t slot = smap ? local_slot(g, mw, smap[e]) : -1;
        if (slot >= 0) any = true;
        else all = false;
        if (slot == seen[e]) continue;
        changed = true;
        seen[e] = slot;
        hm_cuda_moe_slot *sl = &slots[e];
        if (slot < 0) {
            sl->gate = sl->up = sl->down = NULL;
            sl->gate_b = sl->up_b = sl->down_b = NULL;
            continue;
        }
        slot_parts(g, slot, up_off, &sl->gate, &sl->up, &sl->down);
        unit_bias(g, mw, e, &sl->gate_b, &sl->up_b, &sl->down_b);
        HM_ASSERT(sl->gate && sl->up && sl->down);
    }
    *all_hot = all;
    *any_hot = any;
    return changed;
}

hm_status hm_moe_forward_gpu_dev(const hm_model *m, const hm_moe_weights *mw, const hm_cuda_moe_slot *slots_dev,
                                 const int32_t *ids_dev, const float *w_dev, int64_t n_tok, int k,
                                 const hm_moe_gpu_buf *b, hm_err *err) {
    HM_ASSERT(m->gpu);
    hm_status st = hm_cuda_moe_dev_act_lim(layer_ctx(m->gpu, mw), slots_dev, mw->gate.type, mw->down.type,
                                           cuda_act(mw), mw->act_limit, ids_dev, w_dev, k, b->x_dev, n_tok,
                                           mw->n_embd, mw->n_ff, b->out_dev, b->scratch_dev, b->scratch_dev_size,
                                           err);
    if (st == HM_OK && mw->down_b)
        st = hm_cuda_moe_dev_down_bias(layer_ctx(m->gpu, mw), slots_dev, ids_dev, w_dev, k, n_tok, mw->n_embd,
                                       b->out_dev, err);
    return st;
}

hm_status hm_moe_forward_gpu_cold(const hm_model *m, hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *r,
                                  const hm_moe_gpu_buf *b, hm_scratch *scratch, hm_err *err) {
    HM_ASSERT(m->gpu);
    int n_hot = 0, n_peer = 0;
    const int32_t n_cold = split_units(m, mw, r, b, false, &n_hot, &n_peer);
    return cold_part(m, pool, mw, r, n_cold, n_peer, b, scratch, err);
}

hm_status hm_moe_gpu_layer_step(const hm_model *m, hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *route,
                                hm_scratch *scratch, const hm_moe_gpu_buf *b, bool dec, bool all_hot, bool any_hot,
                                const hm_cuda_moe_slot *slots_dev, const int32_t *ids_d, int32_t *ids_h, int64_t nr,
                                int k, hm_cuda_event *routed, hm_err *err) {
    hm_cuda_ctx *c = layer_ctx(m->gpu, mw);
    const size_t nk = (size_t)nr * (size_t)k, xb = (size_t)nr * (size_t)mw->n_embd * sizeof(float);
    const float *w_d = (const float *)(ids_d + nk), *w_h = (const float *)(ids_h + nk);
    hm_status st;
    if (dec) {
        if (!all_hot) {
            if ((st = hm_cuda_download_async(c, ids_h, ids_d, 2 * nk * sizeof(int32_t), err)) != HM_OK) return st;
            if ((st = hm_cuda_download_async(c, (void *)b->x_host, b->x_dev, xb, err)) != HM_OK) return st;
            if ((st = hm_cuda_event_record(c, routed, false, err)) != HM_OK) return st;
        }
        if (any_hot && (st = hm_moe_forward_gpu_dev(m, mw, slots_dev, ids_d, w_d, nr, k, b, err)) != HM_OK) return st;
        if (all_hot) return HM_OK;
        if ((st = hm_cuda_event_wait(routed, err)) != HM_OK) return st; /* the layer's one wait */
        hm_moe_route_build(route, ids_h, w_h, (int32_t)nr);
        return hm_moe_forward_gpu_cold(m, pool, mw, route, b, scratch, err);
    }
    if ((st = hm_cuda_download_async(c, ids_h, ids_d, 2 * nk * sizeof(int32_t), err)) != HM_OK) return st;
    if (!all_hot && (st = hm_cuda_download_async(c, (void *)b->x_host, b->x_dev, xb, err)) != HM_OK) return st;
    if ((st = hm_cuda_sync(c, err)) != HM_OK) return st; /* the layer's one wait: the host needs the routing */
    /* usage counts: the units this layer computes (only the wanted rows in the last layer) */
    if (m->experts) hm_experts_record(m->experts, mw->layer, ids_h, (int32_t)nk);
    hm_moe_route_build(route, ids_h, w_h, (int32_t)nr);
    return hm_moe_forward_gpu(m, pool, mw, route, b, scratch, err);
}

hm_status hm_moe_gpu_cold_host(const hm_model *m, hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *r,
                               const float *x_host, float *cold_host, hm_scratch *scratch, hm_err *err) {
    HM_ASSERT(m->gpu);
    int n_hot = 0, n_peer = 0;
    const hm_moe_gpu_buf b = {0};
    const int32_t n_cold = split_units(m, mw, r, &b, false, &n_hot, &n_peer);
    if (n_cold == 0 && n_peer == 0) {
        memset(cold_host, 0, (size_t)r->n_tok * (size_t)mw->n_embd * sizeof(float));
        return HM_OK;
    }
    /* through the RAM tier when there is one, and the peer units on their devices, as cold_part */
    return cold_and_peer(m, pool, mw, r, n_cold, n_peer, x_host, cold_host, scratch, err);
}
