#!/usr/bin/env bash
# Issue 16, round 27 on the H200 (one device call, ~2 minutes): the waits
# carry one index ((tid, on_ns); (pid, on_ns) dropped) and the report reads
# each process's latest wait from `wait_ends`, stored at the completion.
# On real PyTorch traces taken with `--torch-allocator` (the default
# allocator and expandable segments, scripts/gpu/allocator_check.py):
#  1. the allocator acceptance again (the traces' truth: torch's counters);
#  2. the report drawn from the stored ends == the report of a copy without
#     `meta.wait_ends` (one aggregate over the waits) == one of a copy with
#     the old index (the seek per process): byte-identical HTML asked;
#  3. what the dropped index would cost on these traces (the copy with it,
#     vacuumed, against the file vacuumed), and bytes per event.
# Usage (device, repo root, the build carried as target/release/gpusleuth):
#   OUT=$OUT bash scripts/gpu/round27_waits.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
S=$OUT/summary.txt
{ date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; } >"$S" 2>&1
echo "== allocator_check" >>"$S"
timeout 240 "$PY" scripts/gpu/allocator_check.py --gs "$GS" --py "$PY" --out "$OUT/alloc" >"$OUT/allocator.log" 2>&1
echo "rc=$?" >>"$S"; grep -E "PASS|FAIL" "$OUT/allocator.log" | tail -6 >>"$S"
echo "== the report's latest waits: stored ends, an aggregate, the old index" >>"$S"
for mode in default expandable; do
  db=/tmp/alloc_$mode.db
  [ -f "$db" ] || { echo "$mode: no trace" >>"$S"; continue; }
  # Same file names (the report names its file), in directories of their own.
  mkdir -p /tmp/r27/ends /tmp/r27/agg /tmp/r27/idx
  ends=/tmp/r27/ends/alloc_$mode.db; agg=/tmp/r27/agg/alloc_$mode.db; idx=/tmp/r27/idx/alloc_$mode.db
  cp "$db" "$ends"; cp "$db" "$agg"; cp "$db" "$idx"
  db=$ends
  "$PY" - "$db" "$agg" "$idx" >>"$S" 2>&1 <<'PY'
import os, shutil, sqlite3, sys
db, agg, idx = sys.argv[1:4]
c = sqlite3.connect(db)
n = lambda q: c.execute(q).fetchone()[0]
calls, waits = n("SELECT count(*) FROM call_rows"), n("SELECT count(*) FROM waits")
blocks = n("SELECT count(*) FROM allocator_events")
ends = c.execute("SELECT pid, kind, last_on_ns FROM wait_ends").fetchall()
indexes = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='waits'")]
size = os.path.getsize(db)
ev = calls + waits + blocks
print(f"  {db}: {calls} calls + {waits} waits + {blocks} allocator events, {size} bytes = {size/ev:.1f} bytes per event; wait indexes {indexes}; wait_ends {ends}")
for path, extra in ((agg, ""), (idx, "CREATE INDEX waits_pid_on ON waits(pid, on_ns);")):
    k = sqlite3.connect(path)
    k.executescript("DELETE FROM meta WHERE key = 'wait_ends';" + extra)
    k.commit(); k.close()
# What the index costs: both vacuumed copies.
a, b = db + ".vac", idx + ".vac"
for src, dst in ((db, a), (idx, b)):
    shutil.copy(src, dst)
    k = sqlite3.connect(dst); k.execute("VACUUM"); k.close()
sa, sb = os.path.getsize(a), os.path.getsize(b)
print(f"  vacuumed: {sa} bytes without the (pid, on_ns) index, {sb} with it: {(sb - sa) / ev:.2f} bytes per event")
PY
  for f in "$db" "$agg" "$idx"; do
    "$GS" report --force -o "$f.html" --db "$f" >"$f.report.log" 2>&1; echo "  report $(basename "$f"): rc $?" >>"$S"
  done
  for f in "$agg" "$idx"; do
    if cmp -s "$db.html" "$f.html"; then v=SAME; else v=DIFFERENT; diff <(tr '>' '\n' <"$db.html") <(tr '>' '\n' <"$f.html") | head -5 >>"$S"; fi
    echo "  $mode report from the stored ends vs $(basename "$(dirname "$f")"): $v ($(wc -c <"$db.html") bytes)" >>"$S"
  done
done
cat "$S"
