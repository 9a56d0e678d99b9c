/* test_qwen3moe_hf.c - qwen3moe logits against Hugging Face transformers.
 *
 * Fixtures (made on a machine with torch + transformers by tools/fixtures/make_qwen3moe_fixture.py):
 *   tests/fixtures/qwen3moe_tiny/   a tiny random Qwen3MoeForCausalLM converted to GGUF (F32)
 *   tests/fixtures/qwen3moe_yarn/   the same with YaRN RoPE scaling (factor 4 over an original
 *                                   context of 16, 48 tokens: positions 3x past it; `--yarn`)
 * each with model.gguf, tokens.txt (ids separated by spaces, commas or newlines) and logits.f32
 * (transformers' logits, [n_tokens, n_vocab] little-endian f32). A fixture that is absent is
 * skipped (77 when both are). With the exact f32 KV cache: max |ours - transformers| < 1e-3 over
 * every position, evaluated as one batch and again token by token (KV cache path). With the
 * default f16 cache the bound is 1e-2 (its rounding moves these logits by a few 1e-3) and top-1
 * must agree everywhere.
 * The two fixtures hold the same weights and tokens (one seed; the files differ only in their RoPE
 * keys), so the load-time overrides (llama.cpp's --rope-scaling / --rope-scale / --yarn-orig-ctx,
 * hm_model_opts) are checked across them: the plain file opened as YaRN 4 over 16 gives the YaRN
 * fixture's transformers logits, and the YaRN file opened with scaling "none" the plain one's
 * (f32 KV, one batch, 1e-3). */
#include "fixture.h"
#include "hotmoe.h"
#include "test.h"

#define MAX_TOK 4096

/* One fixture; false when it is absent. */
static bool check_fixture(const char *dir) {
    fixture fx;
    static int32_t tok[MAX_TOK];
    if (!fixture_open(&fx, dir, tok, MAX_TOK)) {
        fixture_skip(&fx);
        return false;
    }
    fprintf(stderr, "fixture %s\n", dir);
    const int n = fx.n;
    CHECKF(n > 0, "no tokens in %s", fx.tokens);

    hm_model *m = fixture_model(&fx, NULL);
    if (!m || n <= 0) return true;
    const int32_t nv = hm_model_n_vocab(m);
    const size_t cnt = (size_t)n * (size_t)nv;
    size_t got;
    float *want = fixture_read_logits(&fx, nv, &got);
    hm_err err;

    for (int kv = 0; kv < 2 && got == cnt; kv++) {
        hm_session_opts so;
        hm_session_opts_default(&so);
        so.n_ctx = n;
        so.n_threads = 2;
        so.kv_type = kv == 0 ? HM_KV_F32 : HM_KV_F16;
        const double tol = kv == 0 ? 1e-3 : 1e-2;
        const char *name = kv == 0 ? "f32 KV" : "f16 KV";
        hm_session *s = NULL;
        CHECKF(hm_session_open(&s, m, &so, &err) == HM_OK, "%s", err.msg);
        if (!s) continue;
        const float *lg = NULL;
        CHECKF(hm_session_eval(s, tok, n, true, &lg, &err) == HM_OK, "%s", err.msg);
        double dmax = 0, lmax = 0;
        int agree = 0;
        if (lg) {
            dmax = fixture_maxdiff(lg, want, cnt);
            for (size_t k = 0; k < cnt; k++)
                if (fabs(want[k]) > lmax) lmax = fabs(want[k]);
            agree = fixture_top1_agree(lg, want, n, nv);
        }
        fprintf(stderr, "%s batch: %d tokens, max |d| = %.3g (max |logit| %.3g), top-1 agree %d/%d\n", name, n,
                dmax, lmax, agree, n);
        CHECKF(dmax < tol, "%s batch: max |d| %g", name, dmax);
        CHECK(agree == n);

        hm_session_reset(s);
        dmax = 0;
        for (int t = 0; t < n; t++) {
            CHECK(hm_session_eval(s, &tok[t], 1, false, &lg, &err) == HM_OK);
            if (lg) dmax = fixture_maxdiff_from(dmax, lg, want + (size_t)t * nv, (size_t)nv);
        }
        fprintf(stderr, "%s decode: max |d| = %.3g\n", name, dmax);
        CHECKF(dmax < tol, "%s decode: max |d| %g", name, dmax);
        hm_session_close(s);
    }
    hm_model_close(m);
    free(want);
    fixture_close(&fx);
    return true;
}

/* The model of dir opened with RoPE overrides against the logits of want_dir (f32 KV, one batch). */
static void check_override(const char *dir, const char *want_dir, const char *scaling, float scale, int32_t orig) {
    fixture fx, fw;
    static int32_t tok[MAX_TOK], tok_w[MAX_TOK];
    if (!fixture_open(&fx, dir, tok, MAX_TOK)) return;
    if (!fixture_open(&fw, want_dir, tok_w, MAX_TOK)) {
        fixture_close(&fx);
        return;
    }
    CHECK(fx.n == fw.n && !memcmp(tok, tok_w, (size_t)fx.n * sizeof(int32_t)));
    hm_model_opts mo;
    hm_model_opts_default(&mo);
    mo.rope_scaling = scaling;
    mo.rope_scale = scale;
    mo.yarn_orig_ctx = orig;
    hm_model *m = NULL;
    hm_err err;
    CHECKF(hm_model_open(&m, fx.gguf, &mo, &err) == HM_OK, "%s", err.msg);
    const int32_t nv = m ? hm_model_n_vocab(m) : 0;
    size_t got = 0;
    float *want = m ? fixture_read_logits(&fw, nv, &got) : NULL;
    hm_session *s = NULL;
    if (m && got == (size_t)fx.n * (size_t)nv) {
        hm_session_opts so;
        hm_session_opts_default(&so);
        so.n_ctx = fx.n;
        so.n_threads = 2;
        so.kv_type = HM_KV_F32;
        CHECKF(hm_session_open(&s, m, &so, &err) == HM_OK, "%s", err.msg);
    }
    if (s) {
        const float *lg = NULL;
        CHECKF(hm_session_eval(s, tok, fx.n, true, &lg, &err) == HM_OK, "%s", err.msg);
        const double d = lg ? fixture_maxdiff(lg, want, got) : 1e9;
        fprintf(stderr, "%s as --rope-scaling %s (%g, %d) vs %s: max |d| = %.3g\n", dir, scaling, (double)scale,
                (int)orig, want_dir, d);
        CHECKF(d < 1e-3, "rope override %s on %s: max |d| %g against %s", scaling, dir, d, want_dir);
        hm_session_close(s);
    }
    free(want);
    hm_model_close(m);
    fixture_close(&fx);
    fixture_close(&fw);
}

int main(void) {
    const bool plain = check_fixture("tests/fixtures/qwen3moe_tiny/");
    const bool yarn = check_fixture("tests/fixtures/qwen3moe_yarn/");
    check_override("tests/fixtures/qwen3moe_tiny/", "tests/fixtures/qwen3moe_yarn/", "yarn", 4.0f, 16);
    check_override("tests/fixtures/qwen3moe_yarn/", "tests/fixtures/qwen3moe_tiny/", "none", 0.0f, 0);
    return plain || yarn ? test_done() : 77;
}
