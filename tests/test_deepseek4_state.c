/* test_deepseek4_state.c - DeepSeek-V4's per-session attention state (exec.h's xm->dsv4) through the
 * public session API, on the synth tiny deepseek4 (q8_0): ratios 0, 4, 128, 4, 128, window 16.
 *   - going back within the current 128-position block (hm_session_trim) and evaluating again gives
 *     the logits of the uninterrupted pass (the compressors' rows and the window ring still hold
 *     what the continuation needs): max |Δ| / max |logit| <= BOUND;
 *   - going back further is HM_ERR_UNSUPPORTED naming the compressed state, and a reset then
 *     evaluates from 0 as a fresh session does (byte for byte);
 *   - a quantised KV type and several sessions in one pass are refused with a message.
 * The agreement with llama.cpp (one pass, micro-batches, token by token) is
 * tests/cli_llama_ref_deepseek4.sh's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hotmoe.h"
#include "hotmoe_tools.h"
#include "test.h"

#define N 200
#define BOUND 1e-4

static double max_rel(const float *a, const float *b, size_t n) {
    double d = 0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (fabs(a[i] - b[i]) > d) d = fabs(a[i] - b[i]);
        if (fabs(a[i]) > m) m = fabs(a[i]);
    }
    return d / m;
}

int main(void) {
    char path[] = "/tmp/hm_ds4_state_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    hm_synth_opts o = {.arch = "deepseek4", .preset = "tiny", .type = "q8_0", .seed = 1, .out_path = path,
                       .n_threads = 2};
    hm_err err = {{0}};
    hm_status st = hm_synth(&o, &err);
    CHECKF(st == HM_OK, "synth: %s", err.msg);
    hm_model *m = NULL;
    if (st == HM_OK) CHECKF((st = hm_model_open(&m, path, NULL, &err)) == HM_OK, "open: %s", err.msg);
    unlink(path);
    if (st != HM_OK) return test_done();
    const int32_t V = hm_model_get_info(m)->n_vocab;
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = 2 + (i * 37 + 11) % (V - 4);

    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = 256;
    so.n_threads = 2;
    so.n_ubatch = 64;
    hm_session *a = NULL, *b = NULL;
    CHECK(hm_session_open(&a, m, &so, &err) == HM_OK);
    CHECK(hm_session_open(&b, m, &so, &err) == HM_OK);
    if (!a || !b) goto out;
    const float *la, *lb;
    float *full = malloc((size_t)N * (size_t)V * sizeof(float));
    CHECK(hm_session_eval(a, tok, N, true, &la, &err) == HM_OK);
    memcpy(full, la, (size_t)N * (size_t)V * sizeof(float));

    /* back to 150 (block 1 of 128 is the current one: positions 128..199) and on again */
    CHECK(hm_session_eval(b, tok, N, false, &lb, &err) == HM_OK);
    CHECKF(hm_session_trim(b, 150, &err) == HM_OK, "trim to 150: %s", err.msg);
    CHECK(hm_session_eval(b, tok + 150, N - 150, true, &lb, &err) == HM_OK);
    double worst = 0;
    for (int i = 150; i < N; i++) {
        const double d = max_rel(full + (size_t)i * (size_t)V, lb + (size_t)(i - 150) * (size_t)V, (size_t)V);
        if (d > worst) worst = d;
    }
    CHECKF(worst <= BOUND, "after trim to 150: max relative logit difference %.3g > %g", worst, BOUND);
    printf("trim to 150 and on: max relative difference %.3g\n", worst);

    /* back to 100: the ratio-128 compressor's rows of positions 0..99 are gone */
    st = hm_session_trim(b, 100, &err);
    CHECKF(st == HM_ERR_UNSUPPORTED && strstr(err.msg, "compressed"), "trim to 100: status %d (%s)", st, err.msg);
    hm_session_reset(b);
    CHECK(hm_session_eval(b, tok, N, true, &lb, &err) == HM_OK);
    CHECK(memcmp(full, lb, (size_t)N * (size_t)V * sizeof(float)) == 0);

    /* one session a pass; f16 state only */
    {
        hm_session *ss[2] = {a, b};
        const int32_t *tp[2] = {tok, tok};
        const int32_t nn[2] = {1, 1};
        hm_session_reset(a);
        hm_session_reset(b);
        st = hm_batch_eval(ss, tp, nn, 2, NULL, &err);
        CHECKF(st == HM_ERR_UNSUPPORTED, "batch eval: status %d (%s)", st, err.msg);
        hm_session *q = NULL;
        so.kv_type = HM_KV_Q8_0;
        st = hm_session_open(&q, m, &so, &err);
        CHECKF(st == HM_ERR_UNSUPPORTED && strstr(err.msg, "q8_0"), "q8_0 state: status %d (%s)", st, err.msg);
        hm_session_close(q);
    }
    free(full);
out:
    hm_session_close(a);
    hm_session_close(b);
    hm_model_close(m);
    return test_done();
}
