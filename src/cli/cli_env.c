/* cli_env.c - the seed forks' environment variables (GGML_CUDA_MOE_CACHE_*, LLAMA_EXPERT_SWAP_*)
 * mapped onto hm_placement_opts: the one place they are read (docs/ENGINE.md's alias table).
 *
 * Rules: a flag given on the command line wins over its variable; a value outside its range is
 * an error naming the variable; a variable of either family this table does not know gets a
 * warning naming it (never silence); one that hotmoe accepts without an effect says so at run
 * time. Without a CUDA device (or CUDA) the variables that size VRAM, and --moe-cache on|auto, are
 * warned about and left out, so a seed command line still runs on the CPU. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hotmoe.h"

extern char **environ;

typedef enum { V_INT, V_BOOL, V_MODE, V_DEVICES } vkind;

typedef struct seed_var {
    const char *name;
    vkind kind;
    long long lo, hi; /* V_INT's range */
} seed_var;

static const seed_var vars[] = {
    {"GGML_CUDA_MOE_CACHE_MODE", V_MODE, 0, 0},
    {"GGML_CUDA_MOE_CACHE_BUDGET_MB", V_INT, -1, 1LL << 30},
    {"GGML_CUDA_MOE_CACHE_BUDGET_MB_DEVICES", V_DEVICES, 0, 0},
    {"GGML_CUDA_MOE_CACHE_RESERVE_MB", V_INT, 0, 1LL << 30},
    {"GGML_CUDA_MOE_CACHE_ADMIT_AFTER", V_INT, 0, 1000000},
    {"GGML_CUDA_MOE_CACHE_INSERTS", V_INT, 0, 1000000},
    {"GGML_CUDA_MOE_CACHE_QUEUE_MB", V_INT, 1, 1 << 20},
    {"GGML_CUDA_MOE_CACHE_STATS", V_INT, 0, 1000000000},
    {"GGML_CUDA_MOE_CACHE_MLOCK", V_BOOL, 0, 1},
    {"GGML_CUDA_MOE_CACHE_ELITE_PCT", V_INT, 0, 100},
    {"GGML_CUDA_MOE_CACHE_DEMAND_DECAY", V_INT, 1, 1000000000},
    {"LLAMA_EXPERT_SWAP_NO_PRELOAD", V_BOOL, 0, 1},
    {"LLAMA_EXPERT_SWAP_PREFETCH", V_BOOL, 0, 1},
    {"LLAMA_EXPERT_SWAP_MLOCK", V_BOOL, 0, 1},
};
enum { N_VARS = sizeof vars / sizeof vars[0] };

static int bad(const char *name, const char *v, const char *what) {
    fprintf(stderr, "hotmoe: %s='%s': %s\n", name, v, what);
    return -1;
}

/* The value of a known variable as an integer (V_INT, V_BOOL: 0/1; V_MODE: 0 off, 1 on, 2 auto). */
static int parse(const seed_var *sv, const char *v, long long *out) {
    char what[128];
    if (sv->kind == V_MODE) {
        if (!strcmp(v, "off") || !strcmp(v, "0")) *out = 0;
        else if (!strcmp(v, "on") || !strcmp(v, "1")) *out = 1;
        else if (!strcmp(v, "auto")) *out = 2;
        else return bad(sv->name, v, "expects on, off or auto");
        return 0;
    }
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    long long lo = sv->kind == V_BOOL ? 0 : sv->lo, hi = sv->kind == V_BOOL ? 1 : sv->hi;
    if (errno || end == v || *end || x < lo || x > hi) {
        snprintf(what, sizeof what, "expects an integer in [%lld, %lld]", lo, hi);
        return bad(sv->name, v, what);
    }
    *out = x;
    return 0;
}

int hm_cli_seed_env(hm_placement_opts *po, int moe_cache) {
    long long val[N_VARS];
    bool set[N_VARS] = {0};
    for (char **e = environ; e && *e; e++) { /* unknown names of the two families: a warning each */
        const char *s = *e, *eq = strchr(s, '=');
        if (!eq || (strncmp(s, "GGML_CUDA_MOE_CACHE_", 20) && strncmp(s, "LLAMA_EXPERT_SWAP_", 18))) continue;
        bool known = false;
        for (int i = 0; i < N_VARS && !known; i++)
            known = strlen(vars[i].name) == (size_t)(eq - s) && !strncmp(s, vars[i].name, (size_t)(eq - s));
        if (!known)
            fprintf(stderr, "hotmoe: warning: %.*s is not a variable hotmoe knows; it has no effect "
                            "(docs/ENGINE.md lists the seed forks' variables)\n", (int)(eq - s), s);
    }
    for (int i = 0; i < N_VARS; i++) {
        const char *v = getenv(vars[i].name);
        if (!v || !*v) continue;
        if (vars[i].kind == V_DEVICES) {
            set[i] = true;
            continue;
        }
        if (parse(&vars[i], v, &val[i])) return -1;
        set[i] = true;
    }
#define SET(i) (set[i])
#define VAL(i) (val[i])
    enum { MODE, BUDGET, DEVICES, RESERVE, ADMIT, INSERTS, QUEUE, STATS, MLOCK, ELITE, DECAY, NO_PRELOAD, PREFETCH,
           SWAP_MLOCK };
    /* the cache's switch: --moe-cache (flag) over MODE; off = no expert slots (the dense part may
     * still go to the GPU with -ngl), on / auto = a budget: the one given, else auto */
    int mode = moe_cache >= 0 ? moe_cache : SET(MODE) ? (int)VAL(MODE) : -1;
    bool flag_budget = po->vram_budget != 0 || po->n_vram_budgets > 0;
    hm_placement_opts dev = *po; /* the per-device list, checked in every build */
    if (SET(DEVICES)) {
        const char *v = getenv("GGML_CUDA_MOE_CACHE_BUDGET_MB_DEVICES");
        hm_err err;
        dev.vram_budget = 0;
        dev.n_vram_budgets = 0;
        if (hm_parse_vram_budget(v, true, &dev, &err) != HM_OK) return bad("GGML_CUDA_MOE_CACHE_BUDGET_MB_DEVICES", v, err.msg);
    }
    if (hm_gpu_count() > 0) {
        if (!flag_budget && mode != 0 && SET(DEVICES)) *po = dev;
        if (!flag_budget && mode != 0 && po->n_vram_budgets == 0 && SET(BUDGET))
            po->vram_budget = VAL(BUDGET) < 0 ? -1 : (int64_t)VAL(BUDGET) << 20;
        if (mode >= 1 && po->vram_budget == 0 && po->n_vram_budgets == 0) po->vram_budget = -1; /* auto */
        if (mode == 0) {
            po->vram_budget = 0;
            po->n_vram_budgets = 0;
            po->cpu_moe = true;
        }
        if (SET(RESERVE) && po->vram_reserve < 0) po->vram_reserve = (int64_t)VAL(RESERVE) << 20;
        if (SET(QUEUE)) po->staging_bytes = (int64_t)VAL(QUEUE) << 20;
    } else if (mode >= 1 || SET(BUDGET) || SET(DEVICES) || SET(RESERVE) || SET(QUEUE)) {
        fprintf(stderr, "hotmoe: warning: %s: %s%s%s%s%s have no VRAM to size; the experts run on the CPU\n",
#ifdef HM_HAVE_CUDA
                "no CUDA device found",
#else
                "built without CUDA",
#endif
                mode >= 1 ? "the expert cache mode (--moe-cache / _MODE) " : "",
                SET(BUDGET) ? "GGML_CUDA_MOE_CACHE_BUDGET_MB " : "", SET(DEVICES) ? "..._BUDGET_MB_DEVICES " : "",
                SET(RESERVE) ? "..._RESERVE_MB " : "", SET(QUEUE) ? "..._QUEUE_MB" : "");
    }
    if (SET(ADMIT) && po->admit_misses < 0) po->admit_misses = (int32_t)VAL(ADMIT);
    if (SET(INSERTS) && po->max_inserts == 0) po->max_inserts = (int32_t)VAL(INSERTS);
    if (SET(STATS) && po->stats_every == 0) po->stats_every = (int32_t)VAL(STATS);
    if (SET(DECAY) && po->demand_half_life == 0) po->demand_half_life = (float)VAL(DECAY);
    if (SET(ELITE) && po->elite_pct < 0) {
        po->elite_pct = (float)VAL(ELITE);
        if (!po->policy) po->policy = "elite";
        else if (strcmp(po->policy, "elite"))
            fprintf(stderr, "hotmoe: warning: GGML_CUDA_MOE_CACHE_ELITE_PCT applies to policy elite, not --policy %s\n",
                    po->policy);
    }
    if ((SET(MLOCK) && VAL(MLOCK)) || (SET(SWAP_MLOCK) && VAL(SWAP_MLOCK))) po->mlock = true;
    if (SET(PREFETCH) && VAL(PREFETCH)) po->prefetch = true;
    if (SET(NO_PRELOAD) && VAL(NO_PRELOAD)) po->no_preload = true;
#undef SET
#undef VAL
    return 0;
}
