/* cmd_plan.c - `hotmoe plan`: how many expert units fit a budget, which, the hit rate, the
 * llama.cpp --n-cpu-moe equivalent, the CPU cost of the rest and, with a GPU, the GPU and upload
 * costs and the decode speed they predict; with --ram-budget the same for the RAM+SSD tiers (hm_plan). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
    fputs("usage: hotmoe plan [-m MODEL.gguf] (--profile P.json | --trace T.bin) [--budget SIZE|N%]\n"
          "                   [--ram-budget SIZE|N%] [--policy static|online|lru] [--ep N] [--json]\n"
          "\n"
          "Answers: with SIZE bytes of VRAM for experts, how many expert units fit, which ones, how\n"
          "often a routed unit is found there (the hit rate), what llama.cpp's --n-cpu-moe would do with\n"
          "the same bytes, and what the rest costs on this CPU. With a GPU (CUDA build), it also\n"
          "measures the upload rate, a hot unit's GPU time and two short decode runs of the model\n"
          "(every unit in VRAM; --cpu-moe), and predicts decode tok/s for both placements.\n"
          "With --ram-budget (a model larger than RAM), the same for the RAM slot pool: units that fit,\n"
          "the RAM hit rate, SSD MiB read per token and, with -m, a calibration read of the model file\n"
          "and the decode tok/s of the CPU-only engine with and without reads overlapping compute.\n"
          "\n"
          "  -m, --model FILE     the GGUF: unit sizes and a short CPU (and GPU) timing of its units\n"
          "  --profile FILE       usage profile (hotmoe's, or the seed-1 fork's moe_layer_perf.v1 /\n"
          "                       moe_layer_opt_perf.v1); alias --moe-hot-cache\n"
          "  --trace FILE         routing trace from --trace-out: every policy is replayed on it\n"
          "  --budget SIZE|N%     bytes for expert units (12GiB, 512MiB) or a share of all units (20%);\n"
          "                       per device for several GPUs (0:6GiB,1:6GiB): each device's hit rate,\n"
          "                       with and without peer units, under the engine's layer split\n"
          "  -ts, --tensor-split L with a budget per device: the layer split (llama.cpp's -ts, 3,1;\n"
          "                       default: equal shares, as equal GPUs' free VRAM gives)\n"
          "  --ram-budget SIZE|N% bytes of the RAM slot pool for expert units (16GiB) or a share of all\n"
          "                       expert bytes; VRAM units are not in RAM (exclusive tiers)\n"
          "  --policy NAME        static (default with a profile), online (default with a trace), lru\n"
          "  --unit-bytes SIZE    without -m: the size of one unit (if the profile does not say)\n"
          "  --per-layer          static: the same number of units in every layer\n"
          "  --warm-start         online/lru: start from the static placement\n"
          "  --update-rate R      online: swaps per window as a fraction of the slots (default 0.005)\n"
          "  --elite-pct P        elite: the static elite's share of the slots, 0..100 (default 60)\n"
          "  --sim-tokens N       without a trace: length of the synthetic trace (default: the\n"
          "                       profile's decode tokens, 2000..20000)\n"
          "  --seed N             of the synthetic trace (default 1)\n"
          "  -t, --threads N      threads for the CPU timing (default: all)\n"
          "  --no-calibrate       skip the CPU and GPU timing\n"
          "  --ep N               expert parallelism over N devices or hosts (needs no budget): each\n"
          "                       layer's experts split contiguously, packed by load, and packed with\n"
          "                       replicas as SGLang's EPLB does; per-device load and imbalance\n"
          "  --ep-redundant R     replicas for --ep (SGLang's --ep-num-redundant-experts; default N,\n"
          "                       rounded up so that experts + R split evenly)\n"
          "  --json               one JSON object\n"
          "  -h, --help           this text\n",
          f);
}

/* A budget flag's value: a share "P%" (0 < P <= 100) into *frac, else a size into *bytes (>= 0, or
 * > 0 when positive). Errors are printed naming the flag; returns 0 ok, 2 bad. */
static int parse_budget(const char *flag, const char *v, bool positive, int64_t *bytes, double *frac, hm_err *err) {
    size_t n = strlen(v);
    if (n > 1 && v[n - 1] == '%') {
        char *end;
        double pct = strtod(v, &end);
        if (end != v + n - 1 || !(pct > 0 && pct <= 100)) {
            fprintf(stderr, "plan: %s %s: a share must be in (0, 100]%%\n", flag, v);
            return 2;
        }
        *frac = pct / 100.0;
    } else if (hm_parse_size(v, bytes, err) != HM_OK || *bytes < (positive ? 1 : 0)) {
        fprintf(stderr, "plan: %s: %s\n", flag,
                err->msg[0] ? err->msg
                            : positive ? "must be a positive size or a share (20%)" : "must be a size or a share (20%)");
        return 2;
    }
    return 0;
}

int hm_cmd_plan(int argc, char **argv) {
    hm_plan_opts o;
    hm_plan_opts_default(&o);
    hm_err err = {{0}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *eq = strchr(a, '=');
        char name[64];
        size_t nlen = eq && a[0] == '-' ? (size_t)(eq - a) : strlen(a);
        snprintf(name, sizeof name, "%.*s", (int)(nlen < sizeof name ? nlen : sizeof name - 1), a);
        bool flag_only = strcmp(name, "--json") == 0 || strcmp(name, "--per-layer") == 0 ||
                         strcmp(name, "--warm-start") == 0 || strcmp(name, "--no-calibrate") == 0 || hm_cli_is_help(a);
        const char *v = NULL;
        if (!flag_only && a[0] == '-') {
            v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) {
                fprintf(stderr, "plan: %s needs a value (see `hotmoe plan --help`)\n", name);
                return 2;
            }
        }
        if (hm_cli_is_help(a)) {
            usage(stdout);
            return 0;
        } else if (strcmp(name, "--json") == 0) {
            o.json = true;
        } else if (strcmp(name, "--per-layer") == 0) {
            o.static_per_layer = true;
        } else if (strcmp(name, "--warm-start") == 0) {
            o.warm_start = true;
        } else if (strcmp(name, "--no-calibrate") == 0) {
            o.calibrate = false;
        } else if (strcmp(name, "-m") == 0 || strcmp(name, "--model") == 0) {
            o.model_path = v;
        } else if (strcmp(name, "--profile") == 0 || strcmp(name, "--moe-hot-cache") == 0) {
            o.profile_path = v;
        } else if (strcmp(name, "--trace") == 0) {
            o.trace_path = v;
        } else if (strcmp(name, "--policy") == 0) {
            o.policy = v;
        } else if (strcmp(name, "--budget") == 0 && strchr(v, ':')) { /* per device: several GPUs */
            hm_placement_opts po;
            hm_placement_opts_default(&po);
            if (hm_parse_vram_budget(v, false, &po, &err) != HM_OK) {
                fprintf(stderr, "plan: --budget %s: %s\n", v, err.msg);
                return 2;
            }
            o.n_gpu_budgets = po.n_vram_budgets;
            memcpy(o.gpu_budgets, po.vram_budgets, sizeof o.gpu_budgets);
        } else if (strcmp(name, "--budget") == 0) {
            if (parse_budget(name, v, false, &o.budget, &o.budget_frac, &err)) return 2;
        } else if (strcmp(name, "-ts") == 0 || strcmp(name, "--tensor-split") == 0) {
            hm_placement_opts po;
            hm_placement_opts_default(&po);
            if (hm_parse_tensor_split(v, &po, &err) != HM_OK) {
                fprintf(stderr, "plan: %s %s: %s\n", name, v, err.msg);
                return 2;
            }
            o.n_tensor_split = po.n_tensor_split;
            memcpy(o.tensor_split, po.tensor_split, sizeof o.tensor_split);
        } else if (strcmp(name, "--ram-budget") == 0) {
            if (parse_budget(name, v, true, &o.ram_budget, &o.ram_budget_frac, &err)) return 2;
        } else if (strcmp(name, "--unit-bytes") == 0) {
            int64_t b;
            if (hm_parse_size(v, &b, &err) != HM_OK || b <= 0) {
                fprintf(stderr, "plan: --unit-bytes: %s\n", err.msg[0] ? err.msg : "must be a positive size");
                return 2;
            }
            o.unit_bytes = (uint64_t)b;
        } else if (strcmp(name, "--update-rate") == 0 || strcmp(name, "--moe-hot-cache-update-rate") == 0) {
            char *end;
            o.update_rate = strtof(v, &end);
            if (*end || !(o.update_rate >= 0 && o.update_rate <= 1)) {
                fprintf(stderr, "plan: --update-rate must be in [0, 1]\n");
                return 2;
            }
        } else if (strcmp(name, "--elite-pct") == 0) {
            char *end;
            o.elite_pct = strtof(v, &end);
            if (end == v || *end || !(o.elite_pct >= 0 && o.elite_pct <= 100)) {
                fprintf(stderr, "plan: --elite-pct must be in [0, 100]\n");
                return 2;
            }
        } else if (strcmp(name, "--ep") == 0 || strcmp(name, "--ep-redundant") == 0) {
            char *end;
            long long n = strtoll(v, &end, 10);
            bool ep = name[4] == 0;
            if (*end || end == v || n < (ep ? 1 : 0) || n > 65536) {
                fprintf(stderr, "plan: %s expects an integer in [%d, 65536], got '%s'\n", name, ep ? 1 : 0, v);
                return 2;
            }
            if (ep) o.ep_devices = (int32_t)n;
            else o.ep_redundant = (int32_t)n;
        } else if (strcmp(name, "--sim-tokens") == 0 || strcmp(name, "--seed") == 0 || strcmp(name, "-t") == 0 ||
                   strcmp(name, "--threads") == 0) {
            char *end;
            long long n = strtoll(v, &end, 10);
            if (*end || n < 0 || n > 100000000) {
                fprintf(stderr, "plan: %s expects a non-negative integer, got '%s'\n", name, v);
                return 2;
            }
            if (name[2] == 's' && name[3] == 'i') o.sim_tokens = n;
            else if (name[2] == 's') o.seed = (uint64_t)n;
            else o.n_threads = (int32_t)n;
        } else {
            fprintf(stderr, "plan: unknown option '%s' (see `hotmoe plan --help`)\n", a);
            return 2;
        }
    }
    if (!o.profile_path && !o.trace_path) {
        fprintf(stderr, "plan: give usage data: --profile FILE or --trace FILE (see `hotmoe plan --help`)\n");
        return 2;
    }
    if (o.n_tensor_split > 0 && o.n_gpu_budgets == 0) {
        fprintf(stderr, "plan: -ts splits the layers over devices: give a budget per device (--budget 0:6GiB,1:6GiB)\n");
        return 2;
    }
    if (o.n_gpu_budgets > 0 && (o.budget >= 0 || o.budget_frac > 0)) {
        fprintf(stderr, "plan: give --budget once: one size (one GPU) or one per device (0:6GiB,1:6GiB)\n");
        return 2;
    }
    const bool budget = o.budget >= 0 || o.budget_frac >= 0 || o.ram_budget >= 0 || o.ram_budget_frac >= 0 ||
                        o.n_gpu_budgets > 0;
    if (o.ep_redundant >= 0 && o.ep_devices == 0) {
        fprintf(stderr, "plan: --ep-redundant goes with --ep N\n");
        return 2;
    }
    if (!budget && o.ep_devices == 0) {
        fprintf(stderr, "plan: give a budget: --budget 12GiB or --budget 20%% (VRAM), --ram-budget 16GiB (RAM), or "
                        "--ep N (expert parallelism)\n");
        return 2;
    }
    if (budget && o.ep_devices > 0 && o.json) {
        fprintf(stderr, "plan: --json prints one object: give --ep N or a budget, not both\n");
        return 2;
    }
    hm_status st = budget ? hm_plan(&o, stdout, &err) : HM_OK;
    if (st == HM_OK && o.ep_devices > 0) {
        if (budget) fputc('\n', stdout);
        st = hm_plan_ep(&o, stdout, &err);
    }
    if (st != HM_OK) {
        fprintf(stderr, "plan: %s\n", err.msg[0] ? err.msg : hm_status_name(st));
        return st == HM_ERR_ARG ? 2 : 1;
    }
    return 0;
}
