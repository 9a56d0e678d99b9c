/* test_gpu_vram_degrade_gpu.c - running out of VRAM after the start degrades instead of failing
 * (issue 5): a session whose device state (KV cache, activations, scratch) does not fit takes
 * room from the model's expert slot pool (hm_model_gpu_make_room: whole chunks of slots, their
 * units back to the CPU, one warning), and only fails (HM_ERR_NOMEM naming the MiB) when the pool
 * is empty, or when even the whole pool would not do (then the pool is left alone).
 *
 * Model: a 2-layer synth of the qwen3-30b-a3b preset at Q4_0 (fast experts): 256 units of ~2.5
 * MiB, so the pool is 4 chunks of 64 slots (~160 MiB each) and chunk freeing matters. The CPU
 * engine computes the reference logits of two sequences (P: a 16-token prompt, the GPU's prefill
 * path; D: a 6-token prompt, the matvec path; each then 8 greedy decode steps); the GPU runs must
 * match them by gpu_compare.h's rule (also test_qwen3moe_gpu.c's): NMSE below NMSE_Q8 (the CPU's
 * Q8 activation rounding dominates) and the same argmax unless a near-tie.
 *
 * Steps: open on the GPU with --vram-budget for every unit (256 slots, lru); session A (n_ctx 64)
 * runs P (slots fill). A "balloon" of device memory then leaves ~32 MiB free. (1) A session of
 * n_ctx 32768 (a 128 MiB KV cache) opens: the pool shrinks (fewer vram_slots, by whole chunks),
 * the warning names the slots given up, its logits and A's (after a reset) match the CPU's. (2) A
 * hopeless session (a 16 GiB KV cache) fails with HM_ERR_NOMEM naming MiB, the pool unchanged.
 * (3) A session whose KV cache needs nearly all of the pool and the free memory opens: the pool
 * is empty. (4) With the pool empty and no room, the next such open fails with HM_ERR_NOMEM
 * naming MiB. (5) The balloon freed, the same open succeeds and its logits match the CPU's.
 * Exits 77 ("skipped: no GPU") without a CUDA device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "gpu_compare.h"
#include "hotmoe_tools.h"
#include "test.h"

#define NP 16       /* prompt P (> 8 rows: the prefill path) */
#define ND 6        /* prompt D (the matvec path) */
#define NDEC 8      /* decode steps after each prompt */
#define NSTEP (1 + NDEC)
#define UBATCH 64
#define NMSE_Q8 3e-4
#define MIB (1024.0 * 1024.0)
#define LEFT_FREE ((size_t)32 << 20)   /* what the balloon leaves free */
#define KV_POS_BYTES 4096              /* f16 K and V of one position: 2 layers x 2 x 4 heads x 128 x 2 */

typedef struct ref {
    int32_t n_vocab;
    int32_t toks_p[NP + NDEC], toks_d[ND + NDEC];
    float *lp, *ld; /* [NSTEP][n_vocab] the CPU's logits per step of P and D */
    uint64_t unit_bytes, n_units;
} ref;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static hm_session *open_session(hm_model *m, int32_t n_ctx, hm_err *err) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = n_ctx;
    so.n_threads = 8;
    so.n_ubatch = UBATCH;
    hm_session *s = NULL;
    return hm_session_open(&s, m, &so, err) == HM_OK ? s : NULL;
}

/* On session s (reset first): prompt toks[0..np) then NDEC single tokens, logits per step into
 * out ([NSTEP][V]); greedy: the CPU reference picks the decode tokens. */
static hm_status run_seq(hm_session *s, int32_t *toks, int32_t np, bool greedy, float *out, int32_t V, hm_err *err) {
    hm_session_reset(s);
    return gpu_compare_run(s, toks, np, NDEC, greedy, out, V, err);
}

/* Both sequences on s against the CPU's. */
static void check_logits(const char *label, hm_session *s, const ref *r) {
    const int32_t V = r->n_vocab;
    float *g = malloc((size_t)NSTEP * (size_t)V * sizeof(float));
    int32_t tp[NP + NDEC], td[ND + NDEC];
    memcpy(tp, r->toks_p, sizeof tp);
    memcpy(td, r->toks_d, sizeof td);
    hm_err err = {{0}};
    char what[160];
    snprintf(what, sizeof what, "%s P", label);
    hm_status st = run_seq(s, tp, NP, false, g, V, &err);
    CHECKF(st == HM_OK, "%s: %s", what, err.msg);
    double wp = st == HM_OK ? gpu_compare_logits(what, g, r->lp, NSTEP, V, NMSE_Q8) : -1;
    snprintf(what, sizeof what, "%s D", label);
    st = run_seq(s, td, ND, false, g, V, &err);
    CHECKF(st == HM_OK, "%s: %s", what, err.msg);
    double wd = st == HM_OK ? gpu_compare_logits(what, g, r->ld, NSTEP, V, NMSE_Q8) : -1;
    fprintf(stderr, "  %s: logits vs the CPU: NMSE P %.3g, D %.3g (bound %.0e)\n", label, wp, wd, NMSE_Q8);
    free(g);
}

static int64_t vram_slots(hm_model *m) {
    hm_usage u;
    hm_err err = {{0}};
    if (hm_model_usage(m, &u, &err) != HM_OK) return -1;
    int64_t n = u.vram_slots;
    hm_usage_free(&u);
    return n;
}

/* stderr into a file while a call runs (the model's warnings), then echoed. */
static char cap_path[64];
static int cap_saved = -1;
static void capture_begin(void) {
    fflush(stderr);
    snprintf(cap_path, sizeof cap_path, "/tmp/hm_vramdg_log_XXXXXX");
    int fd = mkstemp(cap_path);
    cap_saved = dup(2);
    if (fd >= 0) dup2(fd, 2), close(fd);
}
static char *capture_end(void) {
    fflush(stderr);
    if (cap_saved >= 0) dup2(cap_saved, 2), close(cap_saved);
    cap_saved = -1;
    char *text = calloc(1, 1 << 16);
    FILE *f = fopen(cap_path, "r");
    if (f && text) {
        size_t n = fread(text, 1, (1 << 16) - 1, f);
        text[n] = 0;
    }
    if (f) fclose(f);
    unlink(cap_path);
    fprintf(stderr, "%s", text ? text : "");
    return text;
}

static size_t free_vram(hm_cuda_ctx *c) {
    size_t fr = 0, tot = 0;
    hm_err err;
    hm_cuda_mem_info(c, &fr, &tot, &err);
    return fr;
}

/* Take device memory until about LEFT_FREE is free: the largest piece that cudaMalloc grants. */
static void *balloon_inflate(hm_cuda_ctx *c, size_t *bytes) {
    size_t fr = free_vram(c);
    void *p = NULL;
    hm_err err;
    for (size_t want = fr > LEFT_FREE ? fr - LEFT_FREE : 0; want > ((size_t)1 << 30); want -= (size_t)16 << 20)
        if (hm_cuda_alloc(c, want, &p, &err) == HM_OK) {
            *bytes = want;
            return p;
        }
    *bytes = 0;
    return NULL;
}

static void run(const char *path, const ref *r) {
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    po.n_gpu_layers = 99;
    po.n_ctx = 64;
    po.policy = "lru";
    po.vram_budget = (int64_t)r->n_units * (int64_t)(r->unit_bytes + 3 * 256); /* a slot for every unit */
    hm_model_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.placement = &po;
    hm_err err = {{0}};
    hm_model *m = NULL;
    hm_status st = hm_model_open(&m, path, &mo, &err);
    CHECKF(st == HM_OK, "open on the GPU: %s", err.msg);
    if (st != HM_OK) return;
    const int64_t slots0 = vram_slots(m);
    fprintf(stderr, "GPU model: %lld expert slots for %llu units\n", (long long)slots0,
            (unsigned long long)r->n_units);
    CHECKF(slots0 == (int64_t)r->n_units, "%lld slots, want %llu", (long long)slots0, (unsigned long long)r->n_units);

    hm_session *a = open_session(m, 64, &err);
    CHECKF(a != NULL, "session A: %s", err.msg);
    if (!a) {
        hm_model_close(m);
        return;
    }
    check_logits("session A (n_ctx 64, before the balloon)", a, r);

    hm_cuda_ctx *c = NULL;
    CHECKF(hm_cuda_open(&c, 0, &err) == HM_OK, "balloon context: %s", err.msg);
    size_t bal_bytes = 0;
    void *bal = c ? balloon_inflate(c, &bal_bytes) : NULL;
    CHECK(bal != NULL);
    const size_t fr0 = c ? free_vram(c) : 0;
    fprintf(stderr, "balloon: %.1f MiB taken, %.1f MiB free\n", (double)bal_bytes / MIB, (double)fr0 / MIB);

    /* (1) the KV cache alone (128 MiB) is more than what is free: the pool gives up chunks */
    fprintf(stderr, "(1) a session of n_ctx 32768 (KV %.0f MiB)\n", 32768.0 * KV_POS_BYTES / MIB);
    capture_begin();
    hm_session *b = open_session(m, 32768, &err);
    char *log = capture_end();
    CHECKF(b != NULL, "(1) open: %s", err.msg);
    const int64_t slots1 = vram_slots(m);
    CHECKF(slots1 >= 0 && slots1 < slots0 && slots1 % 64 == 0, "(1) %lld slots, before %lld", (long long)slots1,
           (long long)slots0);
    char want[128];
    snprintf(want, sizeof want, "VRAM: gave up %lld expert slots (", (long long)(slots0 - slots1));
    CHECKF(log && strstr(log, want), "(1) the warning '%s...' is missing", want);
    free(log);
    fprintf(stderr, "(1) %lld -> %lld slots\n", (long long)slots0, (long long)slots1);
    if (b) check_logits("(1) session n_ctx 32768 on the smaller pool", b, r);
    check_logits("(1) session A (opened before) on the smaller pool", a, r);

    /* (2) hopeless: a 16 GiB KV cache. NOMEM naming the MiB; the pool is not given up for it */
    fprintf(stderr, "(2) a session of n_ctx 4194304 (KV 16 GiB)\n");
    hm_session *h = open_session(m, 1 << 22, &err);
    CHECK(h == NULL);
    hm_session_close(h);
    CHECKF(strstr(err.msg, "MiB") != NULL, "(2) error without MiB: %s", err.msg);
    fprintf(stderr, "(2) refused: %s\n", err.msg);
    CHECKF(vram_slots(m) == slots1, "(2) %lld slots, want %lld", (long long)vram_slots(m), (long long)slots1);

    /* (3) a KV cache of nearly the whole pool plus what is free (less the margins: 64 MiB kept
     * free, ~96 MiB for activations and scratch): every chunk goes */
    const size_t fr1 = c ? free_vram(c) : 0;
    const double pool = (double)slots1 * (double)(r->unit_bytes + 3 * 256);
    const double kv3 = pool + (double)fr1 - 160.0 * MIB;
    const int32_t ctx3 = kv3 > 0 ? (int32_t)(kv3 / KV_POS_BYTES) / 256 * 256 : 256;
    fprintf(stderr, "(3) a session of n_ctx %d (KV %.0f MiB; pool %.0f MiB, %.0f MiB free)\n", (int)ctx3,
            (double)ctx3 * KV_POS_BYTES / MIB, pool / MIB, (double)fr1 / MIB);
    capture_begin();
    hm_session *e = open_session(m, ctx3, &err);
    log = capture_end();
    CHECKF(e != NULL, "(3) open: %s", err.msg);
    CHECKF(vram_slots(m) == 0, "(3) %lld slots left", (long long)vram_slots(m));
    snprintf(want, sizeof want, "VRAM: gave up %lld expert slots (", (long long)slots1);
    CHECKF(log && strstr(log, want), "(3) the warning '%s...' is missing", want);
    free(log);

    /* (4) the pool empty, still no room: NOMEM naming the MiB, nothing breaks */
    fprintf(stderr, "(4) another session of n_ctx %d with the pool empty\n", (int)ctx3);
    hm_session *f = open_session(m, ctx3, &err);
    CHECK(f == NULL);
    hm_session_close(f);
    CHECKF(strstr(err.msg, "MiB") != NULL && strstr(err.msg, "KV cache"), "(4) error: %s", err.msg);
    fprintf(stderr, "(4) refused: %s\n", err.msg);
    if (e) check_logits("(3) session on the empty pool", e, r);

    /* (5) the balloon gone, the same open works and computes right */
    hm_cuda_free(c, bal);
    fprintf(stderr, "(5) balloon freed: %.1f MiB free; the same open again\n", c ? (double)free_vram(c) / MIB : 0);
    f = open_session(m, ctx3, &err);
    CHECKF(f != NULL, "(5) open: %s", err.msg);
    if (f) check_logits("(5) session after the balloon", f, r);
    CHECK(vram_slots(m) == 0); /* the pool does not grow back */
    hm_session_close(f);
    hm_session_close(e);
    hm_session_close(b);
    hm_session_close(a);
    hm_cuda_close(c);
    hm_model_close(m);
}

int main(void) {
    if (!gpu_compare_have_device()) return 77;
    char path[] = "/tmp/hm_vramdg_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return test_done();
    close(fd);
    double t0 = now_s();
    hm_synth_opts so = {.arch = "qwen3moe", .preset = "qwen3-30b-a3b", .n_layer = 2, .type = "q4_0", .seed = 5,
                        .out_path = path, .fast_experts = true};
    hm_err err = {{0}};
    hm_status st = hm_synth(&so, &err);
    CHECKF(st == HM_OK, "synth: %s", err.msg);
    fprintf(stderr, "synth qwen3-30b-a3b --layers 2 q4_0: %.1f s\n", now_s() - t0);

    ref r;
    memset(&r, 0, sizeof r);
    hm_model *m = NULL;
    if (st == HM_OK) st = hm_model_open(&m, path, NULL, &err);
    CHECKF(st == HM_OK, "open on the CPU: %s", err.msg);
    if (st == HM_OK) {
        t0 = now_s();
        r.n_vocab = hm_model_get_info(m)->n_vocab;
        r.lp = malloc((size_t)NSTEP * (size_t)r.n_vocab * sizeof(float));
        r.ld = malloc((size_t)NSTEP * (size_t)r.n_vocab * sizeof(float));
        gpu_compare_prompts(0x9e3779b97f4a7c15ull, r.n_vocab, r.toks_p, NP, r.toks_d, ND);
        hm_session *s = open_session(m, 64, &err);
        CHECKF(s != NULL, "CPU session: %s", err.msg);
        if (s) {
            CHECKF(run_seq(s, r.toks_p, NP, true, r.lp, r.n_vocab, &err) == HM_OK, "CPU P: %s", err.msg);
            CHECKF(run_seq(s, r.toks_d, ND, true, r.ld, r.n_vocab, &err) == HM_OK, "CPU D: %s", err.msg);
        }
        hm_session_close(s);
        gpu_compare_units(m, &r.unit_bytes, &r.n_units, &err);
        hm_model_close(m);
        fprintf(stderr, "CPU reference: %.1f s; %llu units of %.2f MiB\n", now_s() - t0,
                (unsigned long long)r.n_units, (double)r.unit_bytes / MIB);
        if (!test_failures_) run(path, &r);
    }
    free(r.lp);
    free(r.ld);
    unlink(path);
    return test_done();
}
