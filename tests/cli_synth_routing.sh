#!/usr/bin/env bash
# cli_synth_routing.sh - `hotmoe synth --routing-profile` on the command line: the help names it,
# a good profile writes a file that carries the provenance keys, a profile with the wrong expert
# count is exit 2 with both counts named, a missing profile is exit 1 naming the file, and
# nothing is left behind by a failed run. test_synth_routing.c checks the routing itself.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir synth_routing
profile() { # profile FILE N_EXPERT: a 1-layer hotmoe.profile.v1, counts 16, 15, ...
    local counts; counts=$(seq "$2" -1 1 | paste -sd, -)
    printf '{"schema": "hotmoe.profile.v1", "model": "", "arch": "qwen3moe", "n_layer": 1, "n_expert": %d, "k": 4,
 "tokens": 100, "prompt_tokens": 0, "decode_tokens": 100, "steps": 100, "unit_bytes": 0,
 "layers": [{"layer": 0, "counts": [%s]}]}\n' "$2" "$counts" >"$1"
}

check "help mentions --routing-profile" test "$(code "$EXE" synth --help)" = 0
check "help text" grep -q -- "--routing-profile" "$tmp/out"
check "help lists qwen36-geom" grep -q "qwen36-geom" "$tmp/out"

profile "$tmp/p16.json" 16
check "synth with a profile" test "$(code "$EXE" synth --preset tiny --type q8_0 --layers 2 -q \
    --routing-profile "$tmp/p16.json" -o "$tmp/r.gguf")" = 0
check "file written" test -s "$tmp/r.gguf"
check "provenance key" grep -q "hotmoe.synth.routing.layer_map" "$tmp/r.gguf"

profile "$tmp/p32.json" 32
check "wrong expert count exit 2" test "$(code "$EXE" synth --preset tiny --type q8_0 -q \
    --routing-profile "$tmp/p32.json" -o "$tmp/bad.gguf")" = 2
check "wrong expert count message" grep -q "p32.json has 32 experts per layer but preset 'tiny' has 16" "$tmp/err"
check "nothing left behind" test ! -e "$tmp/bad.gguf" -a ! -e "$tmp/bad.gguf.tmp"
check "missing profile exit 1" test "$(code "$EXE" synth --preset tiny --type q8_0 -q \
    --routing-profile "$tmp/nope.json" -o "$tmp/bad.gguf")" = 1
check "missing profile named" grep -q "nope.json" "$tmp/err"
check "no value exit 2" test "$(code "$EXE" synth --preset tiny --type q8_0 -o "$tmp/x.gguf" --routing-profile)" = 2

exit $fail
