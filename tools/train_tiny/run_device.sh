#!/usr/bin/env bash
# run_device.sh - the one command for the accelerator box: bash tools/train_tiny/run_device.sh OUT [TRAIN_SECONDS]
# Runs train.py (corpus, tokenizer, smoke pass, training, export, eval) under a hard time limit;
# everything that must come back is written under OUT (stdout is also kept as OUT/log.txt).
set -euo pipefail
out=${1:?usage: run_device.sh OUT [TRAIN_SECONDS]}
secs=${2:-360}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout -k 10 560 python3 -u "$here/train.py" --out "$out" --train-seconds "$secs" --budget 525 2>&1 \
    | tee "$out/log.txt"
exit "${PIPESTATUS[0]}"
