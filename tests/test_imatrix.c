/* test_imatrix.c - importance matrices (synth/synth_imatrix.c) and importance-weighted quantisation
 * (quant/quant_weighted.c, the i-quants' hm_quant_iq_quantize, synth/synth_mix.c's with-imatrix
 * rules) against llama.cpp.
 *
 * Fixture (tests/fixtures/imatrix_tiny, README.md says how it was made): imatrix.gguf, written by
 * llama-imatrix on the bundled model (models/tiny-qwen3moe-q8_0.gguf), and MIX.txt for three mixes:
 * the type and the 64-bit FNV-1a of the bytes of every tensor of llama-quantize's output
 * (`llama-quantize --allow-requantize --imatrix imatrix.gguf MODEL out.gguf MIX`).
 *
 *  - parse: every NAME.in_sum2 / NAME.counts pair of the file becomes an entry whose values are
 *    in_sum2 / round(count) per matrix (recomputed here from the raw tensors), sizes as the model's;
 *  - types: synth's rules for the mix with an imatrix, applied to the model's tensor list, give
 *    llama-quantize's type for every tensor;
 *  - bytes: the dequantised Q8_0 weights (what llama-quantize requantises) of the tensors of layers
 *    0 and 5, token_embd and output, quantised with their entries (expert by expert), hash to
 *    llama-quantize's bytes;
 *  - errors: a missing file, a GGUF without the imatrix keys and a truncated legacy file. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "synth/synth_imatrix.h"
#include "synth/synth_impl.h"
#include "test.h"

static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void test_parse(const hm_imatrix *im, const hm_gguf *raw, const hm_gguf *model) {
    int64_t n_pairs = 0;
    for (int64_t i = 0; i < hm_gguf_n_tensors(raw); i++) {
        const hm_gguf_tensor *s = hm_gguf_tensor_at(raw, i);
        const size_t len = strlen(s->name);
        if (len < 8 || strcmp(s->name + len - 8, ".in_sum2") != 0) continue;
        n_pairs++;
        char name[256], cname[272];
        snprintf(name, sizeof name, "%.*s", (int)(len - 8), s->name);
        snprintf(cname, sizeof cname, "%s.counts", name);
        const hm_gguf_tensor *c = hm_gguf_find_tensor(raw, cname);
        CHECKF(c != NULL, "%s has no counts", name);
        int64_t n = 0;
        const float *v = hm_imatrix_find(im, name, &n);
        CHECKF(v != NULL, "no entry %s", name);
        if (!c || !v) continue;
        const int64_t n_mat = c->ne[0] * c->ne[1], ne0 = s->ne[0];
        CHECKF(n == ne0 * n_mat, "%s: %lld values, want %lld", name, (long long)n, (long long)(ne0 * n_mat));
        const hm_gguf_tensor *w = hm_gguf_find_tensor(model, name);
        CHECKF(w && w->ne[0] == ne0 && w->ne[2] == n_mat, "%s: not the shape of the model's tensor", name);
        int bad = 0;
        for (int64_t j = 0; j < n_mat; j++) {
            float cnt;
            memcpy(&cnt, (const char *)c->data + 4 * j, 4);
            const float count = (float)(int64_t)(cnt + 0.5f);
            for (int64_t k = 0; k < ne0; k++) {
                float sum;
                memcpy(&sum, (const char *)s->data + 4 * (j * ne0 + k), 4);
                bad += v[j * ne0 + k] != (count > 0 ? sum / count : 1.0f);
            }
        }
        CHECKF(bad == 0, "%s: %d values are not in_sum2 / count", name, bad);
    }
    CHECKF(n_pairs == hm_imatrix_n_entries(im) && n_pairs > 0, "%lld pairs, %lld entries", (long long)n_pairs,
           (long long)hm_imatrix_n_entries(im));
}

/* The model's tensors as a synth plan: the Q8_0 matrices quantised, the rest (norms, routers) F32. */
static hm_synth_tensor *model_plan(const hm_gguf *g, int64_t *n) {
    *n = hm_gguf_n_tensors(g);
    hm_synth_tensor *t = calloc((size_t)*n, sizeof *t);
    for (int64_t i = 0; t && i < *n; i++) {
        const hm_gguf_tensor *s = hm_gguf_tensor_at(g, i);
        snprintf(t[i].name, sizeof t[i].name, "%s", s->name);
        t[i].n_dims = s->n_dims;
        for (int d = 0; d < 3; d++) t[i].ne[d] = s->ne[d];
        t[i].type = s->type == HM_TYPE_F32 ? HM_TYPE_F32 : HM_TYPE_Q8_0;
    }
    return t;
}

static bool byte_checked(const char *name) {
    return !strncmp(name, "blk.0.", 6) || !strncmp(name, "blk.5.", 6) || !strcmp(name, "token_embd.weight") ||
           !strcmp(name, "output.weight");
}

static void test_mix(const char *mix, const hm_imatrix *im, const hm_gguf *model) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/imatrix_tiny/%s.txt", mix);
    FILE *f = fopen(test_src_path(rel), "r");
    CHECKF(f != NULL, "no fixture %s", rel);
    if (!f) return;
    int64_t n = 0;
    hm_synth_tensor *plan = model_plan(model, &n);
    hm_synth_mix m = *hm_synth_find_mix(mix);
    m.imatrix = true;
    int64_t n_expert = 0, n_head = 0, n_head_kv = 0, n_layer = 0;
    hm_gguf_get_int(model, "qwen3moe.expert_count", &n_expert);
    hm_gguf_get_int(model, "qwen3moe.attention.head_count", &n_head);
    hm_gguf_get_int(model, "qwen3moe.attention.head_count_kv", &n_head_kv);
    hm_gguf_get_int(model, "qwen3moe.block_count", &n_layer);
    const hm_synth_mix_hp hp = {(int32_t)n_layer, (int32_t)(n_head / n_head_kv), (int32_t)n_expert};
    hm_err err = {{0}};
    CHECKF(hm_synth_mix_apply(plan, n, &m, &hp, &err) == HM_OK, "%s: %s", mix, err.msg);
    char name[128], type[32];
    unsigned long long want;
    int lines = 0, checked = 0;
    while (fscanf(f, "%127s %31s %llx", name, type, &want) == 3) {
        lines++;
        const hm_synth_tensor *t = NULL;
        for (int64_t i = 0; i < n; i++)
            if (!strcmp(plan[i].name, name)) t = &plan[i];
        CHECKF(t != NULL, "%s: no tensor %s", mix, name);
        if (!t) continue;
        CHECKF(!strcmp(hm_type_name(t->type), type), "%s %s: type %s, llama-quantize %s", mix, name,
               hm_type_name(t->type), type);
        if (!byte_checked(name) || t->type == HM_TYPE_F32 || strcmp(hm_type_name(t->type), type)) continue;
        const hm_gguf_tensor *s = hm_gguf_find_tensor(model, name);
        const int64_t ne0 = s->ne[0], rows = s->ne[1], nm = s->ne[2];
        float *x = malloc(sizeof(float) * (size_t)(ne0 * rows * nm));
        const size_t rs = hm_row_size(t->type, ne0);
        uint8_t *q = malloc(rs * (size_t)(rows * nm));
        hm_type_get(s->type)->to_float_ref(s->data, x, ne0 * rows * nm);
        int64_t nv = 0;
        const float *qw = hm_imatrix_find(im, name, &nv);
        if (qw && nv != ne0 * nm) qw = NULL; /* llama-quantize: token_embd of another size goes without */
        bool ok = true;
        for (int64_t e = 0; e < nm; e++)
            ok &= hm_quant_quantize(t->type, x + e * ne0 * rows, q + (size_t)(e * rows) * rs, rows, ne0,
                                    qw ? qw + e * ne0 : NULL);
        CHECKF(ok, "%s %s: not quantised", mix, name);
        const uint64_t got = fnv(q, rs * (size_t)(rows * nm));
        CHECKF(got == want, "%s %s (%s%s): bytes hash %016llx, llama-quantize's %016llx", mix, name, type,
               qw ? ", imatrix" : "", (unsigned long long)got, want);
        checked++;
        free(x);
        free(q);
    }
    fclose(f);
    CHECKF(lines == n, "%s: %d fixture lines for %lld tensors", mix, lines, (long long)n);
    CHECKF(checked >= 16, "%s: only %d tensors byte-checked", mix, checked);
    free(plan);
}

static void test_errors(void) {
    hm_imatrix *im = NULL;
    hm_err err = {{0}};
    CHECK(hm_imatrix_open(&im, "/nonexistent/imatrix.gguf", &err) == HM_ERR_IO && !im);
    CHECK(strstr(err.msg, "/nonexistent/imatrix.gguf") != NULL);
    /* a model file is GGUF but not an importance matrix */
    err.msg[0] = 0;
    CHECK(hm_imatrix_open(&im, test_src_path("models/tiny-qwen3moe-q8_0.gguf"), &err) == HM_ERR_FORMAT && !im);
    CHECKF(strstr(err.msg, "imatrix.datasets") != NULL, "%s", err.msg);
    /* legacy: one entry announced, its name cut short */
    char path[256];
    snprintf(path, sizeof path, "/tmp/hm_test_imatrix.%d.dat", (int)getpid());
    FILE *f = fopen(path, "wb");
    const int32_t hdr[2] = {1, 40};
    fwrite(hdr, 4, 2, f);
    fputs("blk.0.attn_q", f);
    fclose(f);
    err.msg[0] = 0;
    CHECK(hm_imatrix_open(&im, path, &err) == HM_ERR_FORMAT && !im);
    CHECKF(strstr(err.msg, "entry 1 of 1") != NULL, "%s", err.msg);
    /* a legacy file that is whole: two entries, values divided by ncall */
    f = fopen(path, "wb");
    const int32_t n2 = 2, l1 = 3, c1 = 4, v1 = 2, l2 = 1, c2 = 0, v2 = 1;
    const float a[2] = {8.0f, 2.0f}, b1 = 5.0f;
    fwrite(&n2, 4, 1, f);
    fwrite(&l1, 4, 1, f), fwrite("abc", 1, 3, f), fwrite(&c1, 4, 1, f), fwrite(&v1, 4, 1, f), fwrite(a, 4, 2, f);
    fwrite(&l2, 4, 1, f), fwrite("z", 1, 1, f), fwrite(&c2, 4, 1, f), fwrite(&v2, 4, 1, f), fwrite(&b1, 4, 1, f);
    fclose(f);
    CHECK(hm_imatrix_open(&im, path, &err) == HM_OK);
    int64_t n = 0;
    const float *v = hm_imatrix_find(im, "abc", &n);
    CHECK(v && n == 2 && v[0] == 2.0f && v[1] == 0.5f); /* 8 / 4, 2 / 4 */
    v = hm_imatrix_find(im, "z", &n);
    CHECK(v && n == 1 && v[0] == 5.0f); /* ncall 0: as stored */
    CHECK(hm_imatrix_is_legacy(im) && hm_imatrix_n_entries(im) == 2 && !hm_imatrix_find(im, "ab", NULL));
    hm_imatrix_close(im);
    unlink(path);
}

int main(void) {
    test_errors();
    hm_err err = {{0}};
    hm_imatrix *im = NULL;
    hm_gguf *raw = NULL, *model = NULL;
    const char *ip = "tests/fixtures/imatrix_tiny/imatrix.gguf";
    CHECKF(hm_imatrix_open(&im, test_src_path(ip), &err) == HM_OK, "%s", err.msg);
    CHECKF(hm_gguf_open(&raw, test_src_path(ip), &err) == HM_OK, "%s", err.msg);
    CHECKF(hm_gguf_open(&model, test_src_path("models/tiny-qwen3moe-q8_0.gguf"), &err) == HM_OK, "%s", err.msg);
    if (im && raw && model) {
        CHECK(!hm_imatrix_is_legacy(im) && hm_imatrix_chunk_count(im) > 0);
        test_parse(im, raw, model);
    }
    if (im && model) {
        test_mix("iq2_m", im, model);
        test_mix("q2_k", im, model);
        test_mix("iq1_s", im, model);
    }
    hm_imatrix_close(im);
    hm_gguf_close(raw);
    hm_gguf_close(model);
    return test_done();
}
