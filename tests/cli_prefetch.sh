#!/usr/bin/env bash
# cli_prefetch.sh - the CPU decode kernels keep their software prefetch in the built binary.
# hm_cpu_rows (backend/cpu/cpu_kernels.c) prefetches weight rows ahead of the one it computes;
# GCC 12 once deleted those calls (it took the inline helper for a pure function), which cost a
# quarter of the CPU decode speed with nothing else noticing. The disassembly of hm_cpu_rows must
# contain a prefetch instruction (x86 prefetcht0/prefetchnta/..., or aarch64 prfm).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
command -v objdump >/dev/null || { echo "skipped: objdump (binutils) not installed"; exit 77; }
hm_tmpdir prefetch
check "hm_cpu_rows disassembles" test "$(code objdump -d --disassemble=hm_cpu_rows "$EXE")" = 0
check "hm_cpu_rows is in the binary" grep -q "<hm_cpu_rows>:" "$tmp/out"
check "hm_cpu_rows prefetches weight rows" grep -qE "prefetch|prfm" "$tmp/out"
exit $fail
