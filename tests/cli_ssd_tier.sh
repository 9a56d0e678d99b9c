#!/usr/bin/env bash
# cli_ssd_tier.sh - the SSD tier wired into the engine (issue 6), as a user runs it:
#  - logits with --ram-budget at 1, 2, 3 and 8 buffers are BIT-IDENTICAL to the logits without a
#    budget (tiny synth model; and the 4-layer qwen3-30b-a3b Q4_K_M model when present, see
#    HM_Q3L4), with and without --prefetch, through io_uring and through pread (--io-pread);
#  - the tier is really used (bench reports reads from the file) and the flags' refusals;
#  - peak RSS of `hotmoe bench` with a budget stays <= budget + dense bytes + buffers on a synth
#    model whose experts are ~18x the budget (without the tier the mmap'd experts would count).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir ssd_tier

if ! "$EXE" synth --preset tiny --type q4_k_m --seed 3 -q -o "$tmp/m.gguf" >/dev/null 2>&1; then
    echo "synth unavailable: skipping"; exit 77
fi
m="$tmp/m.gguf"
toks=1,2,3,4,5,6,7,8,9,10,11,12
check "baseline logits" test "$(code "$EXE" logits -m "$m" --tokens $toks -o "$tmp/base.f32" -t 2)" = 0
# the buffer size, from the refusal of a 1-byte budget
check "budget below one buffer refused" test "$(code "$EXE" logits -m "$m" --tokens 1 -o "$tmp/x.f32" --ram-budget 1)" = 1
slot=$(sed -n 's/.*buffers of \([0-9]*\) bytes.*/\1/p' "$tmp/err")
check "refusal names the buffer size" test -n "$slot"
slot=${slot:-143360}
check "--ram-budget bad value" test "$(code "$EXE" logits -m "$m" --tokens 1 -o "$tmp/x.f32" --ram-budget lots)" = 2
check "--io-depth bad value" test "$(code "$EXE" logits -m "$m" --tokens 1 -o "$tmp/x.f32" --io-depth 0)" = 2
for nb in 1 2 3 8; do
    for pf in "" --prefetch; do
        for io in "" --io-pread; do
            n="budget $nb buffers $pf $io"
            check "$n runs" test "$(code "$EXE" logits -m "$m" --tokens $toks -o "$tmp/b.f32" -t 2 \
                --ram-budget $((nb * slot)) $pf $io)" = 0
            check "$n bit-identical" cmp -s "$tmp/base.f32" "$tmp/b.f32"
        done
    done
done
# env aliases, and a policy with RAM slots (lru) over several decode steps (-ub 1: compare with
# the same micro-batching, which changes the matmuls' batching)
check "baseline -ub 1" test "$(code "$EXE" logits -m "$m" --tokens $toks -o "$tmp/base1.f32" -t 2 -ub 1)" = 0
check "env aliases + lru" test "$(LLAMA_EXPERT_SWAP_PREFETCH=1 code "$EXE" logits -m "$m" --tokens $toks \
    -o "$tmp/b.f32" -t 2 --ram-budget $((6 * slot)) --policy lru -ub 1)" = 0
check "lru -ub 1 bit-identical" cmp -s "$tmp/base1.f32" "$tmp/b.f32"

# the tier is used: bench reports reads, a hit rate and prefetch precision
check "bench with budget" test "$(code "$EXE" bench -m "$m" -p 8 -n 16 -r 1 -t 2 --ram-budget $((4 * slot)) --prefetch)" = 0
check "bench reports the tier" grep -q "SSD tier (tg): .* MiB read in [1-9][0-9]* reads" "$tmp/err"
check "bench reports prefetch" grep -q "prefetch precision" "$tmp/err"
check "run reports the tier" test "$(code "$EXE" run -m "$m" -p hello -n 4 -t 2 --ram-budget $((4 * slot)))" = 0
check "run report" grep -q "SSD tier (whole run)" "$tmp/err"
check "no budget: no report" test "$(code "$EXE" bench -m "$m" -p 8 -n 4 -r 1 -t 2)" = 0
check "no budget: silent" bash -c "! grep -q 'SSD tier' '$tmp/err'"

# the 4-layer qwen3-30b-a3b Q4_K_M model (tests/fixtures/llama_q3l4), when it is on this machine
q3="${HM_Q3L4:-/work/models/q3-l4-q4km.gguf}"
if [ -f "$q3" ]; then
    check "q3l4 baseline" test "$(code nice "$EXE" logits -m "$q3" --tokens 1,2,3,4,5,6 -o "$tmp/q.f32" -t 2)" = 0
    for args in "--ram-budget 64MiB" "--ram-budget 24MiB --prefetch" "--ram-budget 64MiB --prefetch --io-pread"; do
        check "q3l4 $args runs" test "$(code nice "$EXE" logits -m "$q3" --tokens 1,2,3,4,5,6 -o "$tmp/qb.f32" -t 2 $args)" = 0
        check "q3l4 $args bit-identical" cmp -s "$tmp/q.f32" "$tmp/qb.f32"
    done
else
    echo "note: $q3 absent, the qwen3moe fixture part is skipped"
fi

# peak RSS: 64 layers of tiny (experts ~144 MiB), an 8 MiB budget
if "$EXE" synth --preset tiny --layers 64 --type q4_k_m --seed 4 -q -o "$tmp/big.gguf" >/dev/null 2>&1; then
    dense=$("$EXE" inspect "$tmp/big.gguf" 2>/dev/null | sed -n 's/.*dense: *\([0-9.]*\) MiB.*/\1/p')
    budget=$((8 << 20))
    check "rss bench" test "$(code "$EXE" bench -m "$tmp/big.gguf" -p 16 -n 32 -r 1 -t 2 --ram-budget $budget --json)" = 0
    rss=$(sed -n 's/.*"peak_rss_bytes": \([0-9]*\).*/\1/p' "$tmp/out")
    limit=$(awk -v d="${dense:-0}" -v b=$budget 'BEGIN{printf "%d", b + d * 1048576 + 48 * 1048576}')
    echo "peak RSS with --ram-budget 8MiB: $((${rss:-0} >> 20)) MiB (limit: budget + dense ${dense} MiB + 48 MiB buffers = $((limit >> 20)) MiB)"
    check "peak RSS <= budget + dense + buffers" test "${rss:-999999999999}" -le "$limit"
    check "rss bench no budget" test "$(code "$EXE" bench -m "$tmp/big.gguf" -p 16 -n 32 -r 1 -t 2 --json)" = 0
    rss0=$(sed -n 's/.*"peak_rss_bytes": \([0-9]*\).*/\1/p' "$tmp/out")
    echo "peak RSS without a budget (mmap): $((${rss0:-0} >> 20)) MiB"
fi
[ $fail = 0 ] && echo "cli_ssd_tier: ok" || exit 1
