#!/usr/bin/env bash
# cli_llama_ref_gptoss.sh - gpt-oss against llama.cpp: the synth tiny gpt-oss (2 layers: one
# sliding, one full; attention biases and sinks, YaRN, biased router with a softmax over the chosen
# logits, clamped SwiGLU experts with biases) at --type f32 and mxfp4 (the real files' mix: MXFP4
# experts, Q8_0 matrices), seed 1, whose sha256 must equal the one its reference was computed on
# (tests/fixtures/llama_gptoss/TYPE/model.sha256), then `hotmoe logits` on llama_lowbit's 128 token
# ids in one pass and token by token (-ub 1: the decode kernels, the sliding layer's ring wrapping)
# and tests/llama_ref_compare.c against llama.cpp's logits: top-1 >= 99.5 %; mean KL < 1e-5 for
# f32 (the semantics: today 1.5e-7) and < 1e-3 for mxfp4; no disagreement where llama.cpp's margin
# > 0.5; llama_ref_compare's regression guards. tests/fixtures/llama_gptoss/README.md says how the
# references were made. A few seconds.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir llama_gptoss
cmpexe="${HM_BINARY_DIR:-$SRC/build}/llama_ref_compare"
fix="$SRC/tests/fixtures/llama_gptoss"
toks="$SRC/tests/fixtures/llama_lowbit/tokens.txt"
[ -x "$cmpexe" ] || { echo "FAIL: $cmpexe not built"; exit 1; }
for t in f32 mxfp4; do
    m="$tmp/$t.gguf"
    check "synth $t" test "$(code "$EXE" synth --arch gpt-oss --preset tiny --layers 2 --type $t --seed 1 -q -t 2 -o "$m")" = 0
    want=$(awk '{print $1}' "$fix/$t/model.sha256")
    got=$(sha256sum "$m" | awk '{print $1}')
    if [ "$got" != "$want" ]; then
        echo "FAIL: $t: the synth model's sha256 is $got, the reference was made from $want:"
        echo "      regenerate tests/fixtures/llama_gptoss/$t as its README.md says"
        fail=1
        continue
    fi
    kl=1e-3
    [ $t = f32 ] && kl=1e-5
    for ub in 512 1; do
        check "logits $t -ub $ub" test "$(code "$EXE" logits -m "$m" --tokens-file "$toks" -o "$tmp/$t.f32" -t 2 -ub $ub)" = 0
        if "$cmpexe" "$fix/$t" "$tmp/$t.f32" 0.995 $kl >"$tmp/cmp" 2>&1; then
            grep -E "top-1 agreement:|KL" "$tmp/cmp" | sed "s/^/$t -ub $ub: /"
        else
            sed "s/^/$t -ub $ub: /" "$tmp/cmp"
            echo "FAIL: $t -ub $ub against llama.cpp"
            fail=1
        fi
    done
done
exit $fail
