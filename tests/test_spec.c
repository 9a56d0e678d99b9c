/* test_spec.c - speculative decoding (hm_spec) against decoding without it, the independent
 * reference: the same model, prompt and sampler produce token ids through plain one-token decode
 * steps and through hm_spec_step (drafts verified in one micro-batch, rejected rows trimmed off
 * the KV cache); the ids must be identical.
 *
 * Cases: the bundled trained model (models/tiny-qwen3moe-q8_0.gguf) on a prompt that repeats a
 * Python function, with ngram-simple (llama.cpp's defaults and a short n-gram), ngram-cache, draft-simple with
 * the same model as its draft (acceptance near 100 %) and with a different model of the same
 * vocabulary (the bundled file with its expert down projections negated: low acceptance, so most
 * steps roll back), greedy; sampled at temperature 0.8 on the F32 transformers fixture (see
 * sampled_f32 for why not on a quantised model);
 * a gemma4 synth (sliding window 16, micro-batches of 8: the ring cache is rolled back across the
 * window) with ngram-simple and draft-simple; the synth tiny qwen35moe with its MTP block (a
 * recurrent state saved before each verify and restored after a rejection) with draft-mtp, ngram-simple
 * and ngram-cache, one pass and micro-batches of 5, and the draft length's adaptation to the
 * acceptance (0 % for the random MTP head: 3, then 1 a step); draft-mtp on a model without an MTP
 * layer and after the prompt is refused naming why, as is a draft of another vocabulary (HM_ERR_ARG).
 * The MTP head's draft logits against llama.cpp's: test_spec_mtp_ref.c.
 * Every run checks the stats: accepted <= drafted, tokens = accepted + steps, tokens = the ids the
 * steps returned; the repetitive cases must accept some drafts (else nothing was tested). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/spec.h"
#include "gguf/gguf.h"
#include "hotmoe_tools.h"
#include "quant/quant.h"
#include "test.h"
#include "tiny_qwen35moe.h"

#define NGEN 120

typedef struct gen_cfg {
    int32_t n_ubatch;
    float temp; /* 0: greedy */
    uint64_t seed;
    hm_kv_type kv;
} gen_cfg;

static hm_session *open_session(hm_model *m, const gen_cfg *g) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = 512;
    so.n_threads = 2;
    so.n_ubatch = g->n_ubatch;
    so.kv_type = g->kv;
    hm_session *s = NULL;
    hm_err err;
    hm_status st = hm_session_open(&s, m, &so, &err);
    CHECKF(st == HM_OK, "session: %s", err.msg);
    return s;
}

static hm_sampler *open_sampler(const hm_model *m, const gen_cfg *g) {
    hm_sampler_opts o;
    hm_sampler_opts_default(&o);
    o.temp = g->temp;
    o.seed = g->seed;
    hm_sampler *smp = NULL;
    hm_err err;
    if (hm_sampler_open(&smp, hm_model_n_vocab(m), &o, &err) != HM_OK) return NULL;
    return smp;
}

/* Plain decoding: the prompt, then n tokens one eval each. ids[0..n). Returns the count. */
static int gen_plain(hm_model *m, const int32_t *prompt, int32_t np, int32_t n, const gen_cfg *g, int32_t *ids) {
    hm_session *s = open_session(m, g);
    hm_sampler *smp = open_sampler(m, g);
    hm_err err;
    const float *lg;
    int got = 0;
    if (!s || !smp || hm_session_eval(s, prompt, np, false, &lg, &err) != HM_OK) goto done;
    for (int32_t i = 0; i < np; i++) hm_sampler_accept(smp, prompt[i]);
    for (; got < n; got++) {
        ids[got] = hm_sampler_sample(smp, lg);
        hm_sampler_accept(smp, ids[got]);
        if (hm_session_eval(s, &ids[got], 1, false, &lg, &err) != HM_OK) {
            CHECKF(0, "eval: %s", err.msg);
            break;
        }
    }
done:
    hm_sampler_close(smp);
    hm_session_close(s);
    return got;
}

/* The same with speculation: the first token from the prompt's logits, then hm_spec_step. */
static int gen_spec(hm_model *m, const int32_t *prompt, int32_t np, int32_t n, const gen_cfg *g,
                    const hm_spec_opts *so, int32_t *ids, hm_spec_stats *stats) {
    hm_session *s = open_session(m, g);
    hm_sampler *smp = open_sampler(m, g);
    hm_spec *sp = NULL;
    hm_err err;
    const float *lg;
    int got = 0;
    memset(stats, 0, sizeof *stats);
    if (!s || !smp) goto done;
    hm_status st = hm_spec_open(&sp, s, so, &err);
    CHECKF(st == HM_OK, "spec open: %s", err.msg);
    if (st != HM_OK || hm_session_eval(s, prompt, np, false, &lg, &err) != HM_OK ||
        hm_spec_add(sp, prompt, np, &err) != HM_OK)
        goto done;
    for (int32_t i = 0; i < np; i++) hm_sampler_accept(smp, prompt[i]);
    ids[got] = hm_sampler_sample(smp, lg);
    hm_sampler_accept(smp, ids[got++]);
    int32_t from_steps = 0;
    while (got < n) {
        int32_t k = 0;
        if ((st = hm_spec_step(sp, smp, ids[got - 1], n - got, ids + got, &k, &err)) != HM_OK) {
            CHECKF(0, "spec step: %s", err.msg);
            break;
        }
        CHECK(k >= 1 && k <= n - got);
        /* the target holds the prompt, and every id but the pending last one */
        CHECK(hm_session_n_past(s) == np + got + k - 1);
        got += k;
        from_steps += k;
    }
    hm_spec_get_stats(sp, stats);
    CHECK(stats->accepted <= stats->drafted);
    CHECK(stats->tokens == stats->accepted + stats->steps);
    CHECK(stats->tokens == (uint64_t)from_steps);
    CHECK(stats->steps_drafted <= stats->steps);
done:
    hm_spec_close(sp);
    hm_sampler_close(smp);
    hm_session_close(s);
    return got;
}

/* One comparison; returns the acceptance rate (-1 on failure). */
static double compare(const char *what, hm_model *m, const int32_t *prompt, int32_t np, const gen_cfg *g,
                      const hm_spec_opts *so) {
    int32_t a[NGEN], b[NGEN];
    hm_spec_stats st;
    const int na = gen_plain(m, prompt, np, NGEN, g, a);
    const int nb = gen_spec(m, prompt, np, NGEN, g, so, b, &st);
    CHECKF(na == NGEN && nb == NGEN, "%s: %d and %d tokens", what, na, nb);
    int first = -1;
    for (int i = 0; i < na && i < nb && first < 0; i++)
        if (a[i] != b[i]) first = i;
    CHECKF(first < 0, "%s: ids differ from plain decoding at %d (%d vs %d)", what, first, first >= 0 ? a[first] : 0,
           first >= 0 ? b[first] : 0);
    const double rate = st.drafted ? (double)st.accepted / (double)st.drafted : 0.0;
    fprintf(stderr, "%-44s drafted %4llu accepted %4llu (%5.1f %%) steps %3llu (%3llu drafted) tokens %llu%s\n",
            what, (unsigned long long)st.drafted, (unsigned long long)st.accepted, 100.0 * rate,
            (unsigned long long)st.steps, (unsigned long long)st.steps_drafted, (unsigned long long)st.tokens,
            first < 0 ? "  ids identical" : "  IDS DIFFER");
    return first < 0 ? rate : -1;
}

/* A copy of src with every ffn_down_exps Q8_0 block's quants negated: a different model with the
 * same vocabulary. 0 ok. */
static int write_negated(const char *src, const char *dst) {
    hm_gguf *g = NULL;
    hm_err err;
    if (hm_gguf_open(&g, src, &err) != HM_OK) return 1;
    const uint64_t size = hm_gguf_file_size(g);
    unsigned char *buf = malloc(size);
    FILE *f = fopen(src, "rb");
    int rc = 1;
    if (!buf || !f || fread(buf, 1, size, f) != size) goto done;
    int changed = 0;
    for (int64_t i = 0; i < hm_gguf_n_tensors(g); i++) {
        const hm_gguf_tensor *t = hm_gguf_tensor_at(g, i);
        if (!strstr(t->name, "ffn_down_exps") || t->type != HM_TYPE_Q8_0) continue;
        for (size_t b = 0; b + 34 <= t->nbytes; b += 34)
            for (int j = 0; j < 32; j++) {
                int8_t *q = (int8_t *)(buf + t->file_offset + b + 2 + j);
                if (*q != -128) *q = (int8_t)-*q;
            }
        changed++;
    }
    FILE *o = fopen(dst, "wb");
    if (changed && o && fwrite(buf, 1, size, o) == size) rc = 0;
    if (o) fclose(o);
done:
    if (f) fclose(f);
    free(buf);
    hm_gguf_close(g);
    return rc;
}

static void bundled(void) {
    const char *path = test_src_path("models/tiny-qwen3moe-q8_0.gguf");
    hm_err err;
    hm_model *m = NULL, *d = NULL, *dneg = NULL;
    hm_tokenizer *tk = NULL;
    CHECKF(hm_model_open(&m, path, NULL, &err) == HM_OK, "%s", err.msg);
    CHECKF(hm_model_open(&d, path, NULL, &err) == HM_OK, "%s", err.msg);
    CHECKF(hm_tokenizer_open(&tk, path, &err) == HM_OK, "%s", err.msg);
    if (!m || !d || !tk) goto done;
    const char *text = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n\n"
                       "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n\n"
                       "def add(a, b):\n    return a + b\n\n";
    int32_t *prompt = NULL;
    size_t np = 0;
    if (hm_tokenize(tk, text, strlen(text), NULL, &prompt, &np, &err) != HM_OK) goto done;
    gen_cfg greedy = {.n_ubatch = 512};
    hm_spec_opts so;
    hm_spec_opts_default(&so);
    so.type = HM_SPEC_NGRAM_SIMPLE;
    double r = compare("bundled, ngram-simple (12, 48), greedy", m, prompt, (int32_t)np, &greedy, &so);
    CHECKF(r > 0, "ngram-simple accepted nothing on a repetitive prompt");
    so.size_n = 3;
    so.size_m = 8;
    r = compare("bundled, ngram-simple (3, 8), greedy", m, prompt, (int32_t)np, &greedy, &so);
    CHECKF(r > 0, "ngram-simple accepted nothing on a repetitive prompt");
    so.type = HM_SPEC_NGRAM_CACHE;
    r = compare("bundled, ngram-cache, greedy", m, prompt, (int32_t)np, &greedy, &so);
    CHECKF(r > 0, "ngram-cache accepted nothing on a repetitive prompt");

    hm_spec_opts_default(&so);
    so.type = HM_SPEC_DRAFT_SIMPLE;
    so.draft = d;
    so.n_max = 4;
    r = compare("bundled, draft-simple (itself), greedy", m, prompt, (int32_t)np, &greedy, &so);
    CHECKF(r > 0.9, "a draft that is the target itself: acceptance %.3f", r);
    so.p_min = 0.5f;
    so.n_min = 2;
    compare("bundled, draft-simple (itself), p_min .5", m, prompt, (int32_t)np, &greedy, &so);

    /* the same model object as its own draft is refused (its routing would count in the store) */
    so.draft = m;
    hm_session *s = open_session(m, &greedy);
    hm_spec *sp = NULL;
    CHECK(s && hm_spec_open(&sp, s, &so, &err) == HM_ERR_ARG && !sp);
    hm_session_close(s);

    char neg[] = "/tmp/hm_test_spec_neg_XXXXXX";
    int fd = mkstemp(neg);
    if (fd >= 0) close(fd);
    CHECK(fd >= 0 && write_negated(path, neg) == 0);
    CHECKF(hm_model_open(&dneg, neg, NULL, &err) == HM_OK, "%s", err.msg);
    if (dneg) {
        hm_spec_opts_default(&so);
        so.type = HM_SPEC_DRAFT_SIMPLE;
        so.draft = dneg;
        so.n_max = 4;
        r = compare("bundled, draft-simple (other model), greedy", m, prompt, (int32_t)np, &greedy, &so);
        CHECKF(r >= 0 && r < 0.9, "another model as the draft: acceptance %.3f (expected low)", r);
    }
    unlink(neg);
    free(prompt);
done:
    hm_model_close(dneg);
    hm_model_close(d);
    hm_model_close(m);
    hm_tokenizer_close(tk);
}

/* Sampling at temperature 0.8 against plain decoding: on the F32 transformers fixture, where a
 * batched row's logits are bit-identical to a one-row step's (docs/ENGINE.md, batched eval). With
 * quantised weights they are not: the activations are rounded to the weights' Q8_0/Q8_K partner, and
 * a rounding difference of 1e-7 between a batched and a one-row evaluation can flip one activation's
 * rounding and move the logits by up to ~0.1 on the bundled model, enough to move a sampled draw
 * (greedy ids, compared above, are moved only by near-ties). */
static void sampled_f32(void) {
    const char *path = test_src_path("tests/fixtures/qwen3moe_tiny/model.gguf");
    hm_err err;
    hm_model *m = NULL, *d = NULL;
    CHECKF(hm_model_open(&m, path, NULL, &err) == HM_OK, "%s", err.msg);
    CHECKF(hm_model_open(&d, path, NULL, &err) == HM_OK, "%s", err.msg);
    if (m && d) {
        int32_t prompt[48];
        for (int i = 0; i < 48; i++) prompt[i] = 20 + (i * 5) % 16; /* a 16-token phrase, 3 times */
        gen_cfg g = {.n_ubatch = 512, .temp = 0.8f, .seed = 11};
        hm_spec_opts so;
        hm_spec_opts_default(&so);
        so.type = HM_SPEC_NGRAM_SIMPLE;
        so.size_n = 1;
        so.size_m = 4;
        compare("f32 fixture, ngram-simple (1, 4), temp 0.8", m, prompt, 48, &g, &so);
        so.type = HM_SPEC_NGRAM_CACHE;
        compare("f32 fixture, ngram-cache, temp 0.8", m, prompt, 48, &g, &so);
        hm_spec_opts_default(&so);
        so.type = HM_SPEC_DRAFT_SIMPLE;
        so.draft = d;
        so.n_max = 4;
        double r = compare("f32 fixture, draft-simple (itself), temp 0.8", m, prompt, 48, &g, &so);
        CHECKF(r > 0, "sampled, a draft that is the target: nothing accepted (only first rows were used)");
        g.temp = 0;
        compare("f32 fixture, draft-simple (itself), greedy", m, prompt, 48, &g, &so);
    }
    hm_model_close(d);
    hm_model_close(m);
}

static void gemma4(void) {
    char path[] = "/tmp/hm_test_spec_g4_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    hm_synth_opts o = {.arch = "gemma4", .preset = "gemma4-tiny", .type = "q8_0", .seed = 3, .out_path = path,
                       .n_threads = 2};
    hm_err err = {{0}};
    hm_status st = hm_synth(&o, &err);
    CHECKF(st == HM_OK, "synth gemma4: %s", err.msg);
    hm_model *m = NULL, *d = NULL;
    if (st == HM_OK) {
        CHECKF(hm_model_open(&m, path, NULL, &err) == HM_OK, "%s", err.msg);
        CHECKF(hm_model_open(&d, path, NULL, &err) == HM_OK, "%s", err.msg);
    }
    if (m && d) {
        int32_t prompt[60];
        for (int i = 0; i < 60; i++) prompt[i] = 300 + (i * 7) % 20; /* a 20-token phrase, 3 times */
        gen_cfg g = {.n_ubatch = 8};
        hm_spec_opts so;
        hm_spec_opts_default(&so);
        so.type = HM_SPEC_NGRAM_SIMPLE;
        so.size_n = 1; /* a random model seldom repeats longer n-grams: drafts that mostly fail */
        so.size_m = 4;
        double r0 = compare("gemma4 synth, ngram-simple (1, 4), ubatch 8", m, prompt, 60, &g, &so);
        CHECKF(r0 >= 0, "gemma4 ngram-simple");
        so.type = HM_SPEC_NGRAM_CACHE;
        r0 = compare("gemma4 synth, ngram-cache, ubatch 8", m, prompt, 60, &g, &so);
        CHECKF(r0 >= 0, "gemma4 ngram-cache");
        hm_spec_opts_default(&so);
        so.type = HM_SPEC_DRAFT_SIMPLE;
        so.draft = d;
        so.n_max = 5;
        double r = compare("gemma4 synth, draft-simple (itself), ubatch 8", m, prompt, 60, &g, &so);
        CHECKF(r > 0.9, "gemma4: a draft that is the target itself: acceptance %.3f", r);
    }
    hm_model_close(d);
    hm_model_close(m);
    unlink(path);
}

/* qwen35moe with its MTP block (synth --nextn 1): greedy ids identical to plain decoding with every
 * drafter that runs on it; the random head accepts nothing, so each step restores the recurrent state
 * and replays the kept row, and the length falls to 1 after the first rejection. */
static void qwen35moe(void) {
    char path[] = "/tmp/hm_test_spec_q35mtp_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    hm_synth_opts o = {.arch = "qwen35moe", .preset = "tiny", .type = "q8_0", .seed = 1, .out_path = path,
                       .n_threads = 2, .n_nextn = 1};
    hm_err err = {{0}};
    hm_status st = hm_synth(&o, &err);
    CHECKF(st == HM_OK, "synth qwen35moe --nextn 1: %s", err.msg);
    hm_model *m = NULL;
    if (st == HM_OK) CHECKF(hm_model_open(&m, path, NULL, &err) == HM_OK, "%s", err.msg);
    if (m) {
        int32_t prompt[48];
        for (int i = 0; i < 48; i++) prompt[i] = 200 + (i * 5) % 16; /* a 16-token phrase, 3 times */
        const int32_t ubs[2] = {64, 5};
        for (int u = 0; u < 2; u++) {
            gen_cfg g = {.n_ubatch = ubs[u]};
            char what[96];
            hm_spec_opts so;
            hm_spec_opts_default(&so);
            so.type = HM_SPEC_DRAFT_MTP;
            int32_t a[NGEN], b[NGEN];
            hm_spec_stats ss;
            const int na = gen_plain(m, prompt, 48, 40, &g, a);
            const int nb = gen_spec(m, prompt, 48, 40, &g, &so, b, &ss);
            snprintf(what, sizeof what, "qwen35moe synth, draft-mtp, ubatch %d", ubs[u]);
            CHECKF(na == 40 && nb == 40 && !memcmp(a, b, sizeof a[0] * 40), "%s: ids differ", what);
            fprintf(stderr, "%s: %llu drafted, %llu accepted, %llu steps (%llu with a draft)\n", what,
                    (unsigned long long)ss.drafted, (unsigned long long)ss.accepted, (unsigned long long)ss.steps,
                    (unsigned long long)ss.steps_drafted);
            /* adaptive length: n_max 3 at first; every draft rejected, so one past the kept (1) after */
            CHECKF(ss.steps_drafted > 10 && ss.drafted == ss.steps_drafted + 2 * (ss.accepted == 0),
                   "%s: %llu drafted in %llu steps", what, (unsigned long long)ss.drafted,
                   (unsigned long long)ss.steps_drafted);
            so.type = HM_SPEC_NGRAM_SIMPLE;
            so.size_n = 1;
            so.size_m = 4;
            snprintf(what, sizeof what, "qwen35moe synth, ngram-simple (1, 4), ubatch %d", ubs[u]);
            double r = compare(what, m, prompt, 48, &g, &so);
            CHECKF(r > 0 && r < 1, "%s: acceptance %.3f (a rollback must have happened after some kept drafts)", what,
                   r);
            so.type = HM_SPEC_NGRAM_CACHE;
            snprintf(what, sizeof what, "qwen35moe synth, ngram-cache, ubatch %d", ubs[u]);
            CHECKF(compare(what, m, prompt, 48, &g, &so) >= 0, "%s", what);
        }
        /* draft-mtp after the target has evaluated: refused (the head must see every row) */
        gen_cfg g = {.n_ubatch = 64};
        hm_session *s = open_session(m, &g);
        const float *lg;
        hm_spec *sp = NULL;
        hm_spec_opts so;
        hm_spec_opts_default(&so);
        so.type = HM_SPEC_DRAFT_MTP;
        if (s && hm_session_eval(s, prompt, 4, false, &lg, &err) == HM_OK) {
            st = hm_spec_open(&sp, s, &so, &err);
            CHECKF(st == HM_ERR_ARG && !sp && strstr(err.msg, "before the target"), "late draft-mtp: %d %s", (int)st,
                   err.msg);
        }
        hm_session_close(s);
    }
    hm_model_close(m);
    m = NULL;
    /* qwen3next's MTP block: the same head over Qwen3-Next's layout */
    o.arch = "qwen3next";
    st = hm_synth(&o, &err);
    CHECKF(st == HM_OK, "synth qwen3next --nextn 1: %s", err.msg);
    if (st == HM_OK) CHECKF(hm_model_open(&m, path, NULL, &err) == HM_OK, "%s", err.msg);
    if (m) {
        int32_t prompt[48], a[NGEN], b[NGEN];
        for (int i = 0; i < 48; i++) prompt[i] = 200 + (i * 5) % 16;
        gen_cfg g = {.n_ubatch = 16};
        hm_spec_opts so;
        hm_spec_opts_default(&so);
        so.type = HM_SPEC_DRAFT_MTP;
        hm_spec_stats ss;
        const int na = gen_plain(m, prompt, 48, 40, &g, a), nb = gen_spec(m, prompt, 48, 40, &g, &so, b, &ss);
        CHECKF(na == 40 && nb == 40 && !memcmp(a, b, sizeof a[0] * 40), "qwen3next synth, draft-mtp: ids differ");
        CHECK(ss.steps_drafted > 10);
    }
    hm_model_close(m);
    unlink(path);
}

/* draft-mtp on models without an MTP layer and a draft of another vocabulary: refused naming why. */
static void refusals(void) {
    char q35[] = "/tmp/hm_test_spec_q35_XXXXXX", syn[] = "/tmp/hm_test_spec_syn_XXXXXX";
    int fd = mkstemp(q35);
    if (fd >= 0) close(fd);
    fd = mkstemp(syn);
    if (fd >= 0) close(fd);
    hm_err err = {{0}};
    CHECKF(tq35_write(q35, 4, HM_TYPE_F32, "tiny qwen35moe", &err) == HM_OK, "%s", err.msg);
    hm_model *m = NULL, *t = NULL, *ds = NULL;
    gen_cfg g = {.n_ubatch = 64};
    hm_spec_opts so;
    hm_spec_opts_default(&so);
    so.type = HM_SPEC_DRAFT_MTP;
    if (hm_model_open(&m, q35, NULL, &err) == HM_OK) {
        hm_session *s = open_session(m, &g);
        hm_spec *sp = NULL;
        hm_status st = hm_spec_open(&sp, s, &so, &err);
        CHECKF(st == HM_ERR_UNSUPPORTED && !sp && strstr(err.msg, "no multi-token-prediction layer") &&
                   strstr(err.msg, "nextn_predict_layers"),
               "qwen35moe without MTP: %d %s", (int)st, err.msg);
        fprintf(stderr, "refused as it should be: %s\n", err.msg);
        hm_session_close(s);
    } else {
        CHECKF(0, "qwen35moe: %s", err.msg);
    }
    hm_synth_opts o = {.arch = "qwen3moe", .preset = "tiny", .type = "q8_0", .seed = 5, .out_path = syn, .n_threads = 2};
    CHECKF(hm_synth(&o, &err) == HM_OK, "synth: %s", err.msg);
    if (hm_model_open(&t, test_src_path("models/tiny-qwen3moe-q8_0.gguf"), NULL, &err) == HM_OK &&
        hm_model_open(&ds, syn, NULL, &err) == HM_OK) {
        hm_session *s = open_session(t, &g);
        hm_spec *sp = NULL;
        so.type = HM_SPEC_DRAFT_MTP; /* qwen3moe: no MTP layer */
        hm_status st0 = hm_spec_open(&sp, s, &so, &err);
        CHECKF(st0 == HM_ERR_UNSUPPORTED && !sp && strstr(err.msg, "qwen3moe"), "qwen3moe draft-mtp: %d %s", (int)st0,
               err.msg);
        so.type = HM_SPEC_DRAFT_SIMPLE;
        so.draft = ds;
        hm_status st = hm_spec_open(&sp, s, &so, &err);
        CHECKF(st == HM_ERR_ARG && !sp && strstr(err.msg, "draft model"), "vocab: %d %s", (int)st, err.msg);
        fprintf(stderr, "refused as it should be: %s\n", err.msg);
        so.draft = NULL;
        CHECK(hm_spec_open(&sp, s, &so, &err) == HM_ERR_ARG && !sp);
        so.type = HM_SPEC_NGRAM_SIMPLE;
        so.size_n = 0;
        CHECK(hm_spec_open(&sp, s, &so, &err) == HM_ERR_ARG && !sp);
        hm_session_close(s);
    }
    hm_model_close(ds);
    hm_model_close(t);
    hm_model_close(m);
    unlink(q35);
    unlink(syn);
}

/* The drafters on a sequence derived by hand (the rules in spec.h). */
static void drafters(void) {
    const int32_t h[11] = {5, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2};
    int32_t d[16];
    /* ngram-simple n 2, m 3: pattern [2, 3] (hist[10] + tok); latest earlier start 6; hist[8..11) */
    int32_t k = hm_spec_ngram_simple(h, 11, 3, 2, 3, d, 16);
    CHECK(k == 3 && d[0] == 4 && d[1] == 1 && d[2] == 2);
    CHECK(hm_spec_ngram_simple(h, 11, 3, 2, 3, d, 2) == 2);  /* capped */
    CHECK(hm_spec_ngram_simple(h, 11, 9, 2, 3, d, 16) == 0); /* [2, 9] never seen */
    CHECK(hm_spec_ngram_simple(h, 6, 2, 2, 3, d, 16) == 0);  /* n <= n + m + 1 */
    /* ngram-cache: 4-grams decide here: [4 1 2 3] -> 4 (once), [1 2 3 4] -> 1 (twice), ... */
    hm_spec_ngcache *c = NULL;
    hm_err err;
    CHECK(hm_spec_ngcache_open(&c, 64, &err) == HM_OK);
    if (!c) return;
    k = hm_spec_ngcache_draft(c, h, 11, 3, d, 16);
    const int32_t want[8] = {4, 1, 2, 3, 4, 1, 2, 3};
    CHECKF(k == 8 && !memcmp(d, want, sizeof want), "ngram-cache drafted %d", k);
    CHECK(hm_spec_ngcache_len(c) == 12);
    k = hm_spec_ngcache_draft(c, h, 11, 9, d, 16); /* another pending token: rebuilt, nothing follows 9 */
    CHECK(k == 0 && hm_spec_ngcache_len(c) == 12);
    /* one sample of a 1-gram is below its threshold (2): [5] alone drafts nothing */
    const int32_t one[3] = {7, 5, 6};
    CHECK(hm_spec_ngcache_draft(c, one, 2, 7, d, 16) == 0);
    hm_spec_ngcache_close(c);
}

int main(void) {
    drafters();
    bundled();
    sampled_f32();
    gemma4();
    qwen35moe();
    refusals();
    return test_done();
}
