#!/usr/bin/env bash
# cli_llama_ref_deepseek2.sh - deepseek2 (DeepSeek-V2/V3: MLA attention over the compressed KV
# cache, q LoRA, YaRN, a dense first layer, sigmoid routing with exp_probs_b and groups, a shared
# expert) against llama.cpp: `hotmoe synth --arch deepseek2 --preset deepseek2-tiny --type q8_0
# --seed 1`, whose sha256 must equal the one its reference was computed on
# (tests/fixtures/llama_deepseek2/model.sha256; README.md there says how it was made), then
# `hotmoe logits` on the fixture's 128 token ids and tests/llama_ref_compare.c against llama.cpp's
# logits: top-1 >= 99.5 %, mean KL < 1e-3, no disagreement where llama.cpp's margin > 0.5, and its
# regression guards; in one pass and in micro-batches of 7 (F16 cache), and in one pass and token
# by token (-ub 1) with an F32 cache. The F32 passes (one, -ub 7, -ub 1) agree within 1e-4 per
# logit: the chunked prefill and the decode read the compressed cache as the single pass does.
# inspect -c: the cache holds kv_lora + rope values per token and layer, no V. An older conversion
# (attn_kv_b whole, no key_length_mla: tests/ds2_kv_b_gguf.py rewrites the F32 synth so) against
# llama.cpp on that file (its plain multi-head path; fixture kv_b/), and bit-identical with the
# split file's logits. A few seconds.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir llama_ds2
cmpexe="${HM_BINARY_DIR:-$SRC/build}/llama_ref_compare"
fix="$SRC/tests/fixtures/llama_deepseek2"
[ -x "$cmpexe" ] || { echo "FAIL: $cmpexe not built"; exit 1; }
m="$tmp/ds2.gguf"
check "synth deepseek2-tiny" test "$(code "$EXE" synth --arch deepseek2 --preset deepseek2-tiny --type q8_0 --seed 1 -q -t 2 -o "$m")" = 0
want=$(awk '{print $1}' "$fix/model.sha256")
got=$(sha256sum "$m" | awk '{print $1}')
if [ "$got" != "$want" ]; then
    echo "FAIL: the synth model's sha256 is $got, the reference was made from $want:"
    echo "      regenerate tests/fixtures/llama_deepseek2 as its README.md says"
    exit 1
fi
for run in "f16 1 512" "f16 7 7" "f32 1 512" "f32 ub1 1" "f32 ub7 7"; do
    set -- $run
    kv=$1 tag=$2 ub=$3
    out="$tmp/${kv}_$tag.f32"
    check "logits $kv -ub $ub" test "$(code "$EXE" logits -m "$m" --tokens-file "$fix/tokens.txt" -o "$out" -t 2 -ub "$ub" --kv-type "$kv")" = 0
    [ "$tag" = ub7 ] && continue # compared with the one pass below
    if "$cmpexe" "$fix" "$out" 0.995 1e-3 >"$tmp/cmp" 2>&1; then
        grep -E "top-1 agreement:|KL" "$tmp/cmp" | sed "s/^/$kv -ub $ub: /"
    else
        sed "s/^/$kv -ub $ub: /" "$tmp/cmp"
        echo "FAIL: $kv -ub $ub against llama.cpp"
        fail=1
    fi
done
for tag in ub1 ub7; do
    d=$(python3 - "$tmp/f32_1.f32" "$tmp/f32_$tag.f32" <<'PY'
import math, struct, sys
a, b = open(sys.argv[1], 'rb').read(), open(sys.argv[2], 'rb').read()
if len(a) != len(b) or not a: print("nan"); sys.exit()
fa, fb = struct.unpack('%df' % (len(a) // 4), a), struct.unpack('%df' % (len(b) // 4), b)
print(max(abs(x - y) if math.isfinite(y) else math.inf for x, y in zip(fa, fb)))
PY
)
    echo "f32 one pass vs $tag: max |logit difference| $d"
    check "f32 $tag agrees with one pass within 1e-4" awk -v d="$d" 'BEGIN { exit !(d + 0 == d && d < 1e-4) }'
done
# the older conversion (attn_kv_b)
f32="$tmp/ds2_f32.gguf" kvb="$tmp/ds2_kv_b.gguf"
check "synth deepseek2-tiny f32" test "$(code "$EXE" synth --arch deepseek2 --preset deepseek2-tiny --type f32 --seed 1 -q -t 2 -o "$f32")" = 0
check "rewrite as attn_kv_b" python3 "$SRC/tests/ds2_kv_b_gguf.py" "$f32" "$kvb"
want=$(awk '{print $1}' "$fix/kv_b/model.sha256")
got=$(sha256sum "$kvb" | awk '{print $1}')
if [ "$got" != "$want" ]; then
    echo "FAIL: the attn_kv_b model's sha256 is $got, the reference was made from $want:"
    echo "      regenerate tests/fixtures/llama_deepseek2/kv_b as its README.md says"
    fail=1
else
    check "logits attn_kv_b" test "$(code "$EXE" logits -m "$kvb" --tokens-file "$fix/tokens.txt" -o "$tmp/kvb.f32" -t 2)" = 0
    if "$cmpexe" "$fix/kv_b" "$tmp/kvb.f32" 0.995 1e-3 >"$tmp/cmp" 2>&1; then
        grep -E "top-1 agreement:|KL" "$tmp/cmp" | sed "s/^/attn_kv_b: /"
    else
        sed "s/^/attn_kv_b: /" "$tmp/cmp"
        echo "FAIL: attn_kv_b against llama.cpp"
        fail=1
    fi
    check "logits f32 split" test "$(code "$EXE" logits -m "$f32" --tokens-file "$fix/tokens.txt" -o "$tmp/split.f32" -t 2)" = 0
    check "attn_kv_b bit-identical with the split file" cmp -s "$tmp/kvb.f32" "$tmp/split.f32"
fi
# 3 layers x 1000 positions x (kv_lora 64 + rope 32) x 2 bytes: one compressed row, no V
check "inspect -c" test "$(code "$EXE" inspect "$m" -c 1000 --json)" = 0
check "inspect -c: the compressed cache's bytes" grep -q '"kv_bytes": 576000' "$tmp/out"
check "run" "$EXE" run -m "$m" -p "the cat is" -n 4 -t 2 >"$tmp/run" 2>&1
exit $fail
