#!/usr/bin/env bash
# Issue 16, round 7 on the H200 (one device call, ~9 minutes): the tracer's
# footprint before and after reading symbol tables through a small buffer
# (no mapped library pages) and pausing the draining loop after small batches.
#  1. `bench --footprint-only` for each binary (simulated --launches full
#     flood): tracer CPU per stored event (poller, writer), peak RSS.
#  2. tracer_smaps.py for each binary on the PyTorch training loop: where the
#     tracer's resident memory is, by mapping, and its VmHWM.
#  3. overhead_reps.py with the last binary (5 interleaved repetitions of the
#     training loop and the launch loop): overhead ratio, exact traps per
#     launch, tracer peak RSS on real libraries.
# Usage (device): OUT=$OUT bash scripts/gpu/round7.sh BASE NEW [NEW2 ...]
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
PY=${PY:-/opt/torch/.venv/bin/python3}
last=""
for gs in "$@"; do
  chmod +x "$gs" 2>/dev/null
  echo "== footprint $gs" >> "$OUT/footprint.txt"
  timeout 150 "$gs" bench --footprint-only --footprint-launches "${N:-200000}" --reps 1 >> "$OUT/footprint.txt" 2>&1
  echo "== smaps $gs (bench_train.py --steps 40)" >> "$OUT/smaps.txt"
  timeout 120 $PY scripts/gpu/tracer_smaps.py "$gs" -- $PY scripts/gpu/bench_train.py --steps 40 >> "$OUT/smaps.txt" 2>&1
  last=$gs
done
if [ "${SKIP_REPS:-0}" != 1 ]; then
  echo "== overhead and RSS on real workloads ($last)" > "$OUT/overhead.txt"
  OUT=$OUT GS_WORKLOADS=${GS_WORKLOADS:-train,launch} GS_LAUNCHES=${GS_LAUNCHES:-200000} GS_REPS=5 \
    GS_BUDGET_S=${GS_BUDGET_S:-300} timeout 400 $PY scripts/gpu/overhead_reps.py "$last" >> "$OUT/overhead.txt" 2>&1
fi
echo "== summary"
grep -E "^==|^ +[0-9]+ +(on|off)" "$OUT/footprint.txt"
grep -E "^==|tracer peak|MiB  " "$OUT/smaps.txt" | head -60
tail -8 "$OUT/overhead.txt" 2>/dev/null
