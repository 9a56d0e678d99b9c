#!/usr/bin/env bash
# cli_llama_ref_deepseek4.sh - DeepSeek-V4 (deepseek4) against llama.cpp: for q8_0 and q4_k_m, the
# synth tiny deepseek4 model (5 layers: uncompressed, ratio 4 with the indexer, 128, 4, 128;
# hyper-connections, hash-routed layers, shared expert, clamped SwiGLU) whose sha256 must equal the
# one its reference was computed on (tests/fixtures/llama_deepseek4/TYPE/model.sha256), then
# `hotmoe logits` on the fixture's 256 token ids in one pass, in micro-batches of 7 and token by
# token (the compressed state carried across calls), each against llama.cpp's logits through
# tests/llama_ref_compare.c: top-1 >= 99.5 %, mean KL < 1e-3, no disagreement where llama.cpp's
# margin > 0.5, and its regression guards: a state lost between micro-batches (compressor rows,
# compressed rows, the window) fails them. tests/fixtures/llama_deepseek4/README.md says how the
# references were made and what the checks catch. Also: -ngl 99 runs where there is a GPU, and is
# refused with a message where there is none (tests/test_deepseek4_gpu.c holds the GPU's logits to the
# CPU's). Seconds: tiny models.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir llama_ds4
cmpexe="${HM_BINARY_DIR:-$SRC/build}/llama_ref_compare"
fix="$SRC/tests/fixtures/llama_deepseek4"
[ -x "$cmpexe" ] || { echo "FAIL: $cmpexe not built"; exit 1; }
compare() { # compare NAME TYPE FILE.f32
    if "$cmpexe" "$fix/$2" "$3" 0.995 1e-3 >"$tmp/cmp" 2>&1; then
        grep -E "top-1 agreement:|KL" "$tmp/cmp" | sed "s/^/$1: /"
    else
        sed "s/^/$1: /" "$tmp/cmp"
        echo "FAIL: $1 against llama.cpp"
        fail=1
    fi
}
for t in q8_0 q4_k_m; do
    m="$tmp/$t.gguf"
    check "synth $t" test "$(code "$EXE" synth --arch deepseek4 --preset tiny --type $t --seed 1 -q -t 2 -o "$m")" = 0
    want=$(awk '{print $1}' "$fix/$t/model.sha256")
    got=$(sha256sum "$m" | awk '{print $1}')
    if [ "$got" != "$want" ]; then
        echo "FAIL: $t: the synth model's sha256 is $got, the reference was made from $want:"
        echo "      regenerate tests/fixtures/llama_deepseek4/$t as its README.md says"
        fail=1
        continue
    fi
    for ub in 512 7 1; do
        check "logits $t -ub $ub" test "$(code "$EXE" logits -m "$m" --tokens-file "$fix/tokens.txt" -o "$tmp/$t-$ub.f32" -t 2 -ub $ub)" = 0
        compare "$t -ub $ub" $t "$tmp/$t-$ub.f32"
    done
done
# -ngl 99: runs on a GPU; without one (or without CUDA in the build) a clear refusal, never a crash
m="$tmp/q8_0.gguf"
if [ -f "$m" ]; then
    "$EXE" run -m "$m" -p "hi" -n 2 -t 1 -ngl 99 >"$tmp/gpu" 2>&1
    rc=$?
    if [ $rc != 0 ]; then
        check "-ngl 99 refusal says why (exit $rc)" grep -qE "no CUDA device|built without CUDA" "$tmp/gpu"
        check "-ngl 99 refusal is no crash" test $rc -lt 128
    fi
fi
exit $fail
