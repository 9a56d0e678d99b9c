#!/usr/bin/env bash
# cli_server_openai.sh - `hotmoe serve` through the official `openai` npm client (tests/js/openai_client.mjs):
# the real server on a free port of 127.0.0.1 with the tiny qwen3moe fixture, --parallel 4, --api-key,
# the ChatML template (the fixture has none). Chat (plain + streamed), completions, models.list, errors as
# APIError (400/401), another model name served, 4 concurrent streams = single runs, an aborted stream freeing its slot.
# Skips (77) without node or `npm ci` in tests/js, or when the engine cannot run the fixture model.
set -u
. "$(dirname "$0")/lib.sh"
MODEL=$SRC/tests/fixtures/qwen3moe_tiny/model.gguf
JS=$SRC/tests/js
command -v node >/dev/null || { echo "SKIP: node not installed (scripts/deps.sh --test)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl not installed (scripts/deps.sh --test)"; exit 77; }
[ -f "$JS/node_modules/openai/package.json" ] || { echo "SKIP: the openai npm client is missing: run (cd tests/js && npm ci)"; exit 77; }
[ -f "$MODEL" ] || { echo "SKIP: $MODEL missing"; exit 77; }
KEY=openai-test-key
ALIAS=hotmoe-tiny
hm_serve "$KEY" -t 1 -c 4096 --parallel 4 --chat-template chatml \
    --api-key "$KEY" --alias "$ALIAS"
echo "openai $(node -p "require('$JS/node_modules/openai/package.json').version") against hotmoe serve on port $PORT"
timeout 300 node "$JS/openai_client.mjs" "http://127.0.0.1:$PORT" "$KEY" "$ALIAS"
rc=$?
kill -0 $pid 2>/dev/null || { echo "FAIL: the server died"; cat "$LOG"; exit 1; }
[ $rc = 0 ] || { echo "--- server log (tail)"; tail -n 30 "$LOG"; }
exit $rc
