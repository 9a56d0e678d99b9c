#!/usr/bin/env bash
# ssd_tier.sh - the SSD tier (issue 6) on one model: decode tok/s, MiB read from the file per
# decoded token, RAM hit rate, prefetch precision/recall and peak RSS at --ram-budget = 25 % /
# 50 % of the model's expert bytes (with and without --prefetch) and without a budget (100 %:
# the plain mmap; a budget >= the expert bytes opens no tier). Drops the page cache before each
# run when it can (root), so the first reads come from the disk. A benchmark, not a test.
#   bench/ssd_tier.sh [MODEL] [THREADS] [N_GEN]
set -uo pipefail
exe="${HM_EXE:-build/hotmoe}"
model="${1:-/work/models/q3-l4-q4km.gguf}"
th="${2:-2}"
ngen="${3:-32}"
expert_bytes=$("$exe" inspect "$model" 2>/dev/null | sed -n 's/.*experts: *\([0-9.]*\) GiB.*/\1/p')
[ -n "$expert_bytes" ] || { echo "cannot read the expert size of $model"; exit 1; }
eb=$(awk -v g="$expert_bytes" 'BEGIN{printf "%d", g*1073741824}')
drop() { if (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then echo yes; else echo no; fi; }
echo "model $model, experts $expert_bytes GiB, threads $th, tg$ngen after a pp16, 1 repetition"
echo
echo "| budget | prefetch | cache dropped | tg tok/s | MiB read/token (tg) | RAM hit rate (tg) | prefetch precision / recall | peak RSS MiB |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"
for pct in 25 50 100; do
    for pf in no yes; do
        [ $pct = 100 ] && [ $pf = yes ] && continue
        args=()
        [ $pct != 100 ] && args+=(--ram-budget $((eb * pct / 100)))
        [ $pf = yes ] && args+=(--prefetch)
        d=$(drop)
        j=$(nice "$exe" bench -m "$model" -p 16 -n "$ngen" -r 1 -t "$th" --json "${args[@]}" 2>/dev/null | tail -1)
        python3 - "$pct" "$pf" "$d" "$j" <<'PY'
import json, sys
pct, pf, d, j = sys.argv[1:5]
r = json.loads(j)
mib = r.get("tg_ssd_bytes_per_tok", 0) / 1048576
hit = r.get("tg_ram_hit_rate")
pp = r.get("tg_prefetch_precision")
budget = f"{pct} % ({r['ram_budget'] / 1048576:.0f} MiB)" if "ram_budget" in r else "100 % (mmap)"
print(f"| {budget} | {pf} | {d} | {r['tg_tok_s']:.2f} | {mib:.2f} | "
      f"{'%.1f %%' % (100 * hit) if hit is not None else '-'} | "
      f"{'%.1f / %.1f %%' % (100 * pp, 100 * r['tg_prefetch_recall']) if pp is not None else '-'} | "
      f"{r['peak_rss_bytes'] / 1048576:.0f} |")
PY
    done
done
