#!/usr/bin/env bash
# Issue 16, round 54, one device call: the acceptance at HEAD (round11.sh:
# allocator ledger vs torch's counters at every checkpoint, the six verdicts
# and call sites, MCP op scopes), first run of round 53's code (one pass for
# the checkpoints' replay, per-process reads by thread, reused pids, the
# readers' process lists); then, on an H200 with time left (GS_LEFT_S),
# round49.sh (the overhead claims and the tracer's CPU per event: no H200
# figure with the stand-ins loaded yet).
# Usage (device, repo root): GS_LEFT_S=… OUT=$OUT bash scripts/gpu/round54.sh target/release/gpusleuth
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1
date -u >>"$OUT/gpu.txt"
OUT=$OUT/acc bash scripts/gpu/round11.sh "$1" >/dev/null 2>&1
cp "$OUT/acc/summary.txt" "$OUT/acceptance.txt" 2>/dev/null
for f in allocator integration op_scopes; do cp "$OUT/acc/$f.log" "$OUT/$f.log" 2>/dev/null; done
rm -rf "$OUT/acc"
echo "acceptance: $(( $(date +%s) - t0 )) s" >>"$OUT/acceptance.txt"
left=$(( ${GS_LEFT_S:-480} - ($(date +%s) - t0) ))
if grep -q H200 "$OUT/gpu.txt" && [ "$left" -gt 300 ]; then
  mkdir -p "$OUT/r49"
  OUT=$OUT/r49 GS_BUDGET_S=$(( left / 2 )) timeout "$left" bash scripts/gpu/round49.sh "$1" >/dev/null 2>&1
  echo "round49 rc=$? in $(( $(date +%s) - t0 )) s total" >>"$OUT/acceptance.txt"
  cp "$OUT/r49/overhead.txt" "$OUT/r49/tracer.txt" "$OUT/" 2>/dev/null
  rm -rf "$OUT/r49"
fi
cat "$OUT/gpu.txt"
cat "$OUT/acceptance.txt"
tail -14 "$OUT/overhead.txt" 2>/dev/null
sed -n '/^µs per added/,$p' "$OUT/tracer.txt" 2>/dev/null | head -20
