#!/usr/bin/env bash
# Issue 16, round 15 on the H200 (one device call, ~2 minutes): `report
# --from/--to` on real PyTorch data. window_workload.py runs a healthy
# phase, a launch storm and a healthy phase (round 14); report_window_check.py
# writes the report of each phase's window and of the whole trace and checks
# each window's report against `explain`/`stats` of the same window.
# Usage (device, repo root): OUT=$OUT bash scripts/gpu/round15_report.sh target/gs15/final
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
GS=$(readlink -f "$1"); chmod +x "$GS"
PY=${PY:-/opt/torch/.venv/bin/python3}
CUDART=${CUDART:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13}
LIBCUDA=${LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
W=/tmp/gs-window; rm -rf "$W"; mkdir -p "$W"
{
echo "== trace $(date -u +%FT%TZ)"
timeout 120 "$GS" trace --quiet --force --db "$W/phases.db" --cuda-lib "$CUDART" --cuda-lib "$LIBCUDA" \
  -- "$PY" scripts/gpu/window_workload.py "$W/truth.json"
echo "trace rc=$?"
echo "== reports of the windows"
timeout 180 python3 scripts/gpu/report_window_check.py "$GS" "$W/phases.db" "$W/truth.json" "$OUT"
echo "== explain of the whole trace"
"$GS" explain --db "$W/phases.db" | head -4
} >"$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
