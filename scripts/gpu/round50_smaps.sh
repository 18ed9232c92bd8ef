#!/usr/bin/env bash
# Issue 16, round 50, on the device host: where the tracer's resident
# memory goes with 500,000 live PyTorch blocks in a `--rotate 1s` run (the
# GPU host's peak sat ~12 MiB above the VM's: 72-74 against 60-62 MiB at
# the same build). Samples the tracer's /proc/PID/smaps (tracer_smaps.py),
# twice: as the footprint script runs it, and with the simulated libraries
# only (no other CUDA library on the path) as a control.
# Usage (device, repo root): OUT=$OUT bash scripts/gpu/round50_smaps.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
host_facts
D=/tmp/r50-demo
rm -rf "$D"
"$GS" demo --keep "$D" >"$OUT/demo.log" 2>&1 || { echo "demo failed"; tail -3 "$OUT/demo.log"; exit 1; }
export PATH=$D/sim/bin:$PATH LD_LIBRARY_PATH=$D/sim/lib
ARGS="--rotate 1s --torch-allocator --cuda-lib $D/sim/lib/libcudart.so.13 --cuda-lib $D/sim/lib/libcuda.so.1 --cuda-lib $D/sim/lib/libc10_cuda.so --precheck off"
for r in 1 2; do
  GS_TRACE_ARGS="$ARGS" timeout 120 python3 scripts/gpu/tracer_smaps.py "$GS" -- \
    workload "torch_malloc 4096 keep; repeat 500000 { torch_malloc 4096 }; sleep 1500" \
    >"$OUT/smaps$r.txt" 2>&1
done
# Which NVML the tracer maps, and what it costs it alone.
grep -h "nvidia\|nvml" "$OUT"/smaps*.txt | sort | uniq -c | head -5 >"$OUT/nvml.txt"
cat "$OUT/gpu.txt"; head -14 "$OUT/smaps1.txt"; head -3 "$OUT/smaps2.txt"
