#!/usr/bin/env bash
# soak_server.sh - not run by ctest: CLIENTS concurrent clients (half streaming) hammer `hotmoe serve`
# on 127.0.0.1 for SECONDS; prints requests, failures and the server's RSS at start and end.
# Usage: tests/soak_server.sh [SECONDS=300] [CLIENTS=8] [PARALLEL=4] [MODEL=tests/fixtures/qwen3moe_tiny/model.gguf]
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
EXE=${HM_EXE:-$SRC/build/hotmoe}
SECS=${1:-300} CLIENTS=${2:-8} PAR=${3:-4} MODEL=${4:-$SRC/tests/fixtures/qwen3moe_tiny/model.gguf}
PORT=$((20000 + RANDOM % 40000))
TMP=$(mktemp -d)
"$EXE" serve -m "$MODEL" --port $PORT --parallel "$PAR" -t 1 -c 1024 >"$TMP/log" 2>&1 &
spid=$!
trap 'kill $spid 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 1 100); do curl -s -o /dev/null "http://127.0.0.1:$PORT/health" && break; sleep 0.1; done
rss() { awk '/VmRSS/ {print $2}' /proc/$spid/status; }
# warm-up so the allocator settles, then measure
curl -s -o /dev/null "http://127.0.0.1:$PORT/v1/completions" -d '{"prompt":"warm","max_tokens":64}'
rss0=$(rss)
end=$(($(date +%s) + SECS))
client() {
    local i=$1 n=0 f=0
    while [ "$(date +%s)" -lt $end ]; do
        local stream=false
        [ $((n % 2)) = 1 ] && stream=true
        local req="{\"prompt\":\"client $i request $n\",\"max_tokens\":$((16 + RANDOM % 200)),\"seed\":$n,\"stream\":$stream}"
        if $stream; then
            curl -sN --max-time 60 "http://127.0.0.1:$PORT/v1/completions" -d "$req" | grep -q '^data: \[DONE\]' || f=$((f + 1))
        else
            [ "$(curl -s --max-time 60 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/v1/completions" -d "$req")" = 200 ] || f=$((f + 1))
        fi
        n=$((n + 1))
    done
    echo "$n $f" >"$TMP/c$i"
}
for i in $(seq 1 "$CLIENTS"); do client "$i" & done
mid=""
sleep $((SECS / 2)); mid=$(rss)
wait $(jobs -p | grep -v "^$spid$") 2>/dev/null
rss1=$(rss)
req=0 fail=0
for i in $(seq 1 "$CLIENTS"); do read -r n f <"$TMP/c$i"; req=$((req + n)); fail=$((fail + f)); done
tok=$(curl -s "http://127.0.0.1:$PORT/metrics" | awk '/^hotmoe_tokens_predicted_total/ {print $2}')
echo "soak: ${SECS}s, $CLIENTS clients, --parallel $PAR: $req requests, $fail failed, $tok tokens; RSS ${rss0} -> ${mid} -> ${rss1} KiB"
[ "$fail" = 0 ]
