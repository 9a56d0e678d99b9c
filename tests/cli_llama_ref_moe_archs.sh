#!/usr/bin/env bash
# cli_llama_ref_moe_archs.sh - glm4moe, olmoe and llama-with-experts (Mixtral) against llama.cpp:
# for each, `hotmoe synth --arch A --preset A-tiny --type q8_0 --seed 1` (every feature of the arch
# switched on: docs/SYNTH.md) whose sha256 must equal the one its reference was computed on
# (tests/fixtures/llama_moe_archs/PRESET/model.sha256: a synth change that alters the bytes makes
# the reference stale, and that must be loud), then `hotmoe logits` on the fixture's 128 token ids
# and tests/llama_ref_compare.c against llama.cpp's logits: top-1 >= 99.5 %, mean KL < 5e-5, no
# disagreement where llama.cpp's margin > 0.5, and llama_ref_compare's regression guards.
# The KL bound is tighter than the issue's 1e-3: the synth's embedding dominates the residual
# stream, so some wrong layers move the logits little (NEOX instead of normal RoPE pairs on
# mixtral-tiny: mean KL 1.2e-4; today's values are 1.1e-5, 3.4e-6 and 2.7e-7).
# tests/fixtures/llama_moe_archs/README.md says how the references were made. A few seconds.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir llama_moe_archs
cmpexe="${HM_BINARY_DIR:-$SRC/build}/llama_ref_compare"
fix="$SRC/tests/fixtures/llama_moe_archs"
[ -x "$cmpexe" ] || { echo "FAIL: $cmpexe not built"; exit 1; }
for ap in glm4moe:glm4moe-tiny olmoe:olmoe-tiny llama:mixtral-tiny; do
    a=${ap%%:*} p=${ap#*:}
    m="$tmp/$p.gguf"
    check "synth $p" test "$(code "$EXE" synth --arch $a --preset $p --type q8_0 --seed 1 -q -t 2 -o "$m")" = 0
    want=$(awk '{print $1}' "$fix/$p/model.sha256")
    got=$(sha256sum "$m" | awk '{print $1}')
    if [ "$got" != "$want" ]; then
        echo "FAIL: $p: the synth model's sha256 is $got, the reference was made from $want:"
        echo "      regenerate tests/fixtures/llama_moe_archs/$p as its README.md says"
        fail=1
        continue
    fi
    check "logits $p" test "$(code "$EXE" logits -m "$m" --tokens-file "$fix/tokens.txt" -o "$tmp/$p.f32" -t 2)" = 0
    if "$cmpexe" "$fix/$p" "$tmp/$p.f32" 0.995 5e-5 >"$tmp/cmp" 2>&1; then
        grep -E "top-1 agreement:|KL" "$tmp/cmp" | sed "s/^/$p: /"
    else
        sed "s/^/$p: /" "$tmp/cmp"
        echo "FAIL: $p against llama.cpp"
        fail=1
    fi
done
# a dense llama file (no experts) is refused with a message saying so, not run
d="$tmp/dense.gguf"
if python3 - "$SRC/tools" "$d" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from gguf_write import GGUFWriter, GGML_F32
w = GGUFWriter(sys.argv[2])
w.add_str("general.architecture", "llama")
for k, v in (("block_count", 1), ("context_length", 64), ("embedding_length", 32), ("feed_forward_length", 64),
             ("attention.head_count", 2)):
    w.add_u32("llama." + k, v)
w.add_tensor_raw("blk.0.ffn_gate.weight", [32, 64], GGML_F32, bytes(32 * 64 * 4))
w.write()
PY
then
    check "dense llama refused" test "$(code "$EXE" logits -m "$d" --tokens 1 -o "$tmp/d.f32")" != 0
    check "dense llama message" grep -q "dense model" "$tmp/err"
else
    echo "FAIL: could not write the dense llama file"
    fail=1
fi
exit $fail
