#!/usr/bin/env bash
# cli_llama_ref_lowbit.sh - the low-bit files against llama.cpp: for each of q4_1, q5_1, iq4_nl,
# q2_k, q3_k_m, a synth tiny model (2 layers, seed 1) whose sha256 must equal the one its
# reference was computed on (tests/fixtures/llama_lowbit/TYPE/model.sha256: a synth or quantiser
# change that alters the bytes makes the reference stale, and that must be loud), then
# `hotmoe logits` on the fixture's 128 token ids and tests/llama_ref_compare.c against llama.cpp's
# logits: top-1 >= 99 %, mean KL < 1e-3, no disagreement where llama.cpp's margin > 0.5, and
# llama_ref_compare's regression guards. tests/fixtures/llama_lowbit/README.md says how the
# references were made. A few seconds: tiny models.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir llama_lowbit
cmpexe="${HM_BINARY_DIR:-$SRC/build}/llama_ref_compare"
fix="$SRC/tests/fixtures/llama_lowbit"
[ -x "$cmpexe" ] || { echo "FAIL: $cmpexe not built"; exit 1; }
for t in q4_1 q5_1 iq4_nl q2_k q3_k_m; do
    m="$tmp/$t.gguf"
    check "synth $t" test "$(code "$EXE" synth --preset tiny --layers 2 --type $t --seed 1 -q -t 2 -o "$m")" = 0
    want=$(awk '{print $1}' "$fix/$t/model.sha256")
    got=$(sha256sum "$m" | awk '{print $1}')
    if [ "$got" != "$want" ]; then
        echo "FAIL: $t: the synth model's sha256 is $got, the reference was made from $want:"
        echo "      regenerate tests/fixtures/llama_lowbit/$t as its README.md says"
        fail=1
        continue
    fi
    check "logits $t" test "$(code "$EXE" logits -m "$m" --tokens-file "$fix/tokens.txt" -o "$tmp/$t.f32" -t 2)" = 0
    if "$cmpexe" "$fix/$t" "$tmp/$t.f32" >"$tmp/cmp" 2>&1; then
        grep -E "top-1 agreement:|KL" "$tmp/cmp" | sed "s/^/$t: /"
    else
        sed "s/^/$t: /" "$tmp/cmp"
        echo "FAIL: $t against llama.cpp"
        fail=1
    fi
done
exit $fail
