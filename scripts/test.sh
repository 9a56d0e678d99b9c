#!/usr/bin/env bash
# test.sh - install dependencies, build (warnings are errors), run every CPU test, an ASan+UBSan
# build of the fast tests, and both fuzzers (GGUF reader, model load) for 60 s each. GPU tests
# skip themselves without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --test
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DHOTMOE_WERROR=ON
cmake --build build -j"$jobs"
if [ -f tests/js/package.json ]; then (cd tests/js && npm ci --no-audit --no-fund --silent); fi
ctest --test-dir build --output-on-failure -j"$jobs"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHOTMOE_WERROR=ON -DHOTMOE_SANITIZE=ON -DHOTMOE_CUDA=OFF
cmake --build build-asan -j"$jobs"
ctest --test-dir build-asan --output-on-failure -j"$jobs" -L fast
if [ -x fuzz/run_fuzz.sh ]; then fuzz/run_fuzz.sh 60; fi
echo "all tests passed"
