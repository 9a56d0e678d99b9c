#!/usr/bin/env bash
# cli_files.sh - what the command line does with files that are not plain files, hostile usage
# profiles and an empty prompt (issue 21), on the smallest qwen3moe (fuzz/corpus/model/, no BOS):
#   - --profile-out (and synth -o) onto a FIFO, a symlink to a FIFO, a device node (mknod where
#     allowed): refused with the kind named, the special file left as it was, no .tmp.<pid> left;
#     through a symlink to a regular file: the target replaced, the link kept;
#   - plan --profile naming expert 65535 or layer 1999 of a 1-layer, 2-expert model: refused
#     at once, naming the file (exit 2, plan's code for a mismatch); without a model, one of 2000
#     layers x 65536 experts (before: 2 GiB of counts and minutes of simulating empty layers);
#   - plan/run --profile from a FIFO or /dev/zero, inspect of a FIFO: refused, never read (each
#     under a timeout);
#   - run -f /dev/zero: stops at the 256 MiB cap for text files with an error;
#   - run -p "": says the prompt is empty, not that it "does not fit the context";
#   - serve: POST /profile/save onto a FIFO --profile-out is an error answer, the FIFO intact.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir files
M="$SRC/fuzz/corpus/model/qwen3moe.gguf"
T="timeout 60"

# --profile-out onto special files
mkfifo "$tmp/fifo"
check "profile-out fifo exit 1" test "$(code $T "$EXE" run -m "$M" -p "ab" -n 2 --profile-out "$tmp/fifo")" = 1
check "profile-out fifo named" grep -q "fifo is a FIFO" "$tmp/err"
check "fifo still a fifo" test -p "$tmp/fifo"
check "no fifo temporary" sh -c "! ls '$tmp' | grep -q 'fifo.tmp'"
ln -s fifo "$tmp/to_fifo"
check "profile-out link to fifo exit 1" test "$(code $T "$EXE" run -m "$M" -p "ab" -n 2 --profile-out "$tmp/to_fifo")" = 1
check "link to fifo named" grep -q "to_fifo is a symlink to .*fifo, which is a FIFO" "$tmp/err"
check "link still a link" test -L "$tmp/to_fifo"
if mknod "$tmp/null" c 1 3 2>/dev/null; then
    check "profile-out device exit 1" test "$(code $T "$EXE" run -m "$M" -p "ab" -n 2 --profile-out "$tmp/null")" = 1
    check "device named" grep -q "null is a character device" "$tmp/err"
    check "device still a device" test -c "$tmp/null"
else
    echo "mknod of a character device not permitted here: device-node check skipped"
fi
echo old >"$tmp/real.json"
ln -s real.json "$tmp/link.json"
check "profile-out through a link" test "$(code $T "$EXE" run -m "$M" -p "ab" -n 2 --profile-out "$tmp/link.json")" = 0
check "link kept" test -L "$tmp/link.json"
check "target replaced" grep -q "hotmoe.profile.v1" "$tmp/real.json"
check "no temporaries" sh -c "! ls '$tmp' | grep -q '\.tmp\.'"

# a model path that is a FIFO: refused at once (the open does not wait for a writer)
check "inspect fifo exit 1" test "$(code timeout 20 "$EXE" inspect "$tmp/fifo")" = 1
check "inspect fifo message" grep -q "fifo: not a regular file" "$tmp/err"

mkfifo "$tmp/out.gguf"
check "synth -o fifo exit 2" test "$(code $T "$EXE" synth --preset tiny --layers 1 --type f32 -q -o "$tmp/out.gguf")" = 2
check "synth -o fifo named" grep -q "out.gguf is a FIFO" "$tmp/err"
check "synth fifo still a fifo" test -p "$tmp/out.gguf"

# hostile profiles against the model (1 layer x 2 experts)
printf '{"schema": "llama.cpp.moe_layer_perf.v1", "n_expert": 65536, "layers": [{"layer": 0, "experts": [[65535, 1]]}]}' >"$tmp/e65535.json"
check "plan expert 65535 exit 2" test "$(code $T "$EXE" plan -m "$M" --profile "$tmp/e65535.json" --budget 50% --no-calibrate)" = 2
check "plan expert 65535 message" grep -q "e65535.json has 65536 experts per layer but the model has 2" "$tmp/err"
printf '{"schema": "llama.cpp.moe_layer_perf.v1", "n_expert": 2, "layers": [{"layer": 1999, "experts": [[1, 1]]}]}' >"$tmp/l1999.json"
check "plan layer 1999 exit 2" test "$(code timeout 10 "$EXE" plan -m "$M" --profile "$tmp/l1999.json" --budget 50% --no-calibrate)" = 2
check "plan layer 1999 message" grep -q "is layer 1999 but the model has 1 layers" "$tmp/err"
check "run layer 1999 exit 1" test "$(code $T "$EXE" run -m "$M" -p "ab" -n 1 --profile "$tmp/l1999.json")" = 1
check "run layer 1999 message" grep -q "l1999.json" "$tmp/err"
# without a model the size of a profile is capped: 2000 layers x 65536 experts is 2 x 1 GiB of counts
printf '{"schema": "llama.cpp.moe_layer_perf.v1", "n_expert": 65536, "layers": [{"layer": 1999, "experts": [[65535, 1]]}]}' >"$tmp/wide.json"
check "plan wide exit 1" test "$(code timeout 10 "$EXE" plan --profile "$tmp/wide.json" --budget 50% --unit-bytes 1MiB)" = 1
check "plan wide message" grep -q "2000 layers x 65536 experts is more than" "$tmp/err"
check "plan fifo profile exit 2" test "$(code timeout 20 "$EXE" plan -m "$M" --profile "$tmp/fifo" --budget 50% --no-calibrate)" = 2
check "plan fifo profile message" grep -q "is a FIFO" "$tmp/err"
check "plan /dev/zero exit 2" test "$(code timeout 20 "$EXE" plan --profile /dev/zero --budget 50% --unit-bytes 1MiB)" = 2
check "plan /dev/zero message" grep -q "/dev/zero is a character device" "$tmp/err"

# a prompt file that never ends: an error after the cap, not all memory
check "run -f /dev/zero exit 1" test "$(code timeout 60 "$EXE" run -m "$M" -f /dev/zero -n 1)" = 1
check "run -f /dev/zero message" grep -q "/dev/zero is larger than 256 MiB" "$tmp/err"

# the empty prompt
check "empty prompt exit 1" test "$(code $T "$EXE" run -m "$M" -p "" -n 2)" = 1
check "empty prompt named" grep -q "the prompt is empty" "$tmp/err"
check "not a context problem" sh -c "! grep -q 'does not fit' '$tmp/err'"

# the server's POST /profile/save onto a FIFO (its --profile-out): an error answer naming it, the
# FIFO intact (last: hm_serve replaces the EXIT trap, so $tmp is removed here by hand)
if command -v curl >/dev/null; then
    MODEL="$SRC/models/tiny-qwen3moe-q8_0.gguf"
    mkfifo "$tmp/srv.fifo"
    files_tmp=$tmp
    hm_serve "" --profile-out "$tmp/srv.fifo"
    status=$(curl -s -o "$files_tmp/save" -w '%{http_code}' -X POST "http://127.0.0.1:$PORT/profile/save" -d '{}')
    echo "POST /profile/save onto a FIFO: HTTP $status: $(cat "$files_tmp/save")"
    check "/profile/save onto a fifo refused" test "$status" != 200 -a "$status" != 000
    check "/profile/save names the fifo" grep -q "srv.fifo is a FIFO" "$files_tmp/save"
    check "/profile/save fifo intact" test -p "$files_tmp/srv.fifo"
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    pid=
    check "server fifo still a fifo after exit" test -p "$files_tmp/srv.fifo"
    rm -rf "$files_tmp"
else
    echo "curl not found: the /profile/save check skipped"
fi

exit $fail
