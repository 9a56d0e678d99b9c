/* file.h - files the engine replaces atomically, and files it reads whole.
 *
 * Replacing (hm_file_replace_*): the output is written to TARGET.tmp.<pid> and renamed onto
 * TARGET, so a reader or a crash never sees half a file. Atomic replacement is only for regular
 * files, so what PATH names decides what happens:
 *   - nothing there: TARGET = PATH, a new regular file;
 *   - a regular file: TARGET = PATH, replaced;
 *   - a symlink: followed; TARGET = the file it resolves to, which must be a regular file (the
 *     link stays, its target is replaced, as an editor saving through a link does); a dangling
 *     link is refused (its target's directory may not be the one the user thinks);
 *   - a FIFO, a device, a socket, a directory (also as a link's target): refused, HM_ERR_ARG
 *     naming the path and its kind; nothing is created or removed. (Writing a FIFO in place would
 *     block on a reader and lose atomicity; replacing a device node as root would replace it for
 *     the whole machine.)
 * Before creating its temporary file a writer removes stale ones: TARGET.tmp.<pid> files (regular
 * files only) whose pid is not a running process here (a killed writer's). A failure after the
 * temporary file is created removes it, so no handled error leaves one behind.
 *
 * Reading whole (hm_file_read_all): a regular file of at most max_bytes, opened without blocking
 * (a FIFO or a device is refused before anything is read, never read until its end). */
#ifndef HM_CORE_FILE_H
#define HM_CORE_FILE_H

#include <stddef.h>
#include <stdio.h>

#include "status.h"

typedef struct hm_file_replace {
    char *target; /* owned: the file that will be replaced */
    char *tmp;    /* owned: target.tmp.<pid> */
    FILE *f;      /* write here between open and commit */
} hm_file_replace;

/* Resolve path as above, remove stale temporaries, create target.tmp.<pid> (exclusively) and open
 * r->f on it. On failure nothing is left behind and r needs no abort. */
hm_status hm_file_replace_open(hm_file_replace *r, const char *path, hm_err *err);
/* Flush, fsync and rename the temporary onto the target; frees r. On failure the temporary is
 * removed, the target is untouched, and r is freed too. */
hm_status hm_file_replace_commit(hm_file_replace *r, hm_err *err);
/* Close and remove the temporary; frees r. Safe on a zeroed r. */
void hm_file_replace_abort(hm_file_replace *r);

/* Where a replacement of path would go (the rules above), malloc'd into *target; or the error. */
hm_status hm_file_replace_target(const char *path, char **target, hm_err *err);

/* Read a regular file of at most max_bytes whole: *buf malloc'd (caller frees), NUL-terminated,
 * *len bytes. Not a regular file, or larger: HM_ERR_ARG naming path, nothing read. */
hm_status hm_file_read_all(const char *path, size_t max_bytes, char **buf, size_t *len, hm_err *err);

#endif
