#!/usr/bin/env bash
# Issue 16, round 49, on the device host: the ring buffer's pages mapped
# once (sleuth-probe ring.rs). The tracer's peak RSS with 500,000 live
# PyTorch blocks (the simulated c10 allocator) in a `--rotate 1s` run, the
# build before (ring mapped twice) and this one interleaved, 2 reps each
# (the simulated libraries from `demo --keep`); then the acceptance
# (round11.sh: real PyTorch, the allocator ledger, the six verdicts, call
# sites, MCP) with this build, whose capture now reads the ring itself.
# Usage (device, repo root, both builds carried):
#   OUT=$OUT bash scripts/gpu/round49_ring.sh target/release/gpusleuth target/gs-before
# (target/gs-before: a release build of aaebded, before the ring change).
set -u
. scripts/gpu/device_env.sh "$1"
OLD=$(readlink -f "$2"); chmod +x "$OLD"
host_facts
D=/tmp/r49-demo
rm -rf "$D"
"$GS" demo --keep "$D" >"$OUT/demo.log" 2>&1 || { echo "demo failed"; tail -3 "$OUT/demo.log"; exit 1; }
t0=$(date +%s)
NS=500000 MODES=rot timeout 120 bash scripts/torch_blocks_footprint.sh "$D/sim" 2 "$OLD" "$GS" >"$OUT/footprint.txt" 2>&1
echo "footprint: $(( $(date +%s) - t0 )) s" >>"$OUT/gpu.txt"
t0=$(date +%s)
OUT=/tmp/r49b/acc timeout 240 bash scripts/gpu/round11.sh "$GS" >/dev/null 2>&1
cp /tmp/r49b/acc/summary.txt "$OUT/acceptance.txt" 2>/dev/null
echo "acceptance: $(( $(date +%s) - t0 )) s" >>"$OUT/gpu.txt"
cat "$OUT/gpu.txt" "$OUT/footprint.txt"
grep -E "RESULT|expected=|right_line|op_scopes" "$OUT/acceptance.txt"
