#!/usr/bin/env bash
# policy_plot.sh - draw hit rate vs budget from the Markdown tables of policy_report.sh and
# policy_trace_report.sh (one panel per table, side by side) into a PNG (docs/policies.png).
#
# usage: bench/policy_plot.sh OUT.png "TITLE=TABLE.md" ["TITLE=TABLE.md" ...]
#   Every column whose cells are percentages is a line, named by its header; "its hit rate" (the
#   llama.cpp --n-cpu-moe column) is drawn as "layer split (--n-cpu-moe)". x = the first column's
#   percentage of the units. Lines of the file that are not table rows are ignored.
#
# gnuplot is a documentation-time tool only (Debian: apt-get install gnuplot-nox): nothing in the
# build or the tests needs it, and this script is run by hand when docs/POLICIES.md is refreshed.
set -euo pipefail
out="${1:?usage: policy_plot.sh OUT.png TITLE=TABLE.md ...}"
shift
[ $# -ge 1 ] || { echo "policy_plot: no tables given" >&2; exit 2; }
command -v gnuplot >/dev/null || { echo "policy_plot: needs gnuplot (apt-get install gnuplot-nox)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

n=$#
plots=""
i=0
for arg in "$@"; do
    title="${arg%%=*}"
    file="${arg#*=}"
    [ -r "$file" ] || { echo "policy_plot: cannot read $file" >&2; exit 1; }
    i=$((i + 1))
    # header -> the names of the percentage columns; rows -> "x v1 v2 ..." (NaN where missing)
    awk -F'|' -v names="$tmp/names$i" -v data="$tmp/data$i" '
        function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
        /^\|/ && !hdr { for (c = 2; c < NF; c++) h[c] = trim($c); hdr = 1; next }
        /^\|[-: |]+$/ { next }
        /^\|/ && hdr {
            x = trim($2); sub(/ *%.*/, "", x)
            line = x
            for (c = 3; c < NF; c++) {
                v = trim($c)
                if (v ~ /%$/) { sub(/ *%$/, "", v); pct[c] = 1; line = line " " v } else line = line " NaN"
            }
            print line > data
        }
        END {
            for (c = 3; c < NF; c++) if (pct[c]) {
                name = h[c]; if (name == "its hit rate") name = "layer split (--n-cpu-moe)"
                print c - 1 "\t" name > names
            }
        }' "$file"
    p="set title \"$title\"\n"
    sep="plot "
    while IFS=$'\t' read -r col name; do
        p="$p$sep\"$tmp/data$i\" using 1:$col with linespoints title \"$name\""
        sep=", \\\\\n     "
    done <"$tmp/names$i"
    plots="$plots$p\n"
done

{
    echo "set terminal pngcairo size $((560 * n)),440 font 'sans,10'"
    echo "set output '$out'"
    echo "set multiplot layout 1,$n"
    echo "set xlabel 'units in the fast tier (% of all expert units)'"
    echo "set ylabel 'hit rate (% of routed token-expert slots)'"
    echo "set xrange [0:85]; set yrange [0:100]; set grid"
    echo "set key bottom right"
    echo "set datafile missing 'NaN'"
    printf "%b" "$plots"
    echo "unset multiplot"
} >"$tmp/plot.gp"
gnuplot "$tmp/plot.gp"
echo "policy_plot: wrote $out" >&2
