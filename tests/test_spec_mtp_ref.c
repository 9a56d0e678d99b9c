/* test_spec_mtp_ref.c - draft-mtp's MTP head against llama.cpp: the synth tiny qwen35moe with its MTP
 * block (`synth --arch qwen35moe --preset tiny --nextn 1 --type TYPE --seed 1`, TYPE f32 and q8_0, its
 * bytes pinned by tests/fixtures/llama_qwen35mtp/TYPE/model.fnv1a64: a synth change that alters them
 * makes the reference stale, loudly), and the tiny qwen3next the same way (q8_0: llama.cpp runs the
 * same graph_mtp for it, NEOX rotary). llama.cpp's common_speculative draft-mtp driver (a throwaway program,
 * README.md) recorded: the prompt, the target's greedy pick, then two draft cycles of 3 chained
 * steps with every step's full draft logits: cycle 1 right after the prompt (the head fed every
 * prompt row), cycle 2 after a verify batch [pick, first draft] and its acceptance (the pending
 * hidden row chosen by the kept count, the head's KV past it dropped). Here the same through
 * engine/spec_mtp.c: each step's draft token must be llama.cpp's and its logits within the type's
 * tolerance of llama.cpp's (measured 3e-4 for f32, the KV cache's rounding; 0.16 for q8_0, whose
 * activations are rounded to Q8_0 again in the head; README.md). The hidden rows not shifted by one
 * in the process step move the q8_0 logits by 1.04; [h | e] in the wrong order by 37. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/spec.h"
#include "hotmoe_tools.h"
#include "test.h"

#define TOL_F32 2e-3  /* max |d logit| allowed over a cycle's 3 x 384 draft logits */
#define TOL_Q8_0 0.3
#define NV 384
#define NSTEP 3

typedef struct ref {
    int32_t prompt[256], np, target;
    int32_t tok[2][NSTEP], pos[2][NSTEP];
    float lg[2][NSTEP][NV];
    int32_t v_t1, v_d1, v_acc, v_next;
} ref;

static int read_ref(const char *path, ref *r) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fscanf(f, " prompt %d", &r->np) == 1 && r->np > 0 && r->np <= 256;
    for (int i = 0; ok && i < r->np; i++) ok = fscanf(f, "%d", &r->prompt[i]) == 1;
    ok = ok && fscanf(f, " target %d", &r->target) == 1;
    for (int c = 0; ok && c < 2; c++) {
        if (c == 1)
            ok = fscanf(f, " verify %d %d accepted %d next %d", &r->v_t1, &r->v_d1, &r->v_acc, &r->v_next) == 4;
        for (int s = 0; ok && s < NSTEP; s++) {
            int cc, ss;
            ok = fscanf(f, " cycle%d step %d pos %d token %d logits", &cc, &ss, &r->pos[c][s], &r->tok[c][s]) == 4 &&
                 cc == c + 1 && ss == s;
            for (int j = 0; ok && j < NV; j++) ok = fscanf(f, "%f", &r->lg[c][s][j]) == 1;
        }
    }
    fclose(f);
    return ok ? 0 : -1;
}

static uint64_t fnv1a64_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint64_t h = 1469598103934665603ull;
    int c;
    while ((c = getc(f)) != EOF) h = (h ^ (uint64_t)(unsigned char)c) * 1099511628211ull;
    fclose(f);
    return h;
}

static int32_t argmax(const float *v, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* One cycle: draft NSTEP after tok at n_past and hold it to the reference's cycle c. */
static void cycle(hm_spec_mtp *d, int c, int32_t tok, int32_t n_past, const ref *r, const char *type, double tol) {
    static float lg[NSTEP][NV];
    int32_t draft[NSTEP], k = 0;
    hm_err err;
    hm_status st = hm_spec_mtp_draft(d, tok, n_past, NSTEP, 0, 0.0f, draft, NSTEP, &k, &lg[0][0], &err);
    CHECKF(st == HM_OK && k == NSTEP, "cycle %d: draft: %s (k %d)", c + 1, st == HM_OK ? "" : err.msg, k);
    if (st != HM_OK || k != NSTEP) return;
    double md = 0;
    for (int s = 0; s < NSTEP; s++) {
        CHECKF(n_past + s == r->pos[c][s], "cycle %d step %d: position %d, llama.cpp's %d", c + 1, s, n_past + s,
               r->pos[c][s]);
        CHECKF(draft[s] == r->tok[c][s], "cycle %d step %d: token %d, llama.cpp's %d", c + 1, s, draft[s],
               r->tok[c][s]);
        double ms = 0, sum = 0;
        for (int j = 0; j < NV; j++) {
            const double dd = fabs((double)lg[s][j] - (double)r->lg[c][s][j]);
            if (dd > ms) ms = dd;
            sum += dd;
        }
        if (ms > md) md = ms;
        if (getenv("HM_MTP_REF_VERBOSE")) fprintf(stderr, "  cycle %d step %d: max %.3g mean %.3g\n", c + 1, s, ms, sum / NV);
    }
    fprintf(stderr, "%s cycle %d: tokens %d %d %d (llama.cpp %d %d %d), max |d logit| %.3g (tol %g)\n", type, c + 1,
            draft[0], draft[1], draft[2], r->tok[c][0], r->tok[c][1], r->tok[c][2], md, tol);
    CHECKF(md <= tol, "%s cycle %d: max |d logit| %.3g > %g", type, c + 1, md, tol);
}

/* One type's reference: its file synthesised, pinned, compared. */
static void run_type(const char *arch, const char *type, double tol) {
    char fix[128];
    snprintf(fix, sizeof fix, "tests/fixtures/llama_qwen35mtp/%s%s%s", strcmp(arch, "qwen35moe") ? arch : "",
             strcmp(arch, "qwen35moe") ? "-" : "", type);
    char p[512];
    static ref r;
    snprintf(p, sizeof p, "%s/ref.txt", fix);
    if (read_ref(test_src_path(p), &r) != 0) {
        CHECKF(0, "cannot read %s", test_src_path(p));
        return;
    }
    char path[] = "/tmp/hm_test_mtp_ref_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    hm_synth_opts o = {.arch = arch, .preset = "tiny", .type = type, .seed = 1, .out_path = path,
                       .n_threads = 2, .n_nextn = 1};
    hm_err err = {{0}};
    CHECKF(hm_synth(&o, &err) == HM_OK, "synth: %s", err.msg);
    snprintf(p, sizeof p, "%s/model.fnv1a64", fix);
    FILE *f = fopen(test_src_path(p), "r");
    unsigned long long want = 0;
    CHECK(f && fscanf(f, "%llx", &want) == 1);
    if (f) fclose(f);
    const uint64_t got = fnv1a64_file(path);
    CHECKF(got == want, "the synth model's FNV-1a is %016llx, the reference was made from %016llx: regenerate %s as "
           "its README.md says", (unsigned long long)got, want, fix);
    hm_model *m = NULL;
    hm_session *s = NULL;
    hm_spec_mtp *d = NULL;
    if (got == want && hm_model_open(&m, path, NULL, &err) == HM_OK) {
        hm_session_opts so;
        hm_session_opts_default(&so);
        so.n_ctx = 256;
        so.n_ubatch = 128;
        so.n_threads = 2;
        if (getenv("HM_MTP_REF_KV_F32")) so.kv_type = HM_KV_F32;
        const float *lg;
        CHECKF(hm_session_open(&s, m, &so, &err) == HM_OK, "%s", err.msg);
        CHECKF(s && hm_spec_mtp_open(&d, s, &err) == HM_OK, "%s", err.msg);
        if (d && hm_session_eval(s, r.prompt, r.np, false, &lg, &err) == HM_OK) {
            const int32_t t1 = argmax(lg, NV);
            CHECKF(t1 == r.target, "target's pick %d, llama.cpp's %d", t1, r.target);
            cycle(d, 0, t1, r.np, &r, fix + strlen("tests/fixtures/llama_qwen35mtp/"), tol);
            /* the verify batch [t1, first draft], llama.cpp's acceptance, the head told how many kept */
            const int32_t vb[2] = {r.v_t1, r.v_d1};
            CHECKF(hm_session_eval(s, vb, 2, true, &lg, &err) == HM_OK, "%s", err.msg);
            const int32_t acc = argmax(lg, NV) == r.v_d1;
            CHECKF(acc == r.v_acc, "verify: accepted %d, llama.cpp %d", acc, r.v_acc);
            const int32_t t2 = argmax(lg + (size_t)acc * NV, NV);
            CHECKF(t2 == r.v_next, "verify: next %d, llama.cpp's %d", t2, r.v_next);
            hm_spec_mtp_accept(d, acc + 1);
            cycle(d, 1, t2, r.np + 1 + acc, &r, fix + strlen("tests/fixtures/llama_qwen35mtp/"), tol);
        } else {
            CHECKF(0, "prompt: %s", err.msg);
        }
    } else if (got == want) {
        CHECKF(0, "open: %s", err.msg);
    }
    hm_spec_mtp_close(d);
    hm_session_close(s);
    hm_model_close(m);
    unlink(path);
}

int main(void) {
    run_type("qwen35moe", "f32", TOL_F32);
    run_type("qwen35moe", "q8_0", TOL_Q8_0);
    run_type("qwen3next", "q8_0", TOL_Q8_0);
    return test_done();
}
