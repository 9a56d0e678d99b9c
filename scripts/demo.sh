#!/usr/bin/env bash
# demo.sh - install dependencies, build hotmoe, and run the bundled demo on the bundled model,
# models/tiny-qwen3moe-q8_0.gguf: a 24 M-parameter qwen3moe (6 layers x 32 experts, 4 used per
# token) trained on Python source and package documentation (tools/train_tiny/README.md). It shows
# the model's expert units, continues a Python function and an English sentence (greedy), records
# which experts the Python run used and plans a VRAM budget from that usage. (A tiny model: the
# text is recognisable Python and documentation prose, not correct programs.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
mkdir -p demo
m=models/tiny-qwen3moe-q8_0.gguf
./build/hotmoe inspect "$m" --budget 5MiB
echo "--- Python (greedy, 48 tokens)"
./build/hotmoe run -m "$m" -p $'def read_json(path):\n    """Load a JSON file."""\n' -n 48 --temp 0 \
    --profile-out demo/usage.json
echo "--- English (greedy, 40 tokens)"
./build/hotmoe run -m "$m" -p "This package provides" -n 40 --temp 0
echo "--- the experts the Python run used, and what 25 % of them in VRAM would hit"
./build/hotmoe plan -m "$m" --profile demo/usage.json --budget 25%
