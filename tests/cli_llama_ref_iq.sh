#!/usr/bin/env bash
# cli_llama_ref_iq.sh - the grid i-quants end to end against llama.cpp: for each fixture of
# tests/fixtures/llama_iq_tiny (a tiny 2-layer qwen3moe synth in an i-quant mix or pure i-quant,
# llama.cpp's logits made as its README.md says), re-synthesise the model, check its sha256 (a
# changed synth or quantiser makes the reference stale, loudly), run `hotmoe logits` on the
# fixture's tokens and compare with tests/llama_ref_compare.c (top-1 >= 99 %, mean KL < 1e-3,
# no disagreement where llama.cpp's top-2 margin > 0.5, and its regression guards).
set -uo pipefail
src="${HM_SOURCE_DIR:-.}"
exe="${HM_EXE:-build/hotmoe}"
cmpexe="${HM_BINARY_DIR:-build}/llama_ref_compare"
fix="$src/tests/fixtures/llama_iq_tiny"
for f in "$exe" "$cmpexe"; do
    [ -x "$f" ] || { echo "FAIL: $f not built"; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hm_llama_ref_iq.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
for dir in "$fix"/*/; do
    mix=$(basename "$dir")
    if ! "$exe" synth --arch qwen3moe --preset tiny --layers 2 --type "$mix" --seed 1 -t 2 -q -o "$tmp/$mix.gguf"; then
        echo "FAIL: synth $mix"; fails=$((fails + 1)); continue
    fi
    want=$(awk '{print $1}' "$dir/model.sha256")
    got=$(sha256sum "$tmp/$mix.gguf" | awk '{print $1}')
    if [ "$got" != "$want" ]; then
        echo "FAIL: $mix: the synth model's sha256 is $got, the reference was made from $want;"
        echo "      regenerate tests/fixtures/llama_iq_tiny as its README.md says"
        fails=$((fails + 1)); continue
    fi
    if ! "$exe" logits -m "$tmp/$mix.gguf" --tokens-file "$fix/tokens.txt" -o "$tmp/$mix.f32" -t 2 > /dev/null; then
        echo "FAIL: hotmoe logits $mix"; fails=$((fails + 1)); continue
    fi
    echo "== $mix"
    if ! "$cmpexe" "$dir" "$tmp/$mix.f32"; then
        echo "FAIL: $mix against llama.cpp"; fails=$((fails + 1))
    fi
done
[ "$fails" -eq 0 ] || exit 1
echo "PASS: i-quant models against llama.cpp"
