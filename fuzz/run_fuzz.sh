#!/usr/bin/env bash
# run_fuzz.sh [seconds] - build the libFuzzer targets with clang into build-fuzz and fuzz the GGUF
# reader for N seconds (default 60) on a scratch copy of the seed corpus (fuzz/corpus-work/,
# gitignored), one worker. Exits non-zero when the fuzzer finds a crash (the input is saved
# under fuzz/corpus-work/ as crash-*; add it to fuzz/regress/gguf/ once fixed). One process, one
# core: the machine is shared.
set -euo pipefail
secs="${1:-60}"
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-fuzz"
work="$root/fuzz/corpus-work"

CC=clang cmake -S "$root" -B "$build" -DHOTMOE_FUZZ=ON -DHOTMOE_CUDA=OFF -DHOTMOE_NATIVE=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j2 --target fuzz_gguf

mkdir -p "$work/gguf"
cp -n "$root"/fuzz/corpus/gguf/* "$work/gguf/" 2>/dev/null || true
if [ -d "$root/fuzz/regress/gguf" ]; then cp -n "$root"/fuzz/regress/gguf/* "$work/gguf/" 2>/dev/null || true; fi

cd "$work"
marker="$work/.run-start"
touch "$marker"
echo "fuzzing the GGUF reader for ${secs}s (corpus $work/gguf)"
set +e
"$build/fuzz_gguf" -max_total_time="$secs" -max_len=65536 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/" "$work/gguf" 2>&1 | tee "$work/last_run.log"
rc=${PIPESTATUS[0]}
set -e
new_artifacts="$(find "$work" -maxdepth 1 -newer "$marker" \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \))"
if [ "$rc" -ne 0 ] || [ -n "$new_artifacts" ]; then
    echo "run_fuzz.sh: the fuzzer failed (rc $rc); artifacts:" >&2
    echo "$new_artifacts" >&2
    exit 1
fi
echo "run_fuzz.sh: no crashes in ${secs}s"
