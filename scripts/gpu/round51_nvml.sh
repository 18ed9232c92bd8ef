#!/usr/bin/env bash
# Issue 16, round 51: what in NVML costs the GPU host's tracer ~14 MiB
# (round 50: 500,000 live PyTorch blocks rotated peak 68.4-71.1 MiB with the
# host's NVML, 54.5-56.0 with NVML made unavailable). First NVML alone in a
# Python process, RSS and anonymous mappings after each call the sampler
# makes (nvml_rss.py); then the same rotated run as round 50 under glibc
# malloc settings (`arena_max=1`, a fixed mmap threshold) with
# NVML, and without NVML, interleaved, to see whether the cost is NVML's own
# memory or the allocator's answer to the sampler's extra thread.
# Usage (device, repo root): OUT=$OUT bash scripts/gpu/round51_nvml.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
host_facts
"$PY" scripts/gpu/nvml_rss.py >"$OUT/nvml_rss.txt" 2>&1
D=/tmp/r51-demo
rm -rf "$D"
"$GS" demo --keep "$D" >"$OUT/demo.log" 2>&1 || { echo "demo failed"; exit 1; }
mkdir -p /tmp/no-nvml && echo "not a library" >/tmp/no-nvml/libnvidia-ml.so.1
export PATH=$D/sim/bin:$PATH
ARGS="--rotate 1s --torch-allocator --cuda-lib $D/sim/lib/libcudart.so.13 --cuda-lib $D/sim/lib/libcuda.so.1 --cuda-lib $D/sim/lib/libc10_cuda.so --precheck off"
W="torch_malloc 4096 keep; repeat 500000 { torch_malloc 4096 }; sleep 1500"
run() { # NAME LD_LIBRARY_PATH GLIBC_TUNABLES
  LD_LIBRARY_PATH=$2 GLIBC_TUNABLES=$3 GS_TRACE_ARGS="$ARGS" timeout 120 \
    python3 scripts/gpu/tracer_smaps.py "$GS" -- workload "$W" >"/tmp/r51-$1.txt" 2>&1
  echo "== $1 (${3:-default malloc})"; head -1 "/tmp/r51-$1.txt"
  grep -E "^ +[0-9.]+ MiB +(\[anon\]|\[heap\])|^  anon" "/tmp/r51-$1.txt" | head -6
}
for r in 1 2; do
  run nvml$r "$D/sim/lib" ""
  run nonvml$r "/tmp/no-nvml:$D/sim/lib" ""
  run nvml-arena1-$r "$D/sim/lib" "glibc.malloc.arena_max=1"
  run nvml-mmap-$r "$D/sim/lib" "glibc.malloc.mmap_threshold=1048576"
done >"$OUT/smaps.txt"
cat "$OUT/gpu.txt" "$OUT/nvml_rss.txt"
grep -E "^==|^tracer peak" "$OUT/smaps.txt"
