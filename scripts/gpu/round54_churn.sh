#!/usr/bin/env bash
# Issue 16, round 54: the node agent's peak under ~300 new PyTorch processes
# a second on the GPU host, NVML's ~16 MiB included (the VM measured 46.7-47.3
# MB with --torch-allocator after round 54's fixes): process_churn_footprint.sh
# (6,000 simulated PyTorch processes one after another, `--rotate 2s --keep 3
# --torch-allocator`), with the host's NVML and with NVML made unavailable,
# interleaved, two runs each.
# Usage (device, repo root): OUT=$OUT bash scripts/gpu/round54_churn.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
host_facts
D=/tmp/r54-demo
rm -rf "$D"
"$GS" demo --keep "$D" >"$OUT/demo.log" 2>&1 || { echo "demo failed"; exit 1; }
mkdir -p /tmp/no-nvml && echo "not a library" >/tmp/no-nvml/libnvidia-ml.so.1
WL="malloc 1000000 a; torch_malloc 3000000 t; launch 10; churn 10"
for r in 1 2; do
  for v in nvml nonvml; do
    pre=""
    [ "$v" = nonvml ] && pre=/tmp/no-nvml:
    s=$(date +%s.%N)
    o=$(LIB_PREFIX="$pre" WL="$WL" ROT=2s KEEP=3 TRACE_ARGS="--torch-allocator" \
      timeout 200 bash scripts/process_churn_footprint.sh "$D/sim" 6000 "$GS" 2>&1)
    e=$(date +%s.%N)
    echo "$r $v: $(echo "$o" | grep -o 'included: [0-9]* kB'), $(python3 -c "print(round($e-$s,1))") s, $(echo "$o" | grep -o 'dropped: [^;]*' | head -1)"
  done
done >"$OUT/churn.txt"
cat "$OUT/gpu.txt" "$OUT/churn.txt"
