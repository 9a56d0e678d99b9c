/* test_synth_routing.c - `hotmoe synth --routing-profile`: the profile's skew is in the weights.
 *
 * A hand-made 2-layer profile of 16 experts (k 4) with a steep popularity curve (counts ~ 0.78^e,
 * the last expert never routed; layer 1 the same curve reversed) is built into the tiny preset
 * (4 layers: model layers 0, 1 take profile layer 0 and 2, 3 take layer 1), as q8_0 and as q4_k_m
 * (a Q4_K embedding: the calibration replays its quantisation). Then, reading only
 * the GGUF file (reader + the quant table's to_float, no synth code):
 *  - the construction's invariants hold: the rows of attn_output / ffn_down_exps that write the
 *    reserved channels R are exactly zero, ffn_norm is 1 on R, the router is zero outside R, and
 *    every token embedding carries the same constant on U (up to its quantisation);
 *  - a naive router (embedding row -> RMSNorm * ffn_norm -> F32 router -> top-k) over every token
 *    of the vocabulary gives each layer's selection frequencies within TV 0.02 of its profile
 *    layer. Since nothing writes R, this layer-l replay from the embedding is exact for any
 *    position and context, and the expectation over uniformly random tokens is this average over
 *    the whole vocabulary (384 tokens, all of which the calibration sees: synth calibrates on every
 *    row when n_vocab <= 8192). What remains is the fit's error with 384 discrete tokens (each moves
 *    a frequency by 1/384, and 1536 selections spread over 15 experts), measured 0.003; 0.02
 *    leaves room for float summation order but fails a wrong mapping (a layer against the other
 *    profile layer gives TV 0.77) or an unskewed model (uniform routing: TV 0.42);
 *  - the metadata names the profile and the layer map;
 *  - bytes do not depend on the thread count (calibration included);
 *  - a profile with the wrong expert count, or a missing one, is HM_ERR_ARG / HM_ERR_IO with a
 *    message naming the file and both expert counts. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "experts/profile.h"
#include "gguf/gguf.h"
#include "hotmoe_tools.h"
#include "quant/quant.h"
#include "test.h"

enum { E = 256, X = 16, K = 4, V = 384, NL = 4 };

static char tmpdir[256];

static const char *tpath(const char *name) {
    static char buf[4][512];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", tmpdir, name);
    return buf[i];
}

/* Profile with n_layer layers of n_expert experts; layer l's counts ~ 0.78^e (reversed for odd
 * l), the least popular expert 0. */
static void write_profile(const char *path, int32_t n_layer, int32_t n_expert) {
    hm_profile p;
    hm_err err = {{0}};
    CHECK(hm_profile_init(&p, n_layer, n_expert, &err) == HM_OK);
    p.k = K;
    p.tokens = p.decode_tokens = 1000;
    snprintf(p.arch, sizeof p.arch, "qwen3moe");
    for (int32_t l = 0; l < n_layer; l++)
        for (int32_t e = 0; e < n_expert; e++) {
            int32_t r = l % 2 ? n_expert - 1 - e : e;
            p.counts[(size_t)l * (size_t)n_expert + (size_t)e] = r == n_expert - 1 ? 0 : (uint64_t)(1000.0 * pow(0.78, r));
        }
    CHECK(hm_profile_write(&p, path, HM_PROFILE_HOTMOE, &err) == HM_OK);
    hm_profile_free(&p);
}

static hm_status synth(const char *out, const char *profile, const char *type, int threads, hm_err *err) {
    hm_synth_opts o = {.arch = "qwen3moe", .preset = "tiny", .type = type, .seed = 7, .out_path = out,
                       .n_threads = threads, .routing_profile = profile};
    return hm_synth(&o, err);
}

static const hm_gguf_tensor *tensor(const hm_gguf *g, const char *suffix, int l) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s.weight", l, suffix);
    const hm_gguf_tensor *t = hm_gguf_find_tensor(g, name);
    CHECKF(t != NULL, "missing %s", name);
    return t;
}

/* Row r of tensor t as floats (n = ne[0]). */
static void row(const hm_gguf_tensor *t, int64_t r, float *dst) {
    size_t rb = hm_row_size(t->type, t->ne[0]);
    hm_type_get(t->type)->to_float((const char *)t->data + (size_t)r * rb, dst, t->ne[0]);
}

static double files_differ(const char *a_path, const char *b_path) { /* 0 when equal */
    FILE *a = fopen(a_path, "rb"), *b = fopen(b_path, "rb");
    double diff = 1;
    if (a && b) {
        int ca, cb;
        do {
            ca = fgetc(a);
            cb = fgetc(b);
        } while (ca == cb && ca != EOF);
        diff = ca == cb ? 0 : 1;
    }
    if (a) fclose(a);
    if (b) fclose(b);
    return diff;
}

/* The invariants and the naive router's frequencies of a synthesised tiny model (see the top). */
static void check_model(const char *model, const char *prof, const char *type) {
    hm_err err = {{0}};
    hm_gguf *g = NULL;
    CHECKF(hm_gguf_open(&g, model, &err) == HM_OK, "%s", err.msg);
    if (!g) return;

    /* metadata */
    int64_t u0 = 0, nu = 0, ns = 0;
    CHECK(hm_gguf_get_int(g, "hotmoe.synth.routing.u_first", &u0));
    CHECK(hm_gguf_get_int(g, "hotmoe.synth.routing.u_count", &nu));
    CHECK(hm_gguf_get_int(g, "hotmoe.synth.routing.s_count", &ns));
    CHECK(u0 + nu + ns == E && nu == 32 && ns >= 32);
    hm_gguf_str name;
    CHECK(hm_gguf_get_str(g, "hotmoe.synth.routing.profile", &name) && name.len == 8 && !memcmp(name.ptr, "p16.json", 8));
    hm_gguf_arr map;
    CHECK(hm_gguf_get_arr(g, "hotmoe.synth.routing.layer_map", &map) && map.n == NL);
    const int want_map[NL] = {0, 0, 1, 1};
    for (int l = 0; l < NL; l++) {
        int64_t v = -1;
        CHECK(hm_gguf_arr_int(&map, (uint64_t)l, &v) && v == want_map[l]);
    }

    /* invariants of the construction */
    static float buf[X * E];
    const hm_gguf_tensor *emb = hm_gguf_find_tensor(g, "token_embd.weight");
    CHECK(emb && emb->ne[0] == E && emb->ne[1] == V);
    /* U is one quant sub-block of equal values: equal within a row; across rows the block scale
     * is rounded per row (Q4_K: a 6-bit sub-block scale under an fp16 super-block scale, measured
     * +-3 %), so the spread max - min is within 1 % (q8_0) / 10 % (q4_k_m) of the max */
    const float tol = strcmp(type, "q8_0") == 0 ? 0.01f : 0.10f;
    float cmin = INFINITY, cmax = -INFINITY;
    bool u_row = true;
    for (int64_t t = 0; t < V; t++) {
        row(emb, t, buf);
        for (int64_t j = u0; j < u0 + nu; j++) u_row &= buf[j] == buf[u0];
        cmin = fminf(cmin, buf[u0]);
        cmax = fmaxf(cmax, buf[u0]);
    }
    CHECKF(cmin > 0 && u_row && cmax - cmin <= tol * cmax, "%s: U in [%g, %g]", type, (double)cmin, (double)cmax);
    for (int l = 0; l < NL; l++) {
        const hm_gguf_tensor *ao = tensor(g, "attn_output", l), *dn = tensor(g, "ffn_down_exps", l);
        const hm_gguf_tensor *fn = tensor(g, "ffn_norm", l), *gi = tensor(g, "ffn_gate_inp", l);
        if (!ao || !dn || !fn || !gi) continue;
        bool zero = true, nonzero_elsewhere = false;
        for (int64_t r = 0; r < ao->ne[1]; r++) {
            row(ao, r, buf);
            for (int64_t j = 0; j < ao->ne[0]; j++) {
                if (r >= u0) zero &= buf[j] == 0;
                else nonzero_elsewhere |= buf[j] != 0;
            }
        }
        for (int64_t r = 0; r < dn->ne[1] * dn->ne[2]; r++) {
            row(dn, r, buf);
            if (r % E >= u0)
                for (int64_t j = 0; j < dn->ne[0]; j++) zero &= buf[j] == 0;
        }
        CHECKF(zero && nonzero_elsewhere, "layer %d: output rows of R not zero", l);
        const float *norm = fn->data;
        bool one = true;
        for (int64_t j = u0; j < E; j++) one &= norm[j] == 1.0f;
        CHECKF(one, "layer %d: ffn_norm not 1 on R", l);
        bool outside = true;
        for (int64_t e = 0; e < X; e++) {
            const float *w = (const float *)gi->data + e * E;
            for (int64_t j = 0; j < u0; j++) outside &= w[j] == 0;
        }
        CHECKF(outside, "layer %d: router not zero outside R", l);
    }

    /* naive router over every token, every layer */
    hm_profile p;
    CHECK(hm_profile_read(&p, prof, &err) == HM_OK);
    static float h[E], logit[X];
    double unskewed_tv = 0;
    for (int l = 0; l < NL; l++) {
        const hm_gguf_tensor *fn = tensor(g, "ffn_norm", l), *gi = tensor(g, "ffn_gate_inp", l);
        if (!fn || !gi) continue;
        uint64_t cnt[X] = {0};
        for (int64_t t = 0; t < V; t++) {
            row(emb, t, h);
            double ss = 0;
            for (int j = 0; j < E; j++) ss += (double)h[j] * h[j];
            const float inv = (float)(1.0 / sqrt(ss / E + 1e-6));
            for (int j = 0; j < E; j++) h[j] = h[j] * inv * ((const float *)fn->data)[j];
            for (int e = 0; e < X; e++) {
                const float *w = (const float *)gi->data + e * E;
                double s = 0;
                for (int j = 0; j < E; j++) s += (double)w[j] * h[j];
                logit[e] = (float)s;
            }
            for (int i = 0; i < K; i++) { /* top-k by repeated argmax */
                int best = -1;
                for (int e = 0; e < X; e++)
                    if (logit[e] > -INFINITY && (best < 0 || logit[e] > logit[best])) best = e;
                cnt[best]++;
                logit[best] = -INFINITY;
            }
        }
        const int pl = want_map[l];
        const double total = (double)hm_profile_layer_total(&p, pl);
        double tv = 0, tv_other = 0;
        for (int e = 0; e < X; e++) {
            double f = (double)cnt[e] / (double)(V * K);
            tv += fabs(f - (double)hm_profile_count(&p, pl, e) / total);
            tv_other += fabs(f - (double)hm_profile_count(&p, 1 - pl, e) / total);
            if (l == 0) unskewed_tv += fabs(1.0 / X - (double)hm_profile_count(&p, pl, e) / total);
        }
        tv *= 0.5;
        tv_other *= 0.5;
        fprintf(stderr, "%s layer %d (profile layer %d): TV %.4f (vs the other profile layer %.3f)\n", type, l, pl, tv, tv_other);
        CHECKF(tv < 0.02, "layer %d: TV %.4f", l, tv);
        CHECK(tv_other > 0.5);
        CHECK(cnt[pl == 0 ? X - 1 : 0] == 0 || cnt[pl == 0 ? X - 1 : 0] < V * K / 200); /* the never-routed expert */
    }
    fprintf(stderr, "uniform routing vs profile layer 0: TV %.3f\n", 0.5 * unskewed_tv);
    CHECK(0.5 * unskewed_tv > 0.3);
    hm_profile_free(&p);
    hm_gguf_close(g);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hm_test_synth_routing.XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    const char *prof = tpath("p16.json");
    write_profile(prof, 2, X);
    hm_err err = {{0}};
    const char *model = tpath("tiny.gguf");
    CHECKF(synth(model, prof, "q8_0", 1, &err) == HM_OK, "%s", err.msg);

    check_model(model, prof, "q8_0");
    const char *model_q4 = tpath("tiny_q4.gguf");
    CHECKF(synth(model_q4, prof, "q4_k_m", 1, &err) == HM_OK, "%s", err.msg);
    check_model(model_q4, prof, "q4_k_m");
    unlink(model_q4);

    /* threads do not change the bytes */
    const char *model3 = tpath("tiny3.gguf");
    CHECKF(synth(model3, prof, "q8_0", 3, &err) == HM_OK, "%s", err.msg);
    CHECK(files_differ(model, model3) == 0);

    /* bad profiles */
    const char *p32 = tpath("p32.json");
    write_profile(p32, 2, 32);
    memset(&err, 0, sizeof err);
    CHECK(synth(tpath("bad.gguf"), p32, "q8_0", 1, &err) == HM_ERR_ARG);
    CHECKF(strstr(err.msg, "p32.json") && strstr(err.msg, "32 experts") && strstr(err.msg, "has 16"), "%s", err.msg);
    struct stat sb;
    CHECK(stat(tpath("bad.gguf"), &sb) != 0); /* nothing written */
    memset(&err, 0, sizeof err);
    CHECK(synth(tpath("bad.gguf"), tpath("nope.json"), "q8_0", 1, &err) != HM_OK);
    CHECKF(strstr(err.msg, "nope.json") != NULL, "%s", err.msg);

    unlink(prof);
    unlink(p32);
    unlink(model);
    unlink(model3);
    rmdir(tmpdir);
    return test_done();
}
