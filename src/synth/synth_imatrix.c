/* synth_imatrix.c - reading llama.cpp's importance-matrix files (synth_imatrix.h says both forms
 * and how each becomes the importance llama-quantize uses). Entries keep the file's order; the
 * values are owned copies, already divided by their counts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/file.h"
#include "../gguf/gguf.h"
#include "synth_imatrix.h"

typedef struct im_entry {
    char *name;
    float *v;
    int64_t n;
} im_entry;

struct hm_imatrix {
    im_entry *e;
    int64_t n, cap;
    int32_t chunk_count;
    bool legacy;
};

#define IM_MAX_LEGACY_BYTES ((size_t)16 << 30)

void hm_imatrix_close(hm_imatrix *m) {
    if (!m) return;
    for (int64_t i = 0; i < m->n; i++) {
        free(m->e[i].name);
        free(m->e[i].v);
    }
    free(m->e);
    free(m);
}

const float *hm_imatrix_find(const hm_imatrix *m, const char *name, int64_t *n) {
    for (int64_t i = 0; m && i < m->n; i++)
        if (strcmp(m->e[i].name, name) == 0) {
            if (n) *n = m->e[i].n;
            return m->e[i].v;
        }
    return NULL;
}

int64_t hm_imatrix_n_entries(const hm_imatrix *m) { return m ? m->n : 0; }
const char *hm_imatrix_name(const hm_imatrix *m, int64_t i) { return m && i >= 0 && i < m->n ? m->e[i].name : NULL; }
int32_t hm_imatrix_chunk_count(const hm_imatrix *m) { return m ? m->chunk_count : 0; }
bool hm_imatrix_is_legacy(const hm_imatrix *m) { return m && m->legacy; }

/* Append an entry named name[len] with n values (uninitialised); NULL on allocation failure or a
 * repeated name (*dup set). */
static im_entry *im_push(hm_imatrix *m, const char *name, size_t len, int64_t n, bool *dup) {
    *dup = false;
    for (int64_t i = 0; i < m->n; i++)
        if (strlen(m->e[i].name) == len && memcmp(m->e[i].name, name, len) == 0) {
            *dup = true;
            return NULL;
        }
    if (m->n == m->cap) {
        int64_t c = m->cap ? 2 * m->cap : 64;
        im_entry *g = realloc(m->e, (size_t)c * sizeof *g);
        if (!g) return NULL;
        m->e = g;
        m->cap = c;
    }
    im_entry *e = &m->e[m->n];
    e->name = malloc(len + 1);
    e->v = malloc((size_t)n * sizeof(float));
    if (!e->name || !e->v) {
        free(e->name);
        free(e->v);
        return NULL;
    }
    memcpy(e->name, name, len);
    e->name[len] = 0;
    e->n = n;
    m->n++;
    return e;
}

static hm_status im_check_finite(const char *path, const im_entry *e, hm_err *err) {
    for (int64_t i = 0; i < e->n; i++)
        if (!isfinite(e->v[i]))
            return hm_errf(err, HM_ERR_FORMAT, "imatrix %s: entry %s has a non-finite value at %lld", path, e->name,
                           (long long)i);
    return HM_OK;
}

static bool im_read32(const char *buf, size_t len, size_t *pos, int32_t *out) {
    if (len - *pos < 4) return false;
    memcpy(out, buf + *pos, 4);
    *pos += 4;
    return true;
}

static hm_status im_open_legacy(hm_imatrix *m, const char *path, hm_err *err) {
    char *buf = NULL;
    size_t len = 0;
    hm_status st = hm_file_read_all(path, IM_MAX_LEGACY_BYTES, &buf, &len, err);
    if (st) return st;
    size_t pos = 0;
    int32_t n_entries = 0;
    m->legacy = true;
    if (!im_read32(buf, len, &pos, &n_entries) || n_entries < 1) {
        st = hm_errf(err, HM_ERR_FORMAT, "imatrix %s: neither a GGUF file nor a legacy imatrix (no entry count)", path);
        goto done;
    }
    for (int32_t i = 0; i < n_entries; i++) {
        int32_t nlen = 0, ncall = 0, nval = 0;
        if (!im_read32(buf, len, &pos, &nlen) || nlen < 1 || (size_t)nlen > len - pos) {
            st = hm_errf(err, HM_ERR_FORMAT, "imatrix %s: entry %d of %d: bad or truncated name", path, i + 1, n_entries);
            goto done;
        }
        const char *name = buf + pos;
        pos += (size_t)nlen;
        if (!im_read32(buf, len, &pos, &ncall) || !im_read32(buf, len, &pos, &nval) || nval < 1 ||
            (size_t)nval > (len - pos) / 4) {
            st = hm_errf(err, HM_ERR_FORMAT, "imatrix %s: entry %.*s: truncated or no values", path, (int)nlen, name);
            goto done;
        }
        bool dup;
        im_entry *e = im_push(m, name, (size_t)nlen, nval, &dup);
        if (!e) {
            st = dup ? hm_errf(err, HM_ERR_FORMAT, "imatrix %s: entry %.*s appears twice", path, (int)nlen, name)
                     : hm_errf(err, HM_ERR_NOMEM, "imatrix %s: out of memory", path);
            goto done;
        }
        memcpy(e->v, buf + pos, (size_t)nval * 4);
        pos += (size_t)nval * 4;
        /* llama-quantize: sums hold (raw / count) * ncall; divide by ncall (as a float) */
        if (ncall > 0)
            for (int64_t j = 0; j < e->n; j++) e->v[j] = e->v[j] / (float)ncall;
        if ((st = im_check_finite(path, e, err))) goto done;
    }
    int32_t chunks = 0;
    if (pos < len && im_read32(buf, len, &pos, &chunks)) m->chunk_count = chunks;
done:
    free(buf);
    return st;
}

/* The name before suffix when s ends with it (length in *len). */
static bool im_strip(const char *s, const char *suffix, size_t *len) {
    size_t n = strlen(s), k = strlen(suffix);
    if (n <= k || strcmp(s + n - k, suffix) != 0) return false;
    *len = n - k;
    return true;
}

static hm_status im_open_gguf(hm_imatrix *m, const char *path, hm_gguf *g, hm_err *err) {
    if (hm_gguf_find_key(g, "imatrix.datasets") < 0 || hm_gguf_find_key(g, "imatrix.chunk_count") < 0 ||
        hm_gguf_find_key(g, "imatrix.chunk_size") < 0)
        return hm_errf(err, HM_ERR_FORMAT, "imatrix %s: a GGUF file without the imatrix.datasets, imatrix.chunk_count "
                       "and imatrix.chunk_size keys (not an imatrix file?)", path);
    int64_t cc = 0;
    if (hm_gguf_get_int(g, "imatrix.chunk_count", &cc)) m->chunk_count = (int32_t)cc;
    const int64_t nt = hm_gguf_n_tensors(g);
    for (int64_t i = 0; i < nt; i++) {
        const hm_gguf_tensor *s = hm_gguf_tensor_at(g, i);
        size_t len;
        if (im_strip(s->name, ".counts", &len)) continue; /* found through its in_sum2 */
        if (!im_strip(s->name, ".in_sum2", &len)) continue; /* llama.cpp ignores other tensors too */
        char cname[512];
        if (len + sizeof ".counts" > sizeof cname)
            return hm_errf(err, HM_ERR_FORMAT, "imatrix %s: tensor name %s is too long", path, s->name);
        memcpy(cname, s->name, len);
        memcpy(cname + len, ".counts", sizeof ".counts");
        const hm_gguf_tensor *c = hm_gguf_find_tensor(g, cname);
        if (!c) return hm_errf(err, HM_ERR_FORMAT, "imatrix %s: %s has no %s", path, s->name, cname);
        if (s->type != 0 || c->type != 0)
            return hm_errf(err, HM_ERR_FORMAT, "imatrix %s: %s and %s must be F32", path, s->name, cname);
        int64_t nval = 1, ncnt = 1;
        for (uint32_t d = 0; d < s->n_dims; d++) nval *= s->ne[d];
        for (uint32_t d = 0; d < c->n_dims; d++) ncnt *= c->ne[d];
        if (ncnt < 1 || nval < 1 || nval % ncnt)
            return hm_errf(err, HM_ERR_FORMAT, "imatrix %s: %s has %lld values, not a multiple of the %lld counts of %s",
                           path, s->name, (long long)nval, (long long)ncnt, cname);
        bool dup;
        im_entry *e = im_push(m, s->name, len, nval, &dup);
        if (!e)
            return dup ? hm_errf(err, HM_ERR_FORMAT, "imatrix %s: entry %.*s appears twice", path, (int)len, s->name)
                       : hm_errf(err, HM_ERR_NOMEM, "imatrix %s: out of memory", path);
        const float *sums = s->data, *counts = c->data;
        const int64_t ne0 = nval / ncnt;
        for (int64_t j = 0; j < ncnt; j++) {
            float cnt;
            memcpy(&cnt, counts + j, 4);
            /* llama.cpp rounds the stored count to an integer, then divides as a float */
            const float count = (float)lroundf(cnt);
            for (int64_t k = 0; k < ne0; k++) {
                float v;
                memcpy(&v, sums + j * ne0 + k, 4);
                e->v[j * ne0 + k] = count > 0.0f ? v / count : 1.0f;
            }
        }
        hm_status st = im_check_finite(path, e, err);
        if (st) return st;
    }
    if (m->n == 0) return hm_errf(err, HM_ERR_FORMAT, "imatrix %s: no NAME.in_sum2 / NAME.counts tensors", path);
    return HM_OK;
}

hm_status hm_imatrix_open(hm_imatrix **out, const char *path, hm_err *err) {
    *out = NULL;
    hm_imatrix *m = calloc(1, sizeof *m);
    if (!m) return hm_errf(err, HM_ERR_NOMEM, "imatrix %s: out of memory", path);
    FILE *f = fopen(path, "rb");
    if (!f) {
        free(m);
        return hm_errf(err, HM_ERR_IO, "imatrix %s: cannot open it", path);
    }
    char magic[4] = {0};
    const bool is_gguf = fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
    fclose(f);
    hm_status st;
    if (is_gguf) {
        hm_gguf *g = NULL;
        st = hm_gguf_open(&g, path, err);
        if (!st) st = im_open_gguf(m, path, g, err);
        hm_gguf_close(g);
    } else {
        st = im_open_legacy(m, path, err);
    }
    if (st) {
        hm_imatrix_close(m);
        return st;
    }
    *out = m;
    return HM_OK;
}
