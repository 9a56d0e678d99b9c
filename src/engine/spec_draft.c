/* spec_draft.c - draft-simple: a second, smaller model with the target's vocabulary drafts greedily
 * in a session of its own (its own KV cache). The vocabulary check is llama.cpp's
 * (common_speculative_are_compatible): same tokenizer model, same BOS/EOS add-flags and ids,
 * vocabulary sizes at most 128 apart, and the same token text for every id from 5 up to the
 * smaller size. Invariant: toks[0..n_past) are the tokens the draft session holds; each draft
 * trims it back to its common prefix with the target's history, so a rejected draft costs the
 * draft model no re-evaluation of what it already saw. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"
#include "model/model.h"
#include "spec.h"

#define SPEC_VOCAB_MAX_DIFF 128 /* llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE */
#define SPEC_VOCAB_CHECK_FROM 5 /* llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID */
#define SPEC_DRAFT_TOP_K 10     /* llama.cpp's draft sampler: top-k 10, then the probabilities */

struct hm_spec_drafter {
    hm_model *model;  /* borrowed */
    hm_session *s;    /* owned */
    int32_t *toks;    /* [n_ctx] what s holds */
    int32_t n_ctx;
};

static bool kv_bool(const hm_gguf *g, const char *key) {
    bool b = false;
    return hm_gguf_get_bool(g, key, &b) && b;
}
static int64_t kv_int(const hm_gguf *g, const char *key) {
    int64_t v = -1;
    return hm_gguf_get_int(g, key, &v) ? v : -1;
}

static hm_status vocab_check(const hm_model *tgt, const hm_model *dft, hm_err *err) {
    const hm_gguf *gt = tgt->gguf, *gd = dft->gguf;
    hm_gguf_str mt = {0}, md = {0};
    hm_gguf_get_str(gt, "tokenizer.ggml.model", &mt);
    hm_gguf_get_str(gd, "tokenizer.ggml.model", &md);
    if (mt.len != md.len || (mt.len && memcmp(mt.ptr, md.ptr, mt.len)))
        return hm_errf(err, HM_ERR_ARG, "draft model: its tokenizer type '%.*s' is not the target's '%.*s' "
                       "(speculation needs the same vocabulary)", (int)md.len, md.ptr ? md.ptr : "",
                       (int)mt.len, mt.ptr ? mt.ptr : "");
    const char *keys[2][2] = {{"tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id"},
                              {"tokenizer.ggml.add_eos_token", "tokenizer.ggml.eos_token_id"}};
    for (int i = 0; i < 2; i++) {
        const bool at = kv_bool(gt, keys[i][0]), ad = kv_bool(gd, keys[i][0]);
        const int64_t it = kv_int(gt, keys[i][1]), id = kv_int(gd, keys[i][1]);
        if (at != ad || (at && it != id))
            return hm_errf(err, HM_ERR_ARG, "draft model: %s tokens differ from the target's (add %d vs %d, id %lld "
                           "vs %lld)", i ? "EOS" : "BOS", (int)ad, (int)at, (long long)id, (long long)it);
    }
    hm_gguf_arr tt, td;
    if (!hm_gguf_get_arr(gt, "tokenizer.ggml.tokens", &tt) || !hm_gguf_get_arr(gd, "tokenizer.ggml.tokens", &td))
        return hm_errf(err, HM_ERR_ARG, "draft model: the %s has no tokenizer.ggml.tokens to compare",
                       hm_gguf_get_arr(gt, "tokenizer.ggml.tokens", &tt) ? "draft" : "target");
    const uint64_t diff = tt.n > td.n ? tt.n - td.n : td.n - tt.n;
    if (diff > SPEC_VOCAB_MAX_DIFF)
        return hm_errf(err, HM_ERR_ARG, "draft model: vocabulary of %llu tokens, the target's %llu (more than %d "
                       "apart)", (unsigned long long)td.n, (unsigned long long)tt.n, SPEC_VOCAB_MAX_DIFF);
    const uint64_t n = tt.n < td.n ? tt.n : td.n;
    for (uint64_t i = SPEC_VOCAB_CHECK_FROM; i < n; i++) {
        hm_gguf_str a, b;
        if (!hm_gguf_arr_str(&tt, i, &a) || !hm_gguf_arr_str(&td, i, &b) || a.len != b.len ||
            memcmp(a.ptr, b.ptr, a.len))
            return hm_errf(err, HM_ERR_ARG, "draft model: token %llu differs from the target's ('%.*s' vs '%.*s')",
                           (unsigned long long)i, (int)(b.len > 40 ? 40 : b.len), b.ptr ? b.ptr : "",
                           (int)(a.len > 40 ? 40 : a.len), a.ptr ? a.ptr : "");
    }
    if (dft->info.n_vocab > tgt->info.n_vocab)
        return hm_errf(err, HM_ERR_ARG, "draft model: its output has %d rows, more than the target's %d (a drafted "
                       "id would be outside the target's vocabulary)", dft->info.n_vocab, tgt->info.n_vocab);
    return HM_OK;
}

hm_status hm_spec_drafter_open(hm_spec_drafter **out, hm_model *draft, const hm_session *target, hm_err *err) {
    *out = NULL;
    hm_model *tm = hm_session_model(target);
    if (draft == tm)
        return hm_errf(err, HM_ERR_ARG, "draft model: it is the target model object (open the file a second time: "
                       "the draft must not count in the target's expert store)");
    if (draft->xm && draft->xm->n_rs_layer > 0)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "draft model: %s has a recurrent state, which cannot be rewound "
                       "past a rejected draft", draft->arch->name);
    hm_status st = vocab_check(tm, draft, err);
    if (st != HM_OK) return st;
    hm_spec_drafter *d = calloc(1, sizeof *d);
    if (!d) return hm_errf(err, HM_ERR_NOMEM, "draft model: out of memory");
    d->model = draft;
    d->n_ctx = hm_session_n_ctx(target);
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = d->n_ctx;
    so.n_threads = hm_session_n_threads(target);
    so.n_ubatch = hm_session_n_ubatch(target);
    if ((st = hm_session_open(&d->s, draft, &so, err)) != HM_OK) goto fail;
    hm_session_borrow_pool(d->s, target);
    if (!(d->toks = malloc((size_t)d->n_ctx * sizeof *d->toks))) {
        st = hm_errf(err, HM_ERR_NOMEM, "draft model: out of memory");
        goto fail;
    }
    *out = d;
    return HM_OK;
fail:
    hm_spec_drafter_close(d);
    return st;
}

void hm_spec_drafter_close(hm_spec_drafter *d) {
    if (!d) return;
    hm_session_close(d->s);
    free(d->toks);
    free(d);
}

int32_t hm_spec_top_token(const float *lg, int32_t n, float *p) {
    float top[SPEC_DRAFT_TOP_K];
    int32_t best = 0, nt = 0;
    for (int32_t i = 0; i < n; i++) {
        const float v = lg[i];
        if (v > lg[best]) best = i;
        if (nt < SPEC_DRAFT_TOP_K) {
            int32_t j = nt++;
            while (j > 0 && top[j - 1] < v) top[j] = top[j - 1], j--;
            top[j] = v;
        } else if (v > top[nt - 1]) {
            int32_t j = nt - 1;
            while (j > 0 && top[j - 1] < v) top[j] = top[j - 1], j--;
            top[j] = v;
        }
    }
    double s = 0;
    for (int32_t i = 0; i < nt; i++) s += exp((double)(top[i] - top[0]));
    *p = (float)(1.0 / s);
    return best;
}

hm_status hm_spec_drafter_draft(hm_spec_drafter *d, const int32_t *hist, int32_t n, int32_t tok, int32_t n_max,
                                int32_t n_min, float p_min, int32_t *draft, int32_t cap, int32_t *n_draft,
                                hm_err *err) {
    *n_draft = 0;
    if (n_max > cap) n_max = cap;
    if (n_max <= 0 || n + 1 + n_max > d->n_ctx) return HM_OK;
    /* common prefix of what the draft holds and hist + tok; keep at least tok to evaluate */
    const int32_t held = hm_session_n_past(d->s);
    int32_t c = 0;
    while (c < held && c < n && d->toks[c] == hist[c]) c++;
    /* c <= n: tok is evaluated again even when held, to give the first draft's logits */
    hm_status st = hm_session_trim(d->s, c, err);
    if (st != HM_OK) return st;
    const float *lg = NULL;
    if (c < n) memcpy(d->toks + c, hist + c, (size_t)(n - c) * sizeof *hist);
    d->toks[n] = tok; /* what it lacks of hist, and tok, in one eval */
    if ((st = hm_session_eval(d->s, d->toks + c, n + 1 - c, false, &lg, err)) != HM_OK) goto fail;
    const int32_t nv = hm_session_model(d->s)->info.n_vocab;
    int32_t k = 0;
    while (k < n_max) {
        float p;
        const int32_t t = hm_spec_top_token(lg, nv, &p);
        if (p < p_min) break;
        draft[k++] = t;
        if (k == n_max) break;
        d->toks[n + k] = t;
        if ((st = hm_session_eval(d->s, &t, 1, false, &lg, err)) != HM_OK) goto fail;
    }
    *n_draft = k < n_min ? 0 : k;
    return HM_OK;
fail:
    /* the session may hold fewer tokens than toks says: forget it all, the next draft re-evaluates */
    hm_session_reset(d->s);
    return st;
}
