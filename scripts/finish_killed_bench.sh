#!/bin/bash
# `trace --finish-killed` on a large file a killed tracer left (issue 16,
# round 49): the bench's synthetic trace (CALLS calls) left as a killed
# tracer leaves it (scripts/unfinish.sql) under a default trace name in a
# directory of runs; then a rotated trace of the simulated workload WL (a
# training-like loop: host compute, a launch, a copy, a sync, a nap) into a
# new run in that directory, without and with --finish-killed, REPS times
# alternated: the workload's wall time, the tracer's peak RSS (its last
# file's completion included), what the tracer noted, and whether the
# killed file holds its rollups after. Needs root, eBPF and the simulated
# libraries (`gpusleuth demo --keep DIR`: SIM_DIR is DIR/sim).
# Usage: sudo [WL=...] [REPS=2] bash scripts/finish_killed_bench.sh SIM_DIR BIN [CALLS]
set -u
sim=$1 bin=$(readlink -f "$2") n=${3:-3500000}
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$sim/lib
wl=${WL:-"repeat 1500 { compute 10; launch ; memcpy 4096; sync_device; sleep 5 }"}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$bin" bench --analysis-only --analysis-calls "$n" --keep-trace "$work/done.db" >/dev/null
cp "$work/done.db" "$work/killed.db"
# In WAL mode, as a killed tracer leaves its file (a finishing cut short
# then leaves its uncommitted pages in the -wal, which readers ignore).
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.executescript(open(sys.argv[2]).read()); c.commit(); c.execute('PRAGMA journal_mode=WAL')" \
  "$work/killed.db" "$here/unfinish.sql"
echo "$n calls, killed file $(stat -c %s "$work/killed.db") bytes; workload: $wl; $(date -u)"
one() { # mode (plain|finish), rep
  local d="$work/runs-$1-$2" opt=()
  mkdir "$d"; cp "$work/killed.db" "$d/gpusleuth-20000101-000000.db"
  local f="$d/gpusleuth-20000101-000000.db"
  [ "$1" = finish ] && opt=(--finish-killed)
  GPUSLEUTH_PEAK_RSS_FILE="$d/peak" "$bin" trace --db "$d/next" --rotate 5s --quiet --precheck off "${opt[@]}" \
    --cuda-lib "$sim/lib/libcudart.so.13" --cuda-lib "$sim/lib/libcuda.so.1" -- \
    /usr/bin/time -f "%e" -o "$d/wall" "$sim/bin/workload" "$wl" >"$d/log" 2>&1
  local done_
  done_=$(sqlite3 "$f" "SELECT count(*) FROM meta WHERE key = 'rollups' AND value = '1'")
  printf '%-7s rep %s: workload %s s, tracer peak RSS %s kB, killed file complete after: %s\n' \
    "$1" "$2" "$(cat "$d/wall")" "$(cat "$d/peak")" "$done_"
  for f in "$d"/next/part-*.db; do
    sqlite3 "$f" "SELECT '  ' || level || ': ' || text FROM notes WHERE text LIKE '%--finish-killed%'"
  done
  rm -rf "$d"
}
for ((r = 1; r <= ${REPS:-2}; r++)); do
  one plain "$r"
  one finish "$r"
done
