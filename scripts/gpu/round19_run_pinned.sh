#!/usr/bin/env bash
# Issue 16, round 19 on the H200 (one device call, about a minute): a
# `trace --rotate 2s` run of a PyTorch program that pins a buffer at its
# start and copies from it all run long (run_pinned_workload.py), traced by
# this build and by the previous one (GS_OLD, optional); checked against
# the program's own counts and memory_reserved() (run_pinned_check.py).
# Usage (device, repo root): OUT=$OUT bash scripts/gpu/round19_run_pinned.sh target/release/gpusleuth [OLD_BINARY]
set -u
. "$(dirname "$0")/device_env.sh"
OLD=${2:-}
W=/tmp/gs-pinned; rm -rf "$W"; mkdir -p "$W"
{
for b in new old; do
  bin=$GS; [ "$b" = old ] && { [ -n "$OLD" ] || continue; bin=$(readlink -f "$OLD"); chmod +x "$bin"; }
  echo "== trace ($b) $(date -u +%FT%TZ)"
  timeout 120 "$bin" trace --quiet --rotate 2s --db "$W/run-$b" --cuda-lib "$CUDART" --cuda-lib "$LIBCUDA" \
    -- "$PY" scripts/gpu/run_pinned_workload.py "$W/truth-$b.json" 10
  echo "trace rc=$?"
  ls -l "$W/run-$b" | tail -n +2 | awk '{print $5, $9}' | tr '\n' ' '; echo
done
echo "== checks $(date -u +%FT%TZ)"
if [ -n "$OLD" ]; then
  timeout 300 python3 scripts/gpu/run_pinned_check.py "$GS" "$W/run-new" "$W/truth-new.json" \
    "$(readlink -f "$OLD")" "$W/run-old" "$W/truth-old.json" "$OUT"
else
  timeout 300 python3 scripts/gpu/run_pinned_check.py "$GS" "$W/run-new" "$W/truth-new.json" "$OUT"
fi
} >"$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
