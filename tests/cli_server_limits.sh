#!/usr/bin/env bash
# cli_server_limits.sh - slow and greedy clients cannot lock others out of `hotmoe serve`. The real
# server (tiny qwen3moe fixture) on a free port of 127.0.0.1; python3 clients bind other loopback
# addresses (127.0.0.2 ...) so that each is its own client address. Every load stops by itself.
#   - defaults: one client opening 300 connections that send their headers a line a second
#     (slowloris, 6 s) holds at most --max-conns-per-ip (32) of them; /health and a completion
#     from another address are answered at once meanwhile;
#   - --header-timeout 2: connections whose headers are not in after 2 s are closed (whether
#     they trickle bytes or send nothing); --body-timeout 2: the same for a body;
#   - --max-conns 6 --health-conns 2: with 6 connections open (from two addresses), other requests answer 503
#     server_busy and /health is still 200;
#   - the flags are in --help.
# Skips (77) without curl/python3, when 127.0.0.2 cannot be bound, or when the engine cannot run
# the model.
set -u
. "$(dirname "$0")/lib.sh"
MODEL=$SRC/tests/fixtures/qwen3moe_tiny/model.gguf
hm_need curl python3
[ -f "$MODEL" ] || { echo "SKIP: $MODEL missing"; exit 77; }
python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.2", 0))' 2>/dev/null ||
    { echo "SKIP: cannot bind 127.0.0.2 (no loopback /8)"; exit 77; }
hm_tmpdir server_limits

cat >"$tmp/slow.py" <<'PY'
# slow.py PORT SRC_ADDR N SECONDS MODE [READY]: open N connections from SRC_ADDR (then create the
# file READY), then for SECONDS feed
# them slowly; print one line per connection: "open" (still open at the end), "refused" (closed
# by the server within 0.3 s of connecting) or "closed T" (closed by the server T s after it
# was opened). MODE: header = a header line every 0.5 s, never the end of the headers; silent =
# nothing at all; body = full headers of a 100-byte POST, then a body byte every 0.5 s.
import socket, sys, time
port, src, n, secs, mode = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
ready = sys.argv[6] if len(sys.argv) > 6 else None
conns = []
for i in range(n):
    s = socket.socket()
    s.bind((src, 0))
    try:
        s.connect(('127.0.0.1', port))
    except OSError:
        conns.append([None, time.time(), 'refused'])
        continue
    first = (b'GET /health HTTP/1.1\r\nHost: x\r\n' if mode == 'header' else
             b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{' if mode == 'body' else b'')
    try:
        if first:
            s.sendall(first)
    except OSError:
        pass
    s.setblocking(False)
    conns.append([s, time.time(), None])
if ready:
    open(ready, 'w').close()

def alive(c):
    s = c[0]
    try:
        return s.recv(4096) != b''  # an answer (not expected) still counts as open
    except BlockingIOError:
        return True
    except OSError:
        return False

start = time.time()
while time.time() - start < secs:
    for c in conns:
        if c[2] is None and not alive(c):
            c[2] = 'closed %.2f' % (time.time() - c[1])
            continue
        if c[2] is None and mode in ('header', 'body'):
            try:
                c[0].send(b'X-Slow: 1\r\n' if mode == 'header' else b' ')
            except OSError:
                c[2] = 'closed %.2f' % (time.time() - c[1])
    time.sleep(0.5)
for c in conns:
    state = c[2] or 'open'
    if state.startswith('closed') and float(state.split()[1]) < 0.6 and mode != 'silent':
        state = 'refused'  # closed at once: the per-address cap
    print(state)
    if c[0]:
        c[0].close()
PY
URL=
# wait_for FILE...: until the loads have opened their connections (python3 may take seconds to
# start on a busy machine)
wait_for() {
    local i f missing
    for i in $(seq 1 200); do
        missing=0
        for f in "$@"; do [ -e "$f" ] || missing=1; done
        [ $missing = 0 ] && return 0
        sleep 0.05
    done
    return 1
}
# answered CODE PATH: within 3 s, from 127.0.0.1
answered() { [ "$(curl -s -o /dev/null -m 3 -w '%{http_code}' "$URL$2")" = "$1" ]; }

# ---- defaults: a slowloris of 300 connections from one address ----
hm_serve "" -t 1 -c 512
URL=http://127.0.0.1:$PORT
python3 "$tmp/slow.py" "$PORT" 127.0.0.2 300 6 header "$tmp/loris.ready" >"$tmp/loris" &
loris=$!
check "the slowloris started" wait_for "$tmp/loris.ready"
check "defaults: /health answered during the slowloris" answered 200 /health
check "defaults: a completion answered during the slowloris" \
    [ "$(curl -s -o /dev/null -m 5 -w '%{http_code}' "$URL/v1/completions" -d '{"prompt":"hi","max_tokens":2}')" = 200 ]
wait $loris
n_open=$(grep -c '^open' "$tmp/loris")
n_refused=$(grep -c '^refused' "$tmp/loris")
echo "slowloris of 300: $n_open held open, $n_refused refused"
check "defaults: one address holds at most 32 connections ($n_open)" [ "$n_open" -le 32 ] && [ "$n_open" -ge 1 ]
check "defaults: the rest were closed by the server ($n_refused at once)" [ "$(grep -c '^closed\|^refused' "$tmp/loris")" = $((300 - n_open)) ]
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
pid=

# ---- deadlines and the /health reserve ----
check "--help lists the limits" sh -c "'$EXE' serve --help | grep -q -- --max-conns-per-ip && '$EXE' serve --help | grep -q -- --header-timeout"
hm_serve_up "$MODEL" -t 1 -c 512 --max-conns 6 --max-conns-per-ip 4 --health-conns 2 --header-timeout 2 \
    --body-timeout 2
URL=http://127.0.0.1:$PORT
check "the server starts with the limit flags" [ $up = 1 ]
if [ $up = 1 ]; then
    # 6 silent connections from two addresses fill --max-conns: the next request is 503, /health 200
    python3 "$tmp/slow.py" "$PORT" 127.0.0.3 3 1.2 silent "$tmp/r1" >/dev/null &
    s1=$!
    python3 "$tmp/slow.py" "$PORT" 127.0.0.4 3 1.2 silent "$tmp/r2" >/dev/null &
    s2=$!
    check "the idle connections are open" wait_for "$tmp/r1" "$tmp/r2"
    r=$(curl -s -m 3 -w '\n%{http_code}' "$URL/v1/models")
    check "--max-conns reached: 503" [ "$(echo "$r" | tail -n1)" = 503 ]
    check "--max-conns reached: server_busy error" sh -c "echo '$r' | head -n1 | grep -q '\"code\":\"server_busy\"'"
    check "--max-conns reached: /health still answers" answered 200 /health
    wait $s1 $s2
    check "after the load: requests answer again" answered 200 /v1/models

    python3 "$tmp/slow.py" "$PORT" 127.0.0.2 6 5 header >"$tmp/hdr" &
    s1=$!
    python3 "$tmp/slow.py" "$PORT" 127.0.0.3 1 5 silent >"$tmp/silent" &
    s2=$!
    python3 "$tmp/slow.py" "$PORT" 127.0.0.4 1 5 body >"$tmp/body" &
    s3=$!
    wait $s1 $s2 $s3
    echo "header trickle: $(tr '\n' ' ' <"$tmp/hdr"); silent: $(tr '\n' ' ' <"$tmp/silent"); body trickle: $(tr '\n' ' ' <"$tmp/body")"
    # closed by the deadline: after 2 s (+ the watchdog's 0.25 s and the client's 0.5 s steps)
    in_time() { awk '$1 == "closed" { if ($2 >= 1.5 && $2 <= 4) ok++ } END { exit !(ok == n) }' n="$2" "$1"; }
    check "--max-conns-per-ip 4: 2 of 6 refused" [ "$(grep -c '^refused' "$tmp/hdr")" = 2 ]
    check "--header-timeout 2: trickled headers closed after ~2 s" in_time "$tmp/hdr" 4
    check "--header-timeout 2: a silent connection closed after ~2 s" in_time "$tmp/silent" 1
    check "--body-timeout 2: a trickled body closed after ~2 s" in_time "$tmp/body" 1
    check "still serving" answered 200 /health
    kill -0 "$pid" 2>/dev/null || { echo "FAIL: the server died"; cat "$LOG"; fail=1; }
fi
exit $fail
