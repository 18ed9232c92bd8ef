#!/usr/bin/env bash
# Issue 16, round 15 on the H200 (one device call, ~9 minutes): the
# overhead claims on this round's build (the tracer gained the settle of
# unseen switch-ins in round 13 and the launch-count samples in round 14
# since they were last measured in rounds 4-7): the training loop's
# traced/untraced ratio and the launch loop's traps per launch, 5
# interleaved repetitions (scripts/gpu/overhead_reps.py).
# Usage (device, repo root): OUT=$OUT bash scripts/gpu/round15_overhead.sh target/gs15/final
set -u
GS=$(readlink -f "${1:-target/release/gpusleuth}"); chmod +x "$GS"
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
date -u >"$OUT/overhead.txt"
OUT=$OUT GS_WORKLOADS=train,launch GS_LAUNCHES=${GS_LAUNCHES:-200000} GS_REPS=5 \
  GS_BUDGET_S=${GS_BUDGET_S:-420} timeout 530 python3 scripts/gpu/overhead_reps.py "$GS" >>"$OUT/overhead.txt" 2>&1
echo "rc=$?" >>"$OUT/overhead.txt"
tail -14 "$OUT/overhead.txt"
