/* calib_gpu_cuda.c - the GPU side of `plan`'s cost model, measured on device 0 with the model's
 * own units (calib.h, hm_calib_gpu). Only built with CUDA; calib.c has the stub.
 *
 * Order matters for VRAM: the upload and hot-unit measurements use a context and slot pool of
 * their own, closed before the model is opened (twice) for the decode runs, so each run has the
 * whole device. Every part that fails after the device opened is left out with a note, never
 * an error: plan goes on with what was measured. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "experts/tier_vram.h"
#include "calib.h"
#include "core/timer.h"

#define GPU_UPLOAD_UNITS 64
#define GPU_MOE_REPS 32
#define GPU_WARM_TOKENS 3
#define GPU_DECODE_TOKENS 16

static void add_note(hm_calib_gpu *g, const char *what, const char *why) {
    size_t n = strlen(g->note);
    snprintf(g->note + n, sizeof g->note - n, "%s%s: %s", n ? "; " : "", what, why);
}

static hm_unit_ref unit_ref(const hm_units *u, int32_t layer, int32_t expert) {
    const hm_units_layer *l = &u->layers[layer];
    hm_unit_ref r = {.layer = layer, .expert = expert, .bytes = l->unit_bytes};
    for (int p = 0; p < HM_UNIT_NPART; p++) {
        r.part_bytes[p] = l->slab_bytes[p];
        r.src[p] = l->part[p] ? (const char *)l->part[p]->data + (size_t)expert * l->slab_bytes[p] : NULL;
    }
    return r;
}

/* n units spread over the MoE layers and experts (as the CPU calibration picks them). */
static int32_t pick_units(const hm_units *u, int32_t n, int32_t *layer, int32_t *expert) {
    int32_t moe[4096], n_moe = 0;
    for (int32_t l = 0; l < u->n_layer && n_moe < 4096; l++)
        if (u->layers[l].n_expert && u->layers[l].part[HM_UNIT_DOWN]) moe[n_moe++] = l;
    if (!n_moe) return 0;
    for (int32_t i = 0; i < n; i++) {
        layer[i] = moe[i % n_moe];
        expert[i] = (int32_t)(((int64_t)(i / n_moe) * 37 + (i % n_moe) * 11 + 5) % u->layers[layer[i]].n_expert);
    }
    return n;
}

/* Fill every slot i with unit i, then wait for all: seconds. */
static hm_status fill_all(hm_vram_tier *t, const hm_units *u, int32_t n, const int32_t *layer, const int32_t *expert,
                          double *sec, hm_err *err) {
    hm_tier hot;
    hm_vram_tier_as_hot(t, &hot);
    int64_t t0 = hm_time_us();
    for (int32_t i = 0; i < n; i++) {
        hm_unit_ref r = unit_ref(u, layer[i], expert[i]);
        hm_status st = hot.fill(hot.ctx, &r, i, err);
        if (st) return st;
    }
    hm_status st = hm_vram_tier_wait(t, err);
    *sec = (double)(hm_time_us() - t0) / 1e6;
    return st;
}

/* One grouped launch of up to k resident units (slots whose layer has slot 0's shapes) for one
 * token, repeated: microseconds per unit. */
static hm_status time_hot_units(hm_cuda_ctx *c, hm_vram_tier *t, const hm_units *u, int32_t n, const int32_t *layer,
                                int32_t k, double *us_unit, hm_err *err) {
    const hm_units_layer *L = &u->layers[layer[0]];
    const bool fused = L->part[HM_UNIT_GATE_UP] != NULL;
    const hm_gguf_tensor *gt = fused ? L->part[HM_UNIT_GATE_UP] : L->part[HM_UNIT_GATE], *dt = L->part[HM_UNIT_DOWN];
    if (!gt || !dt) return hm_errf(err, HM_ERR_UNSUPPORTED, "no gate/down part");
    const int64_t n_embd = gt->ne[0], n_ff = dt->ne[0];
    if (n_embd % 256 || n_ff % 256)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "the CUDA expert kernels take n_embd and n_ff in multiples of 256 "
                       "(this model: %lld, %lld)", (long long)n_embd, (long long)n_ff);
    if (!hm_cuda_type_ok(gt->type) || !hm_cuda_type_ok(dt->type) ||
        (!fused && L->part[HM_UNIT_UP]->type != gt->type))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "an expert tensor type the CUDA kernels do not compute");
    hm_tier hot;
    hm_vram_tier_as_hot(t, &hot);
    hm_cuda_moe_unit units[256];
    const int32_t tok = 0;
    const float w = 1.0f / (float)(k > 0 ? k : 1);
    const size_t up_off = fused ? L->slab_bytes[HM_UNIT_GATE_UP] / 2 : 0;
    int n_hot = 0;
    for (int32_t i = 0; i < n && n_hot < k && n_hot < 256; i++) {
        const hm_units_layer *Li = &u->layers[layer[i]];
        if (Li->unit_bytes != L->unit_bytes || Li->part[HM_UNIT_DOWN]->type != dt->type) continue;
        hm_cuda_moe_unit *m = &units[n_hot++];
        if (fused) {
            m->gate = hot.part(hot.ctx, i, HM_UNIT_GATE_UP);
            m->up = (const char *)m->gate + up_off;
        } else {
            m->gate = hot.part(hot.ctx, i, HM_UNIT_GATE);
            m->up = hot.part(hot.ctx, i, HM_UNIT_UP);
        }
        m->down = hot.part(hot.ctx, i, HM_UNIT_DOWN);
        m->tok_host = &tok;
        m->w_host = &w;
        m->n_tok = 1;
        m->gate_b = m->up_b = m->down_b = NULL; /* the timing runs the units without biases */
    }
    if (!n_hot) return hm_errf(err, HM_ERR_INTERNAL, "no slot with the first layer's shapes");
    float *x = NULL, *out = NULL, *xh = malloc((size_t)n_embd * sizeof *xh);
    void *scratch = NULL;
    size_t ss = hm_cuda_moe_scratch_size(1, n_hot, n_hot, n_ff);
    hm_status st = xh ? HM_OK : hm_errf(err, HM_ERR_NOMEM, "out of memory");
    if (!st) st = hm_cuda_alloc(c, (size_t)n_embd * sizeof *x, (void **)&x, err);
    if (!st) st = hm_cuda_alloc(c, (size_t)n_embd * sizeof *out, (void **)&out, err);
    if (!st) st = hm_cuda_alloc(c, ss ? ss : 256, &scratch, err);
    if (!st) {
        for (int64_t j = 0; j < n_embd; j++) xh[j] = (float)((j * 2654435761u) % 1000) / 1000.0f - 0.5f;
        st = hm_cuda_upload(c, x, xh, (size_t)n_embd * sizeof *x, err);
    }
    if (!st) st = hm_cuda_memset(c, out, 0, (size_t)n_embd * sizeof *out, err);
    for (int r = 0; r < 3 && !st; r++)
        st = hm_cuda_moe(c, units, n_hot, gt->type, dt->type, x, 1, n_embd, n_ff, out, scratch, ss, err);
    if (!st) st = hm_cuda_sync(c, err);
    int64_t t0 = hm_time_us();
    for (int r = 0; r < GPU_MOE_REPS && !st; r++)
        st = hm_cuda_moe(c, units, n_hot, gt->type, dt->type, x, 1, n_embd, n_ff, out, scratch, ss, err);
    if (!st) st = hm_cuda_sync(c, err);
    if (!st) *us_unit = (double)(hm_time_us() - t0) / GPU_MOE_REPS / n_hot;
    hm_cuda_free(c, scratch);
    hm_cuda_free(c, out);
    hm_cuda_free(c, x);
    free(xh);
    return st;
}

static hm_status usage_hits(const hm_model *m, uint64_t *hits, uint64_t *misses, hm_err *err) {
    hm_usage us;
    memset(&us, 0, sizeof us);
    hm_status st = hm_model_usage(m, &us, err);
    *hits = us.hits, *misses = us.misses;
    hm_usage_free(&us);
    return st;
}

/* Open the model under po, decode GPU_WARM_TOKENS then GPU_DECODE_TOKENS single tokens: the
 * milliseconds of a timed step and the hit rate over the timed steps. */
static hm_status time_decode(const char *path, const hm_placement_opts *po, int32_t n_threads, double *ms, double *hit,
                             hm_err *err) {
    hm_model_opts mo;
    hm_model_opts_default(&mo);
    mo.placement = po;
    hm_model *m = NULL;
    hm_session *s = NULL;
    hm_status st = hm_model_open(&m, path, &mo, err);
    if (st) return st;
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = GPU_WARM_TOKENS + GPU_DECODE_TOKENS + 8;
    so.n_threads = n_threads;
    if ((st = hm_session_open(&s, m, &so, err))) goto done;
    const int32_t n_vocab = hm_model_n_vocab(m);
    const float *logits;
    uint64_t h0 = 0, m0 = 0, h1 = 0, m1 = 0;
    int64_t t0 = 0;
    for (int32_t i = 0; i < GPU_WARM_TOKENS + GPU_DECODE_TOKENS; i++) {
        if (i == GPU_WARM_TOKENS) {
            if ((st = usage_hits(m, &h0, &m0, err))) goto done;
            t0 = hm_time_us();
        }
        int32_t tok = (int32_t)(((int64_t)i * 7919 + 13) % n_vocab);
        if ((st = hm_session_eval(s, &tok, 1, false, &logits, err))) goto done;
    }
    *ms = (double)(hm_time_us() - t0) / 1000.0 / GPU_DECODE_TOKENS;
    if ((st = usage_hits(m, &h1, &m1, err))) goto done;
    *hit = h1 + m1 > h0 + m0 ? (double)(h1 - h0) / (double)(h1 - h0 + m1 - m0) : 0;
done:
    hm_session_close(s);
    hm_model_close(m);
    return st;
}

hm_status hm_calib_gpu_measure(const char *path, const hm_units *u, int32_t n_threads, double us_cpu_unit,
                               hm_calib_gpu *out, hm_err *err) {
    memset(out, 0, sizeof *out);
    if (hm_cuda_device_count() <= 0) return hm_errf(err, HM_ERR_UNSUPPORTED, "no CUDA device");
    if (hm_cuda_device_name(0, out->device, sizeof out->device) < 0) snprintf(out->device, sizeof out->device, "device 0");
    out->k = u->n_expert_used > 0 ? u->n_expert_used : 1;
    for (int32_t l = 0; l < u->n_layer; l++) out->n_moe_layer += u->layers[l].n_expert > 0;
    hm_cuda_ctx *c = NULL;
    hm_vram_tier *t = NULL;
    int32_t layer[GPU_UPLOAD_UNITS], expert[GPU_UPLOAD_UNITS];
    int32_t n = (int32_t)(u->n_units < GPU_UPLOAD_UNITS ? u->n_units : GPU_UPLOAD_UNITS);
    n = pick_units(u, n, layer, expert);
    if (!n) return hm_errf(err, HM_ERR_ARG, "the model has no expert units");
    hm_status st = hm_cuda_open(&c, 0, err);
    if (st) return st;
    hm_vram_tier_opts to = {.n_slots = n, .slot_bytes = hm_vram_tier_slot_bytes(u)};
    if ((st = hm_vram_tier_open(&t, c, &to, err))) goto upload_done;
    if ((n = (int32_t)hm_vram_tier_n_slots(t)) < 1) {
        st = hm_errf(err, HM_ERR_NOMEM, "no VRAM for one slot of %llu bytes", (unsigned long long)to.slot_bytes);
        goto upload_done;
    }
    uint64_t bytes = 0;
    for (int32_t i = 0; i < n; i++) bytes += u->layers[layer[i]].unit_bytes;
    double sec, best = 0;
    if ((st = fill_all(t, u, n, layer, expert, &sec, err))) goto upload_done; /* pages in, ring warm */
    for (int r = 0; r < 2; r++) {
        if ((st = fill_all(t, u, n, layer, expert, &sec, err))) goto upload_done;
        if (r == 0 || sec < best) best = sec;
    }
    out->have_upload = true;
    out->upload_units = n;
    out->upload_gbs = best > 0 ? (double)bytes / best / 1e9 : 0;
    out->us_upload_unit = best * 1e6 / n;
    hm_err uerr = {{0}};
    if (time_hot_units(c, t, u, n, layer, out->k, &out->us_hot_unit, &uerr) == HM_OK) out->have_unit = true;
    else add_note(out, "hot unit", uerr.msg);
upload_done:
    hm_vram_tier_close(t);
    hm_cuda_close(c);
    if (st) return st;
    if (!out->have_unit) return HM_OK;

    /* decode: every unit in VRAM (as many as fit), then --cpu-moe */
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    po.n_gpu_layers = u->n_layer > 99 ? u->n_layer : 99;
    po.n_ctx = GPU_WARM_TOKENS + GPU_DECODE_TOKENS + 8;
    hm_err derr = {{0}};
    double dummy;
    if (time_decode(path, &po, n_threads, &out->ms_tok_hot, &out->hit_hot, &derr) != HM_OK) {
        add_note(out, "decode with every unit in VRAM", derr.msg);
        return HM_OK;
    }
    po.cpu_moe = true;
    if (time_decode(path, &po, n_threads, &out->ms_tok_cpu_moe, &dummy, &derr) != HM_OK) {
        add_note(out, "decode with --cpu-moe", derr.msg);
        return HM_OK;
    }
    out->decode_tokens = GPU_DECODE_TOKENS;
    const double nl = out->n_moe_layer, k = out->k;
    if (out->hit_hot >= 0.99 || us_cpu_unit <= 0) {
        out->ms_dense = out->ms_tok_hot - nl * k * out->hit_hot * out->us_hot_unit / 1000.0;
        if (us_cpu_unit > 0 && nl > 0) out->us_cold_layer = (out->ms_tok_cpu_moe - out->ms_dense) * 1000.0 / nl - k * us_cpu_unit;
        if (us_cpu_unit <= 0) add_note(out, "cold-layer overhead", "taken as 0 (no CPU calibration)");
    } else {
        out->ms_dense = out->ms_tok_cpu_moe - nl * k * us_cpu_unit / 1000.0;
        char why[96];
        snprintf(why, sizeof why, "taken as 0 (not every unit fit in VRAM: hit rate %.0f %%)", 100.0 * out->hit_hot);
        add_note(out, "cold-layer overhead", why);
    }
    if (out->ms_dense < 0) out->ms_dense = 0;
    if (out->us_cold_layer < 0) out->us_cold_layer = 0;
    out->have_decode = true;
    return HM_OK;
}
