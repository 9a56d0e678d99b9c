/* trace.h - routing traces: the routed experts of every token and layer, for offline policy study
 * (`--trace-out FILE`, `hotmoe plan --trace FILE`).
 *
 * The file mirrors the store's two calls exactly, so a replay makes the same calls the engine
 * made (docs/PROFILE.md has the byte layout):
 *   header  32 bytes: "HMTRACE1", u32 version (1), u32 n_layer, u32 n_expert, u32 k,
 *           u32 id_bytes (1 when n_expert <= 256, else 2), u32 reserved (0)
 *   record  'R' u8 0 u16 layer u32 n, then n expert ids of id_bytes each: hm_experts_record
 *           (ids token-major, [n_tok][k])
 *   record  'S' u8 phase (0 decode, 1 prompt) u16 0 u32 n_tok: hm_experts_step_end
 * All integers little-endian. A decode token of a 48-layer k 8 model costs 48 * 16 + 8 bytes.
 *
 * The writer buffers and reports the first I/O error at close; the reader checks every field
 * (layer < n_layer, ids < n_expert, n a multiple of k) and names the byte offset of a bad one. */
#ifndef HM_EXPERTS_TRACE_H
#define HM_EXPERTS_TRACE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

typedef struct hm_trace_writer hm_trace_writer;

/* Create path (written in place; a trace is a log, not a document). Owned by the caller. */
hm_status hm_trace_writer_open(hm_trace_writer **out, const char *path, int32_t n_layer, int32_t n_expert,
                               int32_t k, hm_err *err);
void hm_trace_write_route(hm_trace_writer *w, int32_t layer, const int32_t *ids, int32_t n);
void hm_trace_write_step(hm_trace_writer *w, int32_t n_tok, bool prompt);
/* Flush and close; the first write error since open, if any. NULL is a no-op (HM_OK). */
hm_status hm_trace_writer_close(hm_trace_writer *w, hm_err *err);

typedef enum hm_trace_kind { HM_TRACE_END = 0, HM_TRACE_ROUTE = 1, HM_TRACE_STEP = 2 } hm_trace_kind;

typedef struct hm_trace_event {
    hm_trace_kind kind;
    int32_t layer;      /* ROUTE */
    int32_t n;          /* ROUTE: ids; STEP: tokens */
    const int32_t *ids; /* ROUTE: [n], borrowed until the next call */
    bool prompt;        /* STEP */
} hm_trace_event;

typedef struct hm_trace_reader hm_trace_reader;

hm_status hm_trace_reader_open(hm_trace_reader **out, const char *path, hm_err *err);
void hm_trace_reader_geom(const hm_trace_reader *r, int32_t *n_layer, int32_t *n_expert, int32_t *k);
/* Next event; ev->kind END at a clean end of file. A truncated or corrupt record is
 * HM_ERR_FORMAT naming the offset. */
hm_status hm_trace_next(hm_trace_reader *r, hm_trace_event *ev, hm_err *err);
void hm_trace_reader_close(hm_trace_reader *r); /* NULL is a no-op */

#endif
