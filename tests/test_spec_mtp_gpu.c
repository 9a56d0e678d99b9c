/* test_spec_mtp_gpu.c - speculative decoding on a GPU placement (-ngl 99) of a recurrent target:
 * the synth tiny qwen35moe with its MTP block (synth --nextn 1). Greedy ids with draft-mtp (the
 * target's hidden rows come down from the device for the head, which runs on the CPU) and with
 * ngram-simple on a repetitive prompt (drafts kept and rejected: the recurrent state saved and
 * restored on the device, hm_exec_gpu_state_save) must be the plain GPU run's, one pass and
 * micro-batches of 5; and the head's first draft logits with the target on the GPU must be close to
 * those with the target on the CPU (the same head, fed hidden rows that differ by the GPU's
 * rounding only). Skipped (77) without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_device.h"
#include "engine/spec.h"
#include "hotmoe_tools.h"
#include "test.h"

#define NGEN 40
#define NV 384

static hm_model *open_model(const char *path, bool gpu) {
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    po.n_gpu_layers = gpu ? 99 : 0;
    po.n_ctx = 256;
    hm_model_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.placement = gpu ? &po : NULL;
    hm_model *m = NULL;
    hm_err err;
    CHECKF(hm_model_open(&m, path, &mo, &err) == HM_OK, "open (%s): %s", gpu ? "gpu" : "cpu", err.msg);
    return m;
}

static hm_session *session(hm_model *m, int32_t ub) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = 256;
    so.n_threads = 2;
    so.n_ubatch = ub;
    hm_session *s = NULL;
    hm_err err;
    CHECKF(hm_session_open(&s, m, &so, &err) == HM_OK, "session: %s", err.msg);
    return s;
}

static int32_t argmax(const float *v) {
    int32_t b = 0;
    for (int32_t i = 1; i < NV; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Greedy ids after prompt: plain (so NULL) or with speculation. */
static int gen(hm_model *m, int32_t ub, const hm_spec_opts *so, const int32_t *prompt, int32_t np, int32_t *ids,
               hm_spec_stats *st) {
    hm_session *s = session(m, ub);
    hm_spec *sp = NULL;
    hm_sampler *smp = NULL;
    hm_sampler_opts o;
    hm_sampler_opts_default(&o);
    o.temp = 0;
    hm_err err;
    const float *lg;
    int got = 0;
    if (!s || hm_sampler_open(&smp, NV, &o, &err) != HM_OK) goto done;
    if (so && hm_spec_open(&sp, s, so, &err) != HM_OK) {
        CHECKF(0, "spec: %s", err.msg);
        goto done;
    }
    if (hm_session_eval(s, prompt, np, false, &lg, &err) != HM_OK || (sp && hm_spec_add(sp, prompt, np, &err))) {
        CHECKF(0, "prompt: %s", err.msg);
        goto done;
    }
    ids[got] = hm_sampler_sample(smp, lg);
    hm_sampler_accept(smp, ids[got++]);
    while (got < NGEN) {
        int32_t k = 1;
        if (sp) {
            if (hm_spec_step(sp, smp, ids[got - 1], NGEN - got, ids + got, &k, &err) != HM_OK) break;
        } else {
            if (hm_session_eval(s, &ids[got - 1], 1, false, &lg, &err) != HM_OK) break;
            ids[got] = hm_sampler_sample(smp, lg);
            hm_sampler_accept(smp, ids[got]);
        }
        got += k;
    }
    CHECKF(got == NGEN, "generation stopped at %d: %s", got, err.msg);
    if (sp && st) hm_spec_get_stats(sp, st);
done:
    hm_spec_close(sp);
    hm_sampler_close(smp);
    hm_session_close(s);
    return got;
}

/* The head's first draft (3 steps) after prompt, the target on m; logits into lg [3, NV]. */
static void first_draft(hm_model *m, const int32_t *prompt, int32_t np, float *lg3) {
    hm_session *s = session(m, 64);
    hm_spec_mtp *d = NULL;
    hm_err err;
    const float *lg;
    int32_t draft[3], k = 0;
    if (s && hm_spec_mtp_open(&d, s, &err) == HM_OK && hm_session_eval(s, prompt, np, false, &lg, &err) == HM_OK)
        CHECKF(hm_spec_mtp_draft(d, argmax(lg), np, 3, 0, 0.0f, draft, 3, &k, lg3, &err) == HM_OK && k == 3, "%s",
               err.msg);
    else
        CHECKF(0, "first draft: %s", err.msg);
    hm_spec_mtp_close(d);
    hm_session_close(s);
}

int main(void) {
    if (hm_cuda_device_count() == 0) {
        printf("skipped: no GPU\n");
        return 77;
    }
    char path[] = "/tmp/hm_test_spec_mtp_gpu_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    hm_synth_opts o = {.arch = "qwen35moe", .preset = "tiny", .type = "q8_0", .seed = 1, .out_path = path,
                       .n_threads = 2, .n_nextn = 1};
    hm_err err = {{0}};
    CHECKF(hm_synth(&o, &err) == HM_OK, "synth: %s", err.msg);
    hm_model *g = open_model(path, true), *c = open_model(path, false);
    int32_t prompt[48];
    for (int i = 0; i < 48; i++) prompt[i] = 200 + (i * 5) % 16;
    if (g && c) {
        const int32_t ubs[2] = {64, 5};
        for (int u = 0; u < 2; u++) {
            int32_t a[NGEN], b[NGEN];
            hm_spec_stats st;
            hm_spec_opts so;
            hm_spec_opts_default(&so);
            gen(g, ubs[u], NULL, prompt, 48, a, NULL);
            so.type = HM_SPEC_DRAFT_MTP;
            gen(g, ubs[u], &so, prompt, 48, b, &st);
            CHECKF(!memcmp(a, b, sizeof a), "gpu, draft-mtp, ubatch %d: ids differ from plain", ubs[u]);
            fprintf(stderr, "gpu draft-mtp ub %d: %llu drafted, %llu accepted\n", ubs[u], (unsigned long long)st.drafted,
                    (unsigned long long)st.accepted);
            so.type = HM_SPEC_NGRAM_SIMPLE;
            so.size_n = 1;
            so.size_m = 4;
            gen(g, ubs[u], &so, prompt, 48, b, &st);
            CHECKF(!memcmp(a, b, sizeof a), "gpu, ngram-simple, ubatch %d: ids differ from plain", ubs[u]);
            fprintf(stderr, "gpu ngram-simple ub %d: %llu drafted, %llu accepted\n", ubs[u],
                    (unsigned long long)st.drafted, (unsigned long long)st.accepted);
            CHECKF(st.accepted > 0 && st.accepted < st.drafted, "ngram-simple: %llu of %llu kept (a rollback needed)",
                   (unsigned long long)st.accepted, (unsigned long long)st.drafted);
        }
        static float lg_g[3 * NV], lg_c[3 * NV];
        first_draft(g, prompt, 48, lg_g);
        first_draft(c, prompt, 48, lg_c);
        double md = 0;
        for (int i = 0; i < 3 * NV; i++) md = fmax(md, fabs((double)lg_g[i] - (double)lg_c[i]));
        fprintf(stderr, "MTP head's draft logits, target on the GPU vs the CPU: max |d| %.3g\n", md);
        CHECKF(md < 0.25, "max |d logit| %.3g (the hidden rows from the device are off)", md);
    }
    hm_model_close(g);
    hm_model_close(c);
    unlink(path);
    return test_done();
}
