/* gpu_split.c - the multi-GPU placement plan (gpu_split.h): parsing the per-device flags
 * (--vram-budget DEV:SIZE,..., -ts), llama.cpp's layer split, the plan, and placing hot units on
 * the device of their layer. No CUDA, no allocation: a plan is a plain value. */
#include "gpu_split.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

/* ---- parsing ---- */

#define TOK_MAX 64

/* Copy s[0..len) into tok (NUL-terminated); false when it does not fit. */
static bool tok_copy(char *tok, const char *s, size_t len) {
    if (len >= TOK_MAX) return false;
    memcpy(tok, s, len);
    tok[len] = '\0';
    return true;
}

/* One budget: a size ("11GiB", "auto", "-1") or, with mib, whole MiB (-1 = auto). */
static bool budget_value(const char *s, bool mib, int64_t *out) {
    if (!mib) {
        hm_err e;
        return hm_parse_size(s, out, &e) == HM_OK;
    }
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < -1 || v > (1LL << 40)) return false;
    *out = v < 0 ? -1 : (int64_t)v << 20;
    return true;
}

hm_status hm_parse_vram_budget(const char *s, bool mib, hm_placement_opts *o, hm_err *err) {
    if (!s || !*s) return hm_errf(err, HM_ERR_ARG, "empty value (expects a size, auto, or DEV:SIZE,...)");
    if (!strchr(s, ':')) { /* the single-device form */
        int64_t v;
        if (!budget_value(s, mib, &v))
            return hm_errf(err, HM_ERR_ARG, "expects %s, auto, or a size per device (0:11GiB,1:5GiB), got '%s'",
                           mib ? "MiB (11800, -1 = auto)" : "a size (12GiB, 512MiB, 0)", s);
        o->vram_budget = v;
        o->n_vram_budgets = 0;
        return HM_OK;
    }
    hm_gpu_budget b[HM_MAX_GPUS];
    int32_t n = 0;
    for (const char *p = s;;) {
        const size_t len = strcspn(p, ",");
        char tok[TOK_MAX];
        if (len == 0) return hm_errf(err, HM_ERR_ARG, "empty entry (expects DEV:SIZE, e.g. 0:11GiB)");
        if (!tok_copy(tok, p, len)) return hm_errf(err, HM_ERR_ARG, "entry '%.24s...' is too long", p);
        char *colon = strchr(tok, ':');
        if (colon) *colon = '\0';
        char *end;
        long dev = isdigit((unsigned char)tok[0]) ? strtol(tok, &end, 10) : -1;
        if (dev < 0 || *end || dev >= HM_MAX_GPUS)
            return hm_errf(err, HM_ERR_ARG, "bad device '%s' (a CUDA device number, 0..%d)", tok, HM_MAX_GPUS - 1);
        if (!colon)
            return hm_errf(err, HM_ERR_ARG, "no size for device %ld (expects DEV:SIZE, e.g. %ld:11GiB)", dev, dev);
        for (int32_t i = 0; i < n; i++)
            if (b[i].device == dev) return hm_errf(err, HM_ERR_ARG, "device %ld is given twice", dev);
        int64_t v;
        if (!budget_value(colon + 1, mib, &v))
            return hm_errf(err, HM_ERR_ARG, "bad size '%s' for device %ld (expects %s)", colon + 1, dev,
                           mib ? "MiB, or -1 = auto" : "e.g. 11GiB, 512MiB, 0 or auto");
        b[n].device = (int32_t)dev; /* n < HM_MAX_GPUS: the devices are distinct and < HM_MAX_GPUS */
        b[n].bytes = v;
        n++;
        if (!p[len]) break;
        p += len + 1;
    }
    memcpy(o->vram_budgets, b, (size_t)n * sizeof b[0]);
    o->n_vram_budgets = n;
    o->vram_budget = 0;
    return HM_OK;
}

hm_status hm_parse_tensor_split(const char *s, hm_placement_opts *o, hm_err *err) {
    if (!s || !*s) return hm_errf(err, HM_ERR_ARG, "empty value (expects proportions per device, e.g. 3,1)");
    float v[HM_MAX_GPUS];
    int32_t n = 0;
    /* llama.cpp splits on the regex [,/]+: runs of separators are one, and a trailing one ends the
     * list; a leading one is an empty first entry (an error there too) */
    for (const char *p = s; *p;) {
        const size_t len = strcspn(p, ",/");
        char tok[TOK_MAX];
        if (len == 0) return hm_errf(err, HM_ERR_ARG, "empty entry (expects proportions per device, e.g. 3,1)");
        if (!tok_copy(tok, p, len)) return hm_errf(err, HM_ERR_ARG, "entry '%.24s...' is too long", p);
        if (n == HM_MAX_GPUS)
            return hm_errf(err, HM_ERR_ARG, "more than %d entries (one per CUDA device)", HM_MAX_GPUS);
        char *end;
        errno = 0;
        const float f = strtof(tok, &end);
        if (errno || end == tok || *end || !isfinite(f) || f < 0)
            return hm_errf(err, HM_ERR_ARG, "bad share '%s' for device %d (a proportion >= 0, e.g. 3)", tok, (int)n);
        v[n++] = f;
        p += len;
        p += strspn(p, ",/");
    }
    memcpy(o->tensor_split, v, (size_t)n * sizeof v[0]);
    for (int32_t i = n; i < HM_MAX_GPUS; i++) o->tensor_split[i] = 0.0f;
    o->n_tensor_split = n;
    return HM_OK;
}

/* ---- llama.cpp's layer split ---- */

/* Cumulative fractions s[i] = (w[0] + .. + w[i]) / sum, in float as llama.cpp sums them. */
static void split_points(const float *w, int32_t n, float *s) {
    float sum = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        sum += w[i];
        s[i] = sum;
    }
    for (int32_t i = 0; i < n; i++) s[i] /= sum;
}

/* std::upper_bound(s, s + n, float(il) / n_act) - s: the first split point above the layer's
 * position. s[n - 1] is exactly 1 and il < n_act, so some point is above; n - 1 guards anyway. */
static int32_t split_dev(const float *s, int32_t n, int32_t il, int32_t n_act) {
    const float x = (float)il / (float)n_act;
    for (int32_t i = 0; i < n; i++)
        if (s[i] > x) return i;
    return n - 1;
}

void hm_gpu_split_layers(const float *weights, int32_t n_w, int32_t n_layer, int32_t *dev_of) {
    HM_ASSERT(n_w >= 1 && n_w <= HM_MAX_GPUS && n_layer >= 0);
    float s[HM_MAX_GPUS];
    split_points(weights, n_w, s);
    for (int32_t il = 0; il <= n_layer; il++) dev_of[il] = split_dev(s, n_w, il, n_layer + 1);
}

/* ---- the plan ---- */

/* "there is 1 CUDA device" / "there are N CUDA devices", for the messages below. */
static const char *there_are(char *buf, size_t size, int32_t n) {
    snprintf(buf, size, n == 1 ? "there is %d CUDA device" : "there are %d CUDA devices", (int)n);
    return buf;
}

hm_status hm_gpu_plan_make(hm_gpu_plan *p, const hm_placement_opts *o, int32_t n_layer, int32_t n_cuda,
                           const int64_t *free_bytes, hm_err *err) {
    memset(p, 0, sizeof *p);
    if (n_layer < 1) return hm_errf(err, HM_ERR_ARG, "gpu plan: the model has no layers");
    if (n_cuda < 1) return hm_errf(err, HM_ERR_CUDA, "no CUDA device found");
    if (n_cuda > HM_MAX_GPUS) n_cuda = HM_MAX_GPUS;
    if (o->n_vram_budgets < 0 || o->n_vram_budgets > HM_MAX_GPUS || o->n_tensor_split < 0 ||
        o->n_tensor_split > HM_MAX_GPUS)
        return hm_errf(err, HM_ERR_ARG, "gpu plan: %d per-device budgets, %d tensor-split entries (at most %d)",
                       (int)o->n_vram_budgets, (int)o->n_tensor_split, HM_MAX_GPUS);

    char msg[48];
    bool in[HM_MAX_GPUS] = {false}, named[HM_MAX_GPUS] = {false};
    int64_t bytes[HM_MAX_GPUS] = {0};
    bool ts_on = false; /* -ts with a share > 0 (all zero = llama.cpp's default split) */
    for (int32_t i = 0; i < o->n_tensor_split; i++) {
        const float f = o->tensor_split[i];
        if (!isfinite(f) || f < 0)
            return hm_errf(err, HM_ERR_ARG, "--tensor-split: bad share %g for device %d", (double)f, (int)i);
        if (f == 0.0f) continue;
        if (i >= n_cuda)
            return hm_errf(err, HM_ERR_ARG, "--tensor-split gives CUDA device %d a share but %s", (int)i,
                           there_are(msg, sizeof msg, n_cuda));
        ts_on = true;
        in[i] = true;
    }
    for (int32_t j = 0; j < o->n_vram_budgets; j++) {
        const hm_gpu_budget *b = &o->vram_budgets[j];
        if (b->device < 0 || b->device >= HM_MAX_GPUS || b->bytes < -1)
            return hm_errf(err, HM_ERR_ARG, "--vram-budget: bad entry %d (device %d, %lld bytes)", (int)j,
                           (int)b->device, (long long)b->bytes);
        if (b->device >= n_cuda)
            return hm_errf(err, HM_ERR_ARG, "--vram-budget names CUDA device %d but %s", (int)b->device,
                           there_are(msg, sizeof msg, n_cuda));
        if (named[b->device])
            return hm_errf(err, HM_ERR_ARG, "--vram-budget: device %d is given twice", (int)b->device);
        named[b->device] = in[b->device] = true;
        bytes[b->device] = b->bytes;
    }
    if (!o->n_vram_budgets && !ts_on) { /* the single-device form */
        if (o->main_gpu < 0 || o->main_gpu >= n_cuda)
            return hm_errf(err, HM_ERR_ARG, "--main-gpu %d: %s", (int)o->main_gpu,
                           there_are(msg, sizeof msg, n_cuda));
        in[o->main_gpu] = true;
    }
    p->by_layer = !o->n_vram_budgets && o->vram_budget == 0;
    p->by_free = !ts_on;
    p->n_layer = n_layer;

    float w[HM_MAX_GPUS];
    bool any = false;
    for (int32_t d = 0; d < n_cuda; d++) {
        if (!in[d]) continue;
        const int32_t i = p->n_dev++;
        p->dev[i] = d;
        p->budget[i] = o->n_vram_budgets ? bytes[d] : o->vram_budget;
        /* a device outside -ts (budget only) has weight 0: no layers, peer units only */
        w[i] = ts_on ? (d < o->n_tensor_split ? o->tensor_split[d] : 0.0f)
                     : (free_bytes ? (float)free_bytes[d] : 1.0f);
        any = any || w[i] > 0.0f;
    }
    if (!any) /* no free memory reported anywhere: equal shares */
        for (int32_t i = 0; i < p->n_dev; i++) w[i] = 1.0f;

    /* Devices of weight 0 between others change no split point, so splitting over the plan's
     * devices only is llama.cpp's split over all of them (as with its --device list). */
    float s[HM_MAX_GPUS];
    split_points(w, p->n_dev, s);
    int32_t il = 0;
    for (int32_t i = 0; i < p->n_dev; i++) {
        p->layer_begin[i] = il;
        while (il < n_layer && split_dev(s, p->n_dev, il, n_layer + 1) == i) il++;
        p->layer_end[i] = il;
    }
    HM_ASSERT(il == n_layer); /* the split is monotone: every layer in one range */
    p->output_dev = split_dev(s, p->n_dev, n_layer, n_layer + 1);
    return HM_OK;
}

int32_t hm_gpu_plan_layer_dev(const hm_gpu_plan *p, int32_t l) {
    HM_ASSERT(l >= 0 && l <= p->n_layer);
    if (l == p->n_layer) return p->output_dev;
    for (int32_t i = 0; i < p->n_dev; i++)
        if (l >= p->layer_begin[i] && l < p->layer_end[i]) return i;
    HM_ASSERT(!"layer outside every range");
    return 0;
}

/* ---- hot units on devices ---- */

int64_t hm_gpu_plan_place_units(const hm_gpu_plan *p, const int64_t *slots, const int32_t *unit_layer, int64_t n,
                                bool allow_peer, int32_t *dev, uint8_t *peer, int64_t *used) {
    int64_t left[HM_MAX_GPUS], total = 0, placed = 0;
    for (int32_t i = 0; i < p->n_dev; i++) {
        left[i] = slots[i] > 0 ? slots[i] : 0;
        total += left[i];
    }
    for (int64_t k = 0; k < n; k++) {
        dev[k] = -1;
        if (peer) peer[k] = 0;
    }
    /* with peers every unit of the hot set gets a slot somewhere, so only the hot set may take
     * its own device's room; without, each device takes the hottest of its own layers */
    const int64_t first = allow_peer ? (n < total ? n : total) : n;
    for (int64_t k = 0; k < first; k++) {
        HM_ASSERT(unit_layer[k] >= 0 && unit_layer[k] < p->n_layer);
        const int32_t d = hm_gpu_plan_layer_dev(p, unit_layer[k]);
        if (left[d] > 0) {
            dev[k] = d;
            left[d]--;
            placed++;
        }
    }
    for (int64_t k = 0; allow_peer && k < first; k++) {
        if (dev[k] >= 0) continue;
        int32_t best = 0;
        for (int32_t i = 1; i < p->n_dev; i++)
            if (left[i] > left[best]) best = i;
        HM_ASSERT(left[best] > 0); /* room left = total - placed >= the hot set's unplaced units */
        dev[k] = best;
        if (peer) peer[k] = 1;
        left[best]--;
        placed++;
    }
    if (used)
        for (int32_t i = 0; i < p->n_dev; i++) used[i] = (slots[i] > 0 ? slots[i] : 0) - left[i];
    return placed;
}
