#!/usr/bin/env bash
# demo.sh - install dependencies, build hotmoe, and run the bundled demo: synthesise a tiny
# random-weight MoE model, inspect its expert units, generate from it and plan a VRAM budget from
# the usage it recorded. (Random weights: the text is gibberish; the routing is real.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
mkdir -p demo
./build/hotmoe synth --arch qwen3moe --preset tiny --type q4_k_m --seed 1 -o demo/tiny.gguf
./build/hotmoe inspect demo/tiny.gguf --budget 2MiB
./build/hotmoe run -m demo/tiny.gguf -p "The experts of this model" -n 32 --seed 1 --profile-out demo/usage.json
./build/hotmoe plan -m demo/tiny.gguf --profile demo/usage.json --budget 25%
