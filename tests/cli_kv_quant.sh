#!/usr/bin/env bash
# cli_kv_quant.sh - the -ctk/-ctv KV cache types from the command line:
#   - `inspect -c N -ctk T --json`: kv_bytes of q8_0 (34 bytes per 32 values), q4_0 (18 per 32) and
#     bf16 (2 a value) computed here by hand from the file's hparams, for the bundled model;
#   - K and V of different types and an unknown type are refused with a message (run and serve);
#   - `serve -ctk q8_0 -ctv q8_0` comes up and answers a completion;
#   - perplexity of the bundled model on the held-out split with a q8_0 cache: within 1 % of
#     transformers' (tools/train_tiny/results/eval.json, the same reference cli_tiny_model.sh holds
#     the f16 cache to; measured: 5.8379 with q8_0, 5.8386 with f16, transformers 5.8361);
#   - a gemma4 synth (sliding ring + global layers, head_dim 64 and 128) runs with a q8_0 cache and
#     gives finite logits; its top tokens agree with the f16 cache's at most positions (>= 90 %).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir kv_quant
hm_need jq
M="$SRC/models/tiny-qwen3moe-q8_0.gguf"
EV="$SRC/tools/train_tiny/results/eval.json"
TXT="$SRC/tests/data/tiny_heldout.txt"
[ -f "$M" ] || { echo "skipped: $M absent"; exit 77; }

# ---- bytes by hand
"$EXE" inspect "$M" --json > "$tmp/i.json"
nl=$(jq '.n_layer' "$tmp/i.json")
nkv=$(jq '.hparams["qwen3moe.attention.head_count_kv"]' "$tmp/i.json")
hd=$(jq '.hparams["qwen3moe.attention.key_length"]' "$tmp/i.json")
N=1000
for t in "q8_0 34 32" "q4_0 18 32" "bf16 2 1" "f16 2 1" "f32 4 1"; do
    set -- $t
    want=$(( nl * 2 * nkv * N * (hd / $3) * $2 ))
    got=$("$EXE" inspect "$M" --json -c $N -ctk "$1" -ctv "$1" | jq '.kv_bytes')
    echo "kv bytes $1: $got (by hand $want = $nl layers x 2 x $nkv heads x $N x $hd / $3 x $2)"
    check "inspect -c $N -ctk $1: kv_bytes" test "$got" = "$want"
done

# ---- refusals
check "-ctk q8_0 -ctv f16 refused" test "$(code "$EXE" logits -m "$M" --tokens 1,2 -o "$tmp/x.f32" -ctk q8_0 -ctv f16)" != 0
check "... naming one type for both" grep -q "one type for both" "$tmp/err"
check "-ctk q5_1 refused" test "$(code "$EXE" logits -m "$M" --tokens 1,2 -o "$tmp/x.f32" -ctk q5_1)" != 0
check "... naming the types" grep -q "q8_0" "$tmp/err"
check "serve -ctk q8_0 -ctv q4_0 refused" test "$(code "$EXE" serve -m "$M" -ctk q8_0 -ctv q4_0)" != 0
check "... naming one type for both" grep -q "one type for both" "$tmp/err"

# ---- serve -ctk q8_0: every slot's cache q8_0, a completion through it
if command -v curl >/dev/null; then
    LOG="$tmp/serve.log"
    hm_serve_up "$M" -ctk q8_0 -ctv q8_0 -c 256 -t 2
    check "serve -ctk q8_0 starts" test "$up" = 1
    if [ "$up" = 1 ]; then
        st=$(curl -s -o "$tmp/c.json" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/completions" \
            -d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0}')
        echo "serve -ctk q8_0 -ctv q8_0: up, a completion answered HTTP $st"
        check "serve -ctk q8_0: a completion (HTTP $st)" test "$st" = 200
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
fi

# ---- perplexity with a q8_0 cache against transformers
ref=$(jq .ppl_q8_0 "$EV")
check "perplexity -ctk q8_0 runs" test "$(code "$EXE" perplexity -m "$M" -f "$TXT" -c 512 -t 2 -ctk q8_0 -ctv q8_0)" = 0
ppl=$(sed -n 's/^Final estimate: PPL = \([0-9.]*\).*/\1/p' "$tmp/out" "$tmp/err" | head -1)
echo "perplexity with a q8_0 cache: ${ppl:-?} (transformers: $ref)"
check "q8_0 cache: perplexity within 1 % of transformers" \
    awk -v a="${ppl:-0}" -v b="$ref" 'BEGIN { d = (a - b) / b; exit !(d < 0.01 && d > -0.01) }'

# ---- gemma4 (the ring path) with a q8_0 cache
G="$tmp/g4.gguf"
check "gemma4 synth" test "$(code "$EXE" synth --arch gemma4 --preset gemma4-tiny --type q8_0 -o "$G")" = 0
toks=$(seq -s, 3 7 420) # 60 tokens: past the sliding window (16)
for kv in f16 q8_0; do
    check "gemma4 logits -ctk $kv" test "$(code "$EXE" logits -m "$G" --tokens "$toks" -o "$tmp/g_$kv.f32" -ub 7 -t 2 -ctk $kv -ctv $kv)" = 0
done
V=$(jq '.n_vocab' <("$EXE" inspect "$G" --json))
agree=$(python3 - "$tmp/g_f16.f32" "$tmp/g_q8_0.f32" "$V" <<'PY'
import math, struct, sys
a, b, V = open(sys.argv[1], 'rb').read(), open(sys.argv[2], 'rb').read(), int(sys.argv[3])
fa, fb = struct.unpack('%df' % (len(a) // 4), a), struct.unpack('%df' % (len(b) // 4), b)
n = len(fa) // V
if len(fb) != len(fa) or any(not math.isfinite(x) for x in fb): print(-1); sys.exit()
am = lambda f, t: max(range(V), key=lambda i: f[t * V + i])
print(sum(am(fa, t) == am(fb, t) for t in range(n)) * 100 // n)
PY
)
echo "gemma4 synth: top-1 q8_0 vs f16 cache at ${agree:-?} % of positions"
check "gemma4 q8_0: finite, top-1 agrees >= 90 %" test "${agree:--1}" -ge 90
exit $fail
