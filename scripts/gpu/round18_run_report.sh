#!/usr/bin/env bash
# Issue 16, round 18 on the H200 (one device call, about a minute): the
# report, per-site table and export of a `trace --rotate 2s --keep 3` run of
# a real PyTorch program (run_memory_workload.py, round 17's: a 1.5 GiB model
# allocated in files --keep deletes), checked against torch's own counters
# and SQL over the run's files (run_report_check.py).
# Usage (device, repo root): OUT=$OUT bash scripts/gpu/round18_run_report.sh target/release/gpusleuth
set -u
. "$(dirname "$0")/device_env.sh"
W=/tmp/gs-runrep; rm -rf "$W"; mkdir -p "$W"
{
echo "== trace $(date -u +%FT%TZ)"
timeout 180 "$GS" trace --quiet --rotate 2s --keep 3 --db "$W/run" --cuda-lib "$CUDART" --cuda-lib "$LIBCUDA" \
  -- "$PY" scripts/gpu/run_memory_workload.py "$W/truth.json"
echo "trace rc=$?"
ls -l "$W/run"
echo "== checks $(date -u +%FT%TZ)"
timeout 400 python3 scripts/gpu/run_report_check.py "$GS" "$W/run" "$W/truth.json" "$OUT"
} >"$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
