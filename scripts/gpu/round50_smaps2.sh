#!/usr/bin/env bash
# Issue 16, round 50, second device call: the tracer's largest anonymous
# mappings at its peak (500,000 live PyTorch blocks, `--rotate 1s`), with
# the host's NVML and with NVML made unavailable (a file that is no shared
# library named libnvidia-ml.so.1 first on LD_LIBRARY_PATH: the tracer then
# notes GPU activity as not measured), one rep each, twice interleaved.
# Usage (device, repo root): OUT=$OUT bash scripts/gpu/round50_smaps2.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
host_facts
D=/tmp/r50-demo
rm -rf "$D"
"$GS" demo --keep "$D" >"$OUT/demo.log" 2>&1 || { echo "demo failed"; exit 1; }
mkdir -p /tmp/no-nvml && echo "not a library" >/tmp/no-nvml/libnvidia-ml.so.1
export PATH=$D/sim/bin:$PATH
ARGS="--rotate 1s --torch-allocator --cuda-lib $D/sim/lib/libcudart.so.13 --cuda-lib $D/sim/lib/libcuda.so.1 --cuda-lib $D/sim/lib/libc10_cuda.so --precheck off"
W="torch_malloc 4096 keep; repeat 500000 { torch_malloc 4096 }; sleep 1500"
for r in 1 2; do
  LD_LIBRARY_PATH=$D/sim/lib GS_TRACE_ARGS="$ARGS" timeout 120 python3 scripts/gpu/tracer_smaps.py "$GS" -- workload "$W" >"$OUT/nvml$r.txt" 2>&1
  LD_LIBRARY_PATH=/tmp/no-nvml:$D/sim/lib GS_TRACE_ARGS="$ARGS" timeout 120 python3 scripts/gpu/tracer_smaps.py "$GS" -- workload "$W" >"$OUT/nonvml$r.txt" 2>&1
done
for f in nvml1 nonvml1 nvml2 nonvml2; do echo "== $f"; head -1 "$OUT/$f.txt"; grep -E "\[anon\]|\[heap\]|nvidia|^  anon" "$OUT/$f.txt" | head -9; done
