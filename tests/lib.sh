# lib.sh - the preamble shared by the shell tests tests/cli_*.sh; source it first:
#     . "$(dirname "$0")/lib.sh"
# (its name does not match cli_*.sh, so CMake does not register it as a test.)
#
# Sets
#   SRC  the source tree: $HM_SOURCE_DIR (ctest sets it), else the directory above tests/
#   EXE  the hotmoe binary: $HM_EXE (ctest sets it), else $SRC/build/hotmoe
#   fail 0; check sets it to 1 on a failed check, and a script ends with `exit $fail`
# Defines
#   hm_tmpdir NAME        tmp=$(mktemp -d /tmp/hm_cli_NAME.XXXXXX), removed on exit (trap EXIT)
#   check NAME CMD...     runs CMD; when it fails prints "FAIL: NAME" and sets fail=1
#   code CMD...           runs CMD with stdout in $tmp/out and stderr in $tmp/err; prints its status
#   hm_need TOOL...       exits 77 (skip) naming the first TOOL not installed
#   hm_serve KEY ARGS...  `$EXE serve -m $MODEL --port PORT ARGS` on a free port (see below)
#   hm_serve_up M ARGS... the same start with model M, after hm_serve (its LOG and trap): up=1 or 0
# shellcheck shell=bash

SRC=${HM_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
EXE=${HM_EXE:-$SRC/build/hotmoe}
fail=0

hm_tmpdir() {
    tmp=$(mktemp -d "/tmp/hm_cli_$1.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
}

check() { # check NAME COND...
    local name=$1; shift
    if "$@"; then :; else echo "FAIL: $name"; fail=1; fi
}

code() { "$@" >"$tmp/out" 2>"$tmp/err"; echo $?; }

hm_need() {
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed (scripts/deps.sh --test)"; exit 77; }
    done
}

# hm_serve_up MODEL ARGS...: start `$EXE serve -m MODEL --port PORT ARGS` in the background on a
# random port of 20000..59999 (up to 8 tries while LOG says "cannot listen", i.e. a port clash),
# waiting up to ~10 s per try for /health. Sets PORT, pid (the server; empty when it did not come
# up) and up (1 when /health answered, else 0). LOG must be set (hm_serve sets it).
hm_serve_up() {
    local model=$1
    shift
    up=0
    pid=
    for _ in 1 2 3 4 5 6 7 8; do
        PORT=$((20000 + RANDOM % 40000))
        "$EXE" serve -m "$model" --port "$PORT" "$@" >"$LOG" 2>&1 &
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
}

# hm_serve KEY ARGS...: hm_serve_up "$MODEL" ARGS. Sets PORT, pid (the server, killed on exit) and
# LOG (its log, a mktemp file removed on exit). Exits 77 (skip) when the server does not come up,
# or when a 2-token completion with the API key KEY is not answered 200 (the engine cannot run
# the model).
hm_serve() {
    local key=$1
    shift
    LOG=$(mktemp)
    pid=
    trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null; rm -f "$LOG"' EXIT
    hm_serve_up "$MODEL" "$@"
    if [ $up != 1 ]; then cat "$LOG"; echo "SKIP: the server did not start with the fixture model"; exit 77; fi
    local status
    status=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $key" "http://127.0.0.1:$PORT/v1/completions" \
        -d '{"prompt":"hi","max_tokens":2}')
    [ "$status" = 200 ] || { echo "SKIP: the engine cannot run the fixture model yet ($status)"; exit 77; }
}
