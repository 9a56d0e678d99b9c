/* test_gpu_split.c - the multi-GPU placement plan (exec/gpu_split.h, issue 11), on the CPU:
 * parsing --vram-budget (one size, one per device, the seed's MiB env form) and -ts; llama.cpp's
 * layer split on cases derived by hand; the plan's devices, budgets and refusals; hot units placed
 * on the device of their layer first, overflow to the device with room (peer), never over budget.
 *
 * The layer rule reproduced is llama.cpp's llama_model::load_tensors (src/llama-model.cpp, read at
 * unslothai/llama.cpp d32676d): with every layer offloaded (-ngl >= n_layer + 1, act = n_layer + 1
 * "layers" counting the output), splits[i] = (w[0] + .. + w[i]) / sum in float, and layer il in
 * 0..n_layer (il = n_layer: the output) goes to device
 *     std::upper_bound(splits, splits + n, float(il) / act) - splits,
 * i.e. the first device whose cumulative fraction is strictly above il / act. The expected values
 * below are worked out from that rule by hand (the float values where rounding decides). */
#include <string.h>

#include "exec/gpu_split.h"
#include "test.h"

#define GIB ((int64_t)1 << 30)
#define MIB ((int64_t)1 << 20)

static hm_placement_opts opts(void) {
    hm_placement_opts o;
    hm_placement_opts_default(&o);
    return o;
}

/* The parse fails and the message contains want; o is left as it was. */
static void bad_budget(const char *s, bool mib, const char *want) {
    hm_placement_opts o = opts();
    o.vram_budget = 7;
    hm_err err = {{0}};
    CHECKF(hm_parse_vram_budget(s, mib, &o, &err) == HM_ERR_ARG, "'%s' accepted", s);
    CHECKF(strstr(err.msg, want) != NULL, "'%s': message '%s' lacks '%s'", s, err.msg, want);
    CHECK(o.vram_budget == 7 && o.n_vram_budgets == 0);
}

static void bad_split(const char *s, const char *want) {
    hm_placement_opts o = opts();
    hm_err err = {{0}};
    CHECKF(hm_parse_tensor_split(s, &o, &err) == HM_ERR_ARG, "'%s' accepted", s);
    CHECKF(strstr(err.msg, want) != NULL, "'%s': message '%s' lacks '%s'", s, err.msg, want);
    CHECK(o.n_tensor_split == 0);
}

static void test_parse_budget(void) {
    hm_placement_opts o = opts();
    hm_err err;
    CHECK(hm_parse_vram_budget("12GiB", false, &o, &err) == HM_OK && o.vram_budget == 12 * GIB && !o.n_vram_budgets);
    CHECK(hm_parse_vram_budget("auto", false, &o, &err) == HM_OK && o.vram_budget == -1);
    CHECK(hm_parse_vram_budget("-1", false, &o, &err) == HM_OK && o.vram_budget == -1);
    CHECK(hm_parse_vram_budget("0", false, &o, &err) == HM_OK && o.vram_budget == 0);
    CHECK(!hm_placement_wants_gpu(&o));

    CHECK(hm_parse_vram_budget("0:11GiB,1:11GiB,2:5GiB", false, &o, &err) == HM_OK);
    CHECK(o.n_vram_budgets == 3 && o.vram_budget == 0);
    CHECK(o.vram_budgets[0].device == 0 && o.vram_budgets[0].bytes == 11 * GIB);
    CHECK(o.vram_budgets[1].device == 1 && o.vram_budgets[1].bytes == 11 * GIB);
    CHECK(o.vram_budgets[2].device == 2 && o.vram_budgets[2].bytes == 5 * GIB);
    CHECK(hm_placement_wants_gpu(&o));
    CHECK(hm_parse_vram_budget("3:auto,1:512MiB", false, &o, &err) == HM_OK && o.n_vram_budgets == 2);
    CHECK(o.vram_budgets[0].device == 3 && o.vram_budgets[0].bytes == -1);
    CHECK(o.vram_budgets[1].device == 1 && o.vram_budgets[1].bytes == 512 * MIB);
    CHECK(hm_parse_vram_budget("15:0", false, &o, &err) == HM_OK && o.n_vram_budgets == 1 && !o.vram_budgets[0].bytes);
    CHECK(hm_placement_wants_gpu(&o)); /* "15:0": the GPU, no slots */
    /* the single form after a list: the list is gone */
    CHECK(hm_parse_vram_budget("2GiB", false, &o, &err) == HM_OK && o.vram_budget == 2 * GIB && !o.n_vram_budgets);

    /* the seed's env form: MiB */
    CHECK(hm_parse_vram_budget("0:11800,1:11800", true, &o, &err) == HM_OK && o.n_vram_budgets == 2);
    CHECK(o.vram_budgets[0].bytes == 11800 * MIB && o.vram_budgets[1].bytes == 11800 * MIB);
    CHECK(hm_parse_vram_budget("1:-1", true, &o, &err) == HM_OK && o.vram_budgets[0].bytes == -1);
    CHECK(hm_parse_vram_budget("4096", true, &o, &err) == HM_OK && o.vram_budget == 4096 * MIB);

    bad_budget("0:11GiB,x", false, "bad device 'x'");
    bad_budget("x:5GiB", false, "bad device 'x'");
    bad_budget("16:1GiB", false, "bad device '16'");
    bad_budget("-1:1GiB", false, "bad device '-1'");
    bad_budget("0:11GiB,12GiB", false, "bad device '12GiB'");
    bad_budget("0:11GiB,1", false, "no size for device 1");
    bad_budget("0:11GiB,0:5GiB", false, "device 0 is given twice");
    bad_budget("0:lots", false, "bad size 'lots' for device 0");
    bad_budget("1:", false, "bad size '' for device 1");
    bad_budget("0:1GiB,", false, "empty entry");
    bad_budget(",0:1GiB", false, "empty entry");
    bad_budget("lots", false, "got 'lots'");
    bad_budget("-5GiB", false, "got '-5GiB'");
    bad_budget("", false, "empty value");
    bad_budget("0:11GiB", true, "bad size '11GiB' for device 0");
    bad_budget("0:-2", true, "bad size '-2'");
    bad_budget("12GiB", true, "got '12GiB'");
}

static void test_parse_split(void) {
    hm_placement_opts o = opts();
    hm_err err;
    CHECK(!hm_placement_wants_gpu(&o));
    CHECK(hm_parse_tensor_split("3,1", &o, &err) == HM_OK && o.n_tensor_split == 2);
    CHECK(o.tensor_split[0] == 3.0f && o.tensor_split[1] == 1.0f && o.tensor_split[2] == 0.0f);
    CHECK(hm_placement_wants_gpu(&o));
    /* llama.cpp splits on [,/]+: '/' too, runs of separators are one, a trailing one ends the list */
    CHECK(hm_parse_tensor_split("0.5/0.25", &o, &err) == HM_OK && o.n_tensor_split == 2);
    CHECK(o.tensor_split[0] == 0.5f && o.tensor_split[1] == 0.25f);
    CHECK(hm_parse_tensor_split("1,,/2,", &o, &err) == HM_OK && o.n_tensor_split == 2 && o.tensor_split[1] == 2.0f);
    CHECK(hm_parse_tensor_split("0,0", &o, &err) == HM_OK && o.n_tensor_split == 2);
    CHECK(!hm_placement_wants_gpu(&o)); /* all zero: llama.cpp's default, asks for nothing */
    CHECK(hm_parse_tensor_split("1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", &o, &err) == HM_OK && o.n_tensor_split == 16);
    o = opts();
    CHECK(hm_parse_tensor_split("5", &o, &err) == HM_OK && o.n_tensor_split == 1);

    bad_split("3,x", "bad share 'x' for device 1");
    bad_split("-1,1", "bad share '-1' for device 0");
    bad_split("1,nan", "bad share 'nan'");
    bad_split("inf", "bad share 'inf'");
    bad_split("1e39", "bad share '1e39'");
    bad_split(",3", "empty entry");
    bad_split("", "empty value");
    bad_split("1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", "more than 16 entries");
}

/* hm_gpu_split_layers on w[0..n) over n_layer layers equals want[0..n_layer] (the output last). */
static void split_is(const float *w, int32_t n, int32_t n_layer, const int32_t *want, const char *what) {
    int32_t got[128];
    if (n_layer >= 128) return;
    hm_gpu_split_layers(w, n, n_layer, got);
    for (int32_t il = 0; il <= n_layer; il++)
        CHECKF(got[il] == want[il], "%s: layer %d on device %d, want %d", what, (int)il, (int)got[il], (int)want[il]);
}

/* want[i] = the first layer of device i (ranges are contiguous), want[n] = n_layer */
static void ranges_are(const float *w, int32_t n, int32_t n_layer, const int32_t *first, int32_t out,
                       const char *what) {
    int32_t want[128];
    for (int32_t i = 0; i < n; i++)
        for (int32_t il = first[i]; il < first[i + 1]; il++) want[il] = i;
    want[n_layer] = out;
    split_is(w, n, n_layer, want, what);
}

static void test_llama_split(void) {
    /* 48 layers, -ts 3,1: splits {0.75, 1}, act 49. Device 0 while il/49 < 0.75, i.e. il <= 36
     * (36/49 = 0.735, 37/49 = 0.755): layers 0..36 (37 of them), device 1 layers 37..47 and the
     * output (48/49). */
    ranges_are((const float[]){3, 1}, 2, 48, (const int32_t[]){0, 37, 48}, 1, "48 x 3,1");
    /* 40 layers, -ts 1,1,1: splits {1/3, 2/3, 1} (0.33333334f, 0.6666667f), act 41. il/41 < 1/3
     * for il <= 13 (13.67), < 2/3 for il <= 27 (27.33): 0..13, 14..27, 28..39 + output. */
    ranges_are((const float[]){1, 1, 1}, 3, 40, (const int32_t[]){0, 14, 28, 40}, 2, "40 x 1,1,1");
    /* exactly on a boundary: 3 layers, 1,1 -> splits {0.5, 1}, act 4; layer 2 is at 2/4 = 0.5,
     * not above it, so upper_bound passes it to device 1: 0..1 | 2 + output. */
    ranges_are((const float[]){1, 1}, 2, 3, (const int32_t[]){0, 2, 3}, 1, "3 x 1,1 boundary");
    /* 8 layers, 1,1,1, act 9: 3.0f/9 and 1.0f/3 are the same float (0.333333343), as are 6.0f/9
     * and 2.0f/3 (0.666666687): layers 3 and 6 sit on boundaries and go up: 0..2 | 3..5 | 6..7. */
    ranges_are((const float[]){1, 1, 1}, 3, 8, (const int32_t[]){0, 3, 6, 8}, 2, "8 x 1,1,1 boundaries");
    /* float rounding decides: 8 layers, -ts 0.4,0.5, act 9. In exact arithmetic split 0 is 4/9 and
     * layer 4 (4/9) would go to device 1. In float 0.4f + 0.5f is a tie that rounds to even,
     * 0.899999976, so splits[0] = 0.4f / 0.899999976 = 0.444444478 > 4.0f/9 = 0.444444448:
     * layer 4 stays on device 0 (as in llama.cpp): 0..4 | 5..7 + output. */
    ranges_are((const float[]){0.4f, 0.5f}, 2, 8, (const int32_t[]){0, 5, 8}, 1, "8 x 0.4,0.5 float");
    /* a zero share: 4 layers, 1,0,1 -> splits {0.5, 0.5, 1}, act 5: device 1 never is the first
     * above; il/5 < 0.5 for il <= 2: 0..2 on 0, 3 + output on 2. */
    split_is((const float[]){1, 0, 1}, 3, 4, (const int32_t[]){0, 0, 0, 2, 2}, "4 x 1,0,1");
    /* one layer, 1,1: act 2; layer 0 at 0 on device 0, the output at 0.5 on device 1 */
    split_is((const float[]){1, 1}, 2, 1, (const int32_t[]){0, 1}, "1 x 1,1");
    /* more devices than layers: 2 layers, 1,1,1,1 -> {0.25, 0.5, 0.75, 1}, act 3: 0 -> 0,
     * 1/3 -> 1, the output 2/3 -> 2, device 3 nothing */
    split_is((const float[]){1, 1, 1, 1}, 4, 2, (const int32_t[]){0, 1, 2}, "2 x 1,1,1,1");
    /* the default split weighs free bytes: 2x 24 GiB + 12 GiB (2x RTX 3090 + RTX 3060), 48 layers:
     * splits {0.4, 0.8, 1}, act 49; il/49 < 0.4 for il <= 19 (19.6), < 0.8 for il <= 39 (39.2) */
    ranges_are((const float[]){24.0f * GIB, 24.0f * GIB, 12.0f * GIB}, 3, 48, (const int32_t[]){0, 20, 40, 48}, 2,
               "48 by free 24,24,12 GiB");
}

static void test_plan(void) {
    hm_gpu_plan p;
    hm_err err = {{0}};
    hm_placement_opts o = opts();

    /* no per-device flag: main_gpu alone, every layer on it; budget 0 = by the layer flags */
    CHECK(hm_gpu_plan_make(&p, &o, 48, 2, NULL, &err) == HM_OK);
    CHECK(p.n_dev == 1 && p.dev[0] == 0 && p.by_layer && p.by_free);
    CHECK(p.layer_begin[0] == 0 && p.layer_end[0] == 48 && p.output_dev == 0);
    o.main_gpu = 1;
    o.vram_budget = 12 * GIB;
    CHECK(hm_gpu_plan_make(&p, &o, 48, 2, NULL, &err) == HM_OK);
    CHECK(p.n_dev == 1 && p.dev[0] == 1 && p.budget[0] == 12 * GIB && !p.by_layer);
    o.main_gpu = 2;
    CHECK(hm_gpu_plan_make(&p, &o, 48, 2, NULL, &err) == HM_ERR_ARG && strstr(err.msg, "--main-gpu 2"));

    /* a per-device list of one device: that device alone (what -mg N --vram-budget SIZE does) */
    o = opts();
    CHECK(hm_parse_vram_budget("1:5GiB", false, &o, &err) == HM_OK);
    CHECK(hm_gpu_plan_make(&p, &o, 48, 2, NULL, &err) == HM_OK);
    CHECK(p.n_dev == 1 && p.dev[0] == 1 && p.budget[0] == 5 * GIB && p.layer_end[0] == 48);

    /* the seed's 3-GPU box: budgets per device, layers by free memory */
    const int64_t freeb[3] = {24 * GIB, 24 * GIB, 12 * GIB};
    CHECK(hm_parse_vram_budget("0:11GiB,1:11GiB,2:5GiB", false, &o, &err) == HM_OK);
    CHECK(hm_gpu_plan_make(&p, &o, 48, 3, freeb, &err) == HM_OK);
    CHECK(p.n_dev == 3 && p.dev[0] == 0 && p.dev[1] == 1 && p.dev[2] == 2 && p.by_free && !p.by_layer);
    CHECK(p.budget[0] == 11 * GIB && p.budget[1] == 11 * GIB && p.budget[2] == 5 * GIB);
    CHECK(p.layer_begin[0] == 0 && p.layer_end[0] == 20 && p.layer_begin[1] == 20 && p.layer_end[1] == 40);
    CHECK(p.layer_begin[2] == 40 && p.layer_end[2] == 48 && p.output_dev == 2);
    CHECK(hm_gpu_plan_layer_dev(&p, 19) == 0 && hm_gpu_plan_layer_dev(&p, 20) == 1);
    CHECK(hm_gpu_plan_layer_dev(&p, 48) == 2);
    /* the same list on a 2-GPU machine names a device that is not there */
    CHECK(hm_gpu_plan_make(&p, &o, 48, 2, freeb, &err) == HM_ERR_ARG);
    CHECK(strstr(err.msg, "--vram-budget names CUDA device 2 but there are 2 CUDA devices") != NULL);
    /* listed devices only: 0 and 2, by their free bytes 24 : 12 -> {2/3, 1}, act 49: il <= 32 */
    CHECK(hm_parse_vram_budget("2:5GiB,0:11GiB", false, &o, &err) == HM_OK);
    CHECK(hm_gpu_plan_make(&p, &o, 48, 3, freeb, &err) == HM_OK);
    CHECK(p.n_dev == 2 && p.dev[0] == 0 && p.dev[1] == 2 && p.budget[0] == 11 * GIB && p.budget[1] == 5 * GIB);
    CHECK(p.layer_end[0] == 33 && p.layer_begin[1] == 33 && p.layer_end[1] == 48);

    /* -ts with the single budget: every device in the split gets it */
    o = opts();
    o.vram_budget = -1;
    CHECK(hm_parse_tensor_split("3,1", &o, &err) == HM_OK);
    CHECK(hm_gpu_plan_make(&p, &o, 48, 2, freeb, &err) == HM_OK);
    CHECK(p.n_dev == 2 && p.budget[0] == -1 && p.budget[1] == -1 && !p.by_free);
    CHECK(p.layer_end[0] == 37 && p.layer_begin[1] == 37 && p.layer_end[1] == 48 && p.output_dev == 1);
    CHECK(hm_gpu_plan_make(&p, &o, 48, 1, freeb, &err) == HM_ERR_ARG);
    CHECK(strstr(err.msg, "--tensor-split gives CUDA device 1 a share but there is 1 CUDA device") != NULL);
    /* -ts 0,1: device 1 alone (llama.cpp puts every layer there too) */
    CHECK(hm_parse_tensor_split("0,1", &o, &err) == HM_OK);
    CHECK(hm_gpu_plan_make(&p, &o, 48, 2, NULL, &err) == HM_OK && p.n_dev == 1 && p.dev[0] == 1);
    /* -ts all zero: llama.cpp's default, i.e. no -ts: main_gpu */
    CHECK(hm_parse_tensor_split("0,0", &o, &err) == HM_OK);
    CHECK(hm_gpu_plan_make(&p, &o, 48, 2, NULL, &err) == HM_OK && p.n_dev == 1 && p.dev[0] == 0 && p.by_free);
    /* -ts and a list: a device with a budget but no share holds peer units only; one with a share
     * but no budget gets 0 bytes */
    CHECK(hm_parse_tensor_split("1,0,1", &o, &err) == HM_OK);
    CHECK(hm_parse_vram_budget("0:4GiB,1:2GiB", false, &o, &err) == HM_OK);
    CHECK(hm_gpu_plan_make(&p, &o, 4, 3, NULL, &err) == HM_OK && p.n_dev == 3);
    CHECK(p.budget[0] == 4 * GIB && p.budget[1] == 2 * GIB && p.budget[2] == 0);
    CHECK(p.layer_end[0] == 3 && p.layer_begin[1] == 3 && p.layer_end[1] == 3 && p.layer_end[2] == 4);
    CHECK(p.output_dev == 2);
}

static void test_place_fixed(void) {
    hm_placement_opts o = opts();
    hm_gpu_plan p;
    hm_err err;
    CHECK(hm_parse_tensor_split("3,1", &o, &err) == HM_OK);
    CHECK(hm_gpu_plan_make(&p, &o, 48, 2, NULL, &err) == HM_OK); /* 0..36 | 37..47 */
    const int32_t layer[10] = {0, 40, 1, 41, 2, 42, 43, 44, 3, 45}; /* hottest first */
    int32_t dev[10];
    uint8_t peer[10];
    int64_t used[2];
    /* with peers, slots {4, 1}: the hot set is the first 5; 0, 1, 2 and 40 on their own devices;
     * 41 finds device 1 full and goes to device 0 (the one with room), as a peer unit */
    CHECK(hm_gpu_plan_place_units(&p, (const int64_t[]){4, 1}, layer, 10, true, dev, peer, used) == 5);
    const int32_t want_dev[10] = {0, 1, 0, 0, 0, -1, -1, -1, -1, -1};
    const uint8_t want_peer[10] = {0, 0, 0, 1, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < 10; k++) CHECKF(dev[k] == want_dev[k] && peer[k] == want_peer[k], "peer unit %d", k);
    CHECK(used[0] == 4 && used[1] == 1);
    /* without: each device the hottest of its own layers; 41 stays on the CPU, so does every
     * later unit of device 1, and device 0's last slot goes to layer 3 */
    CHECK(hm_gpu_plan_place_units(&p, (const int64_t[]){4, 1}, layer, 10, false, dev, peer, used) == 5);
    const int32_t want_own[10] = {0, 1, 0, -1, 0, -1, -1, -1, 0, -1};
    for (int k = 0; k < 10; k++) CHECKF(dev[k] == want_own[k] && !peer[k], "own unit %d", k);
    CHECK(used[0] == 4 && used[1] == 1);
    /* more slots than units: all placed, each on its own device */
    CHECK(hm_gpu_plan_place_units(&p, (const int64_t[]){100, 100}, layer, 10, true, dev, NULL, used) == 10);
    for (int k = 0; k < 10; k++) CHECK(dev[k] == (layer[k] >= 37));
    CHECK(used[0] == 4 && used[1] == 6);
    /* no slots: nothing placed */
    CHECK(hm_gpu_plan_place_units(&p, (const int64_t[]){0, 0}, layer, 10, true, dev, peer, NULL) == 0);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* Random plans, slots and rankings: the invariants of hm_gpu_plan_place_units. */
static void test_place_random(void) {
    enum { N = 400 };
    for (int it = 0; it < 300; it++) {
        hm_placement_opts o = opts();
        const int32_t n_cuda = 1 + (int32_t)rnd(4), n_layer = 1 + (int32_t)rnd(60);
        o.n_tensor_split = n_cuda;
        for (int32_t d = 0; d < n_cuda; d++) o.tensor_split[d] = (float)rnd(4);
        o.tensor_split[rnd((uint32_t)n_cuda)] = 1.0f + (float)rnd(3);
        hm_gpu_plan p;
        hm_err err;
        if (hm_gpu_plan_make(&p, &o, n_layer, n_cuda, NULL, &err) != HM_OK) {
            CHECKF(0, "plan: %s", err.msg);
            continue;
        }
        int64_t slots[HM_MAX_GPUS], total = 0;
        for (int32_t i = 0; i < p.n_dev; i++) total += slots[i] = rnd(5) ? (int64_t)rnd(N / 3) : 0;
        const int64_t n = (int64_t)rnd(N);
        int32_t layer[N], dev[N];
        uint8_t peer[N];
        int64_t used[HM_MAX_GPUS];
        for (int64_t k = 0; k < n; k++) layer[k] = (int32_t)rnd((uint32_t)n_layer);
        for (int pass = 0; pass < 2; pass++) {
            const bool allow = pass == 0;
            const int64_t placed = hm_gpu_plan_place_units(&p, slots, layer, n, allow, dev, peer, used);
            int64_t count[HM_MAX_GPUS] = {0}, got = 0;
            for (int64_t k = 0; k < n; k++) {
                if (dev[k] < 0) continue;
                CHECK(dev[k] < p.n_dev);
                count[dev[k]]++;
                got++;
                const int32_t own = hm_gpu_plan_layer_dev(&p, layer[k]);
                CHECK(peer[k] == (dev[k] != own)); /* peer exactly when not on its layer's device */
                CHECK(allow || !peer[k]);
            }
            CHECK(got == placed);
            for (int32_t i = 0; i < p.n_dev; i++) CHECK(count[i] == used[i] && used[i] <= slots[i]);
            const int64_t hot = n < total ? n : total;
            for (int64_t k = 0; k < n; k++) {
                const int32_t own = hm_gpu_plan_layer_dev(&p, layer[k]);
                const bool full = used[own] == slots[own];
                if (allow) {
                    CHECK((dev[k] >= 0) == (k < hot)); /* the hot set, all of it, and nothing else */
                    if (peer[k]) CHECK(full);           /* a peer unit only when its device is full */
                } else if (dev[k] < 0) {
                    CHECK(full); /* out only because its own device is full */
                }
            }
            if (allow) CHECK(placed == hot);
        }
    }
}

int main(void) {
    test_parse_budget();
    test_parse_split();
    test_llama_split();
    test_plan();
    test_place_fixed();
    test_place_random();
    return test_done();
}
