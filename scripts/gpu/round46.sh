#!/usr/bin/env bash
# Issue 16, round 46: the tracer's peak RSS while many short-lived CUDA
# processes come and go, traced into one file (`ROT=none`: no --rotate),
# this round's build (the completion stores each process's rollups once its
# threads are done) against the build before, on the device host; then the
# new build with the deploy files' rotation (`--rotate 1s` here, the
# script's default). The simulated libraries from `demo --keep`.
# Usage (device, repo root, both builds carried):
#   OUT=$OUT bash scripts/gpu/round46.sh target/release/gpusleuth target/release/gpusleuth-before [N]
set -u
. scripts/gpu/device_env.sh "$1"
OLD=$(readlink -f "$2"); chmod +x "$OLD"
N=${3:-6000}
host_facts
C=$OUT/churn.txt
D=/tmp/r46-demo
rm -rf "$D"
"$GS" demo --keep "$D" >"$OUT/demo.log" 2>&1 || { echo "demo failed"; tail -3 "$OUT/demo.log"; exit 1; }
for b in "$OLD" "$GS"; do
  echo "== one file, $N processes, $(basename "$b")" >>"$C"
  t0=$(date +%s)
  ROT=none timeout 250 bash scripts/process_churn_footprint.sh "$D/sim" "$N" "$b" 2>&1 \
    | grep -E "^processes .*000:|peak RSS|one.db|saved" | cut -c1-200 >>"$C"
  echo "  ($(( $(date +%s) - t0 )) s)" >>"$C"
done
echo "== --rotate 1s, $N processes, $(basename "$GS")" >>"$C"
timeout 250 bash scripts/process_churn_footprint.sh "$D/sim" "$N" "$GS" 2>&1 \
  | grep -E "^processes .*000:|peak RSS|saved" | cut -c1-200 >>"$C"
{ cat "$OUT/gpu.txt"; cat "$C"; } | tail -40
