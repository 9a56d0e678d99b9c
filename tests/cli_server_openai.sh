#!/usr/bin/env bash
# cli_server_openai.sh - `hotmoe serve` through the official `openai` npm client (tests/js/openai_client.mjs):
# the real server on a free port of 127.0.0.1 with the tiny qwen3moe fixture, --parallel 4, --api-key,
# the ChatML template (the fixture has none). Chat (plain + streamed), completions, models.list, errors as
# APIError (404/400/401), 4 concurrent streams = single runs, an aborted stream freeing its slot.
# Skips (77) without node or `npm ci` in tests/js, or when the engine cannot run the fixture model.
set -u
SRC=${HM_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
EXE=${HM_EXE:-$SRC/build/hotmoe}
MODEL=$SRC/tests/fixtures/qwen3moe_tiny/model.gguf
JS=$SRC/tests/js
command -v node >/dev/null || { echo "SKIP: node not installed (scripts/deps.sh --test)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl not installed (scripts/deps.sh --test)"; exit 77; }
[ -f "$JS/node_modules/openai/package.json" ] || { echo "SKIP: the openai npm client is missing: run (cd tests/js && npm ci)"; exit 77; }
[ -f "$MODEL" ] || { echo "SKIP: $MODEL missing"; exit 77; }
LOG=$(mktemp)
KEY=openai-test-key
ALIAS=hotmoe-tiny
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null; rm -f "$LOG"' EXIT
up=0
for _ in 1 2 3 4 5 6 7 8; do
    PORT=$((20000 + RANDOM % 40000))
    "$EXE" serve -m "$MODEL" --port "$PORT" -t 1 -c 4096 --parallel 4 --chat-template chatml \
        --api-key "$KEY" --alias "$ALIAS" >"$LOG" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do
        curl -s -o /dev/null "http://127.0.0.1:$PORT/health" && { up=1; break; }
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    [ $up = 1 ] && break
    kill $pid 2>/dev/null
    wait $pid 2>/dev/null
    pid=
    grep -q "cannot listen" "$LOG" || break # not a port clash
done
if [ $up != 1 ]; then cat "$LOG"; echo "SKIP: the server did not start with the fixture model"; exit 77; fi
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" "http://127.0.0.1:$PORT/v1/completions" \
    -d '{"prompt":"hi","max_tokens":2}')
[ "$code" = 200 ] || { echo "SKIP: the engine cannot run the fixture model yet ($code)"; exit 77; }
echo "openai $(node -p "require('$JS/node_modules/openai/package.json').version") against hotmoe serve on port $PORT"
timeout 300 node "$JS/openai_client.mjs" "http://127.0.0.1:$PORT" "$KEY" "$ALIAS"
rc=$?
kill -0 $pid 2>/dev/null || { echo "FAIL: the server died"; cat "$LOG"; exit 1; }
[ $rc = 0 ] || { echo "--- server log (tail)"; tail -n 30 "$LOG"; }
exit $rc
