#!/usr/bin/env bash
# Issue 16, round 30: real `--torch-allocator` traces written by a build that
# stores allocator checkpoints (the seed's generate/del/empty_cache rounds,
# scripts/gpu/allocator_check.py, which also checks the ledger and the
# allocator views at every checkpoint of the program against torch's own
# counters), brought back whole (xz) so that a window's views taken up from
# the checkpoints are compared offline with the replay from the file's start
# on every row of real data; prints each trace's checkpoints.
# Usage (device, repo root, the build carried as target/release/gpusleuth):
#   OUT=$OUT bash scripts/gpu/round30_checkpoints.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
timeout 300 "$PY" scripts/gpu/allocator_check.py --gs "$GS" --py "$PY" --out "$OUT/alloc" >"$OUT/allocator.log" 2>&1
echo "allocator_check rc=$?"; grep -E "RESULT" "$OUT/allocator.log"
for mode in default expandable; do
  f="/tmp/alloc_$mode.db"
  xz -T8 -6 -c "$f" >"$OUT/alloc_$mode.db.xz" && ls -l "$f" "$OUT/alloc_$mode.db.xz"
  "$PY" - "$f" <<'PY'
import sqlite3, sys, os
c = sqlite3.connect(sys.argv[1])
n = [c.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("calls", "waits", "allocator_events")]
size = os.path.getsize(sys.argv[1])
print(sys.argv[1], "calls waits allocator_events:", *n, f"{size} B, {size / sum(n):.1f} B/event")
done = c.execute("SELECT value FROM meta WHERE key = 'allocator_checkpoints'").fetchone()
rows = c.execute("SELECT pid, count(*), sum(length(ledger) + length(replay)), min(at_ns), max(at_ns) FROM allocator_checkpoints GROUP BY pid").fetchall()
print("  allocator_checkpoints complete:", done[0] if done else None, "per pid (pid, rows, bytes, first, last):", rows)
PY
done
