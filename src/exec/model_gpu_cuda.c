/* model_gpu_cuda.c - opening a model's GPU placement (model_gpu.h): the devices (one, or the
 * layer split of gpu_split.h over several), the arch's dense upload, and the size of each
 * device's VRAM expert slot pool from the placement flags. CUDA builds only.
 *
 * Sizing (in this order): the dense weights go up first (their bytes are known only after the
 * arch's gpu_load); then the slots the flags ask for; then what fits: free VRAM minus the KV
 * cache of the context the sessions will ask for, an activation margin and the reserve. A pool
 * that fits only in part comes up smaller with a warning; the tier itself may come up smaller
 * still if an allocation fails (a warning again). Nothing here aborts for lack of VRAM except the
 * dense part, which must fit whole (an error naming the bytes). Later, a session whose device
 * state does not fit takes room back from the pool (hm_model_gpu_make_room: whole chunks of
 * slots, their units back to the CPU, a warning). With several devices all of this is per device
 * (its layers' KV cache, its budget), and the store sees the pools as one numbering through a
 * dispatching tier view (multi_fill / _ready / _part).
 *
 * At the end, the helpers the GPU forward (exec/exec_cuda.c) uses: named weight uploads, the session state's allocations (device, pinned) with the
 * same make_room rule, and the per-step slot table refresh and routing record. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "experts/tier_vram.h"
#include "core/alloc.h"
#include "core/timer.h"
#include "gpu_split.h"
#include "model/model.h"
#include "model_gpu.h"
#include "moe.h"
#include "quant/quant.h"

#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)
/* Activations, attention and MoE scratch of a session's device state, with room to spare. */
#define HM_GPU_ACT_MARGIN ((int64_t)512 << 20)

static hm_status track(hm_gpu *g, void *p, hm_err *err) {
    if (g->n_allocs == g->cap_allocs) {
        int32_t cap = g->cap_allocs ? 2 * g->cap_allocs : 64;
        hm_gpu_alloc *a = realloc(g->allocs, (size_t)cap * sizeof *a);
        if (!a) {
            hm_cuda_free(g->dev[g->up_dev].ctx, p);
            return hm_errf(err, HM_ERR_NOMEM, "gpu: out of host memory");
        }
        g->allocs = a;
        g->cap_allocs = cap;
    }
    g->allocs[g->n_allocs++] = (hm_gpu_alloc){p, g->up_dev};
    return HM_OK;
}

static hm_status upload(hm_gpu *g, const void *src, size_t bytes, void **out, const char *what, hm_err *err) {
    hm_gpu_dev *dv = &g->dev[g->up_dev];
    void *d = NULL;
    hm_status st = hm_cuda_alloc(dv->ctx, bytes, &d, err);
    if (st != HM_OK) {
        size_t fr = 0, tot = 0;
        hm_err e2;
        hm_cuda_mem_info(dv->ctx, &fr, &tot, &e2);
        return hm_errf(err, st, "gpu %d: no room for the dense weights (%s, %.1f MiB; %.1f MiB uploaded so far, "
                       "%.1f MiB free of %.1f)", (int)dv->ordinal, what, (double)bytes / MIB,
                       (double)dv->dense_bytes / MIB, (double)fr / MIB, (double)tot / MIB);
    }
    if ((st = track(g, d, err)) != HM_OK) return st;
    if ((st = hm_cuda_upload(dv->ctx, d, src, bytes, err)) != HM_OK) return st;
    dv->dense_bytes += bytes;
    g->dense_bytes += bytes;
    *out = d;
    return HM_OK;
}

hm_status hm_gpu_upload_mat(hm_gpu *g, const hm_mat *w, hm_cuda_mat *out, hm_err *err) {
    memset(out, 0, sizeof *out);
    if (!hm_cuda_type_ok(w->type))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "gpu: weights of type %s are not computed by the CUDA backend",
                       hm_type_name(w->type));
    void *d;
    hm_status st = upload(g, w->data, w->nb1 * (size_t)w->ne1, &d, hm_type_name(w->type), err);
    if (st != HM_OK) return st;
    out->data = d;
    out->type = w->type;
    out->ne0 = w->ne0;
    out->ne1 = w->ne1;
    out->nb1 = w->nb1;
    return HM_OK;
}

hm_status hm_gpu_upload_vec(hm_gpu *g, const float *v, int64_t n, float **out, hm_err *err) {
    *out = NULL;
    if (!v) return HM_OK;
    void *d;
    hm_status st = upload(g, v, (size_t)n * sizeof(float), &d, "f32 vector", err);
    if (st == HM_OK) *out = d;
    return st;
}

void hm_model_gpu_close(hm_model *m) {
    hm_gpu *g = m->gpu;
    if (!g) return;
    for (int32_t d = 0; d < g->n_dev; d++) { /* each waits for its fills in flight */
        hm_vram_tier_close(g->dev[d].vram);
        hm_vram_tier_close(g->dev[d].stream);
        free(g->dev[d].stream_expert);
    }
    if (m->arch && m->arch->gpu_unload) m->arch->gpu_unload(m);
    for (int32_t i = 0; i < g->n_allocs; i++) hm_cuda_free(g->dev[g->allocs[i].dev].ctx, g->allocs[i].p);
    free(g->allocs);
    if (g->pinned) hm_cuda_host_unregister(g->dev[0].ctx, g->pinned); /* no copy reads it: tiers closed */
    for (int32_t d = 0; d < g->n_dev; d++) {
        hm_gpu_dev *dv = &g->dev[d];
        hm_cuda_free(dv->ctx, dv->peer_x);
        hm_cuda_free(dv->ctx, dv->peer_out);
        hm_cuda_free(dv->ctx, dv->peer_scratch);
        hm_cuda_host_free(dv->ctx, dv->peer_out_h);
        hm_cuda_close(dv->ctx);
    }
    free(g->peer_work);
    free(g->peer_work_dev);
    free(g->layer_dev);
    free(g);
    m->gpu = NULL;
}

int32_t hm_gpu_slot_dev(const hm_gpu *g, int64_t slot) {
    for (int32_t d = 0; d < g->n_dev; d++)
        if (slot >= g->dev[d].slot0 && slot < g->dev[d].slot0 + g->dev[d].n_slots) return d;
    return -1;
}

hm_status hm_gpu_peer_reserve(const hm_model *m, int64_t rows, int64_t n_pairs, int64_t n_ff, hm_err *err) {
    hm_gpu *g = m->gpu;
    if (!g || !g->peer_units) return HM_OK;
    const int64_t E = m->info.n_embd;
    for (int32_t d = 0; d < g->n_dev; d++) {
        hm_gpu_dev *dv = &g->dev[d];
        if (dv->n_slots <= 0 || dv->peer_rows >= rows) continue;
        const size_t rb = (size_t)rows * (size_t)E * sizeof(float);
        const size_t ss = hm_cuda_moe_scratch_size(rows, n_pairs, m->units.n_expert, n_ff);
        hm_cuda_free(dv->ctx, dv->peer_x);
        hm_cuda_free(dv->ctx, dv->peer_out);
        hm_cuda_free(dv->ctx, dv->peer_scratch);
        hm_cuda_host_free(dv->ctx, dv->peer_out_h);
        dv->peer_x = dv->peer_out = dv->peer_out_h = NULL;
        dv->peer_scratch = NULL;
        dv->peer_rows = 0;
        hm_status st;
        if ((st = hm_gpu_dev_alloc_on(m, d, rb, 2 * rb + ss, (void **)&dv->peer_x, "peer units' input", err)) != HM_OK ||
            (st = hm_gpu_dev_alloc_on(m, d, rb, rb + ss, (void **)&dv->peer_out, "peer units' sum", err)) != HM_OK ||
            (st = hm_gpu_dev_alloc_on(m, d, ss, ss, &dv->peer_scratch, "peer units' scratch", err)) != HM_OK)
            return st;
        hm_err e;
        if (hm_cuda_host_alloc(dv->ctx, rb, (void **)&dv->peer_out_h, &e) != HM_OK)
            return hm_errf(err, HM_ERR_NOMEM, "gpu %d: cannot pin %.1f MiB for the peer units' sum: %s",
                           (int)dv->ordinal, (double)rb / MIB, e.msg);
        dv->peer_scratch_size = ss;
        dv->peer_rows = rows;
    }
    return HM_OK;
}

hm_status hm_model_gpu_wait_fills(const hm_model *m, hm_err *err) {
    const hm_gpu *g = m->gpu;
    for (int32_t d = 0; g && d < g->n_dev; d++) {
        hm_status st = g->dev[d].vram ? hm_vram_tier_wait(g->dev[d].vram, err) : HM_OK;
        if (st != HM_OK) return st;
    }
    return HM_OK;
}

/* ---- the store's view of several devices' slots: slot s of the store is slot s - slot0 of the
 * device whose range holds it (model_gpu.h) ---- */

static hm_status multi_fill(void *ctx, const hm_unit_ref *u, int32_t slot, hm_err *err) {
    const hm_gpu *g = ctx;
    const int32_t d = hm_gpu_slot_dev(g, slot);
    if (d < 0) return hm_errf(err, HM_ERR_ARG, "vram: slot %d is on no device", (int)slot);
    const hm_tier *t = &g->dev[d].hot;
    return t->fill(t->ctx, u, (int32_t)(slot - g->dev[d].slot0), err);
}

static bool multi_ready(void *ctx, int32_t slot) {
    const hm_gpu *g = ctx;
    const int32_t d = hm_gpu_slot_dev(g, slot);
    return d >= 0 && g->dev[d].hot.ready(g->dev[d].hot.ctx, (int32_t)(slot - g->dev[d].slot0));
}

static const void *multi_part(void *ctx, int32_t slot, hm_unit_part p) {
    const hm_gpu *g = ctx;
    const int32_t d = hm_gpu_slot_dev(g, slot);
    return d < 0 ? NULL : g->dev[d].hot.part(g->dev[d].hot.ctx, (int32_t)(slot - g->dev[d].slot0), p);
}

/* Room left free beyond a session state's own bytes when the pool gives some up: the allocator's
 * rounding and whatever the runtime takes on the side. */
#define HM_GPU_ROOM_MARGIN ((uint64_t)64 << 20)

hm_status hm_model_gpu_make_room(const hm_model *m, int32_t dev, uint64_t bytes, hm_err *err) {
    hm_gpu *g = m->gpu;
    hm_gpu_dev *dv = g ? &g->dev[dev] : NULL;
    if (!dv || !dv->vram || dv->n_slots <= 0)
        return hm_errf(err, HM_ERR_NOMEM, "no expert slots left in VRAM to give up");
    size_t fr = 0, tot = 0;
    hm_status st = hm_cuda_mem_info(dv->ctx, &fr, &tot, err);
    if (st != HM_OK) return st;
    const uint64_t want = bytes + HM_GPU_ROOM_MARGIN, pool = hm_vram_tier_bytes(dv->vram);
    const uint64_t stride = pool / (uint64_t)dv->n_slots;
    if ((uint64_t)fr + pool < want) /* hopeless: keep the pool for the sessions that fit */
        return hm_errf(err, HM_ERR_NOMEM, "even the whole expert slot pool (%lld slots, %.1f MiB) and the %.1f "
                       "MiB free would not make room", (long long)dv->n_slots, (double)pool / MIB, (double)fr / MIB);
    /* free may already look big enough when the allocation failed for lack of one piece that
     * large: give up at least one chunk then */
    const uint64_t deficit = want > fr ? want - fr : 1;
    const int64_t pc = hm_vram_tier_chunk_slots(dv->vram), before = dv->n_slots;
    int64_t give = (int64_t)((deficit + stride - 1) / stride);
    int64_t keep = before - give;
    keep = keep > 0 ? keep / pc * pc : 0; /* whole chunks: the tier frees nothing less */
    if (m->experts) {
        st = g->n_dev > 1 ? hm_experts_shrink_group(m->experts, dev, keep, err) : hm_experts_shrink(m->experts, keep, err);
        if (st != HM_OK) return st;
    }
    const int64_t n = hm_vram_tier_shrink(dv->vram, keep, err);
    if (n < 0) return (hm_status)n;
    hm_err werr;
    /* pinned units moved below keep: their copies have landed now (the shrink drained the copier) */
    if (hm_vram_tier_wait(dv->vram, &werr) == HM_OK && m->experts) hm_experts_land(m->experts);
    dv->n_slots = n;
    g->n_slots -= before - n;
    char which[32] = "";
    if (g->n_dev > 1) snprintf(which, sizeof which, " of gpu %d", (int)dv->ordinal);
    hm_log_printf(&m->log, HM_LOG_WARN, "VRAM%s: gave up %lld expert slots (%.2f GiB) for session state of %.1f MiB; "
                  "the evicted units run on the CPU (%lld slots left; %.1f MiB were free)", which,
                  (long long)(before - n), (double)(before - n) * (double)stride / GIB, (double)bytes / MIB,
                  (long long)n, (double)fr / MIB);
    return HM_OK;
}

/* Bytes of the f16 KV cache of one session at n_ctx positions, for n_layers layers. */
static int64_t kv_bytes(const hm_model *m, int32_t n_ctx, int32_t n_layers) {
    const hm_model_info *i = &m->info;
    return (int64_t)n_ctx * n_layers * 2 * (int64_t)i->n_head_kv * i->head_dim * 2;
}

/* The plan of a one-device placement: main_gpu, every layer, the single budget. */
static void plan_one(hm_gpu_plan *p, const hm_placement_opts *o, int32_t n_layer) {
    memset(p, 0, sizeof *p);
    p->n_dev = 1;
    p->dev[0] = o->main_gpu;
    p->budget[0] = o->vram_budget;
    p->by_layer = o->vram_budget == 0;
    p->n_layer = n_layer;
    p->layer_end[0] = n_layer;
    p->output_dev = 0;
}

/* Open the plan's device contexts (g->n_dev of them); with several, peer access between each pair
 * where the hardware allows. */
static hm_status open_devices(hm_model *m, hm_gpu *g, const hm_gpu_plan *p, int32_t flash_attn, hm_err *err) {
    for (int32_t d = 0; d < p->n_dev; d++) {
        hm_status st = hm_cuda_open(&g->dev[d].ctx, p->dev[d], err);
        if (st != HM_OK) return st;
        if (flash_attn >= 0) hm_cuda_set_flash(g->dev[d].ctx, flash_attn > 0); /* -fa on|off over the env */
        g->dev[d].ordinal = p->dev[d];
        g->n_dev = d + 1;
    }
    g->ctx = g->dev[0].ctx;
    g->peer_on = p->n_dev > 1;
    for (int32_t a = 0; a < p->n_dev; a++)
        for (int32_t b = a + 1; b < p->n_dev; b++) {
            bool on = false;
            hm_status st = hm_cuda_enable_peer(g->dev[a].ctx, g->dev[b].ctx, &on, err);
            if (st != HM_OK) return st;
            g->peer_on = g->peer_on && on;
        }
    if (p->n_dev > 1 && !g->peer_on)
        hm_log_printf(&m->log, HM_LOG_WARN, "the GPUs cannot all read each other's memory: the residual goes across "
                      "through host memory at each layer-range boundary");
    return HM_OK;
}

/* Slots of each device's prefill streaming pool (model_gpu.h), two halves: a bound on the units one
 * layer streams (48), and VRAM beyond the budget (96 units of Qwen3-30B-A3B: 254 MiB). */
#define HM_STREAM_SLOTS 96
/* With --mlock a copy costs a seventh of a staged one (moe_cuda.c): the cost model streams more
 * units a layer, so the halves hold 128 each (500 MiB of Qwen3.6-35B-A3B's 1.95 MiB units). */
#define HM_STREAM_SLOTS_PINNED 256

/* --mlock with the plain mapping (no SSD tier): the expert bytes of the file mapping (one span,
 * all layers) registered with CUDA, so the VRAM tiers' copies are one DMA per part instead of a
 * staging memcpy and a DMA, and the pages stay in RAM. Not possible (the driver's reason): a
 * warning, the copies stage as without --mlock. */
static void pin_experts(hm_model *m, hm_gpu *g, const hm_placement_opts *o) {
    const hm_units *u = &m->units;
    if (!o->mlock || (o->ram_budget > 0 && (uint64_t)o->ram_budget < u->expert_bytes)) return;
    const char *lo = NULL;
    size_t len = 0;
    /* one registered range: a split model's largest expert span (the other files' units stage) */
    for (int32_t f = 0; f < u->n_files; f++) {
        const char *l2;
        size_t n2;
        hm_units_span(u, f, &l2, &n2);
        if (n2 > len) lo = l2, len = n2;
    }
    hm_err e2;
    /* more than RAM can hold: not pinned; the --mlock step after the placement refuses it and says why */
    if (!len || hm_mlock_fits(len, hm_phys_ram_bytes(), "the experts", &e2) != HM_OK) return;
    const int64_t t0 = hm_time_us();
    if (hm_cuda_host_register(g->dev[0].ctx, lo, len, &e2) != HM_OK) {
        hm_log_printf(&m->log, HM_LOG_WARN, "--mlock: %s; expert copies to VRAM go through staging buffers", e2.msg);
        return;
    }
    g->pinned = lo;
    g->pinned_bytes = len;
    hm_log_printf(&m->log, HM_LOG_INFO, "--mlock: %.2f GiB of expert weights registered with CUDA for direct "
                  "copies to VRAM (%.1f s)", (double)g->pinned_bytes / GIB, (double)(hm_time_us() - t0) * 1e-6);
}

/* Threads that stage a unit for the VRAM tiers' copies (hm_vram_tier_opts.copy_threads):
 * HOTMOE_TIER_COPY_THREADS=N (1..64) for measurements, else the tier's default. */
static int tier_copy_threads(hm_model *m) {
    const char *ev = getenv("HOTMOE_TIER_COPY_THREADS");
    if (!ev) return 0;
    char *end;
    long n = strtol(ev, &end, 10);
    if (*end || n < 1 || n > 64) {
        hm_log_printf(&m->log, HM_LOG_WARN, "HOTMOE_TIER_COPY_THREADS=%s: not 1..64; using the default", ev);
        return 0;
    }
    return (int)n;
}

/* Prefill streaming (moe_cuda.c): a pool of HM_STREAM_SLOTS slots on each device that runs layers,
 * when some unit is cold and some is in a slot (not --cpu-moe: the experts stay on the CPU there, as
 * the user asked), the GPU computes the units, and the CPU reads them from the file mapping
 * (not the SSD tier's RAM pool: --ram-budget below the experts' size turns it off). Smaller when
 * VRAM is short (a warning), none at all is not an error. */
static hm_status open_stream(hm_model *m, hm_gpu *g, const hm_placement_opts *o, hm_err *err) {
    const char *ev = getenv("HOTMOE_PREFILL_STREAM");
    g->stream_mode = !ev                 ? 3
                     : !strcmp(ev, "0")     ? 0
                     : !strcmp(ev, "all")   ? 2
                     : !strcmp(ev, "ahead") ? 1
                     : !strcmp(ev, "layer") ? 3
                                            : -1;
    if (g->stream_mode < 0) {
        hm_log_printf(&m->log, HM_LOG_WARN, "HOTMOE_PREFILL_STREAM=%s: not 0, layer, ahead or all; using layer", ev);
        g->stream_mode = 3;
    }
    const bool ssd_tier = o->ram_budget > 0 && (uint64_t)o->ram_budget < m->units.expert_bytes;
    /* no slots at all (--cpu-moe): the GPU computes no expert (moe_cuda.c's gpu_computes) */
    if (!g->stream_mode || ssd_tier || g->no_gpu_experts || !g->slot_bytes || g->n_slots == 0 ||
        (uint64_t)g->n_slots >= m->units.n_units)
        return HM_OK;
    for (int32_t d = 0; d < g->n_dev; d++) {
        hm_gpu_dev *dv = &g->dev[d];
        bool runs = false;
        for (int32_t il = 0; il < m->info.n_layer; il++) runs = runs || g->layer_dev[il] == d;
        if (!runs) continue;
        hm_vram_tier_opts vo;
        memset(&vo, 0, sizeof vo);
        vo.n_slots = g->pinned ? HM_STREAM_SLOTS_PINNED : HM_STREAM_SLOTS;
        vo.slot_bytes = g->slot_bytes;
        vo.direct = g->pinned;
        vo.direct_bytes = g->pinned_bytes;
        vo.copy_threads = tier_copy_threads(m);
        hm_status st = hm_vram_tier_open(&dv->stream, dv->ctx, &vo, err);
        if (st != HM_OK) return st;
        const int64_t n = hm_vram_tier_n_slots(dv->stream);
        dv->stream_half = (int32_t)(n / 2);
        if (dv->stream_half == 0) {
            hm_vram_tier_close(dv->stream);
            dv->stream = NULL;
        } else {
            hm_vram_tier_as_hot(dv->stream, &dv->stream_t);
            dv->stream_layer[0] = dv->stream_layer[1] = -1;
            if (!(dv->stream_expert = calloc((size_t)n, sizeof *dv->stream_expert)))
                return hm_errf(err, HM_ERR_NOMEM, "out of memory");
        }
        if (n < HM_STREAM_SLOTS)
            hm_log_printf(&m->log, HM_LOG_WARN, "gpu %d: room for %lld of %d prefill streaming slots",
                          (int)dv->ordinal, (long long)n, HM_STREAM_SLOTS);
    }
    return HM_OK;
}

hm_status hm_model_gpu_open(hm_model *m, const hm_placement_opts *o, int64_t *slots_out, int32_t *layer_from,
                            hm_err *err) {
    *slots_out = 0;
    *layer_from = -1;
    if (!m->arch->gpu_load)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "the GPU path is not implemented for %s models yet (drop -ngl / "
                       "--vram-budget to run on the CPU)", m->arch_name);
    const int n_cuda = hm_cuda_device_count();
    if (n_cuda <= 0)
        return hm_errf(err, HM_ERR_CUDA, "no CUDA device found (drop -ngl / --vram-budget to run on the CPU)");
    if (o->main_gpu < 0 || o->main_gpu >= n_cuda)
        return hm_errf(err, HM_ERR_ARG, "--main-gpu %d: there are %d CUDA devices", (int)o->main_gpu, n_cuda);
    const int32_t NL = m->info.n_layer;
    /* which devices (free memory does not matter for that), then, with several, the layer split
     * by their free memory (when -ts does not give it) once they are open */
    hm_gpu_plan plan;
    hm_status st;
    if (o->n_vram_budgets > 0 || o->n_tensor_split > 0) {
        if ((st = hm_gpu_plan_make(&plan, o, NL, n_cuda, NULL, err)) != HM_OK) return st;
    } else {
        plan_one(&plan, o, NL);
    }
    if (plan.n_dev > 1 && !m->arch->gpu_multi)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "several GPUs are not implemented for %s models yet: use one device "
                       "(-mg N, or a --vram-budget / -ts naming one)", m->arch_name);
    if (o->n_gpu_layers > 0 && o->n_gpu_layers < NL)
        hm_log_printf(&m->log, HM_LOG_WARN, "-ngl %d < %d layers: hotmoe keeps every layer's dense part on the "
                      "GPU (use --cpu-moe / --n-cpu-moe / --vram-budget to keep experts on the CPU)",
                      (int)o->n_gpu_layers, (int)NL);

    hm_gpu *g = calloc(1, sizeof *g);
    if (!g) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    g->n_cpu_moe = -1;
    m->gpu = g;
    if (!(g->layer_dev = calloc((size_t)NL + 1, sizeof *g->layer_dev))) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = open_devices(m, g, &plan, o->flash_attn, err)) != HM_OK) goto fail;
    g->peer_units = g->n_dev > 1 && !o->no_peer;
    if (g->peer_units && (!(g->peer_work = calloc(2 * (size_t)m->units.n_expert, sizeof *g->peer_work)) ||
                          !(g->peer_work_dev = calloc((size_t)m->units.n_expert, sizeof *g->peer_work_dev)))) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    size_t fr[HM_MAX_GPUS] = {0}, tot[HM_MAX_GPUS] = {0};
    for (int32_t d = 0; d < g->n_dev; d++)
        if ((st = hm_cuda_mem_info(g->dev[d].ctx, &fr[d], &tot[d], err)) != HM_OK) goto fail;
    if (plan.n_dev > 1 && plan.by_free) {
        int64_t fb[HM_MAX_GPUS] = {0};
        for (int32_t d = 0; d < g->n_dev; d++) fb[plan.dev[d]] = (int64_t)fr[d];
        if ((st = hm_gpu_plan_make(&plan, o, NL, n_cuda, fb, err)) != HM_OK) goto fail;
    }
    for (int32_t il = 0; il <= NL; il++) g->layer_dev[il] = hm_gpu_plan_layer_dev(&plan, il);
    if ((st = m->arch->gpu_load(m, err)) != HM_OK) goto fail;
    g->up_dev = 0;

    /* the slots the flags ask for, per device */
    const hm_units *u = &m->units;
    g->slot_bytes = hm_vram_tier_slot_bytes(u);
    int64_t want[HM_MAX_GPUS] = {0};
    const char *why;
    if (o->vram_budget != 0 && o->n_cpu_moe >= 0)
        hm_log_printf(&m->log, HM_LOG_WARN, "--n-cpu-moe %d is ignored: --vram-budget places expert units by use",
                      (int)o->n_cpu_moe);
    if (!plan.by_layer) {
        why = o->n_vram_budgets > 0 ? "--vram-budget per device" : o->vram_budget < 0 ? "--vram-budget auto"
                                                                                        : "--vram-budget";
        for (int32_t d = 0; d < g->n_dev; d++)
            want[d] = plan.budget[d] < 0 ? INT64_MAX /* capped by what fits below */
                      : g->slot_bytes    ? plan.budget[d] / (int64_t)g->slot_bytes
                                         : 0;
    } else if (o->cpu_moe) {
        why = "--cpu-moe";
    } else {
        int32_t from = o->n_cpu_moe >= 0 ? o->n_cpu_moe : 0;
        if (from > u->n_layer) from = u->n_layer;
        for (int32_t l = from; l < u->n_layer; l++) want[g->layer_dev[l]] += u->layers[l].n_expert;
        *layer_from = from;
        g->n_cpu_moe = from;
        why = o->n_cpu_moe >= 0 ? "--n-cpu-moe" : "-ngl (every expert on the GPU)";
    }
    bool want_any = false;
    for (int32_t d = 0; d < g->n_dev; d++) want_any = want_any || want[d] > 0;
    if (g->no_gpu_experts && want_any) {
        hm_log_printf(&m->log, HM_LOG_WARN, "the CUDA expert kernels cannot compute this model's expert units (%s): "
                      "every expert runs on the CPU, no VRAM slots are taken", g->no_gpu_experts);
        memset(want, 0, sizeof want);
        *layer_from = -1;
        g->n_cpu_moe = -1;
    }

    /* what fits on each device: free VRAM after the dense part, minus the KV cache of its layers
     * for the context the sessions will ask for, the activations and (auto) the reserve */
    int32_t n_ctx = o->n_ctx > 0 ? o->n_ctx : (m->info.n_ctx_train > 0 ? m->info.n_ctx_train : 4096);
    if (o->n_ctx <= 0 && n_ctx > 32768) n_ctx = 32768;
    const int64_t reserve = o->vram_reserve >= 0 ? o->vram_reserve : ((int64_t)1 << 30);
    if (want_any && !g->no_gpu_experts) pin_experts(m, g, o);
    for (int32_t d = 0; d < g->n_dev; d++) {
        hm_gpu_dev *dv = &g->dev[d];
        int32_t nl_d = 0;
        for (int32_t il = 0; il < NL; il++) nl_d += g->layer_dev[il] == d;
        if (g->n_dev > 1 && nl_d == 0 && want[d] > 0) {
            hm_log_printf(&m->log, HM_LOG_WARN, "gpu %d runs no layers (its -ts share is 0): its expert budget is "
                          "not used (units are computed by their own layer's device)", (int)dv->ordinal);
            want[d] = 0;
        }
        if ((st = hm_cuda_mem_info(dv->ctx, &fr[d], &tot[d], err)) != HM_OK) goto fail;
        const int64_t keep = kv_bytes(m, n_ctx, nl_d) + HM_GPU_ACT_MARGIN + (plan.budget[d] < 0 ? reserve : 0);
        int64_t fit = g->slot_bytes && (int64_t)fr[d] > keep ? ((int64_t)fr[d] - keep) / (int64_t)g->slot_bytes : 0;
        if ((uint64_t)want[d] > u->n_units) want[d] = (int64_t)u->n_units;
        if (want[d] > fit) {
            if (plan.budget[d] >= 0)
                hm_log_printf(&m->log, HM_LOG_WARN, "gpu %d: %s asks for %lld expert slots (%.2f GiB) but only %lld "
                              "fit in the %.2f GiB of free VRAM after the KV cache for %d positions and activations: "
                              "using %lld", (int)dv->ordinal, why, (long long)want[d],
                              (double)want[d] * (double)g->slot_bytes / GIB, (long long)fit, (double)fr[d] / GIB,
                              (int)n_ctx, (long long)fit);
            want[d] = fit;
        }
        dv->slot0 = g->n_slots;
        if (want[d] > 0) {
            hm_vram_tier_opts vo;
            memset(&vo, 0, sizeof vo);
            vo.n_slots = want[d];
            vo.slot_bytes = g->slot_bytes;
            vo.staging_bytes = o->staging_bytes > 0 ? (size_t)o->staging_bytes : 0; /* QUEUE_MB; 0 = the tier's */
            vo.direct = g->pinned;
            vo.direct_bytes = g->pinned_bytes;
            vo.copy_threads = tier_copy_threads(m);
            if ((st = hm_vram_tier_open(&dv->vram, dv->ctx, &vo, err)) != HM_OK) goto fail;
            dv->n_slots = hm_vram_tier_n_slots(dv->vram);
            if (dv->n_slots < want[d])
                hm_log_printf(&m->log, HM_LOG_WARN, "gpu %d: VRAM ran out while taking the expert slots: %lld of %lld",
                              (int)dv->ordinal, (long long)dv->n_slots, (long long)want[d]);
            hm_vram_tier_as_hot(dv->vram, &dv->hot);
        }
        g->n_slots += dv->n_slots;
    }
    if ((st = open_stream(m, g, o, err)) != HM_OK) goto fail;
    if (g->n_dev == 1) {
        g->hot = g->dev[0].hot; /* one device: its own view, no dispatch */
    } else if (g->n_slots > 0) {
        g->hot = (hm_tier){.name = "vram", .ctx = g, .fill = multi_fill, .ready = multi_ready, .part = multi_part};
    }
    *slots_out = g->n_slots;
    for (int32_t d = 0; d < g->n_dev; d++) {
        const hm_gpu_dev *dv = &g->dev[d];
        char name[128] = "", layers[64] = "";
        hm_cuda_device_name(dv->ordinal, name, sizeof name);
        if (g->n_dev > 1) {
            int32_t lo = NL, hi = -1;
            for (int32_t il = 0; il < NL; il++)
                if (g->layer_dev[il] == d) lo = il < lo ? il : lo, hi = il;
            if (hi >= 0) snprintf(layers, sizeof layers, "layers %d-%d%s; ", (int)lo, (int)hi,
                                  g->layer_dev[NL] == d ? " + output" : "");
            else snprintf(layers, sizeof layers, "no layers; ");
        }
        hm_log_printf(&m->log, HM_LOG_INFO, "gpu %d: %s; %sdense part %.1f MiB; %lld expert slots of %.2f MiB "
                      "(%.2f GiB, %s) for %llu units; %.2f GiB free of %.2f before the slots",
                      (int)dv->ordinal, name, layers, (double)dv->dense_bytes / MIB, (long long)dv->n_slots,
                      (double)g->slot_bytes / MIB, (double)dv->n_slots * (double)g->slot_bytes / GIB, why,
                      (unsigned long long)u->n_units, (double)fr[d] / GIB, (double)tot[d] / GIB);
    }
    return HM_OK;
fail:
    hm_model_gpu_close(m);
    return st;
}


/* ---- helpers the arches' GPU forwards share (model_gpu.h) ---- */

hm_status hm_gpu_name_err(hm_status st, const char *name, hm_err *err) {
    if (st != HM_OK && err) {
        char tmp[sizeof err->msg];
        snprintf(tmp, sizeof tmp, "%s", err->msg);
        hm_errf(err, st, "tensor '%s': %s", name, tmp);
    }
    return st;
}

hm_status hm_gpu_up_mat(hm_gpu *g, const hm_mat *w, const char *name, bool *f32_any, hm_cuda_mat *out,
                        hm_err *err) {
    memset(out, 0, sizeof *out);
    if (f32_any) *f32_any = false;
    if (!hm_cuda_type_ok(w->type))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "tensor '%s': type %s is not computed by the CUDA backend (run "
                       "the model on the CPU: drop -ngl / --vram-budget)", name, hm_type_name(w->type));
    const size_t al = hm_cuda_type_align(w->type);
    if (w->ne0 % 32 || (al && w->nb1 % al)) {
        if (!f32_any || w->type != HM_TYPE_F32 || w->nb1 % 4)
            return hm_errf(err, HM_ERR_UNSUPPORTED, "tensor '%s': rows of %lld %s elements (%zu bytes) do not fit "
                           "the CUDA kernels (a multiple of 32 elements and of %zu bytes)", name, (long long)w->ne0,
                           hm_type_name(w->type), w->nb1, al);
        *f32_any = true;
    }
    return hm_gpu_name_err(hm_gpu_upload_mat(g, w, out, err), name, err);
}

hm_status hm_gpu_up_vec(hm_gpu *g, const float *v, int64_t n, const char *name, float **out, hm_err *err) {
    return hm_gpu_name_err(hm_gpu_upload_vec(g, v, n, out, err), name, err);
}

hm_status hm_gpu_dev_alloc_on(const hm_model *m, int32_t dev, size_t n, size_t rest, void **out, const char *what,
                              hm_err *err) {
    hm_cuda_ctx *c = m->gpu->dev[dev].ctx;
    *out = NULL;
    if (!n) n = 256;
    if (rest < n) rest = n;
    for (;;) {
        hm_err e;
        hm_status st = hm_cuda_alloc(c, n, out, &e);
        if (st == HM_OK) return HM_OK;
        if (st != HM_ERR_NOMEM)
            return hm_errf(err, st, "gpu: cannot allocate the %s (%.1f MiB) on the device: %s", what, (double)n / MIB,
                           e.msg);
        hm_err re;
        if ((st = hm_model_gpu_make_room(m, dev, rest, &re)) == HM_ERR_NOMEM) {
            size_t fr = 0, tot = 0;
            hm_err e2;
            (void)hm_cuda_mem_info(c, &fr, &tot, &e2);
            return hm_errf(err, HM_ERR_NOMEM, "gpu: cannot allocate the %s (%.1f MiB) on the device (%.1f MiB free "
                           "of %.1f, %s): %s", what, (double)n / MIB, (double)fr / MIB, (double)tot / MIB, re.msg,
                           e.msg);
        }
        if (st != HM_OK)
            return hm_errf(err, st, "gpu: cannot allocate the %s (%.1f MiB) on the device, nor give up expert slots "
                           "for it: %s", what, (double)n / MIB, re.msg);
    }
}

size_t hm_gpu_layout(const size_t *elems, size_t *off, size_t n) {
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        off[i] = at;
        at += (elems[i] * 4 + 255) & ~(size_t)255;
    }
    return at;
}

hm_status hm_gpu_pinned_block(hm_cuda_ctx *c, const size_t *elems, size_t *off, size_t n, void **out, hm_err *err) {
    const size_t bytes = hm_gpu_layout(elems, off, n);
    hm_err e;
    if (hm_cuda_host_alloc(c, bytes, out, &e) != HM_OK)
        return hm_errf(err, HM_ERR_NOMEM, "gpu: cannot allocate %.1f MiB of pinned host memory: %s",
                       (double)bytes / MIB, e.msg);
    return HM_OK;
}

hm_status hm_gpu_moe_slots_refresh(const hm_model *m, hm_cuda_ctx *c, const hm_moe_weights *const *mw,
                                   int32_t n_layer, int32_t n_expert, bool dec, int32_t *seen,
                                   hm_cuda_moe_slot *slots_h, hm_cuda_moe_slot *slots, uint8_t *all_hot,
                                   uint8_t *any_hot, hm_err *err) {
    const size_t NE = (size_t)n_expert;
    int32_t lo = n_layer, hi = -1; /* the changed layers' range goes up */
    for (int32_t il = 0; il < n_layer; il++) {
        all_hot[il] = any_hot[il] = 0;
        if (!mw[il]) continue;
        if (dec) {
            bool all = false, any = false;
            if (hm_moe_gpu_slot_table(m, mw[il], seen + (size_t)il * NE, slots_h + (size_t)il * NE, &all, &any)) {
                lo = il < lo ? il : lo;
                hi = il;
            }
            all_hot[il] = all;
            any_hot[il] = any;
        } else {
            all_hot[il] = hm_moe_gpu_all_hot(m, mw[il]);
        }
    }
    if (hi < lo) return HM_OK;
    return hm_cuda_upload_compute(c, slots + (size_t)lo * NE, slots_h + (size_t)lo * NE,
                                  (size_t)(hi - lo + 1) * NE * sizeof(hm_cuda_moe_slot), err);
}

void hm_gpu_record_routing(const hm_model *m, const hm_moe_weights *const *mw, const int32_t *sel_all_h,
                           size_t sel_stride, const int32_t *rec_n, int32_t n_rec) {
    if (!m->experts) return;
    for (int32_t il = 0; il < n_rec; il++)
        if (mw[il]) hm_experts_record(m->experts, il, sel_all_h + (size_t)il * sel_stride, rec_n[il]);
}

void hm_gpu_step_abort(hm_cuda_ctx *c, int32_t *seen, size_t n) {
    hm_err e;
    hm_cuda_sync(c, &e);
    for (size_t i = 0; i < n; i++) seen[i] = -2;
}

hm_status hm_gpu_state_opts_check(const hm_state_opts *o, hm_err *err) {
    if (o->kv_type == HM_KV_F32)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "an f32 KV cache with the GPU: the device KV cache is f16, bf16, q8_0 "
                       "or q4_0 (drop the f32 KV type, or run on the CPU)");
    if (o->n_ubatch > 65535)
        return hm_errf(err, HM_ERR_ARG, "n_ubatch %d: the GPU path takes at most 65535 rows a pass", o->n_ubatch);
    return HM_OK;
}

hm_status hm_gpu_cold_part_open(hm_moe_route *route, hm_scratch *scratch, int32_t n_expert, int32_t k, int64_t n_embd,
                                int64_t n_ff_exp, const hm_state_opts *o, hm_err *err) {
    hm_status st = hm_moe_route_init(route, n_expert, k, o->n_ubatch, err);
    if (st != HM_OK) return st;
    scratch->size = hm_moe_compute_scratch_size(route, n_embd, n_ff_exp, o->n_threads);
    if (scratch->size && !(scratch->data = hm_malloc_aligned(scratch->size)))
        return hm_errf(err, HM_ERR_NOMEM, "cannot allocate %.1f MiB of scratch", (double)scratch->size / MIB);
    return HM_OK;
}

hm_status hm_gpu_upload_batch_ints(hm_cuda_ctx *c, int32_t *ints, int32_t *ints_h, int64_t n_ubatch,
                                   const hm_fwd_batch *b, hm_err *err) {
    const int64_t U = n_ubatch;
    memcpy(ints_h, b->tokens, (size_t)b->n * sizeof(int32_t));
    memcpy(ints_h + U, b->pos, (size_t)b->n * sizeof(int32_t));
    for (int64_t i = 0; i < b->n_out; i++) ints_h[2 * U + i] = b->pos[b->out_rows[i]];
    return hm_cuda_upload_compute(c, ints, ints_h, (size_t)(3 * U) * sizeof(int32_t), err);
}

hm_status hm_gpu_moe_host_open(hm_gpu_moe_host *h, hm_cuda_ctx *c, int32_t n_layer, int32_t n_expert, hm_err *err) {
    const size_t NL = (size_t)n_layer, NE = (size_t)n_expert;
    h->units = calloc(NE ? NE : 1, sizeof *h->units);
    h->all_hot = calloc(NL, 1);
    h->any_hot = calloc(NL, 1);
    h->rec_n = calloc(NL, sizeof *h->rec_n);
    const size_t n_seen = NL * NE;
    h->seen = malloc((n_seen > 0 ? n_seen : 1) * sizeof *h->seen);
    h->mw = calloc(NL, sizeof *h->mw);
    if (!h->units || !h->all_hot || !h->any_hot || !h->rec_n || !h->seen || !h->mw)
        return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n_seen; i++)
        h->seen[i] = -2; /* no entry of the host slot table built yet */
    hm_err e;
    if (hm_cuda_event_create(c, &h->routed, &e) != HM_OK || hm_cuda_event_create(c, &h->handoff, &e) != HM_OK)
        return hm_errf(err, HM_ERR_CUDA, "gpu: %s", e.msg);
    return HM_OK;
}

void hm_gpu_moe_host_free(hm_gpu_moe_host *h) {
    hm_cuda_event_destroy(h->routed);
    hm_cuda_event_destroy(h->handoff);
    hm_moe_graph_close(h->graph);
    free(h->units);
    free(h->all_hot);
    free(h->any_hot);
    free(h->seen);
    free(h->rec_n);
    free(h->mw);
    memset(h, 0, sizeof *h);
}

int32_t hm_gpu_chain_links(const hm_gpu *g, int32_t n_layer, hm_gpu_link *links) {
    int32_t n = 0;
    for (int32_t d = 0; d < g->n_dev; d++) {
        int32_t l0 = n_layer, l1 = 0;
        for (int32_t il = 0; il < n_layer; il++)
            if (hm_gpu_layer_dev(g, il) == d) l0 = il < l0 ? il : l0, l1 = il + 1;
        const bool out = hm_gpu_layer_dev(g, n_layer) == d;
        if (l1 <= l0) {
            if (!out) continue;
            l0 = l1 = n_layer; /* the output alone */
        }
        links[n++] = (hm_gpu_link){.dev = d, .l0 = l0, .l1 = l1, .out = out};
    }
    return n;
}
