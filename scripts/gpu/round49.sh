#!/usr/bin/env bash
# Issue 16, round 49: in one device call (asked for an H200), the overhead
# claims at HEAD (round15_overhead.sh: the training loop traced/untraced and
# the launch loop's traps per launch, 5 interleaved reps; last run at round
# 42's build, before the tracer stored its loss counters once a second) and
# the tracer's CPU per added event (round15_tracer.sh, 10 reps of 200,000
# launches; no H200 figure with the stand-ins loaded yet).
# Usage (device, repo root, the release build carried):
#   OUT=$OUT bash scripts/gpu/round49.sh target/release/gpusleuth
set -u
. "$(dirname "$0")/device_env.sh"
host_facts
date -u >>"$OUT/gpu.txt"
t0=$(date +%s)
OUT=/tmp/r49/overhead GS_BUDGET_S=${GS_BUDGET_S:-300} bash scripts/gpu/round15_overhead.sh "$GS" >/dev/null 2>&1
cp /tmp/r49/overhead/overhead.txt "$OUT/overhead.txt"
echo "overhead: $(( $(date +%s) - t0 )) s" >>"$OUT/gpu.txt"
t0=$(date +%s)
OUT=/tmp/r49/tracer bash scripts/gpu/round15_tracer.sh 10 200000 "$GS" >/dev/null 2>&1
cp /tmp/r49/tracer/summary.txt "$OUT/tracer.txt"
echo "tracer: $(( $(date +%s) - t0 )) s" >>"$OUT/gpu.txt"
cat "$OUT/gpu.txt"
tail -14 "$OUT/overhead.txt"
sed -n '/^µs per added/,$p' "$OUT/tracer.txt" | head -20
