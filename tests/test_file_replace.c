/* test_file_replace.c - what a profile write (--profile-out, POST /profile/save: both are
 * hm_profile_write) and a profile read do with paths that are not plain files, on real special
 * files in a scratch directory:
 *   - a new path and a regular file are written (replaced atomically);
 *   - a FIFO, a directory, a device node (mknod of a character device, where allowed; else
 *     skipped with a message) are refused with a message naming the kind, and left as they were;
 *   - a symlink to a regular file: the link stays, its target is replaced; a symlink to a FIFO and
 *     a dangling symlink are refused;
 *   - stale PATH.tmp.<pid> files of dead processes are removed by the next write, those of a live
 *     process and other names are kept;
 *   - a write that fails (RLIMIT_FSIZE: EFBIG) returns an error and leaves no temporary file and
 *     the old file intact;
 *   - reading a profile from a FIFO (no writer), a device (/dev/zero) or a file over the size cap
 *     is refused without blocking or reading to the end (an alarm fails the test if it blocks). */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "experts/profile.h"
#include "test.h"

static char dir[256];

static const char *at(const char *name) {
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

/* temporaries of base (base.tmp.*) in the scratch directory */
static int count_tmp(const char *base) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    char pre[256];
    snprintf(pre, sizeof pre, "%s.tmp.", base);
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, pre, strlen(pre)) == 0) n++;
    if (d) closedir(d);
    return n;
}

static hm_profile prof;

static hm_status write_to(const char *path, hm_err *err) {
    memset(err, 0, sizeof *err);
    return hm_profile_write(&prof, path, HM_PROFILE_HOTMOE, err);
}

static bool is_profile(const char *path) {
    hm_profile q;
    hm_err err;
    bool ok = hm_profile_read(&q, path, &err) == HM_OK && q.n_layer == 2 && q.n_expert == 3;
    hm_profile_free(&q);
    return ok;
}

static void test_regular(void) {
    hm_err err;
    CHECKF(write_to(at("new.json"), &err) == HM_OK, "%s", err.msg);
    CHECK(is_profile(at("new.json")));
    CHECKF(write_to(at("new.json"), &err) == HM_OK, "%s", err.msg); /* replace */
    CHECK(is_profile(at("new.json")) && count_tmp("new.json") == 0);
}

static void test_refused(const char *name, const char *kind_word, mode_t want_kind) {
    hm_err err;
    hm_status st = write_to(at(name), &err);
    CHECKF(st == HM_ERR_ARG && strstr(err.msg, kind_word) && strstr(err.msg, name), "%s: %s '%s'", name,
           hm_status_name(st), err.msg);
    struct stat sb;
    CHECKF(lstat(at(name), &sb) == 0 && (sb.st_mode & S_IFMT) == want_kind, "%s was replaced", name);
    CHECKF(count_tmp(name) == 0, "%s: a temporary was left", name);
}

static void test_special(void) {
    CHECK(mkfifo(at("fifo"), 0600) == 0);
    test_refused("fifo", "FIFO", S_IFIFO);
    CHECK(mkdir(at("adir"), 0700) == 0);
    test_refused("adir", "directory", S_IFDIR);
    if (mknod(at("null"), S_IFCHR | 0600, makedev(1, 3)) == 0) {
        test_refused("null", "character device", S_IFCHR);
        unlink(at("null"));
    } else {
        printf("mknod of a character device not permitted here (%s): device-node check skipped\n", strerror(errno));
    }
    /* links */
    CHECK(write_to(at("target.json"), &(hm_err){{0}}) == HM_OK);
    CHECK(symlink("target.json", at("link.json")) == 0);
    hm_err err;
    CHECKF(write_to(at("link.json"), &err) == HM_OK, "%s", err.msg);
    struct stat sb;
    CHECK(lstat(at("link.json"), &sb) == 0 && S_ISLNK(sb.st_mode)); /* the link stays */
    CHECK(lstat(at("target.json"), &sb) == 0 && S_ISREG(sb.st_mode) && is_profile(at("target.json")));
    CHECK(count_tmp("target.json") == 0 && count_tmp("link.json") == 0);
    CHECK(symlink("fifo", at("link_fifo")) == 0);
    test_refused("link_fifo", "FIFO", S_IFLNK);
    struct stat fb;
    CHECK(lstat(at("fifo"), &fb) == 0 && S_ISFIFO(fb.st_mode));
    CHECK(symlink("nowhere/x.json", at("dangling")) == 0);
    test_refused("dangling", "does not resolve", S_IFLNK);
    unlink(at("link.json"));
    unlink(at("link_fifo"));
    unlink(at("dangling"));
    unlink(at("target.json"));
}

static void test_stale(void) {
    pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0); /* child's pid is now a dead process's */
    char dead[64], live[64];
    snprintf(dead, sizeof dead, "out.json.tmp.%d", (int)child);
    snprintf(live, sizeof live, "out.json.tmp.%d", (int)getppid());
    const char *names[] = {dead, live, "out.json.tmp.abc", "out.json.tmpx.1"};
    for (int i = 0; i < 4; i++) {
        FILE *f = fopen(at(names[i]), "w");
        CHECK(f != NULL);
        if (f) fclose(f);
    }
    hm_err err;
    CHECKF(write_to(at("out.json"), &err) == HM_OK, "%s", err.msg);
    CHECKF(access(at(dead), F_OK) != 0, "stale %s was kept", dead);
    CHECKF(access(at(live), F_OK) == 0, "%s of a live process was removed", live);
    CHECK(access(at("out.json.tmp.abc"), F_OK) == 0 && access(at("out.json.tmpx.1"), F_OK) == 0);
    for (int i = 1; i < 4; i++) unlink(at(names[i]));
    unlink(at("out.json"));
}

static void test_failed_write(void) {
    hm_err err;
    CHECK(write_to(at("keep.json"), &err) == HM_OK);
    struct stat before;
    CHECK(stat(at("keep.json"), &before) == 0);
    struct rlimit old, small = {.rlim_cur = 64, .rlim_max = 0};
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    small.rlim_max = old.rlim_max;
    signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
    hm_status st = write_to(at("keep.json"), &err);
    setrlimit(RLIMIT_FSIZE, &old);
    CHECKF(st == HM_ERR_IO && strstr(err.msg, "keep.json"), "%s '%s'", hm_status_name(st), err.msg);
    CHECKF(count_tmp("keep.json") == 0, "a failed write left its temporary");
    struct stat after;
    CHECK(stat(at("keep.json"), &after) == 0 && after.st_size == before.st_size && is_profile(at("keep.json")));
    unlink(at("keep.json"));
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_file_replace: a profile read blocked (alarm)\n";
    if (write(2, msg, sizeof msg - 1)) {}
    _exit(1);
}

static void test_read_special(void) {
    signal(SIGALRM, on_alarm);
    alarm(20);
    hm_profile q;
    hm_err err = {{0}};
    hm_status st = hm_profile_read(&q, at("fifo"), &err);
    CHECKF(st == HM_ERR_ARG && strstr(err.msg, "FIFO"), "fifo: %s '%s'", hm_status_name(st), err.msg);
    st = hm_profile_read(&q, "/dev/zero", &err);
    CHECKF(st == HM_ERR_ARG && strstr(err.msg, "character device"), "/dev/zero: %s '%s'", hm_status_name(st), err.msg);
    st = hm_profile_read(&q, at("adir"), &err);
    CHECKF(st == HM_ERR_ARG && strstr(err.msg, "directory"), "adir: %s '%s'", hm_status_name(st), err.msg);
    /* over the cap: a sparse file, nothing is read */
    FILE *f = fopen(at("huge.json"), "w");
    CHECK(f && fseek(f, (long)HM_PROFILE_MAX_BYTES + 1, SEEK_SET) == 0 && fputc(' ', f) != EOF);
    if (f) fclose(f);
    st = hm_profile_read(&q, at("huge.json"), &err);
    CHECKF(st == HM_ERR_ARG && strstr(err.msg, "larger than"), "huge: %s '%s'", hm_status_name(st), err.msg);
    unlink(at("huge.json"));
    alarm(0);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/hm_test_file_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    hm_err err;
    if (hm_profile_init(&prof, 2, 3, &err) != HM_OK) return 1;
    for (int i = 0; i < 6; i++) prof.counts[i] = (uint64_t)(i * 1000);
    test_regular();
    test_special();
    test_stale();
    test_failed_write();
    test_read_special();
    hm_profile_free(&prof);
    unlink(at("fifo"));
    unlink(at("new.json"));
    rmdir(at("adir"));
    if (rmdir(dir) != 0) fprintf(stderr, "left files in %s\n", dir);
    return test_done();
}
