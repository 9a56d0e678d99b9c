/* trace.c - the binary routing trace (see trace.h for the layout). stdio does the buffering. */
#include "trace.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define TRACE_MAGIC "HMTRACE1"
#define TRACE_VERSION 1u
#define MAX_IDS (1 << 24) /* one record: more than any ubatch * k */

struct hm_trace_writer {
    FILE *f;
    char path[1024];
    int32_t n_layer, n_expert, k;
    uint32_t id_bytes;
    bool failed;
    int saved_errno;
};

static void put_u16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v) { put_u16(p, v & 0xffff), put_u16(p + 2, v >> 16); }
static uint32_t get_u16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t get_u32(const uint8_t *p) { return get_u16(p) | get_u16(p + 2) << 16; }

static void wr(hm_trace_writer *w, const void *p, size_t n) {
    if (!w->failed && fwrite(p, 1, n, w->f) != n) w->failed = true, w->saved_errno = errno;
}

hm_status hm_trace_writer_open(hm_trace_writer **out, const char *path, int32_t n_layer, int32_t n_expert,
                               int32_t k, hm_err *err) {
    *out = NULL;
    if (n_layer <= 0 || n_layer > 65535 || n_expert <= 0 || n_expert > 65536 || k < 0 || k > n_expert)
        return hm_errf(err, HM_ERR_ARG, "%s: trace geometry %d layers x %d experts, k %d is out of range", path,
                       n_layer, n_expert, k);
    hm_trace_writer *w = calloc(1, sizeof *w);
    if (!w) return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory", path);
    w->f = fopen(path, "wb");
    if (!w->f) {
        hm_status st = hm_errf(err, HM_ERR_IO, "%s: %s", path, strerror(errno));
        free(w);
        return st;
    }
    snprintf(w->path, sizeof w->path, "%s", path);
    w->n_layer = n_layer, w->n_expert = n_expert, w->k = k;
    w->id_bytes = n_expert <= 256 ? 1 : 2;
    uint8_t h[32] = {0};
    memcpy(h, TRACE_MAGIC, 8);
    put_u32(h + 8, TRACE_VERSION);
    put_u32(h + 12, (uint32_t)n_layer);
    put_u32(h + 16, (uint32_t)n_expert);
    put_u32(h + 20, (uint32_t)k);
    put_u32(h + 24, w->id_bytes);
    wr(w, h, sizeof h);
    *out = w;
    return HM_OK;
}

void hm_trace_write_route(hm_trace_writer *w, int32_t layer, const int32_t *ids, int32_t n) {
    uint8_t h[8] = {'R', 0};
    put_u16(h + 2, (uint32_t)layer);
    put_u32(h + 4, (uint32_t)n);
    wr(w, h, sizeof h);
    uint8_t buf[512];
    size_t fill = 0;
    for (int32_t i = 0; i < n; i++) {
        if (w->id_bytes == 1) buf[fill++] = (uint8_t)ids[i];
        else put_u16(buf + fill, (uint32_t)ids[i]), fill += 2;
        if (fill + 2 > sizeof buf) wr(w, buf, fill), fill = 0;
    }
    if (fill) wr(w, buf, fill);
}

void hm_trace_write_step(hm_trace_writer *w, int32_t n_tok, bool prompt) {
    uint8_t h[8] = {'S', prompt ? 1 : 0};
    put_u32(h + 4, (uint32_t)n_tok);
    wr(w, h, sizeof h);
}

hm_status hm_trace_writer_close(hm_trace_writer *w, hm_err *err) {
    if (!w) return HM_OK;
    if (fclose(w->f) != 0 && !w->failed) w->failed = true, w->saved_errno = errno;
    hm_status st = w->failed ? hm_errf(err, HM_ERR_IO, "%s: trace write failed: %s", w->path, strerror(w->saved_errno))
                             : HM_OK;
    free(w);
    return st;
}

struct hm_trace_reader {
    FILE *f;
    char path[1024];
    int32_t n_layer, n_expert, k;
    uint32_t id_bytes;
    uint64_t off;
    int32_t *ids;
    int32_t cap;
    uint8_t *raw;
};

hm_status hm_trace_reader_open(hm_trace_reader **out, const char *path, hm_err *err) {
    *out = NULL;
    hm_trace_reader *r = calloc(1, sizeof *r);
    if (!r) return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory", path);
    snprintf(r->path, sizeof r->path, "%s", path);
    hm_status st;
    r->f = fopen(path, "rb");
    if (!r->f) {
        st = hm_errf(err, HM_ERR_IO, "%s: %s", path, strerror(errno));
        goto fail;
    }
    uint8_t h[32];
    if (fread(h, 1, sizeof h, r->f) != sizeof h || memcmp(h, TRACE_MAGIC, 8) != 0) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s: not a hotmoe trace (no %s header)", path, TRACE_MAGIC);
        goto fail;
    }
    uint32_t ver = get_u32(h + 8), nl = get_u32(h + 12), ne = get_u32(h + 16), k = get_u32(h + 20);
    r->id_bytes = get_u32(h + 24);
    if (ver != TRACE_VERSION || !nl || nl > 65535 || !ne || ne > 65536 || k > ne ||
        r->id_bytes != (ne <= 256 ? 1u : 2u)) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s: bad trace header (version %u, %u layers, %u experts, k %u, id bytes %u)",
                     path, ver, nl, ne, k, r->id_bytes);
        goto fail;
    }
    r->n_layer = (int32_t)nl, r->n_expert = (int32_t)ne, r->k = (int32_t)k;
    r->off = sizeof h;
    *out = r;
    return HM_OK;
fail:
    hm_trace_reader_close(r);
    return st;
}

void hm_trace_reader_geom(const hm_trace_reader *r, int32_t *n_layer, int32_t *n_expert, int32_t *k) {
    *n_layer = r->n_layer, *n_expert = r->n_expert, *k = r->k;
}

hm_status hm_trace_next(hm_trace_reader *r, hm_trace_event *ev, hm_err *err) {
    memset(ev, 0, sizeof *ev);
    uint8_t h[8];
    size_t got = fread(h, 1, sizeof h, r->f);
    if (got == 0 && feof(r->f)) return HM_OK; /* END */
    if (got != sizeof h)
        return hm_errf(err, HM_ERR_FORMAT, "%s: truncated record at offset %" PRIu64, r->path, r->off);
    uint64_t at = r->off;
    r->off += sizeof h;
    if (h[0] == 'S') {
        uint32_t n = get_u32(h + 4);
        if (h[1] > 1 || n > INT32_MAX)
            return hm_errf(err, HM_ERR_FORMAT, "%s: bad step record at offset %" PRIu64, r->path, at);
        ev->kind = HM_TRACE_STEP, ev->n = (int32_t)n, ev->prompt = h[1] == 1;
        return HM_OK;
    }
    uint32_t layer = get_u16(h + 2), n = get_u32(h + 4);
    if (h[0] != 'R' || h[1] != 0 || layer >= (uint32_t)r->n_layer || n > MAX_IDS || (r->k && n % (uint32_t)r->k))
        return hm_errf(err, HM_ERR_FORMAT, "%s: bad record at offset %" PRIu64 " (kind 0x%02x, layer %u, %u ids)",
                       r->path, at, h[0], layer, n);
    if ((int32_t)n > r->cap) {
        int32_t *ids = realloc(r->ids, n * sizeof *ids);
        uint8_t *raw = ids ? realloc(r->raw, (size_t)n * 2) : NULL;
        if (ids) r->ids = ids;
        if (!raw) return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory for %u ids", r->path, n);
        r->raw = raw;
        r->cap = (int32_t)n;
    }
    size_t nb = (size_t)n * r->id_bytes;
    if (fread(r->raw, 1, nb, r->f) != nb)
        return hm_errf(err, HM_ERR_FORMAT, "%s: truncated route record at offset %" PRIu64, r->path, at);
    r->off += nb;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = r->id_bytes == 1 ? r->raw[i] : get_u16(r->raw + 2 * i);
        if (id >= (uint32_t)r->n_expert)
            return hm_errf(err, HM_ERR_FORMAT, "%s: expert id %u >= %d in the record at offset %" PRIu64, r->path, id,
                           r->n_expert, at);
        r->ids[i] = (int32_t)id;
    }
    ev->kind = HM_TRACE_ROUTE, ev->layer = (int32_t)layer, ev->n = (int32_t)n, ev->ids = r->ids;
    return HM_OK;
}

void hm_trace_reader_close(hm_trace_reader *r) {
    if (!r) return;
    if (r->f) fclose(r->f);
    free(r->ids);
    free(r->raw);
    free(r);
}
