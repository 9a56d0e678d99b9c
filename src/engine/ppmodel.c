/* ppmodel.c - the prompt-processing model (issue 25): the check that a second file is the same
 * model at another quantisation, and the warm hand-over of the copy's routing to the main model's
 * expert store. session.c runs the copy's forward passes on the session's own state (pp.h).
 *
 * Why the state can be shared: a session's state (exec.c's hm_exec_state on the CPU) is sized and
 * laid out from the layer description's shapes and the session options only - KV rows in the
 * cache's type, the recurrent state, DeepSeek-V4's compressed rows, activations and scratch - never
 * from the weights' types. Two files with the same tensor names and shapes and the same hparams
 * therefore describe the same state, and the copy's forward writes it exactly where and how the
 * main model's would. With a GPU placement the state lives on the device chain of one model's
 * placement (its weights' devices, its decode graph): there the copy runs in a session of its own
 * and exec's hm_exec_state_copy moves the positions it wrote into the main session's state.
 *
 * Warm hand-over: after each of the copy's steps the per-unit count deltas of its store are
 * replayed into the main model's store (hm_experts_record per layer, then one prompt step_end): the
 * main model's policy sees the prompt's routing, counts and all, as if it had routed it, and with
 * VRAM slots starts its fills on the tier's copier thread while the copy computes its next
 * micro-batch. On the mmap path the units routed for the first time are read ahead
 * (madvise WILLNEED) so the first decode steps do not fault them in. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/model.h"
#include "pp.h"

struct hm_pp {
    hm_pp_opts o;
    bool copies;               /* hm_pp_copies */
    bool half_done;            /* this run's half-way re-plan happened */
    int32_t n_layer, n_expert; /* the store's geometry (the largest layer's experts) */
    uint64_t *prev;            /* [n_layer * n_expert] the copy's counts at the last step */
    uint64_t *tot;             /* [n_layer * n_expert] the routing of the current run of the copy */
    uint8_t *advised;          /* [n_layer * n_expert] read ahead in main's mapping already */
    int32_t *ids;              /* [cap] one layer's replayed ids */
    int32_t cap;
    hm_pp_stats st;
};

void hm_pp_opts_default(hm_pp_opts *o) {
    memset(o, 0, sizeof *o);
    o->min_tokens = 8192;
}

/* ---- the same-model check ---- */

static bool has_prefix(const char *k, const char *pre) { return !strncmp(k, pre, strlen(pre)); }

/* Whether key k is part of what makes two files one model: the arch's hparams and the tokenizer. */
static bool model_key(const char *k, const char *arch) {
    const size_t n = strlen(arch);
    return (!strncmp(k, arch, n) && k[n] == '.') || has_prefix(k, "tokenizer.");
}

static bool str_eq(hm_gguf_str a, hm_gguf_str b) { return a.len == b.len && (!a.len || !memcmp(a.ptr, b.ptr, a.len)); }

/* Arrays a and b equal, element by element (nested ones too). */
static bool arr_eq(const hm_gguf_arr *a, const hm_gguf_arr *b, int depth) {
    if (a->elem_type != b->elem_type || a->n != b->n) return false;
    const size_t es = hm_gguf_vtype_size(a->elem_type);
    if (es) return !a->n || !memcmp(a->data, b->data, (size_t)a->n * es);
    for (uint64_t i = 0; i < a->n; i++) {
        if (a->elem_type == HM_GGUF_STRING) {
            hm_gguf_str x, y;
            if (!hm_gguf_arr_str(a, i, &x) || !hm_gguf_arr_str(b, i, &y) || !str_eq(x, y)) return false;
        } else if (a->elem_type == HM_GGUF_ARRAY) {
            hm_gguf_arr x, y;
            if (depth > HM_GGUF_MAX_ARRAY_DEPTH || !hm_gguf_arr_arr(a, i, &x) || !hm_gguf_arr_arr(b, i, &y) ||
                !arr_eq(&x, &y, depth + 1))
                return false;
        } else {
            return false;
        }
    }
    return true;
}

/* Value i of ga equals value j of gb (same type, same value). */
static bool kv_eq(const hm_gguf *ga, int64_t i, const hm_gguf *gb, int64_t j) {
    const hm_gguf_vtype t = hm_gguf_kv_type(ga, i);
    if (t != hm_gguf_kv_type(gb, j)) return false;
    if (t == HM_GGUF_STRING) {
        hm_gguf_str x, y;
        return hm_gguf_kv_str(ga, i, &x) && hm_gguf_kv_str(gb, j, &y) && str_eq(x, y);
    }
    if (t == HM_GGUF_ARRAY) {
        hm_gguf_arr x, y;
        return hm_gguf_kv_arr(ga, i, &x) && hm_gguf_kv_arr(gb, j, &y) && arr_eq(&x, &y, 1);
    }
    if (t == HM_GGUF_F32 || t == HM_GGUF_F64) {
        double x, y;
        return hm_gguf_kv_float(ga, i, &x) && hm_gguf_kv_float(gb, j, &y) && !memcmp(&x, &y, sizeof x);
    }
    int64_t x, y;
    return hm_gguf_kv_int(ga, i, &x) && hm_gguf_kv_int(gb, j, &y) && x == y;
}

/* A short text of value i of g for a message. */
static void kv_text(const hm_gguf *g, int64_t i, char *buf, size_t cap) {
    const hm_gguf_vtype t = hm_gguf_kv_type(g, i);
    int64_t v;
    double d;
    hm_gguf_str s;
    hm_gguf_arr a;
    if (t == HM_GGUF_STRING && hm_gguf_kv_str(g, i, &s))
        snprintf(buf, cap, "'%.*s%s'", (int)(s.len > 40 ? 40 : s.len), s.ptr ? s.ptr : "", s.len > 40 ? "..." : "");
    else if (t == HM_GGUF_ARRAY && hm_gguf_kv_arr(g, i, &a))
        snprintf(buf, cap, "an array of %llu %s", (unsigned long long)a.n, hm_gguf_vtype_name(a.elem_type));
    else if ((t == HM_GGUF_F32 || t == HM_GGUF_F64) && hm_gguf_kv_float(g, i, &d))
        snprintf(buf, cap, "%g", d);
    else if (hm_gguf_kv_int(g, i, &v))
        snprintf(buf, cap, "%lld", (long long)v);
    else
        snprintf(buf, cap, "a %s", hm_gguf_vtype_name(t));
}

static const char *base(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

hm_status hm_model_check_same(const hm_model *m, const hm_model *pp, hm_err *err) {
    const char *mp = base(hm_gguf_path(m->gguf)), *pn = base(hm_gguf_path(pp->gguf));
#define DIFF(...)                                                                                                 \
    do {                                                                                                          \
        char what_[320];                                                                                          \
        snprintf(what_, sizeof what_, __VA_ARGS__);                                                               \
        return hm_errf(err, HM_ERR_ARG, "prompt-processing model %s is not the same model as %s at another "      \
                       "quantisation: %s", pn, mp, what_);                                                         \
    } while (0)
    if (strcmp(m->arch->name, pp->arch->name))
        DIFF("architecture %s, the main model's %s", pp->arch->name, m->arch->name);
    /* the keys that define the model: every one of either file must be in the other, equal */
    for (int pass = 0; pass < 2; pass++) {
        const hm_gguf *ga = pass ? pp->gguf : m->gguf, *gb = pass ? m->gguf : pp->gguf;
        for (int64_t i = 0; i < hm_gguf_n_kv(ga); i++) {
            const char *k = hm_gguf_key(ga, i);
            if (!model_key(k, m->arch->name)) continue;
            const int64_t j = hm_gguf_find_key(gb, k);
            if (j < 0) DIFF("key %s is only in %s", k, pass ? pn : mp);
            if (!pass && !kv_eq(ga, i, gb, j)) {
                char a[96], b[96];
                kv_text(gb, j, a, sizeof a);
                kv_text(ga, i, b, sizeof b);
                DIFF("key %s = %s, the main model's %s", k, a, b);
            }
        }
    }
    if (strcmp(m->rope_scaling, pp->rope_scaling) || m->rope_scale != pp->rope_scale ||
        m->yarn_orig_ctx != pp->yarn_orig_ctx)
        DIFF("it was opened with other RoPE scaling options");
    /* the tensors: the same names and shapes, in any order; the types may differ */
    const int64_t nt = hm_gguf_n_tensors(m->gguf);
    if (hm_gguf_n_tensors(pp->gguf) != nt)
        DIFF("%lld tensors, the main model's %lld", (long long)hm_gguf_n_tensors(pp->gguf), (long long)nt);
    for (int64_t i = 0; i < nt; i++) {
        const hm_gguf_tensor *a = hm_gguf_tensor_at(m->gguf, i), *b = hm_gguf_find_tensor(pp->gguf, a->name);
        if (!b) DIFF("it has no tensor %s", a->name);
        if (a->n_dims != b->n_dims || memcmp(a->ne, b->ne, sizeof a->ne))
            DIFF("tensor %s is [%lld, %lld, %lld, %lld], the main model's [%lld, %lld, %lld, %lld]", a->name,
                 (long long)b->ne[0], (long long)b->ne[1], (long long)b->ne[2], (long long)b->ne[3],
                 (long long)a->ne[0], (long long)a->ne[1], (long long)a->ne[2], (long long)a->ne[3]);
        /* the weights: vectors (norms, biases) stay f32 at every quantisation, so the same model has
         * the same bytes there; another model of the same shape (another seed, another fine-tune)
         * does not. Cheap: they are a few KiB a layer. */
        if (a->n_dims == 1 && a->type == b->type && (a->nbytes != b->nbytes || memcmp(a->data, b->data, a->nbytes)))
            DIFF("tensor %s has other values (the same type in both files: not the same weights)", a->name);
    }
#undef DIFF
    return HM_OK;
}

/* ---- a session's attachment ---- */

hm_status hm_pp_open(hm_pp **out, hm_model *main, const hm_pp_opts *o, int32_t n_ubatch, hm_err *err) {
    *out = NULL;
    hm_model *pp = o->model;
    if (pp == main)
        return hm_errf(err, HM_ERR_ARG, "prompt-processing model: it is the main model object (open the file a "
                       "second time: the copy's routing must not count in the main model's store directly)");
    if (o->min_tokens < 1 || o->refresh < 0)
        return hm_errf(err, HM_ERR_ARG, "prompt-processing model: min tokens %d (need >= 1), refresh %d (need >= 0)",
                       o->min_tokens, o->refresh);
    hm_status st = hm_model_check_same(main, pp, err);
    if (st != HM_OK) return st;
    if (pp->arch != main->arch || !pp->xm || !main->xm)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "prompt-processing model: architecture %s has no layer description "
                       "to share a session's state through", main->arch->name);
    hm_pp *p = calloc(1, sizeof *p);
    if (!p) return hm_errf(err, HM_ERR_NOMEM, "prompt-processing model: out of memory");
    p->o = *o;
    p->copies = o->copy_state || main->gpu || pp->gpu;
    if (main->experts && pp->experts) {
        const hm_units *u = &main->units;
        p->n_layer = u->n_layer;
        for (int32_t l = 0; l < u->n_layer; l++)
            if (u->layers[l].n_expert > p->n_expert) p->n_expert = u->layers[l].n_expert;
        const size_t nu = (size_t)p->n_layer * (size_t)p->n_expert;
        p->cap = n_ubatch * (u->n_expert_used > 0 ? u->n_expert_used : 1);
        p->prev = calloc(nu, sizeof *p->prev);
        p->tot = calloc(nu, sizeof *p->tot);
        p->advised = calloc(nu, 1);
        p->ids = malloc((size_t)p->cap * sizeof *p->ids);
        if (!p->prev || !p->tot || !p->advised || !p->ids) {
            hm_pp_close(p);
            return hm_errf(err, HM_ERR_NOMEM, "prompt-processing model: out of memory");
        }
    }
    *out = p;
    return HM_OK;
}

void hm_pp_close(hm_pp *p) {
    if (!p) return;
    free(p->prev);
    free(p->tot);
    free(p->advised);
    free(p->ids);
    free(p);
}

hm_model *hm_pp_model(const hm_pp *p) { return p->o.model; }
bool hm_pp_copies(const hm_pp *p) { return p->copies; }
const hm_pp_opts *hm_pp_get_opts(const hm_pp *p) { return &p->o; }
hm_pp_stats *hm_pp_stats_of(hm_pp *p) { return &p->st; }

void hm_pp_begin(hm_pp *p) {
    const hm_experts *e = p->o.model->experts;
    if (!p->prev || !e) return;
    const hm_units *u = hm_experts_units(e);
    for (int32_t l = 0; l < p->n_layer; l++)
        for (int32_t x = 0; x < u->layers[l].n_expert; x++)
            p->prev[(size_t)l * (size_t)p->n_expert + (size_t)x] = hm_experts_unit(e, l, x)->count;
    memset(p->tot, 0, (size_t)p->n_layer * (size_t)p->n_expert * sizeof *p->tot);
    p->half_done = false;
}

/* The VRAM residency of main's store placed from its counts now (static's ranking), then the policy
 * in force again (online and lru keep the residents): fills start on the tier's copier thread. */
static void replan(hm_pp *p, hm_model *main) {
    hm_experts *e = main->experts;
    hm_experts_stats es;
    hm_experts_get_stats(e, &es);
    const hm_policy_kind k = hm_experts_policy(e);
    if (es.n_slots <= 0 || k == HM_POLICY_NONE || k == HM_POLICY_STATIC) return;
    hm_err serr;
    if (hm_experts_set_policy(e, HM_POLICY_STATIC, NULL, &serr) != HM_OK ||
        hm_experts_set_policy(e, k, NULL, &serr) != HM_OK)
        hm_log_printf(&main->log, HM_LOG_WARN, "expert store (prompt-processing hand-over): %s", serr.msg);
    p->st.replans++;
}

void hm_pp_progress(hm_pp *p, hm_model *main, int32_t done, int32_t total, int32_t n_ubatch) {
    if (p->o.no_warm || !p->prev || !main->experts || p->half_done || total < 4 * n_ubatch || 2 * done < total) return;
    p->half_done = true;
    replan(p, main);
}

void hm_pp_end(hm_pp *p, hm_model *main) {
    if (p->o.no_warm || !p->prev || !main->experts) return;
    replan(p, main);
    if (!main->ram) return;
    /* the SSD tier: each layer's most routed units of the run read into staging now, in the
     * background (the tier's prefetch: skips units in VRAM or RAM already), as many as staging
     * holds spread over the layers; the first decode steps then find them in RAM */
    hm_ram_tier_stats rs;
    hm_ram_tier_get_stats(main->ram, &rs);
    int32_t per = p->n_layer > 0 ? rs.n_stage / p->n_layer : 0;
    if (per < 1) per = 1;
    if (per > p->cap) per = p->cap;
    for (int32_t l = 0; l < p->n_layer; l++) {
        uint64_t *t = p->tot + (size_t)l * (size_t)p->n_expert;
        int32_t n = 0;
        for (; n < per; n++) { /* selection of the top `per` by count (small: a few per layer) */
            int32_t best = -1;
            for (int32_t x = 0; x < p->n_expert; x++)
                if (t[x] && (best < 0 || t[x] > t[best])) best = x;
            if (best < 0) break;
            p->ids[n] = best;
            t[best] = 0;
        }
        if (n) hm_ram_tier_prefetch(main->ram, l, p->ids, n);
        p->st.units_prefetched += (uint64_t)n;
    }
}

/* Read unit (l, x) of main's mapping ahead: its parts' pages, page-aligned. */
static void advise(const hm_model *main, int32_t l, int32_t x) {
    const long pg = sysconf(_SC_PAGESIZE);
    const uintptr_t mask = (uintptr_t)(pg > 0 ? pg : 4096) - 1;
    const hm_unit_ref r = hm_unit_ref_of(&main->units, l, x);
    for (int q = 0; q < HM_UNIT_NPART; q++) {
        if (!r.src[q] || !r.part_bytes[q]) continue;
        const uintptr_t a = (uintptr_t)r.src[q] & ~mask, b = (uintptr_t)r.src[q] + (uintptr_t)r.part_bytes[q];
        (void)madvise((void *)a, (size_t)(b - a), MADV_WILLNEED); /* advice: a failure costs only speed */
    }
}

void hm_pp_step(hm_pp *p, hm_model *main, int32_t n_tok) {
    if (p->o.no_warm || !p->prev || !main->experts || !p->o.model->experts) return;
    const hm_experts *pe = p->o.model->experts;
    const hm_units *u = hm_experts_units(pe);
    for (int32_t l = 0; l < p->n_layer; l++) {
        int32_t n = 0;
        for (int32_t x = 0; x < u->layers[l].n_expert; x++) {
            const size_t ui = (size_t)l * (size_t)p->n_expert + (size_t)x;
            const uint64_t c = hm_experts_unit(pe, l, x)->count;
            uint64_t d = c - p->prev[ui];
            p->prev[ui] = c;
            if (!d) continue;
            p->tot[ui] += d;
            p->st.routes_warm += d;
            if (!main->ram && !p->advised[ui]) {
                advise(main, l, x);
                p->advised[ui] = 1;
                p->st.units_advised++;
            }
            for (; d > 0; d--) { /* the unit's selections, replayed as ids (a layer's chunk at a time) */
                if (n == p->cap) {
                    hm_experts_record(main->experts, l, p->ids, n);
                    n = 0;
                }
                p->ids[n++] = x;
            }
        }
        if (n) hm_experts_record(main->experts, l, p->ids, n);
    }
    hm_err serr;
    if (hm_experts_step_end(main->experts, n_tok, true, &serr) != HM_OK)
        hm_log_printf(&main->log, HM_LOG_WARN, "expert store (prompt-processing hand-over): %s", serr.msg);
    if (main->ram && hm_ram_tier_step_end(main->ram, n_tok, true, &serr) != HM_OK)
        hm_log_printf(&main->log, HM_LOG_WARN, "RAM tier (prompt-processing hand-over): %s", serr.msg);
}
