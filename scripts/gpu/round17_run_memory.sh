#!/usr/bin/env bash
# Issue 16, round 17 on the H200 (one device call, under a minute): the memory
# ledger of a `trace --rotate 2s --keep 3` run of a real PyTorch program
# whose model was allocated in files --keep deleted (run_memory_workload.py),
# from `memory --db DIR` and MCP `memory` of the directory, checked against
# torch's own counters (run_memory_check.py).
# Usage (device, repo root): OUT=$OUT bash scripts/gpu/round17_run_memory.sh target/release/gpusleuth
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
GS=$(readlink -f "$1"); chmod +x "$GS"
PY=${PY:-/opt/torch/.venv/bin/python3}
CUDART=${CUDART:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13}
LIBCUDA=${LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
W=/tmp/gs-runmem; rm -rf "$W"; mkdir -p "$W"
{
echo "== trace $(date -u +%FT%TZ)"
timeout 180 "$GS" trace --quiet --rotate 2s --keep 3 --db "$W/run" --cuda-lib "$CUDART" --cuda-lib "$LIBCUDA" \
  -- "$PY" scripts/gpu/run_memory_workload.py "$W/truth.json"
echo "trace rc=$?"
ls "$W/run" | tr '\n' ' '; echo
echo "== the same program into one file $(date -u +%FT%TZ)"
timeout 180 "$GS" trace --quiet --db "$W/one.db" --cuda-lib "$CUDART" --cuda-lib "$LIBCUDA" \
  -- "$PY" scripts/gpu/run_memory_workload.py "$W/one-truth.json"
echo "trace rc=$?"
echo "== checks"
timeout 300 python3 scripts/gpu/run_memory_check.py "$GS" "$W/run" "$W/truth.json" "$OUT" "$W/one.db" "$W/one-truth.json"
} >"$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
