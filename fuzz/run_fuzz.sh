#!/usr/bin/env bash
# run_fuzz.sh [seconds] [target ...] - build the libFuzzer targets with clang into build-fuzz and
# fuzz each target for N seconds (default 60), one after the other: fuzz_gguf (the GGUF reader,
# seeds fuzz/corpus/gguf/ and fuzz/corpus/model/) and fuzz_model (loading a model: hparams, tensors, tokenizer, a
# two-token eval; seeds fuzz/corpus/model/). Both use fuzz/gguf.dict (the header keys each arch
# reads). Targets default to both. Each fuzzes a scratch copy of its seeds in
# fuzz/corpus-work/<name>/ (gitignored), one worker. Exits non-zero when a fuzzer finds a crash
# (the input is saved under fuzz/corpus-work/ as crash-*; add it to fuzz/regress/<name>/ once
# fixed). One process, one core: the machine is shared.
set -euo pipefail
secs="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf model)
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-fuzz"
work="$root/fuzz/corpus-work"

CC=clang cmake -S "$root" -B "$build" -DHOTMOE_FUZZ=ON -DHOTMOE_CUDA=OFF -DHOTMOE_NATIVE=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j2 --target $(printf 'fuzz_%s ' "${targets[@]}")

failed=0
for name in "${targets[@]}"; do
    mkdir -p "$work/$name"
    cp -n "$root"/fuzz/corpus/"$name"/* "$work/$name/" 2>/dev/null || true
    # the reader also starts from the model seeds: the keys each arch reads, in a real file
    if [ "$name" = gguf ]; then cp -n "$root"/fuzz/corpus/model/* "$work/$name/" 2>/dev/null || true; fi
    if [ -d "$root/fuzz/regress/$name" ]; then cp -n "$root"/fuzz/regress/"$name"/* "$work/$name/" 2>/dev/null || true; fi
    marker="$work/.run-start-$name"
    touch "$marker"
    echo "fuzzing fuzz_$name for ${secs}s (corpus $work/$name)"
    set +e
    (cd "$work" && "$build/fuzz_$name" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
        -dict="$root/fuzz/gguf.dict" -print_final_stats=1 -artifact_prefix="$work/" "$work/$name") 2>&1 |
        tee "$work/last_run_$name.log"
    rc=${PIPESTATUS[0]}
    set -e
    new_artifacts="$(find "$work" -maxdepth 1 -newer "$marker" \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \))"
    if [ "$rc" -ne 0 ] || [ -n "$new_artifacts" ]; then
        echo "run_fuzz.sh: fuzz_$name failed (rc $rc); artifacts:" >&2
        echo "$new_artifacts" >&2
        failed=1
    else
        echo "run_fuzz.sh: fuzz_$name: no crashes in ${secs}s"
    fi
done
exit $failed
