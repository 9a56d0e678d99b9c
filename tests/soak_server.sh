#!/usr/bin/env bash
# soak_server.sh - not run by ctest: CLIENTS concurrent curl clients hammer `hotmoe serve` on 127.0.0.1
# for SECONDS. Each client cycles through completions (plain, streamed), chat (plain, streamed) and,
# every 8th request, a stream it drops after a few tokens (a deliberate disconnect: not a failure).
# A request fails when it is not HTTP 200 with a complete body (JSON with choices / SSE ending in
# [DONE]). The server's RSS is sampled every 10 s. Prints requests, failures, tokens, the server's
# request outcomes, and RSS start / middle / end / max; exits 1 on any failure or a dead server.
# Usage: tests/soak_server.sh [SECONDS=300] [CLIENTS=8] [PARALLEL=4] [MODEL=tests/fixtures/qwen3moe_tiny/model.gguf]
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
EXE=${HM_EXE:-$SRC/build/hotmoe}
SECS=${1:-300} CLIENTS=${2:-8} PAR=${3:-4} MODEL=${4:-$SRC/tests/fixtures/qwen3moe_tiny/model.gguf}
for tool in curl jq; do command -v $tool >/dev/null || { echo "soak: $tool not installed"; exit 2; }; done
TMP=$(mktemp -d)
spid=
trap '[ -n "$spid" ] && kill $spid 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
up=0
for _ in 1 2 3 4 5 6 7 8; do
    PORT=$((20000 + RANDOM % 40000))
    "$EXE" serve -m "$MODEL" --port $PORT --parallel "$PAR" -t 1 -c 1024 --chat-template chatml >"$TMP/log" 2>&1 &
    spid=$!
    for _ in $(seq 1 100); do
        curl -s -o /dev/null "http://127.0.0.1:$PORT/health" && { up=1; break; }
        kill -0 $spid 2>/dev/null || break
        sleep 0.1
    done
    [ $up = 1 ] && break
    kill $spid 2>/dev/null; wait $spid 2>/dev/null; spid=
    grep -q "cannot listen" "$TMP/log" || break
done
[ $up = 1 ] || { cat "$TMP/log"; echo "soak: the server did not start"; exit 1; }
URL=http://127.0.0.1:$PORT
rss() { awk '/VmRSS/ {print $2}' /proc/$spid/status 2>/dev/null; }
# warm-up so the allocator settles (every slot, every request kind), then measure
for i in $(seq 1 "$CLIENTS"); do
    curl -s -o /dev/null "$URL/v1/completions" -d '{"prompt":"warm","max_tokens":256,"ignore_eos":true}' &
    curl -sN -o /dev/null "$URL/v1/chat/completions" -d '{"messages":[{"role":"user","content":"warm"}],"max_tokens":256,"stream":true}' &
done
wait $(jobs -p | grep -v "^$spid$") 2>/dev/null
start=$(date +%s)
end=$((start + SECS))
echo "0 $(rss)" >"$TMP/rss"
client() {
    local i=$1 n=0 f=0 c=0 kind req url out code
    while [ "$(date +%s)" -lt $end ]; do
        kind=$((n % 8))
        local mt=$((16 + RANDOM % 200))
        case $kind in
            0|4) url=/v1/completions req="{\"prompt\":\"client $i request $n\",\"max_tokens\":$mt,\"seed\":$n}" ;;
            1|5) url=/v1/completions req="{\"prompt\":\"client $i request $n\",\"max_tokens\":$mt,\"seed\":$n,\"stream\":true}" ;;
            2)   url=/v1/chat/completions req="{\"messages\":[{\"role\":\"user\",\"content\":\"client $i request $n\"}],\"max_tokens\":$mt,\"temperature\":0}" ;;
            3|6) url=/v1/chat/completions req="{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"client $i request $n\"}],\"max_tokens\":$mt,\"seed\":$n,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" ;;
            7)   url=/v1/completions req="{\"prompt\":\"drop $i $n\",\"max_tokens\":900,\"ignore_eos\":true,\"stream\":true}" ;;
        esac
        if [ $kind = 7 ]; then # read a few events, then hang up
            curl -sN "$URL$url" -d "$req" | head -n 6 >/dev/null
            c=$((c + 1))
        else
            out=$(curl -sN --max-time 60 -w '\n%{http_code}' "$URL$url" -d "$req")
            code=${out##*$'\n'}
            if [ "$code" != 200 ]; then
                f=$((f + 1)); echo "client $i request $n: HTTP $code ${out:0:200}" >>"$TMP/errors"
            elif [[ "$req" == *'"stream":true'* ]]; then
                [[ "$out" == *$'data: [DONE]\n\n'* ]] || { f=$((f + 1)); echo "client $i request $n: stream without [DONE]" >>"$TMP/errors"; }
            else
                echo "${out%$'\n'*}" | jq -e '.choices[0].finish_reason != null and .usage.total_tokens > 0' >/dev/null ||
                    { f=$((f + 1)); echo "client $i request $n: bad body ${out:0:200}" >>"$TMP/errors"; }
            fi
        fi
        n=$((n + 1))
    done
    echo "$n $f $c" >"$TMP/c$i"
}
for i in $(seq 1 "$CLIENTS"); do client "$i" & done
cpids=$(jobs -p | grep -v "^$spid$")
while [ "$(date +%s)" -lt $end ]; do
    sleep 10
    kill -0 $spid 2>/dev/null || break
    echo "$(($(date +%s) - start)) $(rss)" >>"$TMP/rss"
done
wait $cpids 2>/dev/null
alive=1
kill -0 $spid 2>/dev/null || alive=0
echo "$(($(date +%s) - start)) $(rss)" >>"$TMP/rss"
req=0 fail=0 drop=0
for i in $(seq 1 "$CLIENTS"); do read -r n f c <"$TMP/c$i"; req=$((req + n)); fail=$((fail + f)); drop=$((drop + c)); done
curl -s "$URL/metrics" >"$TMP/metrics"
tok=$(awk '/^hotmoe_tokens_predicted_total/ {print $2}' "$TMP/metrics")
outcomes=$(grep '^hotmoe_requests_total' "$TMP/metrics" | sed -E 's/.*outcome="([a-z_]+)"\} ([0-9]+).*/\1=\2/' | tr '\n' ' ')
busy=$(curl -s "$URL/slots" | jq '[.[] | select(.is_processing)] | length')
n=$(wc -l <"$TMP/rss")
r0=$(awk 'NR==1 {print $2}' "$TMP/rss")
rm_=$(awk -v m=$(((n + 1) / 2)) 'NR==m {print $1 "s:" $2}' "$TMP/rss")
r1=$(awk 'END {print $2}' "$TMP/rss")
rmax=$(awk 'BEGIN {m=0} $2 > m {m=$2} END {print m}' "$TMP/rss")
echo "soak: ${SECS}s, $CLIENTS clients, --parallel $PAR: $req requests ($drop deliberately dropped), $fail failed, $tok tokens"
echo "server outcomes: $outcomes; busy slots at the end: $busy; server alive: $alive"
echo "RSS KiB: start $r0, middle $rm_, end $r1, max $rmax"
echo "RSS timeline (s KiB): $(tr '\n' ',' <"$TMP/rss" | sed 's/,$//')"
[ -s "$TMP/errors" ] && { echo "first errors:"; head -n 10 "$TMP/errors"; }
[ "$fail" = 0 ] && [ $alive = 1 ] && [ "$busy" = 0 ]
