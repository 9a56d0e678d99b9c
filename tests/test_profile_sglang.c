/* test_profile_sglang.c - SGLang's logical_count as a hotmoe profile, both ways, and the EPLB-style
 * placement of `plan --ep` on a hand-checked case.
 *
 * Facts from SGLang's code (python/sglang/srt/eplb/, docs/CLUSTER.md) the fixtures are written from:
 * --init-expert-location reads {"logical_count": X} with X of shape [num_layers, num_experts] or
 * [steps, num_layers, num_experts] (its recorder's stat dump; EPLB sums the first dimension);
 * num_layers is the model's num_hidden_layers and row i is decoder layer i (the recorder is indexed
 * by the layer loop's i): DeepSeek-V3's first_k_dense_replace dense layers are zero rows, and
 * Qwen3-MoE (every layer sparse) has a row per layer. The expected hotmoe profiles below are derived
 * by hand from those facts, not from this code's output. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "experts/profile.h"
#include "plan/ep.h"
#include "test.h"

static void write_text(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(text, 1, len, f) == len);
    fclose(f);
}

static char tmp_path[64];
static const char *tmp_file(const char *text, size_t len) {
    snprintf(tmp_path, sizeof tmp_path, "/tmp/hm_test_sglang_%d.json", (int)getpid());
    write_text(tmp_path, text, len);
    return tmp_path;
}

/* hotmoe -> SGLang JSON -> hotmoe: the same counts and metadata; the file is what SGLang reads. */
static void test_roundtrip(void) {
    hm_err err = {{0}};
    hm_profile p, q;
    /* 5 layers x 4 experts, layers 0 and 1 dense (no routing: zero rows), as a DeepSeek-V3-like
     * model with first_k_dense_replace = 2 records them */
    CHECK(hm_profile_init(&p, 5, 4, &err) == HM_OK);
    snprintf(p.model, sizeof p.model, "ds-like");
    snprintf(p.arch, sizeof p.arch, "deepseek2");
    p.k = 2, p.tokens = 7, p.prompt_tokens = 5, p.decode_tokens = 2, p.steps = 3;
    for (int l = 2; l < 5; l++)
        for (int e = 0; e < 4; e++) p.counts[l * 4 + e] = (uint64_t)((l * 5 + e * 3) % 7) + (l == 4 && e == 1 ? 6000000000ull : 0);
    const char *path = tmp_file("", 0);
    CHECKF(hm_profile_write(&p, path, HM_PROFILE_SGLANG, &err) == HM_OK, "%s", err.msg);
    /* SGLang's view: logical_count is 5 rows (num_hidden_layers) of 4 integers, rows 0-1 zero */
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    CHECK(root != NULL);
    json_t *lc = json_object_get(root, "logical_count");
    CHECK(json_is_array(lc) && json_array_size(lc) == 5);
    for (size_t l = 0; l < 5 && json_is_array(lc); l++) {
        json_t *row = json_array_get(lc, l);
        CHECK(json_is_array(row) && json_array_size(row) == 4);
        for (size_t e = 0; e < 4; e++) {
            json_t *v = json_array_get(row, e);
            CHECK(json_is_integer(v) && (uint64_t)json_integer_value(v) == p.counts[l * 4 + e]);
            if (l < 2) CHECK(json_integer_value(v) == 0);
        }
    }
    CHECK(json_object_get(root, "physical_to_logical_map") == NULL); /* else SGLang takes the mapping branch */
    json_decref(root);
    CHECKF(hm_profile_read_for(&q, path, 5, 4, &err) == HM_OK, "%s", err.msg);
    CHECK(q.n_layer == 5 && q.n_expert == 4 && q.k == 2 && q.tokens == 7 && q.prompt_tokens == 5 &&
          q.decode_tokens == 2 && q.steps == 3);
    CHECK(strcmp(q.model, "ds-like") == 0 && strcmp(q.arch, "deepseek2") == 0);
    CHECK(memcmp(p.counts, q.counts, 20 * sizeof *p.counts) == 0);
    hm_profile_free(&q);
    /* and on to hotmoe's own format and back: still the same counts */
    CHECK(hm_profile_write(&p, path, HM_PROFILE_HOTMOE, &err) == HM_OK);
    CHECK(hm_profile_read(&q, path, &err) == HM_OK && memcmp(p.counts, q.counts, 20 * sizeof *p.counts) == 0);
    hm_profile_free(&q);
    hm_profile_free(&p);
    unlink(path);
}

/* A DeepSeek-V3-like model: num_hidden_layers 5, first_k_dense_replace 2, 4 routed experts, k 2.
 * SGLang's recorder (stat mode) dumps logical_count as [steps][layers][experts]; two steps of 3
 * tokens each (6 routed slots per MoE layer per step). By hand, summed over the steps:
 *   layer 2: [3,1,0,2] + [1,1,2,2] = [4,2,2,4]
 *   layer 3: [1,1,1,3] + [2,0,2,2] = [3,1,3,5]
 *   layer 4: [0,4,2,0] + [3,0,1,2] = [3,4,3,2]
 * and layers 0, 1 stay zero: hotmoe's layer l is SGLang's row l (GGUF blk.l = decoder layer l). */
static const char ds_fixture[] =
    "{\"rank\": 0, \"logical_count\": ["
    " [[0,0,0,0],[0,0,0,0],[3,1,0,2],[1,1,1,3],[0,4,2,0]],"
    " [[0,0,0,0],[0,0,0,0],[1,1,2,2],[2,0,2,2],[3,0,1,2]]],"
    " \"average_utilization_rate_over_window\": null}";

static void test_deepseek_like(void) {
    hm_err err = {{0}};
    hm_profile p;
    const char *path = tmp_file(ds_fixture, sizeof ds_fixture - 1);
    CHECKF(hm_profile_read_for(&p, path, 5, 4, &err) == HM_OK, "%s", err.msg);
    static const uint64_t want[5][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}, {4, 2, 2, 4}, {3, 1, 3, 5}, {3, 4, 3, 2}};
    CHECK(p.n_layer == 5 && p.n_expert == 4 && memcmp(p.counts, want, sizeof want) == 0);
    CHECK(hm_profile_layer_total(&p, 0) == 0 && hm_profile_layer_total(&p, 1) == 0 && hm_profile_layer_total(&p, 2) == 12);
    CHECK(p.k == 0 && p.tokens == 0); /* SGLang's dump does not say them */
    hm_profile_free(&p);
    /* a model that counted only its 3 MoE layers is not SGLang's layout: refused, saying why */
    CHECK(hm_profile_read_for(&p, path, 3, 4, &err) == HM_ERR_ARG);
    CHECKF(strstr(err.msg, "num_hidden_layers") != NULL, "%s", err.msg);
    CHECK(hm_profile_read_for(&p, path, 5, 8, &err) == HM_ERR_ARG); /* experts differ */
    unlink(path);
}

/* A Qwen3-MoE-like model: 3 layers, all sparse (decoder_sparse_step 1, no mlp_only_layers), 8
 * experts, k 2; the [layers][experts] form as --init-expert-location takes it, with counts written
 * as whole floats (a float tensor's tolist()). Row l is layer l. */
static const char qwen_fixture[] =
    "{\"logical_count\": ["
    " [5, 0, 1, 0, 2, 0, 0, 2],"
    " [0, 3, 3, 0, 0, 1, 2, 1],"
    " [1, 1, 1, 1, 1, 1, 1, 3.0]]}";

static void test_qwen3moe_like(void) {
    hm_err err = {{0}};
    hm_profile p;
    const char *path = tmp_file(qwen_fixture, sizeof qwen_fixture - 1);
    CHECKF(hm_profile_read_for(&p, path, 3, 8, &err) == HM_OK, "%s", err.msg);
    CHECK(p.n_layer == 3 && p.n_expert == 8);
    CHECK(hm_profile_count(&p, 0, 0) == 5 && hm_profile_count(&p, 0, 7) == 2 && hm_profile_count(&p, 1, 1) == 3 &&
          hm_profile_count(&p, 1, 6) == 2 && hm_profile_count(&p, 2, 7) == 3);
    for (int l = 0; l < 3; l++) CHECK(hm_profile_layer_total(&p, l) == 10); /* 5 tokens x k 2 */
    CHECK(strcmp(p.schema, "sglang.logical_count") == 0);
    hm_profile_free(&p);
    unlink(path);
}

static void expect_refused(const char *what, const char *text, size_t len, hm_status want, const char *needle) {
    hm_err err = {{0}};
    hm_profile p;
    const char *path = tmp_file(text, len);
    hm_status st = hm_profile_read(&p, path, &err);
    CHECKF(st == want, "%s: status %d, want %d (%s)", what, st, want, err.msg);
    CHECKF(strstr(err.msg, needle) != NULL, "%s: message '%s' lacks '%s'", what, err.msg, needle);
    CHECK(p.counts == NULL);
    unlink(path);
}
#define REFUSED(what, text, want, needle) expect_refused(what, text, sizeof text - 1, want, needle)

static void test_bad_input(void) {
    REFUSED("empty", "{\"logical_count\": []}", HM_ERR_FORMAT, "logical_count");
    REFUSED("flat", "{\"logical_count\": [1, 2, 3]}", HM_ERR_FORMAT, "logical_count");
    REFUSED("ragged", "{\"logical_count\": [[1, 2], [3]]}", HM_ERR_FORMAT, "logical_count[1]");
    REFUSED("ragged steps", "{\"logical_count\": [[[1, 2]], [[3, 4], [5, 6]]]}", HM_ERR_FORMAT, "logical_count[1]");
    REFUSED("negative", "{\"logical_count\": [[1, -2]]}", HM_ERR_FORMAT, "expert 1");
    REFUSED("fraction", "{\"logical_count\": [[1, 2.5]]}", HM_ERR_FORMAT, "expert 1");
    REFUSED("string", "{\"logical_count\": [[\"7\", 2]]}", HM_ERR_FORMAT, "expert 0");
    REFUSED("overflow", "{\"logical_count\": [[[9223372036854775807]], [[9223372036854775807]], "
                        "[[9223372036854775807]]]}", HM_ERR_FORMAT, "overflow");
    REFUSED("a placement", "{\"physical_to_logical_map\": [[0, 1]]}", HM_ERR_UNSUPPORTED, "logical_count");
    /* torch.save files: a zip archive (PyTorch >= 1.6) and a legacy bare pickle */
    REFUSED("torch zip", "PK\x03\x04\x14\0\0\0archive/data.pkl", HM_ERR_UNSUPPORTED, "sglang_pt_to_json.py");
    REFUSED("pickle", "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", HM_ERR_UNSUPPORTED, "torch.save");
}

/* plan --ep's placements on a case worked by hand (ep.h states the algorithm).
 * 3 layers x 4 experts over 2 devices:
 *   layer 0: all zero (a dense layer) -> no imbalance, left out of the means.
 *   layer 1: [90, 30, 20, 10] (150, mean 75 per device)
 *     contiguous: {0,1} = 120, {2,3} = 30 -> 120 / 75 = 1.6
 *     balanced, no replicas: 90 -> dev 0; 30 -> dev 1; 20 -> dev 1 (30 < 90), now full (2 slots);
 *       10 -> dev 0: [100, 50] -> 100 / 75 = 4/3
 *     2 replicas: copies go to expert 0 (90/1 the most), then again (45 > 30): 3 copies of 30 each.
 *       physical loads [30, 30, 20, 10, 30, 30] (slots 4, 5 are expert 0), 3 slots per device.
 *       heaviest first, ties by slot: s0 -> d0 (30); s1 -> d1 (30); s4 -> d0 (tie, lower) 60;
 *       s5 -> d1 60; s2 (20) -> d0 80, full; s3 (10) -> d1 70. [80, 70] -> 80 / 75 = 16/15.
 *       device 0 holds experts [0, 0, 2], device 1 [1, 0, 3].
 *   layer 2: [10, 10, 10, 10] -> 1.0 every way.
 * Means over the two loaded layers: contiguous 1.3, balanced 7/6, replicas 31/30. */
static void test_ep_hand(void) {
    hm_err err = {{0}};
    static const uint64_t w[12] = {0, 0, 0, 0, 90, 30, 20, 10, 10, 10, 10, 10};
    hm_ep_layout c, b, r;
    hm_ep_summary sc, sb, sr;
    CHECKF(hm_ep_place(&c, HM_EP_CONTIGUOUS, w, 3, 4, 2, 0, &err) == HM_OK, "%s", err.msg);
    CHECKF(hm_ep_place(&b, HM_EP_BALANCED, w, 3, 4, 2, 0, &err) == HM_OK, "%s", err.msg);
    CHECKF(hm_ep_place(&r, HM_EP_BALANCED, w, 3, 4, 2, 2, &err) == HM_OK, "%s", err.msg);
    CHECK(hm_ep_layer_imbalance(&c, 0) == 0);
    CHECK_NEAR(hm_ep_layer_imbalance(&c, 1), 1.6, 1e-12);
    CHECK_NEAR(hm_ep_layer_imbalance(&b, 1), 4.0 / 3.0, 1e-12);
    CHECK_NEAR(hm_ep_layer_imbalance(&r, 1), 16.0 / 15.0, 1e-12);
    CHECK_NEAR(hm_ep_layer_imbalance(&r, 2), 1.0, 1e-12);
    CHECK_NEAR(c.dev_load[2], 120, 1e-12);
    CHECK_NEAR(c.dev_load[3], 30, 1e-12);
    CHECK_NEAR(r.dev_load[2], 80, 1e-12);
    CHECK_NEAR(r.dev_load[3], 70, 1e-12);
    CHECK(r.n_phys == 6);
    static const int32_t p2l[6] = {0, 0, 2, 1, 0, 3};
    CHECK(memcmp(r.phys_to_log + 6, p2l, sizeof p2l) == 0);
    CHECK(r.copies[4] == 3 && r.copies[5] == 1 && r.copies[6] == 1 && r.copies[7] == 1);
    hm_ep_summarize(&c, &sc);
    hm_ep_summarize(&b, &sb);
    hm_ep_summarize(&r, &sr);
    CHECK(sc.n_moe_layers == 2 && sr.n_moe_layers == 2);
    CHECK_NEAR(sc.mean_imbalance, 1.3, 1e-12);
    CHECK_NEAR(sb.mean_imbalance, 7.0 / 6.0, 1e-12);
    CHECK_NEAR(sr.mean_imbalance, 31.0 / 30.0, 1e-12);
    CHECK(sc.worst_layer == 1 && sr.worst_layer == 1);
    hm_ep_layout_free(&c);
    hm_ep_layout_free(&b);
    hm_ep_layout_free(&r);
    /* shapes SGLang refuses too: physical experts not a multiple of the devices */
    CHECK(hm_ep_place(&r, HM_EP_BALANCED, w, 3, 4, 3, 0, &err) == HM_ERR_ARG && r.dev_load == NULL);
    CHECK(hm_ep_place(&r, HM_EP_BALANCED, w, 3, 4, 2, 1, &err) == HM_ERR_ARG);
    CHECK(hm_ep_place(&r, HM_EP_CONTIGUOUS, w, 3, 4, 2, 2, &err) == HM_ERR_ARG);
    CHECK(hm_ep_place(&r, HM_EP_BALANCED, w, 3, 4, 0, 0, &err) == HM_ERR_ARG);
}

int main(void) {
    test_roundtrip();
    test_deepseek_like();
    test_qwen3moe_like();
    test_bad_input();
    test_ep_hand();
    return test_done();
}
