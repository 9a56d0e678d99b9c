#!/usr/bin/env bash
# cli_server_input.sh - `hotmoe serve` against hostile and unusual client input, with the real
# server on a free port of 127.0.0.1 (tiny qwen3moe fixture), driven by curl and python3:
#   - client bytes echoed in errors: a path of invalid UTF-8 or a cut character, a role of 185
#     'é' (the message is cut), a policy name cut by the server's own limit, invalid UTF-8 in a
#     JSON body: each answers its 4xx with a JSON error object that is valid UTF-8 (a strict
#     decoder reads it), never 500; the -v log shows the bytes escaped;
#   - HEAD on /health, the page and GET endpoints answers like GET, without a body;
#   - any `model` name is served by the one loaded model and the answer names the served one
#     (--alias, also in /v1/models);
#   - API keys: `--api-key ''` and an empty HOTMOE_API_KEY are errors, --api-key-file (one key
#     per line, '#' comments, CRLF) accepts each of its keys and nothing else, a file without a
#     key is an error;
#   - a model file name that is not UTF-8: /v1/models, /props and completions answer 200 with
#     the name escaped.
# Skips (77) without curl/python3 or when the engine cannot run the model.
set -u
. "$(dirname "$0")/lib.sh"
MODEL=$SRC/tests/fixtures/qwen3moe_tiny/model.gguf
hm_need curl python3
[ -f "$MODEL" ] || { echo "SKIP: $MODEL missing"; exit 77; }
hm_tmpdir server_input

# ---- API keys that would turn authentication off, checked before any server runs ----
# (timeout: a server that starts anyway would serve until killed)
check "--api-key '' is refused" [ "$(code timeout 20 "$EXE" serve -m "$MODEL" --port 1 --api-key '')" = 2 ]
check "--api-key '' says why" grep -q "empty" "$tmp/err"
check "empty HOTMOE_API_KEY is refused" [ "$(code env HOTMOE_API_KEY= timeout 20 "$EXE" serve -m "$MODEL" --port 1)" = 2 ]
check "empty HOTMOE_API_KEY says why" grep -q "HOTMOE_API_KEY" "$tmp/err"
printf '# no key here\n\n   \n' >"$tmp/nokeys"
check "a key file without a key is refused" [ "$(code timeout 20 "$EXE" serve -m "$MODEL" --port 1 --api-key-file "$tmp/nokeys")" != 0 ]
check "a key file without a key says so" grep -q "holds no key" "$tmp/err"
check "a missing key file is refused" [ "$(code timeout 20 "$EXE" serve -m "$MODEL" --port 1 --api-key-file "$tmp/none")" != 0 ]
check "--help documents --api-key-file" sh -c "'$EXE' serve --help | grep -q -- --api-key-file"

K1=first-key-abc
K2=second-key-def
printf '# keys of the test\n%s\r\n\n  %s  \n#%s\n' "$K1" "$K2" "commented-key" >"$tmp/keys"
ALIAS=served-name
hm_serve "$K1" -t 1 -c 512 --chat-template chatml --api-key "$K1" --alias "$ALIAS" -v
URL=http://127.0.0.1:$PORT

# req ARGS...: curl with the body in $tmp/body; prints the status
req() { curl -s -o "$tmp/body" -w '%{http_code}' "$@"; }
# is_error CODE: $tmp/body is strict UTF-8 JSON {"error":{...}} whose code is CODE
is_error() {
    python3 - "$tmp/body" "$1" <<'PY'
import json, sys
raw = open(sys.argv[1], 'rb').read()
e = json.loads(raw.decode('utf-8', errors='strict'))['error']
assert isinstance(e['message'], str) and e['message'] and isinstance(e['type'], str), e
assert e['code'] == sys.argv[2], e
PY
}
A1=(-H "Authorization: Bearer $K1")
A2=(-H "Authorization: Bearer $K2")

# ---- client bytes in error messages ----
check "GET /%ff -> 404" [ "$(req "${A1[@]}" "$URL/%ff")" = 404 ]
check "GET /%ff: valid JSON error" is_error not_found
check "GET /%c3 (a cut character) -> 404" [ "$(req "${A1[@]}" "$URL/a%c3")" = 404 ]
check "GET /%c3: valid JSON error" is_error not_found
check "GET /%ed%a0%80 (a surrogate) -> 404" [ "$(req "${A1[@]}" "$URL/%ed%a0%80x")" = 404 ]
check "GET /%ed%a0%80: valid JSON error" is_error not_found
long=$(python3 -c 'print("/" + "%C3%A9" * 301)')
check "GET of 301 'é' -> 404" [ "$(req "${A1[@]}" "$URL$long")" = 404 ]
check "GET of 301 'é': valid JSON error" is_error not_found
check "DELETE /v1/models -> 405" [ "$(req -X DELETE "${A1[@]}" "$URL/v1/models")" = 405 ]
check "DELETE: valid JSON error" is_error method_not_allowed
role=$(python3 -c 'print("é" * 185)')
check "role of 185 'é' -> 400" [ "$(req "${A1[@]}" "$URL/v1/chat/completions" -d "{\"messages\":[{\"role\":\"$role\",\"content\":\"x\"}]}")" = 400 ]
check "role of 185 'é': valid JSON error" is_error invalid_value
role=$(python3 -c 'print("a" + "€" * 150)')
check "role of 150 '€' -> 400" [ "$(req "${A1[@]}" "$URL/v1/chat/completions" -d "{\"messages\":[{\"role\":\"$role\",\"content\":\"x\"}]}")" = 400 ]
check "role of 150 '€': valid JSON error" is_error invalid_value
policy=$(python3 -c 'print("a" + "é" * 100)')
check "policy of 'a' + 100 'é' -> 400" [ "$(req "${A1[@]}" "$URL/experts/policy" -d "{\"policy\":\"$policy\"}")" = 400 ]
python3 -c 'import sys; sys.stdout.buffer.write(b"{\"prompt\":\"\xff\xfe\",\"max_tokens\":2}")' >"$tmp/bad_utf8"
check "a body with invalid UTF-8 -> 400" [ "$(req "${A1[@]}" "$URL/v1/completions" --data-binary @"$tmp/bad_utf8")" = 400 ]
check "a body with invalid UTF-8: valid JSON error" is_error invalid_json
check "the -v log shows client bytes escaped" grep -qF 'GET /\xff ->' "$LOG"
check "the -v log holds no raw client byte" python3 -c "open('$LOG', 'rb').read().decode('utf-8', errors='strict')"

# ---- HEAD answers like GET, without a body ----
head_ok() { # PATH: status 200 and the GET's Content-Type, and nothing after the headers
    python3 - "$PORT" "$1" "$K1" <<'PY'
import socket, sys
s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=10)
s.sendall(('HEAD %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n'
           % (sys.argv[2], sys.argv[3])).encode())
data = b''
while True:
    b = s.recv(65536)
    if not b:
        break
    data += b
head, _, body = data.partition(b'\r\n\r\n')
lines = head.decode().split('\r\n')
assert lines[0].split()[1] == '200', lines[0]
assert any(l.lower().startswith('content-type:') for l in lines), lines
assert body == b'', body[:80]
PY
}
check "HEAD /health" head_ok /health
check "HEAD /" head_ok /
check "HEAD /v1/models" head_ok /v1/models
check "HEAD /props" head_ok /props
check "HEAD /metrics" head_ok /metrics
check "POST /health is still 405" [ "$(req -X POST "$URL/health")" = 405 ]

# ---- any model name is served by the loaded model, and the answer names it ----
check "/v1/models names the alias" sh -c "curl -s -H 'Authorization: Bearer $K1' '$URL/v1/models' | grep -q '\"id\":\"$ALIAS\"'"
for name in gpt-4o "claude-3-5-sonnet" "$(python3 -c 'print("é" * 300)')" "$ALIAS"; do
    check "model '${name:0:20}' -> 200" [ "$(req "${A1[@]}" "$URL/v1/completions" -d "{\"model\":\"$name\",\"prompt\":\"hi\",\"max_tokens\":2}")" = 200 ]
    check "model '${name:0:20}': answered by $ALIAS" python3 -c "import json; assert json.load(open('$tmp/body'))['model'] == '$ALIAS'"
done
check "chat with another model name -> 200" [ "$(req "${A1[@]}" "$URL/v1/chat/completions" -d '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":2}')" = 200 ]
check "'model' of the wrong type is still 400" [ "$(req "${A1[@]}" "$URL/v1/completions" -d '{"model":5,"prompt":"hi"}')" = 400 ]

kill -0 "$pid" 2>/dev/null || { echo "FAIL: the server died"; cat "$LOG"; fail=1; }
# ---- keys from a file: a second server, its model's file name not UTF-8 ----
ODD=$tmp/$'m\xffodel.gguf'
ln -s "$MODEL" "$ODD"
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
pid=
hm_serve_up "$ODD" -t 1 -c 512 -ub 4096 -b 64 --api-key-file "$tmp/keys" # llama.cpp's -ub/-b (-b caps -ub)
URL=http://127.0.0.1:$PORT
check "the server starts with --api-key-file" [ $up = 1 ]
[ $up = 1 ] || cat "$LOG"
check "key file: first key" [ "$(req "${A1[@]}" "$URL/v1/models")" = 200 ]
check "key file: second key (spaces trimmed)" [ "$(req "${A2[@]}" "$URL/v1/models")" = 200 ]
check "key file: a commented line is no key" [ "$(req -H "Authorization: Bearer commented-key" "$URL/v1/models")" = 401 ]
check "key file: '#commented-key' is no key" [ "$(req -H "Authorization: Bearer #commented-key" "$URL/v1/models")" = 401 ]
check "key file: no key" [ "$(req "$URL/v1/models")" = 401 ]
check "a file name that is not UTF-8: /v1/models 200" [ "$(req "${A1[@]}" "$URL/v1/models")" = 200 ]
check "a file name that is not UTF-8: its id escaped" python3 -c "
import json; assert json.loads(open('$tmp/body', 'rb').read().decode('utf-8'))['data'][0]['id'] == 'm\\\\xffodel.gguf'"
check "a file name that is not UTF-8: /props 200" [ "$(req "${A1[@]}" "$URL/props")" = 200 ]
check "a file name that is not UTF-8: a completion 200" \
    [ "$(req "${A1[@]}" "$URL/v1/completions" -d '{"prompt":"hi","max_tokens":2}')" = 200 ]

exit $fail
