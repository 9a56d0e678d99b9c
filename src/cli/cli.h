/* cli.h - the subcommands of the `hotmoe` binary. Each lives in cli/cmd_<name>.c, parses its own
 * flags, calls the public API (hotmoe.h) and returns the process exit code (0 ok, 1 error,
 * 2 usage). The table in main.c lists them for `hotmoe help`. */
#ifndef HM_CLI_H
#define HM_CLI_H

#include "hotmoe_tools.h"

typedef struct hm_cli_cmd {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand name */
    const char *summary;
} hm_cli_cmd;

int hm_cmd_inspect(int argc, char **argv);
int hm_cmd_synth(int argc, char **argv);
int hm_cmd_tokenize(int argc, char **argv);
int hm_cmd_run(int argc, char **argv);
int hm_cmd_bench(int argc, char **argv);
int hm_cmd_perplexity(int argc, char **argv);
int hm_cmd_logits(int argc, char **argv);
int hm_cmd_plan(int argc, char **argv);
int hm_cmd_serve(int argc, char **argv);
int hm_cmd_profile(int argc, char **argv);

struct hm_placement_opts;
/* cli_env.c: the seed forks' GGML_CUDA_MOE_CACHE_* / LLAMA_EXPERT_SWAP_* variables into po (flags
 * already there win); moe_cache is --moe-cache's (-1 not given, 0 off, 1 on, 2 auto). 0 ok, -1 a
 * bad value (message printed, naming the variable). Unknown variables of the families: a warning. */
int hm_cli_seed_env(struct hm_placement_opts *po, int moe_cache);

/* True for -h / --help. */
int hm_cli_is_help(const char *arg);

/* Install fn (async-signal-safe) for SIGINT and SIGTERM: how a long-running command stops cleanly. */
void hm_cli_on_stop_signals(void (*fn)(int));

#endif
