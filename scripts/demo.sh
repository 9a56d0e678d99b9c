#!/usr/bin/env bash
# demo.sh - install dependencies, build hotmoe, and run the bundled demo: synthesise a tiny
# random-weight MoE model and inspect its expert units.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
mkdir -p demo
./build/hotmoe synth --arch qwen3moe --preset tiny --type q4_k_m --seed 1 -o demo/tiny.gguf
./build/hotmoe inspect demo/tiny.gguf --budget 2MiB
