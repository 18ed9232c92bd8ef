#!/usr/bin/env bash
# Issue 16, round 14 on the H200 (one device call, ~8 minutes): windows of a
# trace (`stats/explain --from/--to`) and the tracer's samples of the
# kernel-counted launches that place them. window_workload.py runs a healthy
# phase, a launch storm and a healthy phase, each logging its bounds on
# CLOCK_MONOTONIC; window_check.py explains each phase's window: no finding
# in the healthy ones, launch_bound in the storm with the add_ kernels it
# launched inside the samples' bounds. Then round 11's acceptance (allocator
# ledger, verdicts, sites, MCP findings by op) on this build.
# Usage (device, repo root, the build carried as target/gs14/new):
#   OUT=$OUT bash scripts/gpu/round14.sh target/gs14/new
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
GS=$(readlink -f "$1"); chmod +x "$GS"
PY=${PY:-/opt/torch/.venv/bin/python3}
CUDART=${CUDART:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13}
LIBCUDA=${LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
W=/tmp/gs-window; rm -rf "$W"; mkdir -p "$W"
{
echo "== windows $(date -u +%FT%TZ)"
timeout 120 "$GS" trace --quiet --force --db "$W/phases.db" --cuda-lib "$CUDART" --cuda-lib "$LIBCUDA" \
  -- "$PY" scripts/gpu/window_workload.py "$W/truth.json"
echo "trace rc=$?"
"$PY" - "$W/phases.db" <<'PYEOF'
import sqlite3, sys
c = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
print("op_counts", c.execute("SELECT op, count FROM op_counts").fetchall())
print("op_count_samples rows", c.execute("SELECT count(*) FROM op_count_samples").fetchone()[0])
PYEOF
timeout 120 "$PY" scripts/gpu/window_check.py "$GS" "$W/phases.db" "$W/truth.json" "$OUT/windows.json"
echo "== whole trace"
"$GS" explain --db "$W/phases.db" | head -8
} >"$OUT/windows.txt" 2>&1
OUT=$OUT bash scripts/gpu/round11.sh "$GS" >/dev/null 2>&1
cat "$OUT/windows.txt" "$OUT/summary.txt"
