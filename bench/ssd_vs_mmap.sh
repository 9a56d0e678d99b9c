#!/usr/bin/env bash
# ssd_vs_mmap.sh - a model larger than RAM (issue 6): hotmoe's SSD tier (--ram-budget, with and
# without --prefetch) vs llama.cpp's default mmap, tg after a short prompt, side by side from one
# run. A benchmark, not a test: it prints numbers and never asserts a time.
#
#   LLAMA_CPP_DIR=/work/llama.cpp/build-cpu/bin bench/ssd_vs_mmap.sh MODEL [BUDGET] [THREADS] [N_GEN] [PROFILE]
#
# Both engines run their own bench on the same test: `-p N_PROMPT -n N_GEN -r 1` (a pp test, then
# a tg test from an empty context, random token ids; hotmoe warms up with 16 tg tokens, llama.cpp
# with 1). llama.cpp runs twice: llama-bench as is (default mmap; on x86 it repacks Q4_K tensors
# into an anonymous CPU_REPACK buffer, which fails for a model larger than RAM, and llama-bench
# has no switch for it), then bench/llama_tg.c, llama-bench's test loop with repacking off
# (use_extra_bufts = false, llama-cli's --no-repack), built here against $LLAMA_CPP_DIR. Before each engine the page cache is dropped
# (echo 3 > /proc/sys/vm/drop_caches, needs root); where that fails, EVICT_FILE (a file at least
# the model's size) is read instead, else the table says the cache was warm.
# Per engine: tok/s, bytes the process read from the block device (/proc/PID/io read_bytes: page
# faults of the mmap included; whole run: load, warm-ups, pp and tg), peak RSS split into anonymous
# and file-backed pages (sampled from /proc/PID/status every 0.2 s: llama.cpp's weights are file
# pages of the mapping, which the kernel may drop under pressure; hotmoe's RAM pool is anonymous).
# With PROFILE (a usage profile, docs/PROFILE.md) `hotmoe plan` is asked what BUDGET of slots
# would hit; a profile with fewer layers than the model is first spread over its depth the way
# `synth --routing-profile` maps it (model layer l <- profile layer floor((l + 1/2) P / L)).
# Env: HM_EXE (build/hotmoe), LLAMA_CPP_DIR, N_PROMPT (16), EVICT_FILE, OUT_DIR (a temp dir),
# LLAMA_RA_KB (see below).
set -uo pipefail
exe="${HM_EXE:-build/hotmoe}"
llama="${LLAMA_CPP_DIR:-/work/llama.cpp/build-cpu/bin}"
model="${1:?usage: bench/ssd_vs_mmap.sh MODEL [BUDGET] [THREADS] [N_GEN] [PROFILE]}"
budget="${2:-16GiB}"
th="${3:-$(nproc)}"
ngen="${4:-64}"
profile="${5:-}"
npp="${N_PROMPT:-16}"
out="${OUT_DIR:-$(mktemp -d /tmp/ssd_vs_mmap.XXXXXX)}"
mkdir -p "$out"
[ -x "$llama/llama-bench" ] || { echo "no llama-bench in $llama (set LLAMA_CPP_DIR)"; exit 1; }
size=$(stat -c %s "$model") || exit 1
inspect=$("$exe" inspect "$model" 2>/dev/null)
echo "model $model: $(awk -v b="$size" 'BEGIN{printf "%.1f GiB", b/1073741824}') on disk, $(echo "$inspect" | grep -m1 -i 'experts:' | sed 's/^ *//')"
echo "RAM $(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo), swap $(awk '/SwapTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo), $(nproc) CPUs, threads $th, pp$npp + tg$ngen, 1 repetition; load before: $(cut -d' ' -f1-3 /proc/loadavg)"

evict() { # how the page cache was emptied before a run
    if (sync && echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then echo dropped
    elif [ -n "${EVICT_FILE:-}" ] && cat "$EVICT_FILE" > /dev/null 2>&1; then echo "evicted (read $EVICT_FILE)"
    else echo "WARM (not dropped)"; fi
}

# run NAME CMD...: runs CMD, samples its RSS, writes NAME.out / NAME.err / NAME.mem (peak anon KiB,
# peak file KiB, read_bytes, wall s) in $out.
run() {
    local name=$1; shift
    local t0=$(date +%s.%N)
    "$@" > "$out/$name.out" 2> "$out/$name.err" &
    local pid=$! anon=0 file=0 rd=0 a f r
    while kill -0 $pid 2>/dev/null; do
        a=$(awk '/^RssAnon/{print $2}' /proc/$pid/status 2>/dev/null); f=$(awk '/^RssFile/{print $2}' /proc/$pid/status 2>/dev/null)
        r=$(awk '/^read_bytes/{print $2}' /proc/$pid/io 2>/dev/null)
        [ -n "$a" ] && [ "$a" -gt $anon ] && anon=$a
        [ -n "$f" ] && [ "$f" -gt $file ] && file=$f
        [ -n "$r" ] && rd=$r
        sleep 0.2
    done
    wait $pid
    echo "$anon $file $rd $(echo "$(date +%s.%N) - $t0" | bc)" > "$out/$name.mem"
}

plan_line="(no profile given)"
if [ -n "$profile" ]; then
    n_layer=$(echo "$inspect" | sed -n 's/.*block_count *\([0-9]*\).*/\1/p' | head -1)
    prof72="$out/profile-${n_layer}l.json"
    python3 - "$profile" "$n_layer" "$prof72" <<'PY'
import copy, json, sys
src, L, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
d = json.load(open(src))
layers = d["layers"]
P = len(layers)
if P != L:
    d["layers"] = []
    for l in range(L):
        e = copy.deepcopy(layers[int((l + 0.5) * P / L)])
        e["layer"] = str(l) if isinstance(e.get("layer"), str) else l
        d["layers"].append(e)
json.dump(d, open(dst, "w"))
PY
    "$exe" plan -m "$model" --profile "$prof72" --budget "$budget" --policy static -t "$th" > "$out/plan-static.txt" 2>&1
    "$exe" plan -m "$model" --profile "$prof72" --budget "$budget" --policy lru -t "$th" > "$out/plan-lru.txt" 2>&1
    plan_line=$(grep -h -E "units fit|expected hit rate|^  (static|online|lru) " "$out/plan-static.txt" | sed 's/^/  /')
fi

# hotmoe configurations: default policy (none: the pool is an LRU of the units read), + --prefetch,
# and with PROFILE its static placement (+ --prefetch)
hm_args=("" "--prefetch")
[ -n "$profile" ] && hm_args+=("--profile $prof72 --prefetch")
: > "$out/how"
for i in "${!hm_args[@]}"; do
    echo "hm$i	$(evict)	hotmoe --ram-budget $budget ${hm_args[$i]/$out\//}" >> "$out/how"
    # shellcheck disable=SC2086
    run "hm$i" "$exe" bench -m "$model" -p "$npp" -n "$ngen" -r 1 -t "$th" --ram-budget "$budget" ${hm_args[$i]} --json
done
# llama.cpp: llama-bench as is (default mmap; repacks Q4_K into anonymous memory on x86), then
# bench/llama_tg.c = the same tests with repacking off (the weights stay in the mmap)
echo "ll	$(evict)	llama.cpp llama-bench (default: mmap + CPU_REPACK)" >> "$out/how"
run ll "$llama/llama-bench" -m "$model" -p "$npp" -n "$ngen" -r 1 -t "$th" -o json
src=$(cd "$llama/../.." && pwd)
if cc -O2 -Wall -I"$src/include" -I"$src/ggml/include" "$(dirname "$0")/llama_tg.c" -L"$llama" -lllama -lggml \
       -lggml-base -Wl,-rpath,"$llama" -o "$out/llama_tg" 2> "$out/llama_tg.cc.err"; then
    echo "lltg	$(evict)	llama.cpp (mmap, no repack: bench/llama_tg.c)" >> "$out/how"
    run lltg "$out/llama_tg" "$model" "$npp" "$ngen" "$th" 0
    # LLAMA_RA_KB: once more with the model's block device read-ahead at that many KiB (root;
    # restored after). mmap page faults read around the fault by the read-ahead window, so a large
    # window multiplies what each fault reads and evicts
    dev=$(basename "$(df --output=source "$model" | tail -1)")
    [ -e "/sys/block/$dev" ] || dev=$(lsblk -no pkname "/dev/$dev" 2>/dev/null | head -1)
    ra="/sys/block/$dev/queue/read_ahead_kb"
    if [ -n "${LLAMA_RA_KB:-}" ] && [ -w "$ra" ]; then
        ra0=$(cat "$ra")
        echo "lltgra	$(evict)	llama.cpp (mmap, no repack), read-ahead ${LLAMA_RA_KB} KiB (default $ra0)" >> "$out/how"
        echo "$LLAMA_RA_KB" > "$ra"
        run lltgra "$out/llama_tg" "$model" "$npp" "$ngen" "$th" 0
        echo "$ra0" > "$ra"
    fi
else
    echo "cannot build bench/llama_tg.c against $llama: $(tail -3 "$out/llama_tg.cc.err")"
fi

python3 - "$out" "$npp" "$ngen" <<'PY'
import json, os, sys
out, npp, ngen = sys.argv[1:4]
how = [l.rstrip("\n").split("\t") for l in open(os.path.join(out, "how"))]
def mem(n):
    a, f, r, w = open(os.path.join(out, n + ".mem")).read().split()
    return int(a) / 1024, int(f) / 1024, int(r) / 2**30, float(w)
def hm(n):
    try:
        return json.loads(open(os.path.join(out, n + ".out")).read().strip().splitlines()[-1])
    except Exception:
        print(f"{n}: no result; stderr tail:\n" + open(os.path.join(out, n + ".err")).read()[-1500:])
        return None
rows = []
for n, how_, label in how:
    if not n.startswith("hm"): continue
    r = hm(n)
    if not r: continue
    a, f, rd, w = mem(n)
    hit = r.get("tg_ram_hit_rate")
    pp = r.get("tg_prefetch_precision")
    rows.append((label, how_, r.get("pp_tok_s", 0), r["tg_tok_s"], f"{r.get('tg_ssd_bytes_per_tok', 0) / 2**20:.1f}",
                 f"{100 * hit:.1f} %" if hit is not None else "-",
                 f"{100 * pp:.0f} / {100 * r['tg_prefetch_recall']:.0f} %" if pp is not None else "-",
                 r["peak_rss_bytes"] / 2**20, a, f, rd, w))
for n, how_, label in how:
    if n == "ll":
        a, f, rd, w = mem(n)
        try:
            ll = json.load(open(os.path.join(out, "ll.out")))
            pp = next((t["avg_ts"] for t in ll if t["n_prompt"] > 0 and t["n_gen"] == 0), 0)
            tg = next(t["avg_ts"] for t in ll if t["n_gen"] > 0)
            rows.append((label, how_, pp, tg, "-", "-", "-", a + f, a, f, rd, w))
        except Exception:
            err = open(os.path.join(out, "ll.err")).read()
            why = [l.strip() for l in err.splitlines() if "insufficient memory" in l or "failed to" in l]
            print(f"{label}: FAILED to load after {w:.0f} s, peak RSS {a + f:.0f} MiB: " + ("; ".join(why[:2]) or err[-300:]))
    elif n.startswith("lltg"):
        a, f, rd, w = mem(n)
        try:
            r = json.loads(open(os.path.join(out, n + ".out")).read().strip().splitlines()[-1])
            rows.append((label, how_, r["pp_tok_s"], r["tg_tok_s"], "-", "-", "-", a + f, a, f, rd, w))
        except Exception:
            print(f"{label}: no result; stderr tail:\n" + open(os.path.join(out, n + ".err")).read()[-1500:])
print()
print(f"| engine | page cache | pp{npp} tok/s | tg{ngen} tok/s | SSD MiB/token (tg) | RAM hit (tg) | prefetch prec. / recall | "
      "peak RSS MiB | peak anon / file MiB | GiB read (whole run) | wall s |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for (label, how, pp, tg, mib, hit, pf, rss, a, f, rd, w) in rows:
    print(f"| {label} | {how} | {pp:.2f} | {tg:.3f} | {mib} | {hit} | {pf} | {rss:.0f} | {a:.0f} / {f:.0f} | {rd:.1f} | {w:.0f} |")
for b in [r for r in rows if r[0].startswith("llama")]:
    print(f"vs {b[0]}: " + ", ".join(f"{r[0]}: {r[3] / b[3]:.2f}x" for r in rows if not r[0].startswith("llama")))
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); raw outputs in $out"
echo "hotmoe plan --budget $budget (slots' hit rate from the profile; no SSD cost model yet):"
echo "$plan_line"
