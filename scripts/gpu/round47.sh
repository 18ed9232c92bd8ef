#!/usr/bin/env bash
# Issue 16, round 47: on the device (asked for an H200, whose tracer CPU per
# event with the stand-ins loaded was never measured: rounds 40-46 got H100s),
# the acceptance at HEAD (round11.sh: allocator ledger = torch's counters,
# the six verdict workloads, call sites, MCP findings {op}) and the tracer's
# CPU per added event (round15_tracer.sh, 10 reps of 200,000 launches), in
# one call; each part's summary comes back as its own file.
# Usage (device, repo root, the release build carried):
#   OUT=$OUT bash scripts/gpu/round47.sh target/release/gpusleuth
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
GS=$(readlink -f "$1"); chmod +x "$GS"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"; } >"$OUT/gpu.txt" 2>&1
t0=$(date +%s)
OUT=/tmp/r47/acc bash scripts/gpu/round11.sh "$GS" >/dev/null 2>&1
cp /tmp/r47/acc/summary.txt "$OUT/acceptance.txt"
echo "acceptance: $(( $(date +%s) - t0 )) s" >>"$OUT/gpu.txt"
t0=$(date +%s)
OUT=/tmp/r47/tracer bash scripts/gpu/round15_tracer.sh 10 200000 "$GS" >/dev/null 2>&1
cp /tmp/r47/tracer/summary.txt "$OUT/tracer.txt"
echo "tracer: $(( $(date +%s) - t0 )) s" >>"$OUT/gpu.txt"
cat "$OUT/gpu.txt"
grep -E "rc=|PASS|FAIL|SUMMARY|expected|verdict" "$OUT/acceptance.txt" | head -30
sed -n '/^µs per added/,$p' "$OUT/tracer.txt" | head -20
