/* file.c - atomic replacement of regular files and bounded whole-file reads (see file.h).
 *
 * Invariants: a temporary file exists only between hm_file_replace_open and commit/abort, and
 * every failure path of those removes it; nothing that is not a regular file (or a link to one)
 * is ever renamed over, created beside as a temporary, or read. */
#include "file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISLNK(m)) return "a symlink";
    return "not a regular file";
}

hm_status hm_file_replace_target(const char *path, char **target, hm_err *err) {
    *target = NULL;
    struct stat sb;
    if (!path || !*path) return hm_errf(err, HM_ERR_ARG, "empty output path");
    if (lstat(path, &sb) != 0) {
        if (errno != ENOENT) return hm_errf(err, HM_ERR_IO, "%s: %s", path, strerror(errno));
        *target = strdup(path); /* a new file */
    } else if (S_ISREG(sb.st_mode)) {
        *target = strdup(path);
    } else if (S_ISLNK(sb.st_mode)) {
        char *real = realpath(path, NULL);
        if (!real)
            return hm_errf(err, HM_ERR_ARG, "%s is a symlink that does not resolve to a file (%s): refusing to write "
                           "through it; give the target's path", path, strerror(errno));
        if (stat(real, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            hm_status st = hm_errf(err, HM_ERR_ARG, "%s is a symlink to %s, which is %s: only regular files are "
                                   "replaced", path, real, kind(sb.st_mode));
            free(real);
            return st;
        }
        *target = real;
    } else {
        return hm_errf(err, HM_ERR_ARG, "%s is %s: output files are replaced atomically (temporary file + rename), "
                       "which only a regular file may be; give the path of a regular file", path, kind(sb.st_mode));
    }
    if (!*target) return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory", path);
    return HM_OK;
}

/* Remove target.tmp.<pid> files of processes that are gone. Best effort: errors are ignored (a
 * stale file left is harmless; one removed wrongly is not, hence the checks). */
static void clean_stale(const char *target) {
    const char *slash = strrchr(target, '/');
    char dir[4096];
    const char *base = slash ? slash + 1 : target;
    if (slash == target) {
        strcpy(dir, "/");
    } else if (slash) {
        size_t n = (size_t)(slash - target);
        if (n >= sizeof dir) return;
        memcpy(dir, target, n);
        dir[n] = 0;
    } else {
        strcpy(dir, ".");
    }
    size_t bl = strlen(base);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        if (strncmp(nm, base, bl) != 0 || strncmp(nm + bl, ".tmp.", 5) != 0) continue;
        const char *num = nm + bl + 5;
        char *end;
        errno = 0;
        long pid = strtol(num, &end, 10);
        if (num[0] < '0' || num[0] > '9' || *end || errno || pid <= 0 || pid > INT32_MAX) continue;
        if (pid == (long)getpid()) continue; /* ours: replaced by the exclusive create below */
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours to judge) */
        char p[4096 + 256];
        if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, nm) >= sizeof p) continue;
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISREG(sb.st_mode)) unlink(p);
    }
    closedir(d);
}

static void replace_free(hm_file_replace *r) {
    free(r->target);
    free(r->tmp);
    r->target = r->tmp = NULL;
    r->f = NULL;
}

hm_status hm_file_replace_open(hm_file_replace *r, const char *path, hm_err *err) {
    memset(r, 0, sizeof *r);
    hm_status st = hm_file_replace_target(path, &r->target, err);
    if (st) return st;
    size_t n = strlen(r->target) + 32;
    if (!(r->tmp = malloc(n))) {
        replace_free(r);
        return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(r->tmp, n, "%s.tmp.%ld", r->target, (long)getpid());
    clean_stale(r->target);
    int fd = -1;
    for (int attempt = 0; attempt < 2 && fd < 0; attempt++) {
        fd = open(r->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno == EEXIST && attempt == 0) {
            /* one of ours left by an earlier process with this pid: a regular file only */
            struct stat sb;
            if (lstat(r->tmp, &sb) != 0 || !S_ISREG(sb.st_mode) || unlink(r->tmp) != 0) break;
        }
    }
    if (fd < 0 || !(r->f = fdopen(fd, "wb"))) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
            unlink(r->tmp);
        }
        st = hm_errf(err, HM_ERR_IO, "%s: cannot create: %s", r->tmp, strerror(e));
        replace_free(r);
        return st;
    }
    return HM_OK;
}

hm_status hm_file_replace_commit(hm_file_replace *r, hm_err *err) {
    int rc = fflush(r->f);
    int e = rc ? errno : 0;
    if (!rc && fsync(fileno(r->f)) != 0) rc = -1, e = errno;
    if (fclose(r->f) != 0 && !rc) rc = -1, e = errno;
    r->f = NULL;
    hm_status st = HM_OK;
    if (rc) st = hm_errf(err, HM_ERR_IO, "%s: write failed: %s", r->tmp, strerror(e));
    else if (rename(r->tmp, r->target) != 0)
        st = hm_errf(err, HM_ERR_IO, "%s: rename from %s failed: %s", r->target, r->tmp, strerror(errno));
    if (st) unlink(r->tmp);
    replace_free(r);
    return st;
}

void hm_file_replace_abort(hm_file_replace *r) {
    if (r->f) fclose(r->f);
    if (r->tmp) unlink(r->tmp);
    replace_free(r);
}

hm_status hm_file_read_all(const char *path, size_t max_bytes, char **buf, size_t *len, hm_err *err) {
    *buf = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO without a writer would block before fstat could refuse it */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return hm_errf(err, HM_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    hm_status st = HM_OK;
    char *b = NULL;
    if (fstat(fd, &sb) != 0) {
        st = hm_errf(err, HM_ERR_IO, "%s: %s", path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = hm_errf(err, HM_ERR_ARG, "%s is %s: only a regular file is read", path, kind(sb.st_mode));
        goto done;
    }
    if ((uint64_t)sb.st_size > max_bytes) {
        st = hm_errf(err, HM_ERR_ARG, "%s: %lld bytes is larger than the %zu this reads", path, (long long)sb.st_size,
                     max_bytes);
        goto done;
    }
    /* the size from fstat, plus one byte to notice a file that grew meanwhile */
    size_t cap = (size_t)sb.st_size + 1, n = 0;
    if (!(b = malloc(cap + 1))) {
        st = hm_errf(err, HM_ERR_NOMEM, "%s: out of memory for %zu bytes", path, cap);
        goto done;
    }
    while (n < cap) {
        ssize_t got = read(fd, b + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            st = hm_errf(err, HM_ERR_IO, "%s: read error: %s", path, strerror(errno));
            goto done;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    if (n > max_bytes || n == cap) {
        st = hm_errf(err, HM_ERR_ARG, "%s: the file grew while it was read", path);
        goto done;
    }
    b[n] = 0;
    *buf = b;
    *len = n;
    b = NULL;
done:
    free(b);
    close(fd);
    return st;
}
