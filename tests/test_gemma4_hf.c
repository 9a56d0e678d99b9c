/* test_gemma4_hf.c - gemma4 logits against Hugging Face transformers.
 *
 * Fixture (tests/fixtures/hf_ref/gemma4/): a tiny random Gemma4ForCausalLM (6 layers: 5 sliding
 * with window 16 and head dim 32, 1 global with head dim 64 and K = V, proportional RoPE, 8 experts
 * top-2 beside a dense GELU MLP, soft-cap 30), config.json + model.safetensors + tokens.txt (80 ids)
 * + logits.f32 (80 x 512, one full forward), converted by tools/convert_gemma4.py into model.gguf.
 * The 80 tokens are longer than the window, so the sliding layers' masking matters.
 *
 * Checked with the exact f32 KV cache (max |ours - transformers| < 1e-3) and the f16 cache (< 5e-2):
 *   - one batch of all 80 tokens (the ring is as large as the context: n_ubatch 512 > 80 - 16);
 *   - n_ubatch 8 (ring of 24 rows): prefill 64 in 8 micro-batches, then 16 single-token decodes;
 *   - n_ubatch 1 (ring of 17 rows): all 80 one by one;
 *   - trimming: going back past the ring's reach is refused, a short step back is exact.
 * Bad input: a missing tensor and a missing key are named in the error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "hotmoe.h"
#include "test.h"

#define DIR "tests/fixtures/hf_ref/gemma4/"
#define MAX_TOK 256

static int32_t nv;
static const float *want;

/* max |got - want| over rows [t0, t0 + n) */
static double dmax_rows(const float *got, int t0, int n) {
    return fixture_maxdiff(got, want + (size_t)t0 * nv, (size_t)n * nv);
}

static hm_session *open_session(hm_model *m, int n_ctx, int n_ubatch, hm_kv_type kv) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = n_ctx;
    so.n_threads = 2;
    so.n_ubatch = n_ubatch;
    so.kv_type = kv;
    hm_session *s = NULL;
    hm_err err;
    CHECKF(hm_session_open(&s, m, &so, &err) == HM_OK, "%s", err.msg);
    return s;
}

static void run_kv(hm_model *m, const int32_t *tok, int n, hm_kv_type kv) {
    /* f16 K/V rounding is amplified by Gemma's attention scale of 1 over unit-RMS q/k heads:
     * 2.5e-2 here, so the f16 bound is 5e-2 */
    const double tol = kv == HM_KV_F32 ? 1e-3 : 5e-2;
    const char *name = kv == HM_KV_F32 ? "f32 KV" : "f16 KV";
    hm_err err;
    const float *lg = NULL;

    hm_session *s = open_session(m, n, 0, kv);
    if (!s) return;
    CHECKF(hm_session_eval(s, tok, n, true, &lg, &err) == HM_OK, "%s", err.msg);
    double d = lg ? dmax_rows(lg, 0, n) : 1e9;
    fprintf(stderr, "%s one batch of %d: max |d| = %.3g\n", name, n, d);
    CHECKF(d < tol, "%s batch: %g", name, d);
    hm_session_close(s);

    /* ring path: prefill 64 in micro-batches of 8, then decode */
    const int np = n < 64 ? n / 2 : 64;
    s = open_session(m, n, 8, kv);
    if (!s) return;
    CHECKF(hm_session_eval(s, tok, np, true, &lg, &err) == HM_OK, "%s", err.msg);
    double dp = lg ? dmax_rows(lg, 0, np) : 1e9, dd = 0;
    for (int t = np; t < n; t++) {
        CHECK(hm_session_eval(s, &tok[t], 1, false, &lg, &err) == HM_OK);
        double x = lg ? dmax_rows(lg, t, 1) : 1e9;
        if (x > dd) dd = x;
    }
    fprintf(stderr, "%s n_ubatch 8: prefill %d max |d| = %.3g, %d decode steps max |d| = %.3g\n", name, np, dp,
            n - np, dd);
    CHECKF(dp < tol && dd < tol, "%s ring prefill %g decode %g", name, dp, dd);

    /* trim: back to 40 needs positions 25..39, long overwritten in a ring of 24 rows */
    CHECK(hm_session_trim(s, 40, &err) != HM_OK);
    /* back two: the window below position 78 is still in the ring */
    CHECKF(hm_session_trim(s, n - 2, &err) == HM_OK, "%s", err.msg);
    CHECKF(hm_session_eval(s, &tok[n - 2], 2, true, &lg, &err) == HM_OK, "%s", err.msg);
    d = lg ? dmax_rows(lg, n - 2, 2) : 1e9;
    CHECKF(d < tol, "%s after trim: %g", name, d);
    hm_session_close(s);

    /* one token at a time: ring of window + 1 rows */
    s = open_session(m, n, 1, kv);
    if (!s) return;
    d = 0;
    for (int t = 0; t < n; t++) {
        CHECK(hm_session_eval(s, &tok[t], 1, false, &lg, &err) == HM_OK);
        double x = lg ? dmax_rows(lg, t, 1) : 1e9;
        if (x > d) d = x;
    }
    fprintf(stderr, "%s n_ubatch 1, token by token: max |d| = %.3g\n", name, d);
    CHECKF(d < tol, "%s token by token: %g", name, d);
    hm_session_close(s);
}

/* Copy the fixture with one byte string replaced (same length) and check the open fails naming it. */
static void bad_copy(const char *gguf, const char *from, const char *to, const char *expect) {
    FILE *f = fopen(gguf, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)sz);
    size_t got = fread(buf, 1, (size_t)sz, f);
    fclose(f);
    CHECK(got == (size_t)sz && strlen(from) == strlen(to));
    int hits = 0;
    for (long i = 0; i + (long)strlen(from) <= sz; i++)
        if (memcmp(buf + i, from, strlen(from)) == 0) {
            memcpy(buf + i, to, strlen(to));
            hits++;
        }
    CHECKF(hits == 1, "'%s' found %d times", from, hits);
    char tmp[] = "/tmp/test_gemma4_XXXXXX";
    int fd = mkstemp(tmp);
    CHECK(fd >= 0);
    FILE *o = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (o) {
        fwrite(buf, 1, (size_t)sz, o);
        fclose(o);
        hm_model *m = NULL;
        hm_err err;
        CHECK(hm_model_open(&m, tmp, NULL, &err) != HM_OK && m == NULL);
        CHECKF(strstr(err.msg, expect) != NULL, "error '%s' does not name '%s'", err.msg, expect);
        fprintf(stderr, "bad file: %s\n", err.msg);
        remove(tmp);
    }
    free(buf);
}

int main(void) {
    fixture fx;
    static int32_t tok[MAX_TOK];
    if (!fixture_open(&fx, DIR, tok, MAX_TOK) || fx.n <= 0) return fixture_skip(&fx);
    const int n = fx.n;
    hm_model *m = fixture_model(&fx, "gemma4");
    if (!m) return test_done();
    nv = hm_model_n_vocab(m);
    size_t cnt = (size_t)n * (size_t)nv, got;
    float *w = fixture_read_logits(&fx, nv, &got);
    want = w;
    if (got == cnt) {
        run_kv(m, tok, n, HM_KV_F32);
        run_kv(m, tok, n, HM_KV_F16);
    }
    /* a token outside the vocabulary is refused */
    hm_err err;
    hm_session *s = open_session(m, n, 0, HM_KV_F32);
    const float *lg;
    int32_t bad = nv;
    if (s) CHECK(hm_session_eval(s, &bad, 1, false, &lg, &err) == HM_ERR_ARG);
    hm_session_close(s);
    hm_model_close(m);

    bad_copy(fx.gguf, "blk.3.attn_q_norm.weight", "blk.3.attn_q_norX.weight", "blk.3.attn_q_norm.weight");
    bad_copy(fx.gguf, "gemma4.attention.sliding_window_pattern", "gemma4.attention.sliding_window_patterX",
             "sliding_window_pattern");
    bad_copy(fx.gguf, "rope_freqs.weight", "rope_freqX.weight", "rope_freqs.weight");
    free(w);
    fixture_close(&fx);
    return test_done();
}
