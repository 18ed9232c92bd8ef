#!/usr/bin/env bash
# Issue 16, round 52, one device call (~585 s of budget left that session):
# first the acceptance at HEAD (round11.sh: allocator ledger vs torch's
# counters, the six verdicts and call sites, MCP op scopes; last run at
# round 50's code, before round 51 changed culprits, window shares, the
# tail/churn/input_wait rules), then what of round51_nvml.sh the remaining
# time allows (NVML's RSS in Python; the rotated 500,000-live-block run with
# and without NVML, glibc arena/mmap settings), bounded by GS_LEFT_S.
# Usage (device, repo root): OUT=$OUT bash scripts/gpu/round52.sh target/release/gpusleuth
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
t0=$(date +%s)
OUT=$OUT/acc bash scripts/gpu/round11.sh "$1" >/dev/null 2>&1
cp "$OUT/acc/summary.txt" "$OUT/acceptance.txt" 2>/dev/null
for f in allocator integration op_scopes; do cp "$OUT/acc/$f.log" "$OUT/$f.log" 2>/dev/null; done
rm -rf "$OUT/acc"
echo "acceptance: $(( $(date +%s) - t0 )) s" >>"$OUT/acceptance.txt"
left=$(( ${GS_LEFT_S:-480} - ($(date +%s) - t0) ))
if [ "$left" -gt 60 ]; then
  OUT=$OUT/nv timeout "$left" bash scripts/gpu/round51_nvml.sh "$1" >/dev/null 2>&1
  echo "nvml rc=$? in $(( $(date +%s) - t0 )) s total" >>"$OUT/acceptance.txt"
  cp "$OUT/nv/nvml_rss.txt" "$OUT/nv/smaps.txt" "$OUT/nv/gpu.txt" "$OUT/" 2>/dev/null
  rm -rf "$OUT/nv"
fi
cat "$OUT/gpu.txt" 2>/dev/null
cat "$OUT/acceptance.txt"
tail -30 "$OUT/nvml_rss.txt" 2>/dev/null
grep -E "^==|^tracer peak" "$OUT/smaps.txt" 2>/dev/null
