#!/usr/bin/env bash
# cli_web.sh - the web page of `hotmoe serve` in real headless Chromium (tests/js/web_page.mjs,
# playwright-core driving Debian's /usr/bin/chromium): load, API key, a streamed chat answer, the
# experts heatmap. Skips (77) without chromium, node or `npm ci` in tests/js, or when the engine
# cannot run the fixture model. Screenshot (a CI artefact): $HM_WEB_SHOT, default
# $HM_BINARY_DIR/artifacts/web.png (ctest sets HM_BINARY_DIR; /tmp/hotmoe/artifacts without it).
set -u
SRC=${HM_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
EXE=${HM_EXE:-$SRC/build/hotmoe}
MODEL=$SRC/tests/fixtures/qwen3moe_tiny/model.gguf
JS=$SRC/tests/js
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
[ -x "$CHROMIUM" ] || { echo "SKIP: $CHROMIUM not installed (scripts/deps.sh --test)"; exit 77; }
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
[ -d "$JS/node_modules/playwright-core" ] || { echo "SKIP: run (cd tests/js && npm ci)"; exit 77; }
LOG=$(mktemp)
KEY=web-test-key
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null; rm -f "$LOG"' EXIT
up=0
for _ in 1 2 3 4 5 6 7 8; do
    PORT=$((20000 + RANDOM % 40000))
    "$EXE" serve -m "$MODEL" --port "$PORT" -t 1 --chat-template chatml --api-key "$KEY" >"$LOG" 2>&1 &
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
    grep -q "cannot listen" "$LOG" || break
done
if [ $up != 1 ]; then cat "$LOG"; echo "SKIP: the server did not start with the fixture model"; exit 77; fi
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" "http://127.0.0.1:$PORT/v1/completions" \
    -d '{"prompt":"hi","max_tokens":2}')
[ "$code" = 200 ] || { echo "SKIP: the engine cannot run the fixture model yet ($code)"; exit 77; }
SHOT=${HM_WEB_SHOT:-${HM_BINARY_DIR:-/tmp/hotmoe}/artifacts/web.png}
mkdir -p "$(dirname "$SHOT")"
rm -f "$SHOT"
CHROMIUM=$CHROMIUM node "$JS/web_page.mjs" "http://127.0.0.1:$PORT/" "$KEY" "$SHOT"
rc=$?
if [ -s "$SHOT" ]; then echo "screenshot: $SHOT"; else echo "no screenshot written ($SHOT)"; fi
exit $rc
