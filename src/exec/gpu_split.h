/* gpu_split.h - the multi-GPU placement plan (issue 11): which device runs each layer's dense part
 * (attention + KV cache), how many bytes of expert slots each device gets, and which device holds
 * each hot expert unit. Pure C, no CUDA: built in every build and tested on the CPU
 * (tests/test_gpu_split.c). The engine executes a plan of one device today; a plan of several is
 * refused at model open (hm_model_gpu_open) until the multi-GPU forward exists.
 *
 * Vocabulary: a "CUDA ordinal" is the device number the flags use (-mg 1, --vram-budget 1:5GiB,
 * the second -ts entry); a "plan device" is an index 0..n_dev-1 into hm_gpu_plan.dev[], which lists
 * the ordinals the plan uses in ascending order.
 *
 * The layer split is llama.cpp's for `-ngl` covering every layer (hotmoe always keeps every
 * layer's dense part on a GPU): llama_model::load_tensors (src/llama-model.cpp) turns the split
 * weights w[0..n) (the -ts values, or each device's free bytes when -ts is absent or all zero)
 * into float cumulative fractions s[i] = (w[0]+..+w[i]) / sum, and gives layer il (0..n_layer;
 * il = n_layer is the output norm + head) to the first device i with s[i] > float(il)/(n_layer+1)
 * (std::upper_bound). So each device gets one contiguous range of layers, a device of weight 0
 * none, a layer exactly on a boundary goes to the later device, and the output goes with the last
 * layers. Computed in float as llama.cpp does, so rounding at the boundaries matches it too.
 *
 * Expert units follow their layer: a device's slot budget is spent on the hot units of its own
 * layers first (their input is already there); units that do not fit go to the device with the
 * most room left, marked `peer` (the next session's forward copies the layer's input there and the
 * result back), or stay on the CPU when peer placement is off. Invariants of
 * hm_gpu_plan_place_units: no device over its slots, every unit at most once, a unit's own device
 * before any other, and no colder unit in VRAM while a hotter one that could go there stays out. */
#ifndef HM_EXEC_GPU_SPLIT_H
#define HM_EXEC_GPU_SPLIT_H

#include <stdbool.h>
#include <stdint.h>

#include "hotmoe.h"

typedef struct hm_gpu_plan {
    int32_t n_dev;               /* plan devices; 1 = today's single-device engine */
    int32_t dev[HM_MAX_GPUS];    /* CUDA ordinal of plan device i, ascending */
    int64_t budget[HM_MAX_GPUS]; /* bytes of expert slots on plan device i; -1 = auto (that device's
                                    free VRAM after its dense part, KV and activations, minus the
                                    reserve); unused when by_layer */
    bool by_layer;               /* no --vram-budget at all: each device's slots are the units of its
                                    own layers the single-device flags put in VRAM (-ngl alone: all;
                                    --n-cpu-moe N: layers >= N; --cpu-moe: none) */
    bool by_free;                /* the layer split followed free memory (no -ts, or -ts all zero) */
    int32_t n_layer;
    int32_t layer_begin[HM_MAX_GPUS]; /* plan device i runs the dense part (attention, norms,  */
    int32_t layer_end[HM_MAX_GPUS];   /* router) and the KV cache of layers [begin, end)        */
    int32_t output_dev;          /* plan device of the output norm + head (llama.cpp's layer n_layer) */
} hm_gpu_plan;

/* llama.cpp's layer split (see the file comment): weights[0..n_w) >= 0, not all zero; fills
 * dev_of[0..n_layer] (n_layer + 1 entries, the last the output) with an index into weights. */
void hm_gpu_split_layers(const float *weights, int32_t n_w, int32_t n_layer, int32_t *dev_of);

/* Build the plan from the placement options for a model of n_layer layers on a machine of n_cuda
 * devices. free_bytes[0..n_cuda) (borrowed; indexed by CUDA ordinal) weighs the default split;
 * NULL = equal weights (enough to know which devices the plan uses, as the open-time refusal
 * needs). Devices: with neither a per-device budget nor -ts, main_gpu alone; else those named by
 * the per-device budget plus those -ts gives a share. Budgets: the per-device list (a plan device
 * it does not name gets 0 bytes), else the single vram_budget on every plan device (-1 = auto on
 * each; 0 = by_layer). HM_ERR_ARG naming the flag when an ordinal is >= n_cuda. */
hm_status hm_gpu_plan_make(hm_gpu_plan *p, const hm_placement_opts *o, int32_t n_layer, int32_t n_cuda,
                           const int64_t *free_bytes, hm_err *err);

/* Plan device running layer l's dense part (0 <= l < n_layer; l = n_layer: the output's). */
int32_t hm_gpu_plan_layer_dev(const hm_gpu_plan *p, int32_t l);

/* Place expert units on the plan's devices. unit_layer[0..n) (borrowed) is the layer of each
 * unit, hottest first (the policy's ranking); slots[0..p->n_dev) the slots each device has (after
 * sizing). allow_peer: the hot set is the first min(n, sum of slots) units; each goes to the device
 * of its layer while that has room, the rest of the hot set (in rank order) to the device with the
 * most slots left (ties: the lower plan device) with peer[i] = 1; every slot ends up used when
 * n >= the sum. Without peer: in rank order, a unit goes to its layer's device while that has
 * room, else to the CPU (each device holds the hottest units of its own layers). Fills dev[0..n)
 * (plan device, -1 = CPU), peer[0..n) (may be NULL) and used[0..n_dev) (may be NULL); returns the
 * units placed. */
int64_t hm_gpu_plan_place_units(const hm_gpu_plan *p, const int64_t *slots, const int32_t *unit_layer, int64_t n,
                                bool allow_peer, int32_t *dev, uint8_t *peer, int64_t *used);

#endif
