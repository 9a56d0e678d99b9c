/* test_ppmodel.c - the prompt-processing model (hotmoe.h's hm_pp_*, issue 25) on synth models.
 *
 * For each arch (synth qwen3moe tiny and deepseek4 tiny, its compressed KV state: main model q8_0,
 * the copy q4_0 from the same seed; qwen35moe, a recurrent state: tests/tiny_qwen35moe.h, main f32,
 * the copy q8_0):
 *  - the copy equal to the main model (the same file opened twice): prefill through the copy, then
 *    decode steps through the main model give logits byte-identical to the main model alone;
 *  - hand-over format: a session prefilled AND continued through the q4_0 copy (hm_session_eval_pp
 *    only) gives logits byte-identical to a plain session of the q4_0 model, so the copy wrote the
 *    main session's state exactly as its own session would have (the independent reference is the
 *    q4_0 model's own session);
 *  - decode after a q4_0 hand-over: deterministic (two sessions agree byte for byte, the second
 *    with a copy opened with share_dense: its dense tensors equal to the main model's bound to the
 *    main model's mapping), and not the main model's own logits (the comparison can fail);
 *  - warm hand-over: the main model's store counts, per unit, exactly the routing the copy's store
 *    counted for the prompt (counts, not ids);
 *  - hm_session_prefill: below min_tokens the main model alone (stats say so), at or above the
 *    copy, with refresh R the last R tokens by the main model (= eval_pp of the head + main eval of
 *    the tail, byte for byte);
 *  - the copy hand-over (hm_pp_opts.copy_state: the copy's own session, its new positions copied
 *    into the main session's state, as with a GPU placement) equals the shared state byte for byte,
 *    through chunks with a main-model eval between them;
 *  - the SSD tier (--ram-budget): the warm hand-over reads the prompt's most routed units into RAM,
 *    so decode misses fewer, with byte-identical logits;
 *  - refusals: another seed (same shapes: the norms differ), another depth, the model object itself.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hotmoe_tools.h"
#include "test.h"
#include "tiny_qwen35moe.h"

#define NP 40 /* prompt tokens */
#define ND 6  /* decode steps checked */

/* 0 written, -1 failed (a failed check), -2 not available (qwen35moe has no seeds). */
static int synth(const char *arch, const char *type, int seed, int layers, char *path, size_t cap) {
    snprintf(path, cap, "/tmp/hm_test_pp_%s_%s_%d_%d.%d.gguf", arch, type, seed, layers, (int)getpid());
    if (!strcmp(arch, "qwen35moe")) { /* values drawn from the tensor names: one "seed" */
        if (seed != 3) return -2;
        hm_err err = {{0}};
        hm_status st = tq35_write(path, layers ? layers : 4, strcmp(type, "f32") ? HM_TYPE_Q8_0 : HM_TYPE_F32,
                                  "tiny qwen35moe (test_ppmodel)", &err);
        CHECKF(st == HM_OK, "write the tiny qwen35moe: %s", err.msg);
        return st == HM_OK ? 0 : -1;
    }
    hm_synth_opts o = {.arch = arch, .preset = "tiny", .type = type, .seed = (uint64_t)seed, .n_layer = layers,
                       .out_path = path, .n_threads = 2};
    hm_err err = {{0}};
    hm_status st = hm_synth(&o, &err);
    CHECKF(st == HM_OK, "synth %s %s: %s", arch, type, err.msg);
    return st == HM_OK ? 0 : -1;
}

static hm_model *open_model(const char *path) {
    hm_model *m = NULL;
    hm_err err = {{0}};
    CHECKF(hm_model_open(&m, path, NULL, &err) == HM_OK, "open %s: %s", path, err.msg);
    return m;
}

static hm_session *open_session(hm_model *m) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = 128;
    so.n_threads = 2;
    so.n_ubatch = 16; /* the prompt takes several steps: each one handed over */
    hm_session *s = NULL;
    hm_err err = {{0}};
    CHECKF(hm_session_open(&s, m, &so, &err) == HM_OK, "session: %s", err.msg);
    return s;
}

static hm_status attach(hm_session *s, hm_model *pp, int32_t min_tokens, int32_t refresh) {
    hm_pp_opts o;
    hm_pp_opts_default(&o);
    o.model = pp;
    o.min_tokens = min_tokens;
    o.refresh = refresh;
    hm_err err = {{0}};
    hm_status st = hm_session_set_pp(s, &o, &err);
    if (st != HM_OK) fprintf(stderr, "set_pp: %s\n", err.msg);
    return st;
}

/* Decode dec[0..ND) one at a time on s; the logits of each step to out[ND][V]. */
static void decode(hm_session *s, const int32_t *dec, float *out, int32_t V) {
    hm_err err = {{0}};
    for (int i = 0; i < ND; i++) {
        const float *lg = NULL;
        hm_status st = hm_session_eval(s, &dec[i], 1, false, &lg, &err);
        CHECKF(st == HM_OK, "decode: %s", err.msg);
        if (st != HM_OK) return;
        memcpy(out + (size_t)i * (size_t)V, lg, (size_t)V * sizeof(float));
    }
}

static void arch_case(const char *arch, const char *t_main, const char *t_pp) {
    fprintf(stderr, "--- %s: main %s, copy %s\n", arch, t_main, t_pp);
    char p8[256], p4[256], ps[256], pl[256];
    if (synth(arch, t_main, 3, 0, p8, sizeof p8) || synth(arch, t_pp, 3, 0, p4, sizeof p4)) return;
    hm_model *m = open_model(p8), *same = open_model(p8), *q4 = open_model(p4), *q4b = open_model(p4);
    if (!m || !same || !q4 || !q4b) goto out;
    const int32_t V = hm_model_n_vocab(m);
    int32_t tok[NP], dec[ND];
    for (int i = 0; i < NP; i++) tok[i] = 2 + (i * 37 + 11) % (V - 4);
    for (int i = 0; i < ND; i++) dec[i] = 3 + (i * 53 + 7) % (V - 4);
    const size_t nb = (size_t)ND * (size_t)V * sizeof(float);
    float *la = malloc(nb), *lb = malloc(nb), *lc = malloc(nb), *lq = malloc(nb);
    const float *lg = NULL;
    hm_err err = {{0}};
    CHECK(la && lb && lc && lq);
    if (!la || !lb || !lc || !lq) goto free_bufs;

    /* the main model alone */
    hm_session *a = open_session(m);
    if (a) {
        CHECK(hm_session_eval(a, tok, NP, false, &lg, &err) == HM_OK);
        decode(a, dec, la, V);
    }
    /* the copy equal to the main model: byte-identical */
    hm_session *b = open_session(m);
    if (b && attach(b, same, 1, 0) == HM_OK) {
        CHECK(hm_session_prefill(b, tok, NP, &lg, &err) == HM_OK);
        hm_pp_stats st;
        hm_session_pp_stats(b, &st);
        CHECK(st.last_pp && st.prefills_pp == 1 && st.tokens_pp == NP && st.tokens_refresh == 0);
        decode(b, dec, lb, V);
        CHECKF(!memcmp(la, lb, nb), "%s: the copy equal to the main model changed the logits", arch);
    } else {
        CHECK(0);
    }
    hm_session_close(b);

    /* the q4_0 copy's writes are its own session's, byte for byte: eval_pp for everything vs q4 alone */
    hm_session *q = open_session(q4b), *c = open_session(m);
    if (q && c && attach(c, q4, 1, 0) == HM_OK) {
        CHECK(hm_session_eval(q, tok, NP, false, &lg, &err) == HM_OK);
        CHECK(hm_session_eval_pp(c, tok, NP, &lg, &err) == HM_OK);
        for (int i = 0; i < ND; i++) {
            const float *l1 = NULL, *l2 = NULL;
            CHECK(hm_session_eval(q, &dec[i], 1, false, &l1, &err) == HM_OK);
            memcpy(lq + (size_t)i * (size_t)V, l1, (size_t)V * sizeof(float));
            CHECK(hm_session_eval_pp(c, &dec[i], 1, &l2, &err) == HM_OK);
            CHECKF(l1 && l2 && !memcmp(lq + (size_t)i * (size_t)V, l2, (size_t)V * sizeof(float)),
                   "%s: step %d: the copy through the main session's state differs from its own session", arch, i);
        }
    } else {
        CHECK(0);
    }
    hm_session_close(q);
    hm_session_close(c);

    /* warm hand-over, counted from fresh models: main store delta == the copy's prompt counts */
    {
        hm_model *m2 = open_model(p8), *q2 = open_model(p4);
        hm_session *w = m2 && q2 ? open_session(m2) : NULL;
        if (w && attach(w, q2, 1, 0) == HM_OK) {
            CHECK(hm_session_prefill(w, tok, NP, &lg, &err) == HM_OK);
            hm_usage um, uq;
            if (hm_model_usage(m2, &um, &err) == HM_OK) {
                if (hm_model_usage(q2, &uq, &err) == HM_OK) {
                    CHECK(um.n_layer == uq.n_layer && um.n_expert == uq.n_expert);
                    uint64_t sum = 0;
                    bool eq = um.n_layer == uq.n_layer && um.n_expert == uq.n_expert;
                    for (size_t i = 0; eq && i < (size_t)um.n_layer * (size_t)um.n_expert; i++) {
                        eq = um.counts[i] == uq.counts[i];
                        sum += uq.counts[i];
                    }
                    CHECKF(eq && sum > 0, "%s: the main store's counts are not the copy's (sum %llu)", arch,
                           (unsigned long long)sum);
                    CHECKF(um.prompt_tokens == NP && uq.prompt_tokens == NP, "%s: prompt tokens %llu / %llu", arch,
                           (unsigned long long)um.prompt_tokens, (unsigned long long)uq.prompt_tokens);
                    hm_pp_stats st;
                    hm_session_pp_stats(w, &st);
                    CHECK(st.routes_warm == sum);
                    hm_usage_free(&uq);
                }
                hm_usage_free(&um);
            }
        } else {
            CHECK(0);
        }
        hm_session_close(w);
        hm_model_close(q2);
        hm_model_close(m2);
    }

    /* decode after a q4_0 hand-over: deterministic, and not the main model's own; the second run's
     * copy holds its dense tensors that equal the main model's in the main model's mapping */
    hm_model *q4s = NULL;
    {
        hm_model_opts mo;
        hm_model_opts_default(&mo);
        mo.share_dense = m;
        CHECKF(hm_model_open(&q4s, p4, &mo, &err) == HM_OK, "open shared: %s", err.msg);
        if (q4s) {
            const hm_model_info *in = hm_model_get_info(q4s);
            CHECKF(in->shared_tensors > 0 && in->shared_bytes > 0 && in->shared_bytes < in->file_bytes,
                   "%s: %d tensors shared", arch, in->shared_tensors);
            fprintf(stderr, "  (the q4_0 copy shares %d tensors, %llu bytes)\n", in->shared_tensors,
                    (unsigned long long)in->shared_bytes);
        }
    }
    hm_session *d1 = open_session(m), *d2 = open_session(m);
    if (d1 && d2 && q4s && attach(d1, q4, 1, 0) == HM_OK && attach(d2, q4s, 1, 0) == HM_OK) {
        CHECK(hm_session_prefill(d1, tok, NP, &lg, &err) == HM_OK);
        decode(d1, dec, lb, V);
        CHECK(hm_session_prefill(d2, tok, NP, &lg, &err) == HM_OK);
        decode(d2, dec, lc, V);
        CHECKF(!memcmp(lb, lc, nb), "%s: decode after the q4_0 hand-over is not deterministic", arch);
        CHECKF(memcmp(la, lb, nb) != 0, "%s: the q4_0 cache gave the main model's own logits", arch);
    } else {
        CHECK(0);
    }
    hm_session_close(d1);
    hm_session_close(d2);
    hm_model_close(q4s);

    /* min tokens and refresh */
    hm_session *r1 = open_session(m), *r2 = open_session(m);
    if (r1 && r2 && attach(r1, q4, NP + 1, 0) == HM_OK) {
        const float *l1 = NULL;
        CHECK(hm_session_prefill(r1, tok, NP, &l1, &err) == HM_OK);
        hm_pp_stats st;
        hm_session_pp_stats(r1, &st);
        CHECK(!st.last_pp && st.prefills_main == 1 && st.tokens_pp == 0);
        decode(r1, dec, lb, V);
        CHECKF(!memcmp(la, lb, nb), "%s: a prompt below min_tokens did not run as the main model alone", arch);
        /* refresh 7: the copy takes NP - 7, the main model the rest; the same as doing it by hand */
        const int R = 7;
        CHECK(attach(r1, q4, NP, R) == HM_OK && attach(r2, q4, 1, 0) == HM_OK);
        hm_session_reset(r1);
        CHECK(hm_session_prefill(r1, tok, NP, &l1, &err) == HM_OK);
        hm_session_pp_stats(r1, &st);
        CHECK(st.last_pp && st.tokens_pp == NP - R && st.tokens_refresh == R);
        decode(r1, dec, lb, V);
        CHECK(hm_session_eval_pp(r2, tok, NP - R, &l1, &err) == HM_OK);
        CHECK(hm_session_eval(r2, tok + NP - R, R, false, &l1, &err) == HM_OK);
        decode(r2, dec, lc, V);
        CHECKF(!memcmp(lb, lc, nb), "%s: refresh differs from the copy's head + the main model's tail", arch);
        /* a refresh as long as the prompt: the main model alone */
        CHECK(attach(r1, q4, 1, NP) == HM_OK);
        hm_session_reset(r1);
        CHECK(hm_session_prefill(r1, tok, NP, &l1, &err) == HM_OK);
        hm_session_pp_stats(r1, &st);
        CHECK(!st.last_pp);
        decode(r1, dec, lb, V);
        CHECKF(!memcmp(la, lb, nb), "%s: refresh >= the prompt did not run as the main model alone", arch);
    } else {
        CHECK(0);
    }
    hm_session_close(r1);
    hm_session_close(r2);

    /* the copy hand-over (a session of the copy's own, its state copied over: what a GPU placement
     * uses) against the shared state, byte for byte, through chunks interleaved with the main model */
    hm_session *sh = open_session(m), *cp = open_session(m);
    if (sh && cp && attach(sh, q4, 1, 0) == HM_OK) {
        hm_pp_opts o;
        hm_pp_opts_default(&o);
        o.model = q4;
        o.copy_state = true;
        CHECK(hm_session_set_pp(cp, &o, &err) == HM_OK);
        hm_session *both[2] = {sh, cp};
        for (int k = 0; k < 2; k++) {
            hm_session *t = both[k];
            CHECK(hm_session_eval_pp(t, tok, 16, &lg, &err) == HM_OK);
            CHECK(hm_session_eval_pp(t, tok + 16, 8, &lg, &err) == HM_OK);
            CHECK(hm_session_eval(t, tok + 24, 6, false, &lg, &err) == HM_OK); /* the main model in between */
            CHECKF(hm_session_eval_pp(t, tok + 30, NP - 30, &lg, &err) == HM_OK, "%s", err.msg);
            decode(t, dec, k ? lc : lb, V);
        }
        CHECKF(!memcmp(lb, lc, nb), "%s: the copy hand-over differs from the shared state", arch);
        hm_pp_stats st;
        hm_session_pp_stats(cp, &st);
        CHECK(st.tokens_pp == NP - 6 && st.routes_warm > 0);
    } else {
        CHECK(0);
    }
    hm_session_close(sh);
    hm_session_close(cp);

    /* refusals, each naming what differs */
    hm_session *x = open_session(m);
    if (x && synth(arch, t_main, 4, 0, ps, sizeof ps) == 0) {
        hm_model *other = open_model(ps);
        hm_pp_opts o;
        hm_pp_opts_default(&o);
        o.model = other;
        CHECK(other && hm_session_set_pp(x, &o, &err) == HM_ERR_ARG && strstr(err.msg, "has other values"));
        fprintf(stderr, "  (refused: %s)\n", err.msg);
        hm_model_close(other);
        unlink(ps);
    }
    if (x && synth(arch, t_main, 3, 2, pl, sizeof pl) == 0) {
        hm_model *other = open_model(pl);
        hm_pp_opts o;
        hm_pp_opts_default(&o);
        o.model = other;
        CHECK(other && hm_session_set_pp(x, &o, &err) == HM_ERR_ARG && strstr(err.msg, "block_count"));
        fprintf(stderr, "  (refused: %s)\n", err.msg);
        hm_model_close(other);
        unlink(pl);
    }
    if (x) {
        hm_pp_opts o;
        hm_pp_opts_default(&o);
        o.model = m;
        CHECK(hm_session_set_pp(x, &o, &err) == HM_ERR_ARG && strstr(err.msg, "main model object"));
        CHECK(hm_session_eval_pp(x, tok, 1, &lg, &err) == HM_ERR_ARG); /* nothing attached */
    }
    hm_session_close(x);
    hm_session_close(a);
free_bufs:
    free(la);
    free(lb);
    free(lc);
    free(lq);
out:
    hm_model_close(q4b);
    hm_model_close(q4);
    hm_model_close(same);
    hm_model_close(m);
    unlink(p8);
    unlink(p4);
}

/* The SSD tier (--ram-budget below the experts): after the copy's prefill its most routed units are
 * read into the main model's RAM tier (warm), and decode reads fewer units on demand than after the
 * same prefill without the warm hand-over, with byte-identical logits. */
static void ram_tier_case(void) {
    fprintf(stderr, "--- qwen3moe: the SSD tier warmed\n");
    char p8[256], p4[256];
    if (synth("qwen3moe", "q8_0", 3, 0, p8, sizeof p8) || synth("qwen3moe", "q4_0", 3, 0, p4, sizeof p4)) return;
    float *out[2] = {NULL, NULL};
    uint64_t reads_after_prefill[2] = {0, 0}, miss_decode[2] = {0, 0}, pref[2] = {0, 0};
    for (int warm = 0; warm < 2; warm++) {
        hm_model *probe = open_model(p8);
        if (!probe) break;
        hm_usage u;
        hm_err err = {{0}};
        CHECK(hm_model_usage(probe, &u, &err) == HM_OK);
        const int64_t budget = (int64_t)(u.unit_bytes * (uint64_t)u.n_layer * (uint64_t)u.n_expert / 2);
        hm_usage_free(&u);
        hm_model_close(probe);
        hm_placement_opts po;
        hm_placement_opts_default(&po);
        po.ram_budget = budget;
        po.io_pread = true;
        hm_model_opts mo;
        hm_model_opts_default(&mo);
        mo.placement = &po;
        hm_model *m = NULL, *q = open_model(p4);
        CHECKF(hm_model_open(&m, p8, &mo, &err) == HM_OK, "open with --ram-budget: %s", err.msg);
        hm_session *s = m && q ? open_session(m) : NULL;
        if (!s) {
            hm_model_close(m);
            hm_model_close(q);
            break;
        }
        const int32_t nv = hm_model_n_vocab(m);
        int32_t tok[NP], dec[ND];
        for (int i = 0; i < NP; i++) tok[i] = 2 + (i * 37 + 11) % (nv - 4);
        for (int i = 0; i < ND; i++) dec[i] = 3 + (i * 53 + 7) % (nv - 4);
        hm_pp_opts o;
        hm_pp_opts_default(&o);
        o.model = q;
        o.min_tokens = 1;
        o.no_warm = !warm;
        CHECK(hm_session_set_pp(s, &o, &err) == HM_OK);
        const float *lg;
        CHECK(hm_session_prefill(s, tok, NP, &lg, &err) == HM_OK);
        hm_pp_stats st;
        hm_session_pp_stats(s, &st);
        pref[warm] = st.units_prefetched;
        /* let the background reads land, then count */
        CHECK(hm_model_usage(m, &u, &err) == HM_OK);
        reads_after_prefill[warm] = u.ssd_reads;
        const uint64_t acq0 = u.ram_acquired, hit0 = u.ram_hits;
        hm_usage_free(&u);
        out[warm] = malloc((size_t)ND * (size_t)nv * sizeof(float));
        if (out[warm]) decode(s, dec, out[warm], nv);
        CHECK(hm_model_usage(m, &u, &err) == HM_OK);
        miss_decode[warm] = (u.ram_acquired - acq0) - (u.ram_hits - hit0);
        hm_usage_free(&u);
        if (out[0] && out[1])
            CHECKF(!memcmp(out[0], out[1], (size_t)ND * (size_t)nv * sizeof(float)),
                   "the warm SSD tier changed the logits");
        hm_session_close(s);
        hm_model_close(q);
        hm_model_close(m);
    }
    fprintf(stderr, "  prefetched %llu units; reads after the prefill %llu (cold) vs %llu (warm); decode misses %llu vs "
            "%llu\n", (unsigned long long)pref[1], (unsigned long long)reads_after_prefill[0],
            (unsigned long long)reads_after_prefill[1], (unsigned long long)miss_decode[0],
            (unsigned long long)miss_decode[1]);
    CHECK(pref[0] == 0 && pref[1] > 0);
    CHECK(reads_after_prefill[1] > reads_after_prefill[0]);
    CHECK(miss_decode[1] < miss_decode[0]);
    free(out[0]);
    free(out[1]);
    unlink(p8);
    unlink(p4);
}

int main(void) {
    arch_case("qwen3moe", "q8_0", "q4_0");
    arch_case("qwen35moe", "f32", "q8_0");
    arch_case("deepseek4", "q8_0", "q4_0");
    ram_tier_case();
    return test_done();
}
