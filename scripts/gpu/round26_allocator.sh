#!/usr/bin/env bash
# Issue 16, round 26 on the H200 (one device call, ~3 minutes): the tracer
# now stores each file's allocator views at its completion (`allocator_rollup`)
# and the readers that rebuild them stream the allocator events from the
# file. On real PyTorch traces taken with `--torch-allocator` (the default
# allocator and expandable segments, scripts/gpu/allocator_check.py):
#  1. the allocator acceptance again (`memory --at` at every checkpoint ==
#     torch's memory_allocated()/memory_reserved(): the streamed path);
#  2. the stored views == the views rebuilt from the file: `memory --json`,
#     `memory --segments` and `explain --json` of each trace against those of
#     a copy without `meta.allocator_rollup` (byte-identical output asked).
# Usage (device, repo root, the build carried as target/release/gpusleuth):
#   OUT=$OUT bash scripts/gpu/round26_allocator.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
S=$OUT/summary.txt
{ date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; } >"$S" 2>&1
echo "== allocator_check" >>"$S"
timeout 240 "$PY" scripts/gpu/allocator_check.py --gs "$GS" --py "$PY" --out "$OUT/alloc" >"$OUT/allocator.log" 2>&1
echo "rc=$?" >>"$S"; grep -E "PASS|FAIL" "$OUT/allocator.log" | tail -6 >>"$S"
echo "== stored allocator views == rebuilt ones" >>"$S"
for mode in default expandable; do
  db=/tmp/alloc_$mode.db
  [ -f "$db" ] || { echo "$mode: no trace" >>"$S"; continue; }
  copy=/tmp/alloc_${mode}_rebuilt.db
  cp "$db" "$copy"
  "$PY" - "$db" "$copy" >>"$S" 2>&1 <<'PY'
import sqlite3, sys
db, copy = sys.argv[1], sys.argv[2]
c = sqlite3.connect(db)
rows = c.execute("SELECT pid, at_ns, length(CAST(view AS BLOB)) FROM allocator_rollup").fetchall()
mark = c.execute("SELECT value FROM meta WHERE key = 'allocator_rollup'").fetchall()
print(f"  {db}: allocator_rollup rows (pid, at_ns, bytes) {rows}, mark {mark}")
k = sqlite3.connect(copy)
k.execute("DELETE FROM meta WHERE key = 'allocator_rollup'")
k.commit()
PY
  for cmd in "memory --json" "memory --segments" "explain --json"; do
    a=$OUT/${mode}_stored_${cmd// /_}.out; b=$OUT/${mode}_rebuilt_${cmd// /_}.out
    t0=$(date +%s%N); "$GS" $cmd --db "$db" >"$a" 2>"$a.err"; ra=$?
    t1=$(date +%s%N); "$GS" $cmd --db "$copy" >"$b" 2>"$b.err"; rb=$?
    t2=$(date +%s%N)
    if cmp -s "$a" "$b"; then v=SAME; else v=DIFFERENT; fi
    echo "  $mode $cmd: $v (rc $ra/$rb; stored $(( (t1 - t0) / 1000000 )) ms, rebuilt $(( (t2 - t1) / 1000000 )) ms, $(wc -c <"$a") bytes)" >>"$S"
  done
done
cat "$S"
