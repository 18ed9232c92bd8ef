#!/usr/bin/env bash
# Issue 16, round 6 on the H200 (one device call, ~8 minutes): the tracer's
# footprint after batching and trimming, on the simulated flood and on real
# PyTorch workloads.
#  1. `bench --footprint-only` (simulated libraries, --launches full flood):
#     tracer CPU per stored event, trace's peak RSS, drops.
#  2. overhead_reps.py on the training loop and the launch loop (5 interleaved
#     repetitions): overhead ratio with its 95% interval, exact traps per
#     launch, and the tracer's peak RSS split (anon / file) on real libraries.
# Usage (device): OUT=$OUT bash scripts/gpu/round6.sh target/release/gpusleuth
set -u
GS=${1:-target/release/gpusleuth}
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
echo "== footprint (simulated flood)" | tee "$OUT/footprint.txt"
timeout 200 "$GS" bench --footprint-only --footprint-launches "${N:-200000}" --reps 1 >> "$OUT/footprint.txt" 2>&1
echo "== overhead and RSS on real workloads" | tee "$OUT/overhead.txt"
OUT=$OUT GS_WORKLOADS=${GS_WORKLOADS:-train,launch} GS_LAUNCHES=${GS_LAUNCHES:-200000} GS_REPS=5 \
  GS_BUDGET_S=${GS_BUDGET_S:-300} timeout 420 python3 scripts/gpu/overhead_reps.py "$GS" >> "$OUT/overhead.txt" 2>&1
echo "== summary"
cat "$OUT/footprint.txt"
tail -8 "$OUT/overhead.txt"
