#!/usr/bin/env bash
# cli_server_halfclose.sh - a client that sends its request and then half-closes its socket
# (shutdown(SHUT_WR), as some HTTP/1.0 clients and proxies do) still gets its whole answer, and
# only a real disconnect cancels. The real server (tiny qwen3moe fixture, one slot) on a free port
# of 127.0.0.1, raw sockets from python3:
#   - half-closed HTTP/1.1 and HTTP/1.0 completions, and a half-closed stream: status 200 (after
#     any 1xx interim answer), the full JSON / SSE up to [DONE], max_tokens tokens;
#   - none of them counted as cancelled in /metrics;
#   - a client that closes its socket during a long non-streaming completion: cancelled, the slot
#     freed long before max_tokens;
#   - a streaming client that closes while its request waits for the slot: cancelled before it
#     gets the slot (it generates no token; its response headers, sent at once, meet the reset).
# Skips (77) without curl/python3 or when the engine cannot run the model.
set -u
. "$(dirname "$0")/lib.sh"
MODEL=$SRC/tests/fixtures/qwen3moe_tiny/model.gguf
hm_need curl python3
[ -f "$MODEL" ] || { echo "SKIP: $MODEL missing"; exit 77; }
hm_tmpdir server_halfclose
hm_serve "" -t 1 -c 4096 --parallel 1
URL=http://127.0.0.1:$PORT

cat >"$tmp/client.py" <<'PY'
# client.py PORT VERSION MODE MAX_TOKENS: send a completion, then MODE: "half" = shutdown(SHUT_WR)
# and read the answer to the end (prints the final status line's code and the body to stdout),
# "close" = close the socket after 0.1 s without reading.
import json, socket, sys, time
port, version, mode, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
stream = len(sys.argv) > 5 and sys.argv[5] == 'stream'
body = json.dumps({'prompt': 'hello there', 'max_tokens': n, 'temperature': 0, 'ignore_eos': True,
                   'stream': stream}).encode()
s = socket.create_connection(('127.0.0.1', port), timeout=60)
s.sendall(b'POST /v1/completions HTTP/%s\r\nHost: x\r\nContent-Type: application/json\r\n'
          b'Content-Length: %d\r\n\r\n' % (version.encode(), len(body)) + body)
if mode == 'close':
    time.sleep(0.1)
    s.close()
    sys.exit(0)
s.shutdown(socket.SHUT_WR)
data = b''
while True:
    b = s.recv(65536)
    if not b:
        break
    data += b
# skip 1xx interim answers, then split the final one
while data.startswith(b'HTTP/1.1 1'):
    data = data.partition(b'\r\n\r\n')[2]
head, _, rest = data.partition(b'\r\n\r\n')
lines = head.decode('latin-1').split('\r\n')
status = lines[0].split(' ')[1] if lines[0] else 'none'
if any(l.lower() == 'transfer-encoding: chunked' for l in lines):
    out = b''
    while rest:
        size, _, rest = rest.partition(b'\r\n')
        k = int(size, 16)
        if k == 0:
            break
        out += rest[:k]
        rest = rest[k + 2:]
    rest = out
print(status)
sys.stdout.write(rest.decode('utf-8'))
PY
outcome() { curl -s "$URL/metrics" | awk -v o="$1" '$1 == "hotmoe_requests_total{outcome=\"" o "\"}" {print $2}'; }
ok0=$(outcome ok)
cancelled0=$(outcome cancelled)

# full_json FILE N: status 200 and a completion of N tokens
full_json() {
    [ "$(head -n1 "$1")" = 200 ] && sed 1d "$1" | python3 -c "
import json, sys
j = json.load(sys.stdin)
assert j['usage']['completion_tokens'] == $2 and j['choices'][0]['finish_reason'] == 'length', j"
}
timeout 60 python3 "$tmp/client.py" "$PORT" 1.1 half 600 >"$tmp/h11" 2>"$tmp/h11.err"
check "half-closed HTTP/1.1 completion: the whole answer" full_json "$tmp/h11" 600
timeout 60 python3 "$tmp/client.py" "$PORT" 1.0 half 600 >"$tmp/h10" 2>"$tmp/h10.err"
check "half-closed HTTP/1.0 completion: the whole answer" full_json "$tmp/h10" 600
timeout 60 python3 "$tmp/client.py" "$PORT" 1.1 half 400 stream >"$tmp/hs" 2>"$tmp/hs.err"
check "half-closed stream: status 200" [ "$(head -n1 "$tmp/hs")" = 200 ]
check "half-closed stream: ends with [DONE]" [ "$(grep '^data: ' "$tmp/hs" | tail -n1)" = "data: [DONE]" ]
check "half-closed stream: 400 token chunks" [ "$(grep -c '^data: {.*"finish_reason":null' "$tmp/hs")" = 400 ]
check "half-closed requests counted ok" [ "$(outcome ok)" = $((ok0 + 3)) ]
check "half-closed requests not counted cancelled" [ "$(outcome cancelled)" = "$cancelled0" ]

# a real disconnect during a long non-streaming completion cancels it
python3 "$tmp/client.py" "$PORT" 1.1 close 4000
freed=0
for _ in $(seq 1 40); do
    curl -s "$URL/slots" | grep -q '"is_processing":false' && { freed=1; break; }
    sleep 0.05
done
check "a closed client frees its slot within 2 s" [ $freed = 1 ]
check "a closed client is counted cancelled" [ "$(outcome cancelled)" = $((cancelled0 + 1)) ]
n_cached=$(curl -s "$URL/slots" | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["n_cached"])')
check "the cancelled generation stopped early ($n_cached positions)" [ "$n_cached" -lt 3000 ]
# a stream waiting for the slot whose client closes is cancelled before its turn
cat >"$tmp/queued.py" <<'PY'
# queued.py PORT: a long completion A on the one slot; meanwhile a streamed request B queued
# behind it, whose client closes after 0.3 s; prints A's completion_tokens once A is done.
import json, socket, sys, time
port = int(sys.argv[1])
def send(body):
    s = socket.create_connection(('127.0.0.1', port), timeout=60)
    b = json.dumps(body).encode()
    s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n' % len(b) + b)
    return s
a = send({'prompt': 'long', 'max_tokens': 4000, 'ignore_eos': True, 'temperature': 0})
time.sleep(0.2)
b = send({'prompt': 'queued', 'max_tokens': 50, 'ignore_eos': True, 'stream': True})
time.sleep(0.3)
b.close()
data = b''
while True:
    x = a.recv(65536)
    if not x:
        break
    data += x
print(json.loads(data.partition(b'\r\n\r\n')[2])['usage']['completion_tokens'])
PY
predicted() { curl -s "$URL/metrics" | awk '$1 == "hotmoe_tokens_predicted_total" {print $2}'; }
tok0=$(predicted)
cancelled1=$(outcome cancelled)
n_a=$(timeout 60 python3 "$tmp/queued.py" "$PORT" 2>"$tmp/queued.err")
sleep 0.3
tok1=$(predicted)
check "a closed stream waiting for the slot is cancelled" [ "$(outcome cancelled)" = $((cancelled1 + 1)) ]
check "... before its turn: only the long request's $n_a tokens were generated ($((tok1 - tok0)))" \
    [ -n "$n_a" ] && [ $((tok1 - tok0)) = "$n_a" ]
check "still serving" [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/completions" -d '{"prompt":"x","max_tokens":2}')" = 200 ]
kill -0 "$pid" 2>/dev/null || { echo "FAIL: the server died"; cat "$LOG"; fail=1; }
[ $fail = 0 ] || { echo "--- client errors"; cat "$tmp"/*.err; echo "--- server log"; tail -n 20 "$LOG"; }
exit $fail
