/* units.c - expert units from a GGUF tensor table (see units.h). Reads names, shapes and sizes
 * only; every value from the file is checked before it is used as a count or an index. */
#include "units.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const part_names[HM_UNIT_NPART] = {
    [HM_UNIT_GATE] = "ffn_gate_exps",
    [HM_UNIT_UP] = "ffn_up_exps",
    [HM_UNIT_DOWN] = "ffn_down_exps",
    [HM_UNIT_GATE_UP] = "ffn_gate_up_exps",
};

const char *hm_unit_part_name(hm_unit_part p) {
    return (unsigned)p < HM_UNIT_NPART ? part_names[p] : "unknown";
}

/* "blk.<layer>.<part>.weight" -> layer and part; false for any other name. */
static bool parse_expert_name(const char *name, int64_t *layer, hm_unit_part *part) {
    if (strncmp(name, "blk.", 4) != 0) return false;
    const char *p = name + 4;
    if (*p < '0' || *p > '9') return false;
    int64_t l = 0;
    while (*p >= '0' && *p <= '9') {
        if (l > 100000000) return false; /* not a layer index anyone writes */
        l = l * 10 + (*p++ - '0');
    }
    if (*p++ != '.') return false;
    for (int i = 0; i < HM_UNIT_NPART; i++) {
        size_t n = strlen(part_names[i]);
        if (strncmp(p, part_names[i], n) == 0 && strcmp(p + n, ".weight") == 0) {
            *layer = l;
            *part = (hm_unit_part)i;
            return true;
        }
    }
    return false;
}

/* Highest N in "blk.N." names, -1 if none. */
static int64_t max_block_index(const hm_gguf *g) {
    int64_t best = -1;
    for (int64_t i = 0; i < hm_gguf_n_tensors(g); i++) {
        const char *name = hm_gguf_tensor_at(g, i)->name;
        if (strncmp(name, "blk.", 4) != 0) continue;
        char *end = NULL;
        long long l = strtoll(name + 4, &end, 10);
        if (end != name + 4 && *end == '.' && l >= 0 && l < 100000000 && l > best) best = l;
    }
    return best;
}

/* <arch>.<suffix> as an int, when present and in [0, max]. */
static bool arch_int(const hm_gguf *g, const char *suffix, int64_t max, int64_t *out, hm_err *err,
                     hm_status *st) {
    hm_gguf_str arch;
    *st = HM_OK;
    if (!hm_gguf_get_str(g, "general.architecture", &arch) || arch.len == 0 || arch.len > 64)
        return false;
    char key[128];
    snprintf(key, sizeof key, "%.*s.%s", (int)arch.len, arch.ptr, suffix);
    int64_t v;
    if (!hm_gguf_get_int(g, key, &v)) return false;
    if (v < 0 || v > max) {
        *st = hm_errf(err, HM_ERR_FORMAT, "%s: %s = %" PRId64 " is out of range [0, %" PRId64 "]",
                      hm_gguf_path(g), key, v, max);
        return false;
    }
    *out = v;
    return true;
}

hm_status hm_units_init(hm_units *u, const hm_gguf *g, hm_err *err) {
    memset(u, 0, sizeof *u);
    const char *path = hm_gguf_path(g);
    hm_status st;
    int64_t n_layer = 0, n_expert = 0, n_used = 0;

    if (!arch_int(g, "block_count", 100000, &n_layer, err, &st)) {
        if (st) return st;
        n_layer = max_block_index(g) + 1;
    }
    bool have_n_expert = arch_int(g, "expert_count", INT32_MAX, &n_expert, err, &st);
    if (st) return st;
    if (arch_int(g, "expert_used_count", INT32_MAX, &n_used, err, &st)) u->n_expert_used = (int32_t)n_used;
    if (st) return st;

    u->n_layer = (int32_t)n_layer;
    u->gguf = g;
    u->n_files = hm_gguf_n_files(g);
    u->n_expert = (int32_t)n_expert;
    if (n_layer > 0) {
        u->layers = calloc((size_t)n_layer, sizeof *u->layers);
        if (!u->layers) return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory for %" PRId64 " layers", path, n_layer);
    }

    for (int64_t i = 0; i < hm_gguf_n_tensors(g); i++) {
        const hm_gguf_tensor *t = hm_gguf_tensor_at(g, i);
        if (__builtin_add_overflow(u->tensor_bytes, (uint64_t)t->nbytes, &u->tensor_bytes)) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: tensor sizes overflow at '%s'", path, t->name);
            goto fail;
        }
        int64_t layer;
        hm_unit_part part;
        if (!parse_expert_name(t->name, &layer, &part)) continue;
        if (layer >= n_layer) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: tensor '%s' is in layer %" PRId64 " but the model has %" PRId64 " layers",
                         path, t->name, layer, n_layer);
            goto fail;
        }
        if (t->n_dims != 3 || t->ne[2] <= 0) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: expert tensor '%s' has %u dims (expected 3: {ne0, ne1, n_expert})",
                         path, t->name, t->n_dims);
            goto fail;
        }
        if (have_n_expert && t->ne[2] != n_expert) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: expert tensor '%s' has ne[2] = %" PRId64 " but expert_count is %" PRId64,
                         path, t->name, t->ne[2], n_expert);
            goto fail;
        }
        hm_units_layer *l = &u->layers[layer];
        if (l->n_expert && l->n_expert != t->ne[2]) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: expert tensor '%s' has %" PRId64 " experts, its layer's others %d",
                         path, t->name, t->ne[2], l->n_expert);
            goto fail;
        }
        if (l->part[part]) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: duplicate expert tensor '%s'", path, t->name);
            goto fail;
        }
        if (t->ne[2] > INT32_MAX || t->nbytes % (uint64_t)t->ne[2]) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: expert tensor '%s': %zu bytes do not split into %" PRId64 " experts",
                         path, t->name, t->nbytes, t->ne[2]);
            goto fail;
        }
        l->n_expert = (int32_t)t->ne[2];
        l->part[part] = t;
        l->slab_bytes[part] = t->nbytes / (uint64_t)t->ne[2];
    }

    for (int32_t li = 0; li < u->n_layer; li++) {
        hm_units_layer *l = &u->layers[li];
        if (!l->n_expert) continue;
        bool gate_up = l->part[HM_UNIT_GATE] && l->part[HM_UNIT_UP];
        bool fused = l->part[HM_UNIT_GATE_UP] != NULL;
        if (!l->part[HM_UNIT_DOWN] || gate_up == fused) {
            const char *missing = !l->part[HM_UNIT_DOWN] ? "ffn_down_exps"
                                  : fused             ? "only one of ffn_gate_up_exps and ffn_{gate,up}_exps"
                                  : !l->part[HM_UNIT_GATE] ? "ffn_gate_exps" : "ffn_up_exps";
            st = hm_errf(err, HM_ERR_FORMAT, "%s: layer %d has expert tensors but lacks %s", path, li, missing);
            goto fail;
        }
        for (int p = 0; p < HM_UNIT_NPART; p++) l->unit_bytes += l->slab_bytes[p];
        if (!u->n_expert) u->n_expert = l->n_expert;
        u->n_units += (uint64_t)l->n_expert;
        u->expert_bytes += l->unit_bytes * (uint64_t)l->n_expert; /* <= tensor_bytes: no overflow */
        if (l->unit_bytes > u->unit_bytes_max) u->unit_bytes_max = l->unit_bytes;
        if (!u->unit_bytes_min || l->unit_bytes < u->unit_bytes_min) u->unit_bytes_min = l->unit_bytes;
    }
    u->dense_bytes = u->tensor_bytes - u->expert_bytes;
    return HM_OK;

fail:
    hm_units_free(u);
    return st;
}

hm_status hm_units_init_geom(hm_units *u, int32_t n_layer, int32_t n_expert, int32_t n_expert_used,
                             uint64_t unit_bytes, hm_err *err) {
    memset(u, 0, sizeof *u);
    u->n_files = 1;
    if (n_layer <= 0 || n_expert <= 0 || n_expert_used < 0 || n_expert_used > n_expert || !unit_bytes)
        return hm_errf(err, HM_ERR_ARG, "unit geometry: need n_layer > 0, n_expert > 0, 0 <= k <= n_expert and unit "
                       "bytes > 0 (got %d, %d, %d, %" PRIu64 ")", n_layer, n_expert, n_expert_used, unit_bytes);
    uint64_t n_units = (uint64_t)n_layer * (uint64_t)n_expert, total;
    if (__builtin_mul_overflow(n_units, unit_bytes, &total))
        return hm_errf(err, HM_ERR_ARG, "unit geometry: %" PRIu64 " units of %" PRIu64 " bytes overflow", n_units, unit_bytes);
    u->layers = calloc((size_t)n_layer, sizeof *u->layers);
    if (!u->layers) return hm_errf(err, HM_ERR_NOMEM, "out of memory for %d layers", n_layer);
    u->n_layer = n_layer;
    u->n_expert = n_expert;
    u->n_expert_used = n_expert_used;
    for (int32_t l = 0; l < n_layer; l++) {
        u->layers[l].n_expert = n_expert;
        u->layers[l].unit_bytes = unit_bytes;
    }
    u->n_units = n_units;
    u->unit_bytes_max = u->unit_bytes_min = unit_bytes;
    u->expert_bytes = u->tensor_bytes = total;
    return HM_OK;
}

void hm_units_free(hm_units *u) {
    if (!u) return;
    free(u->layers);
    memset(u, 0, sizeof *u);
}

uint64_t hm_units_fit(const hm_units *u, int64_t budget) {
    if (budget < 0 || !u->n_units || !u->unit_bytes_max) return 0;
    uint64_t n = (uint64_t)budget / u->unit_bytes_max;
    return n < u->n_units ? n : u->n_units;
}

void hm_units_span(const hm_units *u, int32_t file, const char **lo, size_t *len) {
    const char *a = NULL, *b = NULL;
    for (int32_t l = 0; l < u->n_layer; l++) {
        const hm_units_layer *L = &u->layers[l];
        for (int p = 0; p < HM_UNIT_NPART; p++) {
            if (!L->part[p] || !L->part[p]->data || !L->n_expert || L->part[p]->file != file) continue;
            const char *s = L->part[p]->data, *e = s + (size_t)L->n_expert * L->slab_bytes[p];
            if (!a || s < a) a = s;
            if (!b || e > b) b = e;
        }
    }
    *lo = a;
    *len = a ? (size_t)(b - a) : 0;
}
