/* cli_dspark.h - what `--spec-type draft-dspark` does in hotmoe today (run, bench, serve): the two
 * messages, kept in one place so the three commands say the same thing.
 *
 * DSpark is DeepSeek's block drafter (deepseek-ai/DeepSpec; for DeepSeek-V4 the `mtp.*` tensors of
 * the DSpark checkpoints, converted by llama.cpp's `convert_hf_to_gguf.py --dspark` into a separate
 * GGUF of arch `dflash`). hotmoe cannot run that file yet (docs/ENGINE.md, "DSpark"). So:
 *  - with a drafter file (-md): refused, saying what the file is and what hotmoe lacks;
 *  - without one: llama.cpp's behaviour, loudly. Its llama-server enables a draft-* type only when a
 *    draft model was loaded (common/speculative.cpp: add_config_if_enabled(DRAFT_DSPARK, ctx_dft !=
 *    nullptr); tools/server/server-context.cpp: has_spec = has_draft || spec_mtp), so the seed-2
 *    command line, which names no drafter, decodes one token per step there. hotmoe does the same
 *    and prints a warning saying so. No other drafter is ever put in its place. */
#ifndef HM_CLI_DSPARK_H
#define HM_CLI_DSPARK_H

#include <stdio.h>

#define CLI_DSPARK_NAME "draft-dspark"

/* -md given with draft-dspark: the refusal (the caller returns 2). */
static inline void cli_dspark_refuse(const char *cmd, const char *draft_path) {
    fprintf(stderr,
            "hotmoe %s: --spec-type draft-dspark -md %s: not implemented in hotmoe yet. DSpark is DeepSeek's block "
            "drafter (deepseek-ai/DeepSpec): a few DeepSeek-V4 blocks (hyper-connections, MLA over a sliding window, "
            "MoE with a sqrtsoftplus router) fed the target's hidden states of chosen layers through a projection, drafting a whole "
            "block per step from [last token, mask...], corrected by a low-rank Markov head and cut by a confidence "
            "head. Its GGUF is llama.cpp's arch 'dflash' (convert_hf_to_gguf.py --dspark from the checkpoint's mtp.* "
            "tensors; keys dflash.target_layers, dflash.block_size, tensors fc, enc.output_norm, markov_w1/w2, "
            "conf_proj, blk.N.*). hotmoe would need: that arch's loader, the target's per-layer hidden-state capture "
            "on deepseek4, and the drafter's own KV ring with rollback. Leave out -md to decode without a drafter "
            "(what llama.cpp does for draft-dspark without a draft model), or use --spec-type ngram-simple\n",
            cmd, draft_path);
}

/* draft-dspark without a drafter file: the warning (the caller then decodes without speculation). */
static inline void cli_dspark_warn_none(const char *cmd) {
    fprintf(stderr,
            "hotmoe %s: WARNING: --spec-type draft-dspark without a DSpark drafter file (-md): speculation is OFF, "
            "every step decodes one token. This is what llama.cpp does for a draft-* type with no draft model "
            "loaded; hotmoe runs no other drafter in its place (see docs/ENGINE.md, \"DSpark\")\n",
            cmd);
}

#endif
