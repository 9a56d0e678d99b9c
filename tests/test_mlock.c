/* test_mlock.c - --mlock with the plain mapping (no SSD tier): the experts' span of the file mapping
 * locked in RAM, or a clear refusal.
 *
 * Synthesises a tiny qwen3moe model (`hotmoe synth`, HM_EXE) and:
 *  - the span hm_units_span gives equals the one found independently from the GGUF's tensors named
 *    *_exps (lowest data pointer to the highest end);
 *  - opening it with --mlock either succeeds with hm_usage's mlocked_bytes = that span and logits
 *    bit-identical to a run without --mlock, or (RLIMIT_MEMLOCK too low for the span, without
 *    CAP_IPC_LOCK) fails with HM_ERR_IO naming RLIMIT_MEMLOCK;
 *  - with RLIMIT_MEMLOCK lowered to 16 KiB (below the span) an unprivileged process gets that
 *    refusal, no model, and the same file still opens without --mlock (as root: in a child that
 *    drops to uid/gid 65534, since root's CAP_IPC_LOCK ignores the limit). Sanitizer builds
 *    intercept mlock as a no-op that succeeds: there only the locked-path checks apply;
 *  - hm_mlock_fits (the RAM check before any lock or GPU pin) on hand-derived sizes: at most the
 *    RAM less a tenth of it, or less 1 GiB on machines under 10 GiB. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "experts/units.h"
#include "gguf/gguf.h"
#include "hotmoe.h"
#include "model/model.h"
#include "test.h"

enum { NT = 6 };

/* ASan / LSan / UBSan-with-ASan builds intercept mlock and make it succeed without locking */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZER_MLOCK_IS_NOOP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZER_MLOCK_IS_NOOP 1
#endif
#endif
#ifndef SANITIZER_MLOCK_IS_NOOP
#define SANITIZER_MLOCK_IS_NOOP 0
#endif

static float *eval_logits(hm_model *m, const int32_t *toks, hm_err *err) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = 64;
    so.n_threads = 2;
    hm_session *s = NULL;
    if (hm_session_open(&s, m, &so, err) != HM_OK) return NULL;
    const float *lg = NULL;
    float *out = NULL;
    if (hm_session_eval(s, toks, NT, false, &lg, err) == HM_OK) {
        const size_t nv = (size_t)hm_model_get_info(m)->n_vocab;
        out = malloc(nv * sizeof *out);
        memcpy(out, lg, nv * sizeof *out);
    }
    hm_session_close(s);
    return out;
}

static hm_status open_mlock(hm_model **m, const char *path, bool mlock, hm_err *err) {
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    po.mlock = mlock;
    hm_model_opts mo;
    hm_model_opts_default(&mo);
    mo.placement = &po;
    *m = NULL;
    return hm_model_open(m, path, &mo, err);
}

static void test_fits(void) {
    const uint64_t gib = 1ull << 30, mib = 1ull << 20;
    hm_err err;
    CHECK(hm_mlock_fits(100 * gib, 0, "x", &err) == HM_OK); /* RAM unknown: the kernel decides */
    /* 16 GiB: the reserve is a tenth, 1638.4 MiB */
    CHECK(hm_mlock_fits(14 * gib, 16 * gib, "x", &err) == HM_OK);
    CHECK(hm_mlock_fits(16 * gib - 1639 * mib, 16 * gib, "x", &err) == HM_OK);
    CHECKF(hm_mlock_fits(16 * gib - 1638 * mib, 16 * gib, "the experts", &err) == HM_ERR_NOMEM &&
               strstr(err.msg, "the experts (14746 MiB)") && strstr(err.msg, "16384 MiB of RAM") &&
               strstr(err.msg, "1638 MiB"),
           "16 GiB machine, 14746 MiB: %s", err.msg);
    /* 4 GiB: the reserve is 1 GiB */
    CHECK(hm_mlock_fits(3 * gib, 4 * gib, "x", &err) == HM_OK);
    CHECK(hm_mlock_fits(3 * gib + 1, 4 * gib, "x", &err) == HM_ERR_NOMEM);
    CHECK(hm_mlock_fits(5 * gib, 4 * gib, "x", &err) == HM_ERR_NOMEM && strstr(err.msg, "without --mlock"));
}

int main(void) {
    test_fits();
    char path[256];
    const int skip = test_synth_tiny("mlock", "q4_k_m", 3, path, sizeof path);
    if (skip) return skip;
    int32_t toks[NT];
    for (int i = 0; i < NT; i++) toks[i] = 5 + 11 * i;
    hm_err err;
    hm_model *m = NULL;
    CHECK(open_mlock(&m, path, false, &err) == HM_OK);
    if (!m) return test_done();
    float *ref = eval_logits(m, toks, &err);
    CHECK(ref != NULL);
    const size_t nv = (size_t)hm_model_get_info(m)->n_vocab;

    /* the span, from the unit table and independently from the tensor names */
    const char *lo;
    size_t len;
    hm_units_span(&m->units, 0, &lo, &len);
    const char *a = NULL, *b = NULL;
    for (int64_t i = 0; i < hm_gguf_n_tensors(m->gguf); i++) {
        const hm_gguf_tensor *t = hm_gguf_tensor_at(m->gguf, i);
        if (!strstr(t->name, "_exps")) continue;
        const char *s = t->data, *e = s + t->nbytes;
        if (!a || s < a) a = s;
        if (!b || e > b) b = e;
    }
    CHECKF(a && lo == a && len == (size_t)(b - a), "span %p + %zu, the *_exps tensors %p + %zu", (const void *)lo,
           len, (const void *)a, a ? (size_t)(b - a) : 0);
    hm_usage u;
    CHECK(hm_model_usage(m, &u, &err) == HM_OK);
    CHECKF(u.mlocked_bytes == 0, "without --mlock: %llu bytes locked", (unsigned long long)u.mlocked_bytes);
    hm_usage_free(&u);
    hm_model_close(m);

    /* --mlock: locked (and the same logits), or refused naming the limit */
    hm_status st = open_mlock(&m, path, true, &err);
    if (st == HM_OK) {
        CHECK(hm_model_usage(m, &u, &err) == HM_OK);
        CHECKF(u.mlocked_bytes == len, "--mlock: %llu bytes locked, span %zu", (unsigned long long)u.mlocked_bytes,
               len);
        hm_usage_free(&u);
        float *got = eval_logits(m, toks, &err);
        CHECKF(got && ref && !memcmp(got, ref, nv * sizeof *got), "--mlock: logits differ from the run without");
        free(got);
        hm_model_close(m);
        printf("--mlock: %zu bytes of experts locked\n", len);
    } else {
        CHECKF(st == HM_ERR_IO && strstr(err.msg, "RLIMIT_MEMLOCK") && !m, "--mlock refused: %d %s", (int)st, err.msg);
        printf("--mlock refused here: %s\n", err.msg);
    }

    /* a limit below the span, in an unprivileged process (as root, a child that drops to nobody:
     * root's CAP_IPC_LOCK ignores the limit) */
    fflush(stdout); /* a child must not print the parent's buffered lines again */
    const pid_t pid = geteuid() == 0 ? fork() : 0;
    CHECK(pid >= 0);
    if (pid == 0) {
        if (geteuid() == 0) CHECK(setgid(65534) == 0 && setuid(65534) == 0);
        struct rlimit rl;
        CHECK(getrlimit(RLIMIT_MEMLOCK, &rl) == 0);
        rl.rlim_cur = 16 * 1024;
        CHECK(setrlimit(RLIMIT_MEMLOCK, &rl) == 0);
        st = open_mlock(&m, path, true, &err);
#if SANITIZER_MLOCK_IS_NOOP
        /* the sanitizers' mlock interceptor succeeds without locking: nothing to refuse */
        printf("sanitizer build: mlock is intercepted (a no-op), the refusal is not testable here\n");
        if (st == HM_OK) hm_model_close(m);
#else
        CHECKF(st == HM_ERR_IO && !m && strstr(err.msg, "RLIMIT_MEMLOCK is 16 KiB") &&
                   strstr(err.msg, "experts of the model mapping"),
               "--mlock under a 16 KiB limit: %d %s", (int)st, err.msg);
        printf("under a 16 KiB limit: %s\n", err.msg);
        if (st == HM_OK) hm_model_close(m);
#endif
        CHECK(open_mlock(&m, path, false, &err) == HM_OK); /* the same file opens without --mlock */
        hm_model_close(m);
        if (geteuid() != 0 && getuid() == 65534) exit(test_done()); /* the child */
    } else {
        int ws = 0;
        CHECK(waitpid(pid, &ws, 0) == pid);
        CHECKF(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the unprivileged child: status %d", ws);
    }
    free(ref);
    unlink(path);
    return test_done();
}
