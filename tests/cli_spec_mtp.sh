#!/usr/bin/env bash
# cli_spec_mtp.sh - draft-mtp from the command line and in the server, on the synth tiny qwen35moe
# with its MTP block (synth --nextn 1):
#   - `run --temp 0 --spec-type draft-mtp` (and ngram-simple on a repetitive prompt: drafts kept,
#     so the recurrent state is restored and replayed) prints the same text as the plain run;
#   - `serve --spec-type ngram-simple`: a greedy completion with the request's speculative.n_max 2
#     is the plain server's text; /slots shows the slot's speculative type, n_max 2 and its counts;
#     /metrics counts drafted and accepted tokens and their rate; a bad speculative.n_max is a 400;
#   - `serve --spec-type draft-mtp` answers, and on the file without the MTP block it is refused
#     at start naming what is missing.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_need curl
hm_tmpdir spec_mtp
check "synth --nextn 1" test "$(code "$EXE" synth --arch qwen35moe --preset tiny --nextn 1 --type q8_0 --seed 1 -q -t 2 \
    -o "$tmp/m.gguf")" = 0
check "synth --nextn on qwen3moe refused" test "$(code "$EXE" synth --preset tiny --nextn 1 --type q8_0 -o "$tmp/x.gguf")" = 2
check "synth --nextn named" grep -q "MTP block is written for --arch qwen35moe and qwen3next only" "$tmp/err"
P='one two three four five six one two three four five six one two three'
check "plain run" test "$(code "$EXE" run -m "$tmp/m.gguf" -p "$P" -n 40 --temp 0 -t 2)" = 0
cp "$tmp/out" "$tmp/plain"
check "draft-mtp run" test "$(code "$EXE" run -m "$tmp/m.gguf" -p "$P" -n 40 --temp 0 -t 2 --spec-type draft-mtp \
    --spec-draft-n-max 4)" = 0
check "draft-mtp: same text" cmp -s "$tmp/plain" "$tmp/out"
check "draft-mtp: stats" grep -q "speculation (draft-mtp): [0-9]* drafted" "$tmp/err"
check "ngram-simple run (qwen35moe)" test "$(code "$EXE" run -m "$tmp/m.gguf" -p "$P" -n 40 --temp 0 -t 2 \
    --spec-type ngram-simple --spec-ngram-simple-size-n 1 --spec-ngram-simple-size-m 4)" = 0
check "ngram-simple (qwen35moe): same text" cmp -s "$tmp/plain" "$tmp/out"

LOG=$tmp/log
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
REQ='{"prompt":"one two three four five six one two three four five six one two","max_tokens":24,"temperature":0,"ignore_eos":false'
hm_serve_up "$tmp/m.gguf" -t 2 -c 256
check "plain server up" test "$up" = 1
if [ "$up" = 1 ]; then
    curl -s "http://127.0.0.1:$PORT/v1/completions" -d "$REQ}" | jq -r '.choices[0].text' >"$tmp/srv_plain"
    kill $pid; wait $pid 2>/dev/null
fi
hm_serve_up "$tmp/m.gguf" -t 2 -c 256 --spec-type ngram-simple --spec-ngram-simple-size-n 1 --spec-ngram-simple-size-m 4
check "spec server up" test "$up" = 1
if [ "$up" = 1 ]; then
    curl -s "http://127.0.0.1:$PORT/v1/completions" -d "$REQ,\"speculative.n_max\":2}" | jq -r '.choices[0].text' \
        >"$tmp/srv_spec"
    check "server: same text as without speculation" cmp -s "$tmp/srv_plain" "$tmp/srv_spec"
    check "server: text not empty" test -s "$tmp/srv_spec"
    curl -s "http://127.0.0.1:$PORT/slots" >"$tmp/slots"
    check "slots: type" test "$(jq -r '.[0].speculative.type' "$tmp/slots")" = ngram-simple
    check "slots: the request's n_max" test "$(jq -r '.[0].speculative.n_max' "$tmp/slots")" = 2
    check "slots: drafted" test "$(jq -r '.[0].speculative.n_drafted' "$tmp/slots")" -gt 0
    curl -s "http://127.0.0.1:$PORT/metrics" >"$tmp/metrics"
    d=$(awk '/^hotmoe_spec_decode_num_draft_tokens_total/ {print $2}' "$tmp/metrics")
    a=$(awk '/^hotmoe_spec_decode_num_accepted_tokens_total/ {print $2}' "$tmp/metrics")
    echo "server: drafted $d, accepted $a"
    check "metrics: drafted" awk -v d="$d" 'BEGIN { exit !(d > 0) }'
    check "metrics: accepted <= drafted" awk -v d="$d" -v a="$a" 'BEGIN { exit !(a <= d && a >= 0) }'
    check "metrics: rate" grep -q "^hotmoe_spec_decode_acceptance_rate " "$tmp/metrics"
    code=$(curl -s -o "$tmp/bad" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/completions" -d "$REQ,\"speculative.n_max\":0}")
    check "bad speculative.n_max: 400 ($code)" test "$code" = 400
    kill $pid; wait $pid 2>/dev/null
fi
hm_serve_up "$tmp/m.gguf" -t 2 -c 256 --spec-type draft-mtp
check "draft-mtp server up" test "$up" = 1
if [ "$up" = 1 ]; then
    curl -s "http://127.0.0.1:$PORT/v1/completions" -d "$REQ}" | jq -r '.choices[0].text' >"$tmp/srv_mtp"
    check "draft-mtp server: same text" cmp -s "$tmp/srv_plain" "$tmp/srv_mtp"
    kill $pid; wait $pid 2>/dev/null
fi
pid=
check "synth without MTP" test "$(code "$EXE" synth --arch qwen35moe --preset tiny --type q8_0 --seed 1 -q -t 2 \
    -o "$tmp/n.gguf")" = 0
check "serve draft-mtp without MTP refused" test "$(code "$EXE" serve -m "$tmp/n.gguf" --port 1 --spec-type draft-mtp)" != 0
check "serve draft-mtp without MTP named" grep -q "no multi-token-prediction layer" "$tmp/err"
exit $fail
