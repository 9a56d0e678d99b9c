/* tier_ssd.c - expert units from the model file into RAM buffers (tier_ssd.h).
 *
 * A unit read is one request of up to HM_UNIT_NPART range reads ("ops"). Ops wait in a FIFO and
 * up to queue_depth of them are in the io_uring at once; a partial read is continued from where
 * it stopped (buffered from then on when the remainder is no longer aligned). Invariants: an op is
 * queued, in flight or finished, never two of them; a request is done when its last op finished;
 * the first failing op's details are kept in the request for its message. */
#include "tier_ssd.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef HM_HAVE_URING
#include <liburing.h>
#endif

#include "core/alloc.h"
#include "core/timer.h"

enum { REQ_IDLE = 0, REQ_BUSY = 1, REQ_DONE = 2 };

typedef struct ssd_op {
    int32_t req;
    uint8_t part;
    int32_t file;         /* which file of a split model (units.h hm_units_file) */
    bool direct;          /* read through the O_DIRECT descriptor */
    bool checked;         /* the fault hook has seen it */
    uint64_t off;         /* file offset of the aligned span */
    char *dst;            /* where the span goes */
    uint64_t len;         /* span bytes */
    uint64_t need;        /* bytes that must arrive: up to the end of the part's own range */
    uint64_t done;
} ssd_op;

typedef struct ssd_req {
    uint8_t state;
    int32_t layer, expert;
    int32_t ops_left;
    uint64_t payload;     /* the unit's own bytes */
    bool failed;
    int err_no;           /* 0 with failed: a short read */
    uint8_t err_part;
    int32_t err_file;
    uint64_t err_off, err_len, err_got;
} ssd_req;

struct hm_ssd {
    const hm_units *units;
    char *path;           /* the first file's (hm_ssd_path) */
    int32_t n_files;      /* a split model's files, each opened apart */
    char **paths;         /* [n_files] */
    int *fd, *fd_direct;  /* [n_files]; fd_direct -1 when O_DIRECT is off or unavailable */
    int32_t n_req, qd;
    ssd_req *req;         /* [n_req] */
    ssd_op *ops;          /* [n_req * HM_UNIT_NPART]: op id = req * HM_UNIT_NPART + part */
    int32_t *queue;       /* ring of op ids waiting to be issued */
    int32_t q_head, q_len, q_cap;
    int32_t inflight;
    bool uring;
#ifdef HM_HAVE_URING
    struct io_uring ring;
#endif
    hm_ssd_fault_fn fault;
    void *fault_ctx;
    hm_ssd_stats st;
};

void hm_ssd_opts_default(hm_ssd_opts *o) {
    memset(o, 0, sizeof *o);
    o->queue_depth = 16;
}

/* ---- layout ---- */

static void span_of(uint64_t off, uint64_t len, uint64_t *s0, uint64_t *s1) {
    *s0 = off / HM_SSD_ALIGN * HM_SSD_ALIGN;
    *s1 = hm_align_up(off + len, HM_SSD_ALIGN);
}

void hm_ssd_layout(const hm_units *u, int32_t layer, int32_t expert, void *buf, const void *parts[HM_UNIT_NPART]) {
    const hm_units_layer *l = &u->layers[layer];
    uint64_t pos = 0;
    for (int p = 0; p < HM_UNIT_NPART; p++) {
        parts[p] = NULL;
        if (!l->part[p]) continue;
        uint64_t off = hm_units_offset(u, layer, expert, (hm_unit_part)p), s0, s1;
        span_of(off, l->slab_bytes[p], &s0, &s1);
        parts[p] = (const char *)buf + pos + (off - s0);
        pos += s1 - s0;
    }
}

size_t hm_ssd_slot_bytes(const hm_units *u) {
    uint64_t best = hm_align_up(u->unit_bytes_max, HM_SSD_ALIGN);
    for (int32_t l = 0; l < u->n_layer; l++) {
        const hm_units_layer *L = &u->layers[l];
        for (int32_t e = 0; e < L->n_expert; e++) {
            uint64_t pos = 0;
            for (int p = 0; p < HM_UNIT_NPART; p++) {
                if (!L->part[p]) continue;
                uint64_t s0, s1;
                span_of(hm_units_offset(u, l, e, (hm_unit_part)p), L->slab_bytes[p], &s0, &s1);
                pos += s1 - s0;
            }
            if (pos > best) best = pos;
        }
    }
    return (size_t)best;
}

/* ---- open / close ---- */

hm_status hm_ssd_open(hm_ssd **out, const char *path, const hm_units *units, int32_t n_req, const hm_ssd_opts *o,
                      hm_err *err) {
    *out = NULL;
    hm_ssd_opts dflt;
    if (!o) hm_ssd_opts_default(&dflt), o = &dflt;
    if (n_req <= 0 || n_req > INT32_MAX / HM_UNIT_NPART)
        return hm_errf(err, HM_ERR_ARG, "%s: %d read requests", path, n_req);
    if (o->queue_depth < 0 || o->queue_depth > 4096)
        return hm_errf(err, HM_ERR_ARG, "queue depth %d out of range [1, 4096]", o->queue_depth);
    hm_ssd *io = calloc(1, sizeof *io);
    if (!io) return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory", path);
    hm_status st;
    io->units = units;
    io->n_files = units->gguf && units->n_files > 1 ? units->n_files : 1;
    io->n_req = n_req;
    io->qd = o->queue_depth ? o->queue_depth : 16;
    io->fault = o->fault;
    io->fault_ctx = o->fault_ctx;
    io->q_cap = n_req * HM_UNIT_NPART;
    io->paths = calloc((size_t)io->n_files, sizeof *io->paths);
    io->fd = malloc((size_t)io->n_files * sizeof *io->fd);
    io->fd_direct = malloc((size_t)io->n_files * sizeof *io->fd_direct);
    io->req = calloc((size_t)n_req, sizeof *io->req);
    io->ops = calloc((size_t)io->q_cap, sizeof *io->ops);
    io->queue = malloc((size_t)io->q_cap * sizeof *io->queue);
    if (!io->paths || !io->fd || !io->fd_direct || !io->req || !io->ops || !io->queue) {
        free(io->fd), free(io->fd_direct);
        io->fd = io->fd_direct = NULL;
        st = hm_errf(err, HM_ERR_NOMEM, "%s: out of memory for %d read requests", path, n_req);
        goto fail;
    }
    for (int32_t f = 0; f < io->n_files; f++) io->fd[f] = io->fd_direct[f] = -1;
    io->st.direct = true;
    for (int32_t f = 0; f < io->n_files; f++) {
        /* file 0 is path; a split model's others are its parts (gguf_split.c named and checked them) */
        const char *fp = f == 0 ? path : hm_gguf_file_path(units->gguf, f);
        if (!fp || !(io->paths[f] = strdup(fp))) {
            st = hm_errf(err, HM_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
        io->fd[f] = open(fp, O_RDONLY | O_CLOEXEC);
        if (io->fd[f] < 0) {
            st = hm_errf(err, HM_ERR_IO, "%s: cannot open for expert reads: %s", fp, strerror(errno));
            goto fail;
        }
        posix_fadvise(io->fd[f], 0, 0, POSIX_FADV_RANDOM);
        if (!o->no_direct) io->fd_direct[f] = open(fp, O_RDONLY | O_CLOEXEC | O_DIRECT); /* -1 on tmpfs: buffered */
        io->st.direct = io->st.direct && io->fd_direct[f] >= 0;
    }
    io->path = io->paths[0];
#ifdef HM_HAVE_URING
    if (!o->force_pread) {
        unsigned entries = 1;
        while (entries < (unsigned)io->qd) entries <<= 1;
        io->uring = io_uring_queue_init(entries, &io->ring, 0) == 0; /* else pread (seccomp, old kernel) */
    }
#endif
    io->st.uring = io->uring;
    io->st.queue_depth = io->uring ? io->qd : 1;
    *out = io;
    return HM_OK;
fail:
    hm_ssd_close(io);
    return st;
}

static void drain(hm_ssd *io);

void hm_ssd_close(hm_ssd *io) {
    if (!io) return;
    drain(io); /* the kernel must not write into buffers the caller is about to free */
#ifdef HM_HAVE_URING
    if (io->uring) io_uring_queue_exit(&io->ring);
#endif
    for (int32_t f = 0; io->fd && f < io->n_files; f++) {
        if (io->fd[f] >= 0) close(io->fd[f]);
        if (io->fd_direct[f] >= 0) close(io->fd_direct[f]);
    }
    for (int32_t f = 0; io->paths && f < io->n_files; f++) free(io->paths[f]);
    free(io->paths), free(io->fd), free(io->fd_direct), free(io->req), free(io->ops), free(io->queue);
    free(io);
}

/* ---- ops ---- */

static void q_push(hm_ssd *io, int32_t id) {
    HM_ASSERT(io->q_len < io->q_cap);
    io->queue[(io->q_head + io->q_len++) % io->q_cap] = id;
}

static int32_t q_pop(hm_ssd *io) {
    int32_t id = io->queue[io->q_head];
    io->q_head = (io->q_head + 1) % io->q_cap;
    io->q_len--;
    return id;
}

static void op_finish(hm_ssd *io, ssd_op *op) {
    ssd_req *r = &io->req[op->req];
    if (--r->ops_left > 0) return;
    r->state = REQ_DONE;
    io->st.units++;
    if (r->failed) io->st.errors++;
    else io->st.unit_bytes += r->payload;
}

static void op_fail(hm_ssd *io, ssd_op *op, int err_no) {
    ssd_req *r = &io->req[op->req];
    if (!r->failed) {
        r->failed = true;
        r->err_no = err_no;
        r->err_part = op->part;
        r->err_file = op->file;
        r->err_off = op->off;
        r->err_len = op->len;
        r->err_got = op->done;
    }
    op_finish(io, op);
}

/* A read of op came back with res (bytes, or -errno). true: issue it again (continue/retry). */
static bool op_result(hm_ssd *io, ssd_op *op, int64_t res) {
    if (res < 0) {
        if (res == -EINTR || res == -EAGAIN) return true;
        if (res == -EINVAL && op->direct) { /* this file system refuses O_DIRECT here */
            op->direct = false;
            io->st.retries++;
            return true;
        }
        op_fail(io, op, (int)-res);
        return false;
    }
    if (res == 0) { /* end of file before the range ended */
        op_fail(io, op, 0);
        return false;
    }
    op->done += (uint64_t)res;
    io->st.bytes += (uint64_t)res;
    if (op->done >= op->need) {
        op_finish(io, op);
        return false;
    }
    io->st.retries++;
    if (op->done % HM_SSD_ALIGN) op->direct = false;
    return true;
}

/* The fault hook's verdict as a read result, or 1 to read for real. */
static int64_t fault_check(hm_ssd *io, ssd_op *op) {
    if (op->checked || !io->fault) return 1;
    op->checked = true;
    const ssd_req *r = &io->req[op->req];
    int f = io->fault(io->fault_ctx, r->layer, r->expert, (hm_unit_part)op->part, op->off, op->len);
    return f > 0 ? -(int64_t)f : f < 0 ? 0 : 1;
}

static int64_t pread_op(hm_ssd *io, const ssd_op *op) {
    int fd = op->direct ? io->fd_direct[op->file] : io->fd[op->file];
    ssize_t n = pread(fd, op->dst + op->done, (size_t)(op->len - op->done), (off_t)(op->off + op->done));
    return n < 0 ? -(int64_t)errno : (int64_t)n;
}

#ifdef HM_HAVE_URING
static void pump(hm_ssd *io) {
    int prepared = 0;
    while (io->q_len > 0 && io->inflight < io->qd) {
        int32_t id = q_pop(io);
        ssd_op *op = &io->ops[id];
        int64_t f = fault_check(io, op);
        if (f <= 0) {
            if (op_result(io, op, f)) q_push(io, id);
            continue;
        }
        struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
        if (!sqe) {
            io->q_head = (io->q_head + io->q_cap - 1) % io->q_cap; /* put it back in front */
            io->queue[io->q_head] = id;
            io->q_len++;
            break;
        }
        uint64_t left = op->len - op->done;
        if (left > (1u << 30)) left = 1u << 30;
        io_uring_prep_read(sqe, op->direct ? io->fd_direct[op->file] : io->fd[op->file], op->dst + op->done, (unsigned)left,
                           op->off + op->done);
        io_uring_sqe_set_data64(sqe, (uint64_t)id);
        io->inflight++;
        prepared++;
    }
    if (prepared) {
        int rc;
        do rc = io_uring_submit(&io->ring);
        while (rc == -EINTR || rc == -EAGAIN);
    }
}

/* Take completions; with wait, block for at least one (there must be one in flight). */
static void reap(hm_ssd *io, bool wait) {
    struct io_uring_cqe *cqe;
    for (;;) {
        int rc = wait ? io_uring_wait_cqe(&io->ring, &cqe) : io_uring_peek_cqe(&io->ring, &cqe);
        if (rc == -EINTR) continue;
        if (rc < 0) return; /* -EAGAIN: nothing there (peek) */
        break;
    }
    unsigned head, n = 0;
    io_uring_for_each_cqe(&io->ring, head, cqe) {
        int32_t id = (int32_t)io_uring_cqe_get_data64(cqe);
        io->inflight--;
        if (op_result(io, &io->ops[id], cqe->res)) q_push(io, id);
        n++;
    }
    io_uring_cq_advance(&io->ring, n);
}
#endif

static void progress(hm_ssd *io, bool wait) {
#ifdef HM_HAVE_URING
    if (io->uring) {
        pump(io);
        if (io->inflight > 0) reap(io, wait);
        pump(io);
        return;
    }
#endif
    (void)io, (void)wait; /* pread: everything happened in start */
}

static void drain(hm_ssd *io) {
    while (io->inflight > 0 || io->q_len > 0) progress(io, true);
}

/* ---- requests ---- */

void hm_ssd_start(hm_ssd *io, int32_t req, int32_t layer, int32_t expert, void *buf) {
    HM_ASSERT(req >= 0 && req < io->n_req && io->req[req].state == REQ_IDLE);
    HM_ASSERT(((uintptr_t)buf % HM_SSD_ALIGN) == 0);
    const hm_units *u = io->units;
    const hm_units_layer *l = &u->layers[layer];
    HM_ASSERT(l->n_expert > 0 && expert >= 0 && expert < l->n_expert);
    ssd_req *r = &io->req[req];
    memset(r, 0, sizeof *r);
    r->state = REQ_BUSY;
    r->layer = layer, r->expert = expert;
    r->payload = l->unit_bytes;
    uint64_t pos = 0;
    int32_t ids[HM_UNIT_NPART], n = 0;
    for (int p = 0; p < HM_UNIT_NPART; p++) {
        if (!l->part[p]) continue;
        uint64_t off = hm_units_offset(u, layer, expert, (hm_unit_part)p), s0, s1;
        span_of(off, l->slab_bytes[p], &s0, &s1);
        int32_t id = req * HM_UNIT_NPART + p;
        ssd_op *op = &io->ops[id];
        int32_t file = io->n_files > 1 ? hm_units_file(u, layer, (hm_unit_part)p) : 0;
        *op = (ssd_op){.req = req, .part = (uint8_t)p, .file = file, .direct = io->fd_direct[file] >= 0, .off = s0,
                       .dst = (char *)buf + pos, .len = s1 - s0, .need = off + l->slab_bytes[p] - s0};
        pos += s1 - s0;
        ids[n++] = id;
    }
    r->ops_left = n;
    for (int32_t i = 0; i < n; i++) {
        if (io->uring) {
            q_push(io, ids[i]);
        } else {
            ssd_op *op = &io->ops[ids[i]];
            int64_t f = fault_check(io, op);
            if (f <= 0) {
                op_result(io, op, f);
                continue;
            }
            while (op_result(io, op, pread_op(io, op))) {}
        }
    }
    progress(io, false);
}

bool hm_ssd_done(hm_ssd *io, int32_t req) {
    if (io->req[req].state == REQ_BUSY) progress(io, false);
    return io->req[req].state != REQ_BUSY;
}

bool hm_ssd_busy(const hm_ssd *io, int32_t req) { return io->req[req].state != REQ_IDLE; }

hm_status hm_ssd_wait(hm_ssd *io, int32_t req, hm_err *err) {
    ssd_req *r = &io->req[req];
    while (r->state == REQ_BUSY) {
        HM_ASSERT(io->inflight > 0 || io->q_len > 0);
        progress(io, true);
    }
    if (r->state == REQ_IDLE) return HM_OK;
    r->state = REQ_IDLE;
    if (!r->failed) return HM_OK;
    const char *part = hm_unit_part_name((hm_unit_part)r->err_part);
    if (r->err_no)
        return hm_errf(err, HM_ERR_IO, "%s: reading expert unit (layer %d, expert %d) %s at file offset %" PRIu64
                       " (%" PRIu64 " bytes) failed: %s", io->paths[r->err_file], r->layer, r->expert, part, r->err_off, r->err_len,
                       strerror(r->err_no));
    return hm_errf(err, HM_ERR_IO, "%s: short read of expert unit (layer %d, expert %d) %s at file offset %" PRIu64
                   ": %" PRIu64 " of %" PRIu64 " bytes arrived (the file is shorter than its tensor table says: "
                   "truncated or replaced while open?)", io->paths[r->err_file], r->layer, r->expert, part, r->err_off, r->err_got,
                   r->err_len);
}

void hm_ssd_get_stats(const hm_ssd *io, hm_ssd_stats *out) { *out = io->st; }

const char *hm_ssd_path(const hm_ssd *io) { return io->path; }

void hm_ssd_drop_cache(hm_ssd *io) {
    for (int32_t f = 0; f < io->n_files; f++)
        if (io->fd_direct[f] < 0 && io->fd[f] >= 0) posix_fadvise(io->fd[f], 0, 0, POSIX_FADV_DONTNEED);
}
