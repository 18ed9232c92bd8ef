#!/usr/bin/env bash
# Issue 16, round 28: real `--torch-allocator` traces brought back whole, to
# size an encoding of the allocator rows on every row of real data (round 27
# measured 4,000 rows of each). Traces the seed's generate/del/empty_cache
# rounds (scripts/gpu/allocator_check.py, which also checks the ledger and
# allocator views against torch's counters) and compresses each trace and its
# checkpoint log with xz into $OUT.
# Usage (device, repo root, the build carried as target/release/gpusleuth):
#   OUT=$OUT bash scripts/gpu/round28_traces.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
timeout 300 "$PY" scripts/gpu/allocator_check.py --gs "$GS" --py "$PY" --out "$OUT/alloc" >"$OUT/allocator.log" 2>&1
echo "allocator_check rc=$?"; grep -E "RESULT" "$OUT/allocator.log"
for mode in default expandable; do
  for f in "/tmp/alloc_$mode.db" "/tmp/alloc_$mode.jsonl"; do
    xz -T4 -6 -c "$f" >"$OUT/$(basename "$f").xz" && ls -l "$f" "$OUT/$(basename "$f").xz"
  done
  "$PY" - "/tmp/alloc_$mode.db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
import os
n = [c.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("calls", "waits", "allocator_events")]
v = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
size = os.path.getsize(sys.argv[1])
print(sys.argv[1], "schema", v, "calls waits allocator_events:", *n, f"{size} B, {size / sum(n):.1f} B/event")
if int(v) >= 4:
    base = "base_id" if int(v) == 4 else "base_back"
    based, left = c.execute(f"SELECT count({base}), sum(" + " + ".join(f"(w{i} IS NULL)" for i in range(16)) + ") FROM allocator_rows").fetchone()
    print("  rows stored against a base:", based, "of", n[2], f"words left out per such row {left / max(based, 1):.2f}")
    order = c.execute("SELECT value FROM meta WHERE key = 'allocator_rows_in_end_order'").fetchone()
    index = c.execute("SELECT count(*) FROM sqlite_master WHERE name = 'allocator_rows_pid'").fetchone()[0]
    print("  allocator_rows_in_end_order:", order[0] if order else None, "(pid, end_ns) index:", index)
PY
done
