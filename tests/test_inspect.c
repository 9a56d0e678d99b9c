/* test_inspect.c - the expert-unit accounting (experts/units) and inspect on hand-made GGUF
 * files: small f32 tensors whose byte counts are derived by hand below.
 *
 *  - a layer with gate/up/down, a dense layer, a layer with a fused gate_up: n_units, per-layer
 *    unit bytes, slab file offsets, expert vs dense bytes, units that fit a budget;
 *  - n_layer from the tensor names when block_count is absent;
 *  - malformed expert tensors (2-D, ne[2] != expert_count, missing down, gate_up and gate both,
 *    a layer past block_count) are HM_ERR_FORMAT naming the tensor or layer, and inspect fails
 *    with that message instead of printing. */
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "experts/units.h"
#include "gguf/gguf.h"
#include "hotmoe_tools.h"
#include "quant/quant.h"
#include "test.h"

static char tmpdir[256];

typedef struct tdesc {
    const char *name;
    uint32_t n_dims;
    int64_t ne[3];
} tdesc;

/* Write a qwen3moe-like file: block_count (< 0: absent), expert_count 4, f32 tensors of zeros. */
static const char *write_file(const char *name, int block_count, const tdesc *t, int n) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    hm_gguf_writer *w = NULL;
    hm_err err = {{0}};
    hm_status st = hm_gguf_writer_open(&w, path, 0, &err);
    if (!st) st = hm_gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    if (!st && block_count >= 0) st = hm_gguf_writer_set_u32(w, "qwen3moe.block_count", (uint32_t)block_count);
    if (!st) st = hm_gguf_writer_set_u32(w, "qwen3moe.expert_count", 4);
    if (!st) st = hm_gguf_writer_set_u32(w, "qwen3moe.expert_used_count", 2);
    for (int i = 0; !st && i < n; i++) st = hm_gguf_writer_add_tensor(w, t[i].name, HM_TYPE_F32, t[i].n_dims, t[i].ne);
    if (!st) st = hm_gguf_writer_begin_data(w);
    static const float zeros[256];
    for (int i = 0; !st && i < n; i++) {
        int64_t bytes = 4;
        for (uint32_t d = 0; d < t[i].n_dims; d++) bytes *= t[i].ne[d];
        for (; !st && bytes > 0; bytes -= (int64_t)sizeof zeros)
            st = hm_gguf_writer_write(w, zeros, bytes < (int64_t)sizeof zeros ? (size_t)bytes : sizeof zeros);
    }
    if (!st) st = hm_gguf_writer_finish(w);
    else hm_gguf_writer_abort(w);
    CHECKF(st == HM_OK, "writing %s: %s", name, err.msg);
    return path;
}

static hm_status units_of(const char *path, hm_units *u, hm_err *err) {
    hm_gguf *g = NULL;
    memset(u, 0, sizeof *u);
    hm_status st = hm_gguf_open(&g, path, err);
    if (st) return st;
    st = hm_units_init(u, g, err);
    /* u points into g: callers here only read numbers, offsets are checked in check_good */
    hm_gguf_close(g);
    return st;
}

static void check_good(void) {
    /* layer 0: gate/up {8, 6, 4}, down {6, 8, 4}: slab 8*6*4 = 192 bytes each, unit 576.
     * layer 1: dense (no expert tensors). layer 2: gate_up {8, 12, 4} (slab 384) + down: unit 576.
     * dense: token_embd {8, 10} 320 + attn_q {8, 8} 256 + ffn_gate_inp {8, 4} 128 = 704. */
    const tdesc t[] = {
        {"token_embd.weight", 2, {8, 10, 1}},
        {"blk.0.ffn_gate_inp.weight", 2, {8, 4, 1}},
        {"blk.0.ffn_gate_exps.weight", 3, {8, 6, 4}},
        {"blk.0.ffn_up_exps.weight", 3, {8, 6, 4}},
        {"blk.0.ffn_down_exps.weight", 3, {6, 8, 4}},
        {"blk.1.attn_q.weight", 2, {8, 8, 1}},
        {"blk.2.ffn_gate_up_exps.weight", 3, {8, 12, 4}},
        {"blk.2.ffn_down_exps.weight", 3, {6, 8, 4}},
    };
    const char *path = write_file("good.gguf", 3, t, 8);
    hm_gguf *g = NULL;
    hm_err err = {{0}};
    if (hm_gguf_open(&g, path, &err) != HM_OK) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    hm_units u;
    hm_status st = hm_units_init(&u, g, &err);
    CHECKF(st == HM_OK, "%s", err.msg);
    if (!st) {
        CHECK(u.n_layer == 3 && u.n_expert == 4 && u.n_expert_used == 2 && u.n_units == 8);
        CHECK(u.layers[0].n_expert == 4 && u.layers[1].n_expert == 0 && u.layers[2].n_expert == 4);
        CHECK(u.layers[0].unit_bytes == 576 && u.layers[2].unit_bytes == 576);
        CHECK(u.layers[2].slab_bytes[HM_UNIT_GATE_UP] == 384 && u.layers[2].part[HM_UNIT_GATE] == NULL);
        CHECK(u.unit_bytes_max == 576 && u.unit_bytes_min == 576);
        CHECK(u.expert_bytes == 8 * 576 && u.dense_bytes == 704 && u.tensor_bytes == 8 * 576 + 704);
        const hm_gguf_tensor *down = hm_gguf_find_tensor(g, "blk.0.ffn_down_exps.weight");
        CHECK(hm_units_offset(&u, 0, 3, HM_UNIT_DOWN) == down->file_offset + 3 * 192);
        CHECK(hm_units_offset(&u, 2, 1, HM_UNIT_UP) == 0); /* fused layer: no separate up */
        CHECK(hm_units_fit(&u, 576 * 5 / 2) == 2);
        CHECK(hm_units_fit(&u, 1 << 30) == 8);
        CHECK(hm_units_fit(&u, -1) == 0);
        hm_units_free(&u);
        hm_units_free(&u); /* idempotent */
    }
    hm_gguf_close(g);

    /* inspect --json agrees */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    hm_inspect_opts o = {.json = true, .budget = 1200};
    st = hm_inspect(path, &o, f, &err);
    fclose(f);
    CHECKF(st == HM_OK, "%s", err.msg);
    json_t *j = st ? NULL : json_loads(buf, 0, NULL);
    CHECK(j != NULL);
    if (j) {
        CHECK(json_integer_value(json_object_get(j, "n_units")) == 8);
        CHECK(json_integer_value(json_object_get(j, "unit_bytes")) == 576);
        CHECK(json_integer_value(json_object_get(j, "dense_bytes")) == 704);
        CHECK(json_integer_value(json_object_get(j, "units_in_budget")) == 2);
        CHECK(json_integer_value(json_object_get(j, "n_vocab")) == 10); /* from token_embd */
        json_t *l2 = json_array_get(json_object_get(j, "layers"), 2);
        CHECK(json_object_get(json_object_get(l2, "parts"), "ffn_gate_up_exps") != NULL);
        json_decref(j);
    }
    free(buf);

    /* no block_count: layers from the names */
    path = write_file("noblocks.gguf", -1, t, 8);
    st = units_of(path, &u, &err);
    CHECKF(st == HM_OK && u.n_layer == 3 && u.n_units == 8, "no block_count: %s", err.msg);
    hm_units_free(&u);
}

static void check_bad(const char *what, int block_count, const tdesc *t, int n, const char *needle) {
    char name[64];
    snprintf(name, sizeof name, "bad-%s.gguf", what);
    const char *path = write_file(name, block_count, t, n);
    hm_units u;
    hm_err err = {{0}};
    hm_status st = units_of(path, &u, &err);
    CHECKF(st == HM_ERR_FORMAT && strstr(err.msg, needle), "%s: %d '%s'", what, st, err.msg);
    CHECK(u.layers == NULL && u.n_units == 0); /* left empty */
    FILE *devnull = fopen("/dev/null", "w");
    hm_inspect_opts o = {.json = false, .budget = -1};
    st = hm_inspect(path, &o, devnull, &err);
    CHECKF(st == HM_ERR_FORMAT && strstr(err.msg, needle), "inspect %s: %d '%s'", what, st, err.msg);
    fclose(devnull);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hm_test_inspect_%d", (int)getpid());
    mkdir(tmpdir, 0700);
    check_good();
    const tdesc two_d[] = {{"blk.0.ffn_gate_exps.weight", 2, {8, 24, 1}}};
    check_bad("2d", 1, two_d, 1, "blk.0.ffn_gate_exps.weight");
    const tdesc wrong_e[] = {{"blk.0.ffn_up_exps.weight", 3, {8, 6, 3}}};
    check_bad("ne2", 1, wrong_e, 1, "expert_count is 4");
    const tdesc no_down[] = {{"blk.0.ffn_gate_exps.weight", 3, {8, 6, 4}}, {"blk.0.ffn_up_exps.weight", 3, {8, 6, 4}}};
    check_bad("nodown", 1, no_down, 2, "lacks ffn_down_exps");
    const tdesc both[] = {{"blk.0.ffn_gate_exps.weight", 3, {8, 6, 4}}, {"blk.0.ffn_up_exps.weight", 3, {8, 6, 4}},
                          {"blk.0.ffn_gate_up_exps.weight", 3, {8, 12, 4}}, {"blk.0.ffn_down_exps.weight", 3, {6, 8, 4}}};
    check_bad("both", 1, both, 4, "only one of");
    const tdesc past[] = {{"blk.5.ffn_down_exps.weight", 3, {6, 8, 4}}};
    check_bad("past", 2, past, 1, "layer 5");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done();
}
