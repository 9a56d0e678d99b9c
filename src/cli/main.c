/* main.c - the `hotmoe` binary: dispatches to subcommands. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

static int cmd_help(int argc, char **argv);
static int cmd_version(int argc, char **argv);

static const hm_cli_cmd commands[] = {
    {"inspect", hm_cmd_inspect, "show a GGUF model: hparams, tokenizer, tensors, expert units"},
    {"synth", hm_cmd_synth, "write a random-weight MoE model (real shapes) for testing and speed"},
    {"tokenize", hm_cmd_tokenize, "print the token ids of a text with a model's tokenizer"},
    {"run", hm_cmd_run, "generate text from a prompt (streaming), or chat"},
    {"bench", hm_cmd_bench, "measure prompt and generation speed (like llama-bench)"},
    {"perplexity", hm_cmd_perplexity, "perplexity of a text file (same method as llama-perplexity)"},
    {"logits", hm_cmd_logits, "write raw float32 logits of a token sequence (for comparing engines)"},
    {"serve", hm_cmd_serve, "OpenAI-compatible HTTP server with a web page (chat + experts heatmap)"},
    {"profile", hm_cmd_profile, "run prompts only to record which experts they use (a usage profile)"},
    {"plan", hm_cmd_plan, "which expert units fit a VRAM budget, hit rate, llama.cpp --n-cpu-moe equivalent"},
    {"version", cmd_version, "print the version"},
    {"help", cmd_help, "list subcommands; `hotmoe CMD --help` for one"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

int hm_cli_is_help(const char *arg) {
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

void hm_cli_on_stop_signals(void (*fn)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static int cmd_version(int argc, char **argv) {
    printf("hotmoe %s\n", HOTMOE_VERSION);
    return 0;
}

static int cmd_help(int argc, char **argv) {
    printf("hotmoe %s - run big Mixture-of-Experts models on small machines\n\n"
           "usage: hotmoe <command> [options]\n\ncommands:\n", HOTMOE_VERSION);
    for (size_t i = 0; i < N_COMMANDS; i++) printf("  %-12s %s\n", commands[i].name, commands[i].summary);
    printf("\nRun `hotmoe <command> --help` for a command's options.\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        cmd_help(argc, argv);
        return 2;
    }
    if (hm_cli_is_help(argv[1])) return cmd_help(argc, argv);
    if (strcmp(argv[1], "--version") == 0) return cmd_version(argc, argv);
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "hotmoe: unknown command '%s'; `hotmoe help` lists them\n", argv[1]);
    return 2;
}
