#!/usr/bin/env bash
# Answers over a `trace --rotate` run's directory, two builds interleaved:
# wall time and peak RSS of each command, and whether the two builds'
# outputs are byte-identical. Usage:
#   scripts/run_window_ab.sh BASE_BIN NEW_BIN RUN_DIR [REPS]
# Commands: explain --last 30s / 1h, report --last 30s / 1h (docs/benchmarks.md
# "Windows from a run's start (round 23)").
set -euo pipefail
base=$1 new=$2 run=$3 reps=${4:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cmds=("explain --json --last 30s" "explain --json --last 1h"
      "report --force --last 30s -o OUT.html" "report --force --last 1h -o OUT.html")
for ((r = 1; r <= reps; r++)); do
  for c in "${cmds[@]}"; do
    for b in base new; do
      bin=${!b}
      file="$out/$b.html"
      args=${c//OUT.html/$file}
      # shellcheck disable=SC2086
      /usr/bin/time -f "%e %M" -o "$out/time" "$bin" $args --db "$run" >"$out/$b.stdout" 2>/dev/null
      read -r wall kb <"$out/time"
      printf '%-45s %-4s rep %d: %6.2f s %6d MB\n' "$c" "$b" "$r" "$wall" $((kb / 1024))
    done
    if [[ $c == report* ]]; then
      cmp -s "$out/base.html" "$out/new.html" && echo "  same report" || echo "  REPORTS DIFFER"
    else
      cmp -s "$out/base.stdout" "$out/new.stdout" && echo "  same answer" || echo "  ANSWERS DIFFER"
    fi
  done
done
