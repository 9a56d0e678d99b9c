#!/usr/bin/env bash
# cli_web.sh - the web page of `hotmoe serve` in real headless Chromium (tests/js/web_page.mjs,
# playwright-core driving Debian's /usr/bin/chromium): load, API key, a streamed chat answer, the
# experts heatmap. Skips (77) without chromium, node or `npm ci` in tests/js, or when the engine
# cannot run the fixture model. Screenshot (a CI artefact): $HM_WEB_SHOT, default
# $HM_BINARY_DIR/artifacts/web.png (ctest sets HM_BINARY_DIR; /tmp/hotmoe/artifacts without it).
set -u
. "$(dirname "$0")/lib.sh"
MODEL=$SRC/tests/fixtures/qwen3moe_tiny/model.gguf
JS=$SRC/tests/js
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
[ -x "$CHROMIUM" ] || { echo "SKIP: $CHROMIUM not installed (scripts/deps.sh --test)"; exit 77; }
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
[ -d "$JS/node_modules/playwright-core" ] || { echo "SKIP: run (cd tests/js && npm ci)"; exit 77; }
KEY=web-test-key
hm_serve "$KEY" -t 1 --chat-template chatml --api-key "$KEY"
SHOT=${HM_WEB_SHOT:-${HM_BINARY_DIR:-/tmp/hotmoe}/artifacts/web.png}
mkdir -p "$(dirname "$SHOT")"
rm -f "$SHOT"
CHROMIUM=$CHROMIUM node "$JS/web_page.mjs" "http://127.0.0.1:$PORT/" "$KEY" "$SHOT"
rc=$?
if [ -s "$SHOT" ]; then echo "screenshot: $SHOT"; else echo "no screenshot written ($SHOT)"; fi
exit $rc
