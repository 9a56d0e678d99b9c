#!/usr/bin/env bash
# cli_gemma4_synth.sh - `hotmoe synth --arch gemma4 --preset gemma4-tiny`: the file loads, the
# gemma4 tokenizer (built-in vocabulary, ids derived by hand from synth_gemma4.c's layout) gives
# the expected ids, and run / logits work. llama.cpp's agreement is in docs/SYNTH.md (gemma4).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir g4synth
m="$tmp/g4.gguf"
check "synth gemma4-tiny" "$EXE" synth --arch gemma4 --preset gemma4-tiny --type q8_0 -q -t 2 -o "$m"
check "unknown gemma4 preset is exit 2" test "$("$EXE" synth --arch gemma4 --preset nope --type q8_0 -o "$tmp/x.gguf" >/dev/null 2>&1; echo $?)" = 2
# layout: 0..6 specials (2 <bos>), 7..262 <0x00>..<0xFF>, 263 U+2581, 264.. a-z, merges from 339
# (he 340, at 348): "the cat" = <bos> t he ▁ c at
check "tokenize 'the cat'" test "$("$EXE" tokenize -m "$m" -p "the cat" --ids)" = "2 283 340 263 266 348"
# " and the" = ▁and (359) ▁the (345: ▁t + he)
# newline run "\n\n" is token 338; é (C3 A9) is not a token: byte fallback <0xC3> <0xA9>
check "tokenize newlines + byte fallback" test "$("$EXE" tokenize -m "$m" -p $'x\n\n\xc3\xa9' --ids)" = "2 287 338 202 176"
check "tokenize ' and the'" test "$("$EXE" tokenize -m "$m" -p " and the" --ids --no-bos)" = "359 345"
check "run" "$EXE" run -m "$m" -p "the cat is" -n 4 -t 1 >"$tmp/run" 2>&1
check "logits" "$EXE" logits -m "$m" --tokens 2,300,301 -o "$tmp/l.f32" -t 1 >/dev/null 2>&1
check "logits size" test "$(stat -c %s "$tmp/l.f32")" = $((3 * 512 * 4))
# inspect -c: the KV cache sessions allocate. gemma4-tiny: layers 0, 1 sliding (window 16, 2 kv
# heads of 64: a ring of min(1000, 16 + 512) = 528 rows at the default -ub 512), layer 2 global
# (1 kv head of 128, 1000 rows); K and V each, 2 bytes: 4 * (2*2*64*528 + 128*1000) = 1052672
check "inspect -c on a sliding-window model" test "$(code "$EXE" inspect "$m" -c 1000 --json)" = 0
check "inspect -c: the rings stop at window + ubatch" grep -q '"kv_bytes": 1052672' "$tmp/out"
# RoPE scaling is not implemented for gemma4: asked for, the load refuses rather than ignore it
check "gemma4 refuses --rope-scaling yarn" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 -t 1 --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 64)" = 1
check "gemma4: the refusal says why" grep -q "RoPE scaling.*not implemented" "$tmp/err"
exit $fail
