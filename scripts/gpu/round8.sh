#!/usr/bin/env bash
# Issue 16, round 8 on the H200 (one device call, ~4 minutes): the tracer's
# CPU per event while tracing and, since round 8, the writer's CPU to
# complete the file after the stop (`completion µs/ev`), over interleaved
# repetitions of `bench --footprint-only`.
# Usage (device): OUT=$OUT REPS=3 bash scripts/gpu/round8.sh GS
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
GS=$(readlink -f "$1"); chmod +x "$GS"
cd /tmp
timeout 500 "$GS" bench --footprint-only --footprint-launches "${N:-200000}" --reps "${REPS:-3}" > "$OUT/footprint.txt" 2>&1
echo "== summary"
grep -E "launches|^ +[0-9]+ +(on|off)|per added" "$OUT/footprint.txt"
