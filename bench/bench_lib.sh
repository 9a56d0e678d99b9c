# bench_lib.sh - what the GPU benchmarks share (sourced by gpu_offload.sh and multi_gpu.sh): one
# hotmoe bench run and one llama-bench run, each reduced to its tok/s, and their ratio.
# The caller sets: exe (hotmoe), model, th (threads), reps, llama (a llama.cpp bin folder, or empty:
# then llama-bench's figures are "-").

# hotmoe bench ARGS -> "pp tg hit" ("-" where missing); the last stderr lines when it failed
hm() {
    local j
    j=$("$exe" bench -m "$model" -t "$th" -r "$reps" --json "$@" 2>/tmp/hm_bench_lib.err | tail -1)
    python3 -c '
import json, sys
try:
    r = json.loads(sys.argv[1])
except Exception:
    print("- - -"); sys.exit()
h = r.get("tg_vram_hit_rate")
print("%.1f" % r["pp_tok_s"] if "pp_tok_s" in r else "-", "%.2f" % r["tg_tok_s"] if "tg_tok_s" in r else "-",
      "%.1f" % (100 * h) if h is not None else "-")' "$j"
    [ -n "$j" ] || tail -3 /tmp/hm_bench_lib.err >&2
}

# llama-bench ARGS -> "pp tg"
lb() {
    [ -n "$llama" ] || { echo "- -"; return; }
    local out
    out=$("$llama/llama-bench" -m "$model" -t "$th" -r "$reps" -o json "$@" 2>/tmp/lb_bench_lib.err)
    python3 -c '
import json, sys
try:
    rows = json.loads(sys.argv[1])
except Exception:
    print("- -"); sys.exit()
pp = [r["avg_ts"] for r in rows if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0]
tg = [r["avg_ts"] for r in rows if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0]
print("%.1f" % pp[0] if pp else "-", "%.2f" % tg[0] if tg else "-")' "$out"
    [ -n "$out" ] || tail -3 /tmp/lb_bench_lib.err >&2
}

# ratio A B -> "A/Bx" or "-"
ratio() { python3 -c 'import sys
a, b = sys.argv[1], sys.argv[2]
print("%.2fx" % (float(a) / float(b)) if a not in "-" and b not in "-" and float(b) > 0 else "-")' "$1" "$2"; }
