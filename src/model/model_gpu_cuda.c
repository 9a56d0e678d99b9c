/* model_gpu_cuda.c - opening a model's GPU placement (model_gpu.h): the device, the arch's dense
 * upload, and the size of the VRAM expert slot pool from the placement flags. CUDA builds only.
 *
 * Sizing (in this order): the dense weights go up first (their bytes are known only after the
 * arch's gpu_load); then the slots the flags ask for; then what fits: free VRAM minus the KV
 * cache of the context the sessions will ask for, an activation margin and the reserve. A pool
 * that fits only in part comes up smaller with a warning; the tier itself may come up smaller
 * still if an allocation fails (a warning again). Nothing here aborts for lack of VRAM except the
 * dense part, which must fit whole (an error naming the bytes). Later, a session whose device
 * state does not fit takes room back from the pool (hm_model_gpu_make_room: whole chunks of
 * slots, their units back to the CPU, a warning).
 *
 * At the end, the helpers the arches' GPU forwards share (qwen3moe_cuda.c, qwen35moe_cuda.c,
 * gemma4_cuda.c): named weight uploads, the session state's allocations (device, pinned) with the
 * same make_room rule, and the per-step slot table refresh and routing record. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_tier.h"
#include "core/alloc.h"
#include "gpu_split.h"
#include "model.h"
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
        void **a = realloc(g->allocs, (size_t)cap * sizeof *a);
        if (!a) {
            hm_cuda_free(g->ctx, p);
            return hm_errf(err, HM_ERR_NOMEM, "gpu: out of host memory");
        }
        g->allocs = a;
        g->cap_allocs = cap;
    }
    g->allocs[g->n_allocs++] = p;
    return HM_OK;
}

static hm_status upload(hm_gpu *g, const void *src, size_t bytes, void **out, const char *what, hm_err *err) {
    void *d = NULL;
    hm_status st = hm_cuda_alloc(g->ctx, bytes, &d, err);
    if (st != HM_OK) {
        size_t fr = 0, tot = 0;
        hm_err e2;
        hm_cuda_mem_info(g->ctx, &fr, &tot, &e2);
        return hm_errf(err, st, "gpu: no room for the dense weights (%s, %.1f MiB; %.1f MiB uploaded so far, %.1f "
                       "MiB free of %.1f)", what, (double)bytes / MIB, (double)g->dense_bytes / MIB,
                       (double)fr / MIB, (double)tot / MIB);
    }
    if ((st = track(g, d, err)) != HM_OK) return st;
    if ((st = hm_cuda_upload(g->ctx, d, src, bytes, err)) != HM_OK) return st;
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
    hm_vram_tier_close(g->vram); /* waits for fills in flight */
    if (m->arch && m->arch->gpu_unload) m->arch->gpu_unload(m);
    for (int32_t i = 0; i < g->n_allocs; i++) hm_cuda_free(g->ctx, g->allocs[i]);
    free(g->allocs);
    hm_cuda_close(g->ctx);
    free(g);
    m->gpu = NULL;
}

/* Room left free beyond a session state's own bytes when the pool gives some up: the allocator's
 * rounding and whatever the runtime takes on the side. */
#define HM_GPU_ROOM_MARGIN ((uint64_t)64 << 20)

hm_status hm_model_gpu_make_room(const hm_model *m, uint64_t bytes, hm_err *err) {
    hm_gpu *g = m->gpu;
    if (!g || !g->vram || g->n_slots <= 0)
        return hm_errf(err, HM_ERR_NOMEM, "no expert slots left in VRAM to give up");
    size_t fr = 0, tot = 0;
    hm_status st = hm_cuda_mem_info(g->ctx, &fr, &tot, err);
    if (st != HM_OK) return st;
    const uint64_t want = bytes + HM_GPU_ROOM_MARGIN, pool = hm_vram_tier_bytes(g->vram);
    const uint64_t stride = pool / (uint64_t)g->n_slots;
    if ((uint64_t)fr + pool < want) /* hopeless: keep the pool for the sessions that fit */
        return hm_errf(err, HM_ERR_NOMEM, "even the whole expert slot pool (%lld slots, %.1f MiB) and the %.1f "
                       "MiB free would not make room", (long long)g->n_slots, (double)pool / MIB, (double)fr / MIB);
    /* free may already look big enough when the allocation failed for lack of one piece that
     * large: give up at least one chunk then */
    const uint64_t deficit = want > fr ? want - fr : 1;
    const int64_t pc = hm_vram_tier_chunk_slots(g->vram), before = g->n_slots;
    int64_t give = (int64_t)((deficit + stride - 1) / stride);
    int64_t keep = before - give;
    keep = keep > 0 ? keep / pc * pc : 0; /* whole chunks: the tier frees nothing less */
    if (m->experts && (st = hm_experts_shrink(m->experts, keep, err)) != HM_OK) return st;
    const int64_t n = hm_vram_tier_shrink(g->vram, keep, err);
    if (n < 0) return (hm_status)n;
    hm_err werr;
    /* pinned units moved below keep: their copies have landed now (the shrink drained the copier) */
    if (hm_vram_tier_wait(g->vram, &werr) == HM_OK && m->experts) hm_experts_land(m->experts);
    g->n_slots = n;
    hm_log_printf(&m->log, HM_LOG_WARN, "VRAM: gave up %lld expert slots (%.2f GiB) for session state of %.1f MiB; "
                  "the evicted units run on the CPU (%lld slots left; %.1f MiB were free)", (long long)(before - n),
                  (double)(before - n) * (double)stride / GIB, (double)bytes / MIB, (long long)n, (double)fr / MIB);
    return HM_OK;
}

/* Bytes of the f16 KV cache of one session at n_ctx positions. */
static int64_t kv_bytes(const hm_model *m, int32_t n_ctx) {
    const hm_model_info *i = &m->info;
    return (int64_t)n_ctx * i->n_layer * 2 * (int64_t)i->n_head_kv * i->head_dim * 2;
}

hm_status hm_model_gpu_open(hm_model *m, const hm_placement_opts *o, int64_t *slots_out, int32_t *layer_from,
                            hm_err *err) {
    *slots_out = 0;
    *layer_from = -1;
    if (!m->arch->gpu_load)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "the GPU path is not implemented for %s models yet (drop -ngl / "
                       "--vram-budget to run on the CPU)", m->arch_name);
    const int n_dev = hm_cuda_device_count();
    if (n_dev <= 0)
        return hm_errf(err, HM_ERR_CUDA, "no CUDA device found (drop -ngl / --vram-budget to run on the CPU)");
    if (o->main_gpu < 0 || o->main_gpu >= n_dev)
        return hm_errf(err, HM_ERR_ARG, "--main-gpu %d: there are %d CUDA devices", (int)o->main_gpu, n_dev);
    /* Several GPUs (issue 11): the plan decides which devices; only a plan of one runs today, as
     * the single-device form on that device (free memory does not matter for which devices) */
    hm_placement_opts one;
    if (o->n_vram_budgets > 0 || o->n_tensor_split > 0) {
        hm_gpu_plan plan;
        hm_status pst = hm_gpu_plan_make(&plan, o, m->info.n_layer, n_dev, NULL, err);
        if (pst != HM_OK) return pst;
        if (plan.n_dev > 1)
            return hm_errf(err, HM_ERR_UNSUPPORTED, "several GPUs are planned (issue 11) but not executed yet: use "
                           "one device (-mg N)");
        one = *o;
        one.main_gpu = plan.dev[0];
        if (o->n_vram_budgets > 0) {
            one.vram_budget = plan.budget[0];
            if (plan.budget[0] == 0) one.cpu_moe = true; /* "N:0": no slots (the single form's 0 means unset) */
        }
        one.n_vram_budgets = 0;
        one.n_tensor_split = 0;
        o = &one;
    }
    if (o->n_gpu_layers > 0 && o->n_gpu_layers < m->info.n_layer)
        hm_log_printf(&m->log, HM_LOG_WARN, "-ngl %d < %d layers: hotmoe keeps every layer's dense part on the "
                      "GPU (use --cpu-moe / --n-cpu-moe / --vram-budget to keep experts on the CPU)",
                      (int)o->n_gpu_layers, (int)m->info.n_layer);

    hm_gpu *g = calloc(1, sizeof *g);
    if (!g) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    g->n_cpu_moe = -1;
    m->gpu = g;
    hm_status st = hm_cuda_open(&g->ctx, o->main_gpu, err);
    if (st != HM_OK) goto fail;
    if ((st = m->arch->gpu_load(m, err)) != HM_OK) goto fail;

    /* the slots the flags ask for */
    const hm_units *u = &m->units;
    g->slot_bytes = hm_vram_tier_slot_bytes(u);
    int64_t want = 0;
    const char *why;
    if (o->vram_budget != 0 && o->n_cpu_moe >= 0)
        hm_log_printf(&m->log, HM_LOG_WARN, "--n-cpu-moe %d is ignored: --vram-budget places expert units by use",
                      (int)o->n_cpu_moe);
    if (o->vram_budget > 0) {
        want = g->slot_bytes ? o->vram_budget / (int64_t)g->slot_bytes : 0;
        why = "--vram-budget";
    } else if (o->vram_budget < 0) {
        want = INT64_MAX; /* capped by what fits below */
        why = "--vram-budget auto";
    } else if (o->cpu_moe) {
        why = "--cpu-moe";
    } else {
        int32_t from = o->n_cpu_moe >= 0 ? o->n_cpu_moe : 0;
        if (from > u->n_layer) from = u->n_layer;
        for (int32_t l = from; l < u->n_layer; l++) want += u->layers[l].n_expert;
        *layer_from = from;
        g->n_cpu_moe = from;
        why = o->n_cpu_moe >= 0 ? "--n-cpu-moe" : "-ngl (every expert on the GPU)";
    }
    if ((uint64_t)want > u->n_units) want = (int64_t)u->n_units;
    if (want > 0 && g->no_gpu_experts) {
        hm_log_printf(&m->log, HM_LOG_WARN, "the CUDA expert kernels cannot compute this model's expert units (%s): "
                      "every expert runs on the CPU, no VRAM slots are taken", g->no_gpu_experts);
        want = 0;
        *layer_from = -1;
        g->n_cpu_moe = -1;
    }

    /* what fits */
    size_t fr = 0, tot = 0;
    if ((st = hm_cuda_mem_info(g->ctx, &fr, &tot, err)) != HM_OK) goto fail;
    int32_t n_ctx = o->n_ctx > 0 ? o->n_ctx : (m->info.n_ctx_train > 0 ? m->info.n_ctx_train : 4096);
    if (o->n_ctx <= 0 && n_ctx > 32768) n_ctx = 32768;
    const int64_t reserve = o->vram_reserve >= 0 ? o->vram_reserve : ((int64_t)1 << 30);
    const int64_t keep = kv_bytes(m, n_ctx) + HM_GPU_ACT_MARGIN + (o->vram_budget < 0 ? reserve : 0);
    int64_t fit = g->slot_bytes && (int64_t)fr > keep ? ((int64_t)fr - keep) / (int64_t)g->slot_bytes : 0;
    if (want > fit) {
        if (o->vram_budget >= 0)
            hm_log_printf(&m->log, HM_LOG_WARN, "%s asks for %lld expert slots (%.2f GiB) but only %lld fit in the "
                          "%.2f GiB of free VRAM after the KV cache for %d positions and activations: using %lld",
                          why, (long long)want, (double)want * (double)g->slot_bytes / GIB, (long long)fit,
                          (double)fr / GIB, (int)n_ctx, (long long)fit);
        want = fit;
    }
    if (want > 0) {
        hm_vram_tier_opts vo;
        memset(&vo, 0, sizeof vo);
        vo.n_slots = want;
        vo.slot_bytes = g->slot_bytes;
        if ((st = hm_vram_tier_open(&g->vram, g->ctx, &vo, err)) != HM_OK) goto fail;
        g->n_slots = hm_vram_tier_n_slots(g->vram);
        if (g->n_slots < want)
            hm_log_printf(&m->log, HM_LOG_WARN, "VRAM ran out while taking the expert slots: %lld of %lld",
                          (long long)g->n_slots, (long long)want);
        hm_vram_tier_as_hot(g->vram, &g->hot);
    }
    *slots_out = g->n_slots;
    {
        char name[128] = "";
        hm_cuda_device_name(o->main_gpu, name, sizeof name);
        hm_log_printf(&m->log, HM_LOG_INFO, "gpu %d: %s; dense part %.1f MiB; %lld expert slots of %.2f MiB "
                      "(%.2f GiB, %s) for %llu units; %.2f GiB free of %.2f before the slots",
                      (int)o->main_gpu, name, (double)g->dense_bytes / MIB, (long long)g->n_slots,
                      (double)g->slot_bytes / MIB, (double)g->n_slots * (double)g->slot_bytes / GIB, why,
                      (unsigned long long)u->n_units, (double)fr / GIB, (double)tot / GIB);
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

hm_status hm_gpu_dev_alloc(const hm_model *m, size_t n, size_t rest, void **out, const char *what, hm_err *err) {
    hm_cuda_ctx *c = m->gpu->ctx;
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
        if ((st = hm_model_gpu_make_room(m, rest, &re)) == HM_ERR_NOMEM) {
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
        return hm_errf(err, HM_ERR_UNSUPPORTED, "an f32 KV cache with the GPU: the device KV cache is f16 (drop the "
                       "f32 KV type, or run on the CPU)");
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
