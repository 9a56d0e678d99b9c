#!/usr/bin/env bash
# spec.sh - speculative decoding: greedy decode tok/s with and without it, side by side, on an
# edit-style prompt (bench/data/spec_edit_prompt.txt: a file, then the start of the same file being
# rewritten), on the bundled model by default.
#
#   bench/spec.sh [MODEL.gguf] [THREADS]        (env: HM_EXE, REPS, N_GEN; EXTRA: more bench flags,
#                                                 e.g. EXTRA="-ngl 99" on the GPU)
#
# Runs `hotmoe bench -f PROMPT -n N_GEN` with ngram-simple (llama.cpp's defaults, then n-gram 4 /
# draft 16), ngram-cache and draft-simple with the model as its own draft (acceptance ~100 %, but the drafter
# costs as much as the target: an upper bound on acceptance, a lower bound on speed). Each line
# says whether the tokens were the same as plain greedy. A benchmark: it asserts nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
exe="${HM_EXE:-$root/build/hotmoe}"
model="${1:-$root/models/tiny-qwen3moe-q8_0.gguf}"
threads="${2:-2}"
reps="${REPS:-5}"
ngen="${N_GEN:-128}"
prompt="$root/bench/data/spec_edit_prompt.txt"
[ -x "$exe" ] || { echo "build hotmoe first: $exe missing" >&2; exit 1; }
run() {
    echo "== $*"
    # shellcheck disable=SC2086
    "$exe" bench -m "$model" -t "$threads" -r "$reps" -p 0 -n "$ngen" -f "$prompt" ${EXTRA:-} "$@" 2>&1 |
        grep -E "greedy|speculation"
}
run --spec-type ngram-simple
run --spec-type ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m 16
run --spec-type ngram-cache
run --spec-type draft-simple -md "$model" --spec-draft-n-max 4
