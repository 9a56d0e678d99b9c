/* cmd_engine.h - flag parsing shared by the commands that run a model (logits, run, perplexity,
 * bench, profile; serve takes the placement flags): -m, -t, -c, --ubatch, --kv-type, -v; the expert
 * placement and usage flags (--profile-out, --profile-format, --trace-out, --profile, --policy,
 * --update-rate, --vram-budget (one size or one per device), -ts, with the seed forks' names as
 * aliases); the argv loop's common steps (cli_common_arg, cli_unknown_arg, cli_need_model); and
 * number parsing with errors that name the flag. Header-only (static functions) so each command stays one file; only
 * uses hotmoe.h. A command calls cli_open_model (which applies the placement flags and starts a
 * trace) and, before closing the model, cli_engine_finish (which closes --trace-out, reporting a
 * failed write, and writes --profile-out). */
#ifndef HM_CLI_CMD_ENGINE_H
#define HM_CLI_CMD_ENGINE_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

typedef struct cli_engine {
    const char *cmd;   /* "logits", for messages */
    const char *model; /* -m */
    int32_t n_threads; /* -t, 0 = all CPUs */
    int32_t n_ctx;     /* -c, 0 = command's default */
    int32_t n_ubatch;  /* -ub, 0 = 512 */
    int32_t n_batch;   /* -b (llama.cpp's logical batch): caps n_ubatch as there; 0 = none */
    hm_kv_type kv_type;
    bool kv_type_set; /* a -ctk / -ctv / --kv-type was given (they must agree) */
    const char *rope_scaling; /* --rope-scaling none|linear|yarn (NULL: the file's) */
    float rope_scale;         /* --rope-scale N (0: the file's) */
    int32_t yarn_orig_ctx;    /* --yarn-orig-ctx N (0: the file's) */
    bool verbose;
    /* expert placement and usage */
    const char *profile_out;  /* --profile-out: usage profile written at the end */
    hm_profile_fmt profile_format;
    const char *trace_out;    /* --trace-out: routing trace */
    hm_placement_opts place;  /* --profile, --policy, --update-rate, --vram-budget, -ts */
    bool place_init;
    bool split_none;          /* --split-mode none: one GPU (-mg); layer (the default) splits by layers */
    int moe_cache;            /* --moe-cache: 0 not given, 1 off, 2 on, 3 auto */
} cli_engine;

#define CLI_ENGINE_HELP                                                                        \
    "  -m, --model FILE       GGUF model (required)\n"                                           \
    "  -t, --threads N        compute threads (default: all CPUs)\n"                             \
    "  -ub, --ubatch-size N   tokens per forward micro-batch (default 512; alias --ubatch)\n"      \
    "  -b, --batch-size N     llama.cpp's logical batch: accepted, and caps -ub as there\n"     \
    "  --kv-type T            KV cache type: f16 (default), f32 (exact, slower), bf16, q8_0,\n"  \
    "                         q4_0; aliases -ctk/--cache-type-k, -ctv/--cache-type-v (one type)\n" \
    "  --rope-scaling T       none|linear|yarn over the file's RoPE scaling (llama.cpp's flag)\n" \
    "  --rope-scale N         its factor (the context grows N-fold); --yarn-orig-ctx N: YaRN's\n" \
    "                         original context (both default to the file's keys)\n"              \
    "  -v, --verbose          log model loading\n" CLI_PLACEMENT_HELP

#define CLI_PLACEMENT_HELP                                                                     \
    "expert usage and placement:\n"                                                             \
    "  --profile-out FILE     write the expert usage profile at the end (alias --moe-layer-perf-out)\n" \
    "  --profile-format F     hotmoe (default), seed1 (the seed-1 fork's moe_layer_perf.v1) or\n" \
    "                         sglang (logical_count, for SGLang's --init-expert-location)\n"      \
    "  --trace-out FILE       write every routed (token, layer, expert) to a binary trace\n"      \
    "  --profile FILE         usage profile for static placement (alias --moe-hot-cache): hotmoe's,\n" \
    "                         the seed-1 fork's or SGLang's logical_count JSON\n"                  \
    "  --policy P             static|online|lru|none (default: static with --profile, else none)\n" \
    "  --update-rate R        online: swaps per window as a fraction of slots (alias\n"          \
    "                         --moe-hot-cache-update-rate; default 0.005)\n"                    \
    "GPU (CUDA builds; docs/ENGINE.md \"GPU placement\"):\n"                                  \
    "  -ngl, --n-gpu-layers N dense part (attention, norms, routers, embeddings) and KV cache on\n" \
    "                         the GPU; alone, every expert goes there too (llama.cpp's -ngl 99)\n" \
    "  --vram-budget SIZE     VRAM for hot expert units (e.g. 12GiB; auto or -1 = free VRAM minus\n" \
    "                         --vram-reserve); placed by --profile / --policy (default: static\n" \
    "                         with a profile, else online); the other units run on the CPU at the\n" \
    "                         same time (aliases --moe-hot-cache-max-mib MIB, env\n"         \
    "                         GGML_CUDA_MOE_CACHE_BUDGET_MB); per device: 0:11GiB,1:11GiB,2:5GiB\n" \
    "                         (env GGML_CUDA_MOE_CACHE_BUDGET_MB_DEVICES=0:11800,1:11800 in MiB)\n" \
    "  -ts, --tensor-split L  share of the layers per CUDA device, as llama.cpp's -ts (3,1);\n" \
    "                         each device runs its layers' attention, KV and hot experts\n"  \
    "                         (default split: by free VRAM)\n"                                \
    "  --vram-reserve SIZE    VRAM left free by auto (default 1GiB; alias\n"                 \
    "                         --moe-hot-cache-auto-reserve-mib MIB)\n"                      \
    "  -cmoe, --cpu-moe       every expert on the CPU (unless --vram-budget gives slots)\n"   \
    "  -ncmoe, --n-cpu-moe N  experts of the first N layers on the CPU, the rest in VRAM\n"  \
    "  --no-peer-experts      several GPUs: a device's slots hold only its own layers' units\n"   \
    "                         (default: a full device's hot units may take another's free slots)\n" \
    "  -mg, --main-gpu N      the CUDA device (default 0)\n"                                 \
    "  -sm, --split-mode M    layer (default: several GPUs split by layers, with -ts or per-device\n" \
    "                         budgets) or none (one GPU, -mg); llama.cpp's row is refused\n"  \
    "  -fa, --flash-attn M    on|off|auto (default auto = on): prefill attention of 32+ tokens as\n" \
    "                         one tensor-core kernel (f16 Q and softmax weights); off = the\n"  \
    "                         exact f32 kernels, whose cost grows with batch x context\n"      \
    "models larger than RAM (the SSD tier):\n"                                                  \
    "  --ram-budget SIZE      RAM for expert units (e.g. 16GiB); below the experts' size, units\n" \
    "                         live in a RAM slot pool and the rest are read from the file when\n" \
    "                         routed (default: all in RAM through the mmap)\n"                 \
    "  --mlock                lock the experts in RAM: the RAM slot pool with --ram-budget, else\n" \
    "                         the model mapping's experts, which copies to VRAM then read\n"    \
    "                         directly (env GGML_CUDA_MOE_CACHE_MLOCK=1 or\n"                  \
    "                         LLAMA_EXPERT_SWAP_MLOCK=1)\n"                                     \
    "  --prefetch             read the next layer's predicted units ahead (env\n"              \
    "                         LLAMA_EXPERT_SWAP_PREFETCH=1)\n"                                  \
    "  --moe-cache auto|on|off the seed-2 fork's switch: auto/on = a VRAM budget (the one given, else\n"    \
    "                         auto: free VRAM minus the reserve); off = no expert slots\n"             \
    "  --io-depth N           reads in flight (default 16); --io-pread: no io_uring\n"

static inline int cli_long(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "hotmoe %s: %s expects an integer in [%ld, %ld], got '%s'\n", cmd, flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static inline int cli_float(const char *cmd, const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "hotmoe %s: %s expects a number in [%g, %g], got '%s'\n", cmd, flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* The value of flag argv[*i]; NULL (message printed) when it is the last argument. */
static inline const char *cli_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "hotmoe %s: %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

/* Try argv[*i] as one of the expert usage/placement flags: 1 consumed, 0 not ours, -1 bad value
 * (printed). */
static inline int cli_placement_arg(cli_engine *e, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v;
    double d;
    if (!e->place_init) {
        hm_placement_opts_default(&e->place);
        e->place_init = true;
    }
    if (!strcmp(a, "--profile-out") || !strcmp(a, "--moe-layer-perf-out")) {
        if (!(e->profile_out = cli_value(e->cmd, argc, argv, i))) return -1;
    } else if (!strcmp(a, "--profile-format")) {
        if (!(v = cli_value(e->cmd, argc, argv, i))) return -1;
        int f = hm_profile_fmt_from_name(v);
        if (f < 0) {
            fprintf(stderr, "hotmoe %s: --profile-format expects hotmoe, seed1 or sglang, got '%s'\n", e->cmd, v);
            return -1;
        }
        e->profile_format = (hm_profile_fmt)f;
    } else if (!strcmp(a, "--trace-out")) {
        if (!(e->trace_out = cli_value(e->cmd, argc, argv, i))) return -1;
    } else if (!strcmp(a, "--profile") || !strcmp(a, "--moe-hot-cache")) {
        if (!(e->place.profile = cli_value(e->cmd, argc, argv, i))) return -1;
    } else if (!strcmp(a, "--policy")) {
        if (!(v = cli_value(e->cmd, argc, argv, i))) return -1;
        int known = 0;
        for (int k = 0; k < hm_policy_count() && !known; k++) known = !strcmp(v, hm_policy_info(k, NULL));
        if (!known) {
            fprintf(stderr, "hotmoe %s: --policy expects one of", e->cmd);
            for (int k = 0; k < hm_policy_count(); k++) fprintf(stderr, " %s", hm_policy_info(k, NULL));
            fprintf(stderr, ", got '%s'\n", v);
            return -1;
        }
        e->place.policy = v;
    } else if (!strcmp(a, "--update-rate") || !strcmp(a, "--moe-hot-cache-update-rate")) {
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_float(e->cmd, a, v, 0, 1, &d)) return -1;
        e->place.update_rate = (float)d;
    } else if (!strcmp(a, "--vram-budget")) {
        hm_err err;
        if (!(v = cli_value(e->cmd, argc, argv, i))) return -1;
        if (hm_parse_vram_budget(v, false, &e->place, &err) != HM_OK) {
            fprintf(stderr, "hotmoe %s: --vram-budget %s: %s\n", e->cmd, v, err.msg);
            return -1;
        }
    } else if (!strcmp(a, "-ts") || !strcmp(a, "--tensor-split")) {
        hm_err err;
        if (!(v = cli_value(e->cmd, argc, argv, i))) return -1;
        if (hm_parse_tensor_split(v, &e->place, &err) != HM_OK) {
            fprintf(stderr, "hotmoe %s: %s %s: %s\n", e->cmd, a, v, err.msg);
            return -1;
        }
    } else if (!strcmp(a, "--vram-reserve")) {
        hm_err err;
        if (!(v = cli_value(e->cmd, argc, argv, i))) return -1;
        if (hm_parse_size(v, &e->place.vram_reserve, &err) != HM_OK || e->place.vram_reserve < 0) {
            fprintf(stderr, "hotmoe %s: --vram-reserve expects a size (1GiB, 512MiB), got '%s'\n", e->cmd, v);
            return -1;
        }
    } else if (!strcmp(a, "--moe-hot-cache-auto-reserve-mib")) {
        long mib;
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_long(e->cmd, a, v, 0, 1L << 30, &mib)) return -1;
        e->place.vram_reserve = (int64_t)mib << 20;
    } else if (!strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers") || !strcmp(a, "--gpu-layers")) {
        long n;
        if (!(v = cli_value(e->cmd, argc, argv, i))) return -1;
        if (!strcmp(v, "all") || !strcmp(v, "auto")) n = 999;
        else if (cli_long(e->cmd, a, v, 0, 1 << 20, &n)) return -1;
        e->place.n_gpu_layers = (int32_t)n;
    } else if (!strcmp(a, "-cmoe") || !strcmp(a, "--cpu-moe")) {
        e->place.cpu_moe = true;
    } else if (!strcmp(a, "-ncmoe") || !strcmp(a, "--n-cpu-moe")) {
        long n;
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_long(e->cmd, a, v, 0, 1 << 20, &n)) return -1;
        e->place.n_cpu_moe = (int32_t)n;
    } else if (!strcmp(a, "--no-peer-experts")) {
        e->place.no_peer = true;
    } else if (!strcmp(a, "-sm") || !strcmp(a, "--split-mode")) {
        if (!(v = cli_value(e->cmd, argc, argv, i))) return -1;
        if (!strcmp(v, "none") || !strcmp(v, "layer")) {
            e->split_none = !strcmp(v, "none");
        } else {
            fprintf(stderr, "hotmoe %s: --split-mode %s: hotmoe splits several GPUs by layers (layer, the default: "
                            "-ts or per-device --vram-budget) or uses one (none, with -mg); row is not implemented\n",
                    e->cmd, v);
            return -1;
        }
    } else if (!strcmp(a, "-mg") || !strcmp(a, "--main-gpu")) {
        long n;
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_long(e->cmd, a, v, 0, 63, &n)) return -1;
        e->place.main_gpu = (int32_t)n;
    } else if (!strcmp(a, "-fa") || !strcmp(a, "--flash-attn")) {
        /* llama.cpp's -fa on|off|auto; its older form is the bare flag (= on) */
        const char *m = *i + 1 < argc ? argv[*i + 1] : "";
        if (!strcmp(m, "on") || !strcmp(m, "1") || !strcmp(m, "true")) e->place.flash_attn = 1;
        else if (!strcmp(m, "off") || !strcmp(m, "0") || !strcmp(m, "false")) e->place.flash_attn = 0;
        else if (!strcmp(m, "auto")) e->place.flash_attn = -1;
        else m = NULL;
        if (m) ++*i;
        else e->place.flash_attn = 1;
    } else if (!strcmp(a, "--ram-budget")) {
        hm_err err;
        if (!(v = cli_value(e->cmd, argc, argv, i))) return -1;
        if (hm_parse_size(v, &e->place.ram_budget, &err) != HM_OK || e->place.ram_budget < 0) {
            fprintf(stderr, "hotmoe %s: --ram-budget expects a size (16GiB, 512MiB, 0), got '%s'\n", e->cmd, v);
            return -1;
        }
    } else if (!strcmp(a, "--mlock")) {
        e->place.mlock = true;
    } else if (!strcmp(a, "--prefetch")) {
        e->place.prefetch = true;
    } else if (!strcmp(a, "--io-pread")) {
        e->place.io_pread = true;
    } else if (!strcmp(a, "--io-depth")) {
        long nd;
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_long(e->cmd, a, v, 1, 4096, &nd)) return -1;
        e->place.io_depth = (int32_t)nd;
    } else if (!strcmp(a, "--moe-cache")) { /* the seed-2 fork's switch (cli_env.c applies it) */
        if (!(v = cli_value(e->cmd, argc, argv, i))) return -1;
        if (!strcmp(v, "off")) e->moe_cache = 1;
        else if (!strcmp(v, "on")) e->moe_cache = 2;
        else if (!strcmp(v, "auto")) e->moe_cache = 3;
        else {
            fprintf(stderr, "hotmoe %s: --moe-cache expects auto, on or off, got '%s'\n", e->cmd, v);
            return -1;
        }
    } else if (!strcmp(a, "--moe-hot-cache-max-mib")) {
        long mib;
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_long(e->cmd, a, v, -1, 1L << 40, &mib)) return -1;
        e->place.vram_budget = mib < 0 ? -1 : (int64_t)mib << 20;
        e->place.n_vram_budgets = 0;
    } else {
        return 0;
    }
    return 1;
}

/* The seed forks' environment variables (cli_env.c) and --moe-cache into po: 0 ok, -1 error (printed). */
static inline int cli_placement_env(const cli_engine *e, hm_placement_opts *po) {
    return hm_cli_seed_env(po, e->moe_cache - 1);
}

/* The micro-batch -ub asks for (0 = 512) capped by -b, llama.cpp's logical batch (0 = none). */
static inline int32_t cli_ubatch_capped(int32_t n_ubatch, int32_t n_batch) {
    return n_batch > 0 && (n_ubatch == 0 ? 512 : n_ubatch) > n_batch ? n_batch : n_ubatch;
}

/* --split-mode none against the flags that name several devices: 0 fine, -1 refused (printed). */
static inline int cli_split_check(const cli_engine *e, const hm_placement_opts *po) {
    if (!e->split_none || (po->n_tensor_split == 0 && po->n_vram_budgets <= 1)) return 0;
    fprintf(stderr, "hotmoe %s: --split-mode none uses one GPU (-mg N), but %s names several\n", e->cmd,
            po->n_tensor_split ? "-ts" : "--vram-budget");
    return -1;
}

/* Try argv[*i] as one of the shared flags: 1 consumed, 0 not ours, -1 bad value (printed). */
static inline int cli_engine_arg(cli_engine *e, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v;
    long n;
    int r = cli_placement_arg(e, argc, argv, i);
    if (r) return r;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        if (!(e->model = cli_value(e->cmd, argc, argv, i))) return -1;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_long(e->cmd, a, v, 1, 512, &n)) return -1;
        e->n_threads = (int32_t)n;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_long(e->cmd, a, v, 1, 1 << 24, &n)) return -1;
        e->n_ctx = (int32_t)n;
    } else if (!strcmp(a, "-ub") || !strcmp(a, "--ubatch") || !strcmp(a, "--ubatch-size")) {
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_long(e->cmd, a, v, 1, 1 << 16, &n)) return -1;
        e->n_ubatch = (int32_t)n;
    } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_long(e->cmd, a, v, 1, 1 << 16, &n)) return -1;
        e->n_batch = (int32_t)n;
    } else if (!strcmp(a, "--kv-type") || !strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k") || !strcmp(a, "-ctv") ||
               !strcmp(a, "--cache-type-v")) {
        /* one type for K and V (llama.cpp's -ctk / -ctv name them apart: both must agree here) */
        if (!(v = cli_value(e->cmd, argc, argv, i))) return -1;
        hm_kv_type t;
        hm_err perr = {{0}};
        if (hm_kv_type_parse(v, &t, &perr) != HM_OK) {
            fprintf(stderr, "hotmoe %s: %s: %s\n", e->cmd, a, perr.msg);
            return -1;
        }
        if (e->kv_type_set && t != e->kv_type) {
            fprintf(stderr, "hotmoe %s: K and V caches of different types (%s after %s): hotmoe keeps one type "
                            "for both (give -ctk and -ctv the same type)\n", e->cmd, v, hm_kv_type_name(e->kv_type));
            return -1;
        }
        e->kv_type = t;
        e->kv_type_set = true;
    } else if (!strcmp(a, "--rope-scaling")) {
        if (!(v = cli_value(e->cmd, argc, argv, i))) return -1;
        if (strcmp(v, "none") && strcmp(v, "linear") && strcmp(v, "yarn")) {
            fprintf(stderr, "hotmoe %s: --rope-scaling expects none, linear or yarn, got '%s'\n", e->cmd, v);
            return -1;
        }
        e->rope_scaling = v;
    } else if (!strcmp(a, "--rope-scale")) {
        double f;
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_float(e->cmd, a, v, 1.0, 1e6, &f)) return -1;
        e->rope_scale = (float)f;
    } else if (!strcmp(a, "--yarn-orig-ctx")) {
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_long(e->cmd, a, v, 1, 1 << 24, &n)) return -1;
        e->yarn_orig_ctx = (int32_t)n;
    } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
        e->verbose = true;
    } else {
        return 0;
    }
    return 1;
}

/* Seconds on the monotonic clock (for timings). */
static inline double cli_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The steps of the argv loop every engine command shares. cli_common_arg: the engine flags, then
 * -h/--help (the usage to stdout). Returns CLI_ARG_NEXT (consumed: go on with the next argument),
 * CLI_ARG_OWN (argv[*i] is for the command to parse) or the status to exit with: 0 after the
 * help, 2 after a bad engine flag (already reported). */
enum { CLI_ARG_OWN = -1, CLI_ARG_NEXT = -2 };
static inline int cli_common_arg(cli_engine *e, int argc, char **argv, int *i, void (*usage)(FILE *)) {
    int r = cli_engine_arg(e, argc, argv, i);
    if (r < 0) return 2;
    if (r > 0) return CLI_ARG_NEXT;
    if (hm_cli_is_help(argv[*i])) {
        usage(stdout);
        return 0;
    }
    return CLI_ARG_OWN;
}

/* A flag the command does not know: says so with the usage on stderr; returns 2. */
static inline int cli_unknown_arg(const cli_engine *e, const char *a, void (*usage)(FILE *)) {
    fprintf(stderr, "hotmoe %s: unknown option '%s'\n", e->cmd, a);
    usage(stderr);
    return 2;
}

/* After the argv loop: 0 when -m was given, else says so and returns 2. */
static inline int cli_need_model(const cli_engine *e) {
    if (e->model) return 0;
    fprintf(stderr, "hotmoe %s: no model given (-m FILE); see `hotmoe %s --help`\n", e->cmd, e->cmd);
    return 2;
}

/* Open the model named by -m (error printed, NULL on failure). */
static inline hm_model *cli_open_model(const cli_engine *e) {
    if (!e->model) {
        fprintf(stderr, "hotmoe %s: no model given (-m FILE); see `hotmoe %s --help`\n", e->cmd, e->cmd);
        return NULL;
    }
    hm_placement_opts po;
    if (e->place_init) po = e->place;
    else hm_placement_opts_default(&po);
    if (cli_placement_env(e, &po) || cli_split_check(e, &po)) return NULL;
    hm_model_opts mo;
    hm_model_opts_default(&mo);
    mo.verbose = e->verbose;
    mo.placement = &po;
    mo.rope_scaling = e->rope_scaling;
    mo.rope_scale = e->rope_scale;
    mo.yarn_orig_ctx = e->yarn_orig_ctx;
    hm_model *m = NULL;
    hm_err err;
    if (hm_model_open(&m, e->model, &mo, &err) != HM_OK) {
        fprintf(stderr, "hotmoe %s: %s\n", e->cmd, err.msg);
        return NULL;
    }
    if (!po.n_ctx) po.n_ctx = e->n_ctx;
    if (po.policy && strcmp(po.policy, "none") && !hm_placement_wants_gpu(&po))
        fprintf(stderr, "hotmoe %s: note: --policy %s has no fast tier to place units in (no VRAM budget); expert "
                        "use is counted, every unit runs from RAM\n", e->cmd, po.policy);
    if (e->trace_out && hm_model_trace_out(m, e->trace_out, &err) != HM_OK) {
        fprintf(stderr, "hotmoe %s: %s\n", e->cmd, err.msg);
        hm_model_close(m);
        return NULL;
    }
    return m;
}

/* Before closing m: flush and close --trace-out (a failed write, e.g. a full disk, is an error
 * naming the file) and write --profile-out (messages printed). 0 ok, 1 error. */
static inline int cli_engine_finish(const cli_engine *e, hm_model *m) {
    if (!m) return 0;
    hm_err err;
    int rc = 0;
    if (e->trace_out && hm_model_trace_close(m, &err) != HM_OK) {
        fprintf(stderr, "hotmoe %s: %s\n", e->cmd, err.msg);
        rc = 1;
    }
    if (!e->profile_out) return rc;
    if (hm_model_profile_save(m, e->profile_out, e->profile_format, &err) != HM_OK) {
        fprintf(stderr, "hotmoe %s: %s\n", e->cmd, err.msg);
        return 1;
    }
    fprintf(stderr, "hotmoe %s: wrote the expert usage profile to %s (%s)\n", e->cmd, e->profile_out,
            e->profile_format == HM_PROFILE_FMT_SEED1 ? "seed1" : "hotmoe");
    return rc;
}

/* The SSD tier's counters at one moment (on = false: no tier, nothing to print). */
typedef struct cli_tier_snap {
    bool on, uring, direct, mlocked;
    int64_t budget;
    int32_t slots, stage;
    uint64_t tokens, bytes, reads, errors, acq, hits, hit_pf, pred, pred_used, acq_pred;
    double wait_us;
} cli_tier_snap;

static inline void cli_tier_get(const hm_model *m, cli_tier_snap *t) {
    memset(t, 0, sizeof *t);
    hm_usage u;
    if (!m || hm_model_usage(m, &u, NULL) != HM_OK) return;
    t->on = u.ram_budget > 0;
    t->uring = u.io_uring, t->direct = u.io_direct, t->mlocked = u.ram_mlocked;
    t->budget = u.ram_budget, t->slots = u.ram_slots, t->stage = u.ram_stage;
    t->tokens = u.tokens, t->bytes = u.bytes_from_ssd, t->reads = u.ssd_reads, t->errors = u.ssd_errors;
    t->acq = u.ram_acquired, t->hits = u.ram_hits, t->hit_pf = u.ram_hit_prefetch;
    t->pred = u.prefetch_pred, t->pred_used = u.prefetch_used, t->acq_pred = u.prefetch_acq;
    t->wait_us = u.ssd_wait_us;
    hm_usage_free(&u);
}

/* Print what the SSD tier did between a (NULL: since open) and b, over n_tok tokens (0: the
 * store's token count): one line, "what" names the span. */
static inline void cli_tier_print(FILE *f, const char *cmd, const char *what, const cli_tier_snap *a,
                                  const cli_tier_snap *b, uint64_t n_tok) {
    if (!b->on) return;
    cli_tier_snap z;
    memset(&z, 0, sizeof z);
    if (!a) a = &z;
    if (!n_tok) n_tok = b->tokens - a->tokens;
    const double mib = (double)(b->bytes - a->bytes) / 1048576.0;
    const uint64_t acq = b->acq - a->acq, hits = b->hits - a->hits, pred = b->pred - a->pred;
    const uint64_t used = b->pred_used - a->pred_used, acqp = b->acq_pred - a->acq_pred;
    fprintf(f, "hotmoe %s: SSD tier (%s): budget %.1f MiB (%d slots + %d staging, %s%s%s), %.1f MiB read in %llu "
               "reads = %.2f MiB/token over %llu tokens, RAM hit rate %.1f %% of %llu units (%.1f %% via prefetch), "
               "read wait %.1f ms",
            cmd, what, (double)b->budget / 1048576.0, b->slots, b->stage, b->uring ? "io_uring" : "pread",
            b->direct ? ", O_DIRECT" : "", b->mlocked ? ", mlocked" : "", mib,
            (unsigned long long)(b->reads - a->reads), n_tok ? mib / (double)n_tok : 0.0, (unsigned long long)n_tok,
            acq ? 100.0 * (double)hits / (double)acq : 0.0, (unsigned long long)acq,
            acq ? 100.0 * (double)(b->hit_pf - a->hit_pf) / (double)acq : 0.0, (b->wait_us - a->wait_us) / 1000.0);
    if (pred)
        fprintf(f, ", prefetch precision %.1f %% recall %.1f %%", 100.0 * (double)used / (double)pred,
                acqp ? 100.0 * (double)used / (double)acqp : 0.0);
    if (b->errors - a->errors) fprintf(f, ", %llu read errors", (unsigned long long)(b->errors - a->errors));
    fprintf(f, "\n");
}

/* Open a session of n_ctx positions (error printed, NULL on failure). */
static inline hm_session *cli_open_session(const cli_engine *e, hm_model *m, int32_t n_ctx) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = n_ctx;
    so.n_threads = e->n_threads;
    so.n_ubatch = e->n_ubatch;
    so.n_ubatch = cli_ubatch_capped(so.n_ubatch, e->n_batch);
    so.kv_type = e->kv_type;
    hm_session *s = NULL;
    hm_err err;
    if (hm_session_open(&s, m, &so, &err) != HM_OK) {
        fprintf(stderr, "hotmoe %s: %s\n", e->cmd, err.msg);
        return NULL;
    }
    return s;
}

/* Prompt and text files are read whole, up to this: a pipe (-f <(cmd), -f /dev/stdin) is fine,
 * an endless stream (/dev/zero, a FIFO fed forever) ends with an error instead of all memory. */
#define CLI_MAX_TEXT_BYTES ((size_t)256 << 20)

/* Read a whole file (NUL-terminated, malloc'd); NULL with a message on failure (also past
 * CLI_MAX_TEXT_BYTES). */
static inline char *cli_read_file(const char *cmd, const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "hotmoe %s: cannot open %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) break;
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        if (cap >= CLI_MAX_TEXT_BYTES) {
            fprintf(stderr, "hotmoe %s: %s is larger than %zu MiB (an endless stream?): not read further\n", cmd,
                    path, CLI_MAX_TEXT_BYTES >> 20);
            free(buf);
            fclose(f);
            return NULL;
        }
        char *nb = realloc(buf, 2 * cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "hotmoe %s: cannot read %s\n", cmd, path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

#endif
