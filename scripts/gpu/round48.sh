#!/usr/bin/env bash
# Issue 16, round 48: the tracer's CPU per added event (poller + writer) with
# the stand-ins loaded, asked for on an H200 (rounds 40-47 got H100 hosts:
# 1.34 and 0.742 µs there; the H200's last figure predates round 40's fix of
# the flood's failing launches). 10 reps of 200,000 launches.
# Usage (device, repo root, the release build carried):
#   OUT=$OUT bash scripts/gpu/round48.sh target/release/gpusleuth
set -u
. "$(dirname "$0")/device_env.sh"
host_facts
date -u >>"$OUT/gpu.txt"
t0=$(date +%s)
OUT=/tmp/r48/tracer bash scripts/gpu/round15_tracer.sh 10 200000 "$GS" >/dev/null 2>&1
cp /tmp/r48/tracer/summary.txt "$OUT/tracer.txt"
cp /tmp/r48/tracer/ab.log "$OUT/ab.log"
echo "tracer: $(( $(date +%s) - t0 )) s" >>"$OUT/gpu.txt"
cat "$OUT/gpu.txt"
sed -n '/^µs per added/,$p' "$OUT/tracer.txt" | head -20
