/* tier_ssd.h - reading expert units from the model file into RAM buffers: the SSD tier's I/O.
 *
 * A unit is up to three byte ranges of the GGUF (units.h); they are rarely 4096-aligned. Each
 * range is read as its enclosing 4096-aligned span into the buffer (so O_DIRECT can be used:
 * no page cache, no double buffering) and the part pointer lands at the offset inside. The layout
 * of a unit in a buffer is a pure function of the unit table (hm_ssd_layout), so a caller knows
 * where the parts will be before the read finishes.
 *
 * Reads go through io_uring (liburing) with up to queue_depth range reads in flight; when
 * io_uring is not built in or its setup fails at run time (seccomp'd containers), or force_pread
 * is set, through pread, synchronously inside hm_ssd_start. O_DIRECT is used when the file can
 * be opened with it (tmpfs cannot); a read that the kernel refuses with EINVAL under O_DIRECT is
 * retried buffered.
 *
 * Requests are numbered 0 .. n_req-1 by the caller (one per RAM buffer): a request is idle,
 * busy (reads in flight or queued) or done; hm_ssd_wait collects a done request's status and
 * makes it idle again. An I/O error or a short read (the file shrank, a sector failed) makes
 * that request fail with a message naming the file, unit, part, offset and length; other
 * requests and later ones are unaffected. Partial reads are continued; bytes past the end of the
 * file that only pad the aligned span are not needed.
 *
 * One thread drives an hm_ssd (the forward pass's); it is not thread-safe. */
#ifndef HM_EXPERTS_TIER_SSD_H
#define HM_EXPERTS_TIER_SSD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "units.h"

#define HM_SSD_ALIGN 4096 /* buffer, offset and length alignment used for O_DIRECT */

/* Test-only fault injection: called once per range read before it is issued. Return 0 to read
 * normally, an errno value (> 0) to make the read fail with it, or -1 to make it come back short
 * (as if the file ended at the range's start). */
typedef int (*hm_ssd_fault_fn)(void *ctx, int32_t layer, int32_t expert, hm_unit_part part, uint64_t offset,
                               uint64_t len);

typedef struct hm_ssd_opts {
    int32_t queue_depth;  /* range reads in flight (io_uring); 0 = 16 */
    bool no_direct;       /* never O_DIRECT (page-cache reads) */
    bool force_pread;     /* never io_uring */
    hm_ssd_fault_fn fault;
    void *fault_ctx;
} hm_ssd_opts;

void hm_ssd_opts_default(hm_ssd_opts *o);

typedef struct hm_ssd hm_ssd;

/* Bytes a buffer needs to hold any unit of u with its aligned spans (a multiple of HM_SSD_ALIGN). */
size_t hm_ssd_slot_bytes(const hm_units *u);

/* Where part p of unit (layer, expert) lies inside buf once read (NULL for absent parts). buf
 * must be HM_SSD_ALIGN-aligned and hm_ssd_slot_bytes long. */
void hm_ssd_layout(const hm_units *u, int32_t layer, int32_t expert, void *buf, const void *parts[HM_UNIT_NPART]);

/* Open path (the file units was derived from) for reading units into n_req request slots.
 * units borrowed (must outlive io). *out owned by the caller (hm_ssd_close). */
hm_status hm_ssd_open(hm_ssd **out, const char *path, const hm_units *units, int32_t n_req, const hm_ssd_opts *o,
                      hm_err *err);
/* Waits for reads in flight, then frees. NULL is a no-op. */
void hm_ssd_close(hm_ssd *io);

/* Start reading unit (layer, expert) into buf (borrowed until the request is waited) as request
 * req, which must be idle. With pread the read happens here. Never fails: errors are reported
 * by hm_ssd_wait. */
void hm_ssd_start(hm_ssd *io, int32_t req, int32_t layer, int32_t expert, void *buf);
/* Make progress without blocking; true when req is done (or idle). */
bool hm_ssd_done(hm_ssd *io, int32_t req);
/* Block until req is done; its status (HM_ERR_IO with the message on failure); req becomes idle.
 * An idle req returns HM_OK at once. */
hm_status hm_ssd_wait(hm_ssd *io, int32_t req, hm_err *err);
bool hm_ssd_busy(const hm_ssd *io, int32_t req); /* started and not yet waited */

typedef struct hm_ssd_stats {
    bool uring;           /* io_uring in use (else pread) */
    bool direct;          /* the file is open with O_DIRECT */
    int32_t queue_depth;
    uint64_t units;       /* unit reads completed (ok or not) */
    uint64_t bytes;       /* bytes that arrived from the file (aligned spans, padding included) */
    uint64_t unit_bytes;  /* payload: the units' own bytes of the successful reads */
    uint64_t errors;      /* failed unit reads */
    uint64_t retries;     /* partial reads continued, O_DIRECT refusals retried buffered */
} hm_ssd_stats;
void hm_ssd_get_stats(const hm_ssd *io, hm_ssd_stats *out);
const char *hm_ssd_path(const hm_ssd *io);
/* Drop the file's pages from the page cache (posix_fadvise DONTNEED) so the next reads come from
 * the disk; nothing with O_DIRECT, which bypasses it (calibration, plan/calib_ssd.c). */
void hm_ssd_drop_cache(hm_ssd *io);

#endif
