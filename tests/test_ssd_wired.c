/* test_ssd_wired.c - the SSD tier inside the engine: a read that fails fails that eval, clearly,
 * and the engine stays usable.
 *
 * Synthesises a tiny qwen3moe model (`hotmoe synth`, HM_EXE), evaluates 10 tokens without a RAM
 * budget (the reference logits), then with a budget of 3 buffers and the tier's test fault hook
 * (tier_ssd.h) armed to fail one read: with EIO, and with a short read. Each armed eval must
 * return HM_ERR_IO whose message names the file and the offset; the next eval of the same tokens
 * (on the same session, after a reset) must succeed with logits bit-identical to the reference;
 * --prefetch on and off, io_uring and pread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hotmoe.h"
#include "model/model.h"
#include "test.h"

enum { NT = 10 };

typedef struct fault_ctx {
    int arm;     /* fail the arm-th read from now (1 = the next), 0 = off */
    int kind;    /* errno, or -1 for a short read */
    int fired;
} fault_ctx;

static int fault(void *ctx, int32_t layer, int32_t expert, hm_unit_part part, uint64_t offset, uint64_t len) {
    fault_ctx *f = ctx;
    (void)layer, (void)expert, (void)part, (void)offset, (void)len;
    if (f->arm <= 0) return 0;
    if (--f->arm == 0) {
        f->fired++;
        return f->kind;
    }
    return 0;
}

static float *eval_logits(hm_model *m, const int32_t *toks, hm_status *st, hm_err *err) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = 64;
    so.n_threads = 2;
    hm_session *s = NULL;
    *st = hm_session_open(&s, m, &so, err);
    if (*st != HM_OK) return NULL;
    const float *lg = NULL;
    *st = hm_session_eval(s, toks, NT, false, &lg, err);
    float *out = NULL;
    if (*st == HM_OK) {
        size_t nv = (size_t)hm_model_get_info(m)->n_vocab;
        out = malloc(nv * sizeof *out);
        memcpy(out, lg, nv * sizeof *out);
    }
    hm_session_close(s);
    return out;
}

int main(void) {
    char path[256];
    const int skip = test_synth_tiny("ssd_wired", "q4_k_m", 5, path, sizeof path);
    if (skip) return skip;
    int32_t toks[NT];
    for (int i = 0; i < NT; i++) toks[i] = 3 + 7 * i;
    hm_err err;
    hm_status st;
    hm_model_opts mo;
    hm_model_opts_default(&mo);
    hm_model *m = NULL;
    CHECK(hm_model_open(&m, path, &mo, &err) == HM_OK);
    float *ref = m ? eval_logits(m, toks, &st, &err) : NULL;
    CHECK(ref != NULL);
    const size_t nv = m ? (size_t)hm_model_get_info(m)->n_vocab : 0;
    hm_model_close(m);

    for (int variant = 0; variant < 4 && ref; variant++) {
        fault_ctx fc = {0, 0, 0};
        hm_model_test_io_fault(fault, &fc);
        hm_placement_opts po;
        hm_placement_opts_default(&po);
        po.ram_budget = 3 * 143360; /* 3 buffers of the tiny preset's units (slot bytes checked below) */
        po.prefetch = variant & 1;
        po.io_pread = variant & 2;
        mo.placement = &po;
        m = NULL;
        st = hm_model_open(&m, path, &mo, &err);
        CHECKF(st == HM_OK, "variant %d: open: %s", variant, err.msg);
        if (st != HM_OK) continue;
        CHECK(m->ram != NULL);
        for (int kind = 0; kind < 2; kind++) {
            fc.arm = 5 + 3 * kind;
            fc.kind = kind ? -1 : 5 /* EIO */;
            fc.fired = 0;
            float *bad = eval_logits(m, toks, &st, &err);
            CHECKF(st == HM_ERR_IO, "variant %d kind %d: armed eval gave %d (%s)", variant, kind, (int)st,
                   st ? err.msg : "ok");
            CHECK(bad == NULL);
            CHECK(fc.fired == 1);
            CHECKF(strstr(err.msg, path) && strstr(err.msg, "offset"), "message: %s", err.msg);
            printf("variant %d (prefetch %d, pread %d) %s: %s\n", variant, variant & 1, !!(variant & 2),
                   kind ? "short read" : "EIO", err.msg);
            free(bad);
            /* the next eval succeeds with the reference logits, bit for bit */
            float *good = eval_logits(m, toks, &st, &err);
            CHECKF(st == HM_OK, "variant %d kind %d: eval after the error: %s", variant, kind, err.msg);
            CHECKF(good && !memcmp(good, ref, nv * sizeof *good), "variant %d kind %d: logits differ", variant, kind);
            free(good);
        }
        hm_usage u;
        if (hm_model_usage(m, &u, &err) == HM_OK) {
            CHECK(u.ssd_errors == 2);
            CHECK(u.bytes_from_ssd > 0 && u.ram_acquired > 0);
            CHECK(u.io_uring == !(variant & 2) || !u.io_uring); /* pread when asked (io_uring may be absent) */
            if (variant & 1) CHECK(u.prefetch_pred > 0);
            hm_usage_free(&u);
        }
        hm_model_close(m);
        hm_model_test_io_fault(NULL, NULL);
    }
    free(ref);
    unlink(path);
    return test_done();
}
