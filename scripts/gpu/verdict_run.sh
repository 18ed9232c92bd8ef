#!/usr/bin/env bash
# Issue 12 on the H200: each workload of verdict_workloads.py traced by
# gpusleuth, explained, and compared with the workload's own truth.
#   OUT=/tmp/out GPUSLEUTH=./gpusleuth scripts/gpu/verdict_run.sh [MODE...]
# Results: $OUT/verdict-h200.json (truth + explain JSON per mode), $OUT/verdict-h200.txt.
set -u
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
GS=${GPUSLEUTH:-target/release/gpusleuth}
PY=${PY:-/opt/torch/.venv/bin/python3}
CUDART=${CUDART:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13}
LIBCUDA=${LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
WORK=${WORK:-/tmp/gs-verdict}; rm -rf "$WORK"; mkdir -p "$WORK"
export PYTHONUNBUFFERED=1
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
modes=${*:-starved workers launch item pageable healthy item_full queued queued_full}
{
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null) torch $($PY -c 'import torch; print(torch.__version__)')"
echo "== GPU time per step (untraced, CUDA graph replay timed with CUDA events)"
$PY "$here/verdict_workloads.py" measure "$WORK/measure.json"
for m in $modes; do
  echo "== $m"
  # *_full: every launch recorded, so the verdicts place them.
  case $m in *_full) extra="--launches full" ;; *) extra="" ;; esac
  GS_WORKER_PIDS="$WORK/$m.workers" $GS trace --quiet --force --db "$WORK/$m.db" $extra \
      --cuda-lib "$CUDART" --cuda-lib "$LIBCUDA" -- $PY "$here/verdict_workloads.py" "$m" "$WORK/$m.json"
  $GS explain --db "$WORK/$m.db" > "$WORK/$m.explain.txt"
  $GS explain --json --db "$WORK/$m.db" > "$WORK/$m.explain.json"
  cat "$WORK/$m.explain.txt"
done
$PY "$here/verdict_check.py" "$WORK" "$OUT/verdict-h200.json" $modes
} 2>&1 | tee "$OUT/verdict-h200.txt"
