#!/usr/bin/env bash
# Issue 16, round 55: where NVML's ~16 MiB comes from, and what else a
# 16-core GPU host's tracer holds that the 2-vCPU VM's does not (round 54:
# the node agent's churn peaked 52.4-54.5 MB there with NVML made
# unavailable, 46.7-47.3 MB on the VM). nvml_flags.py (NVML's init variants
# in fresh processes), then an idle system-wide tracer's /proc/PID/smaps
# and threads after 200 short-lived simulated processes, NVML made
# unavailable and with the host's NVML (compare with the VM's, made by
# scripts/idle_tracer_smaps.sh).
# Usage (device, repo root): OUT=$OUT bash scripts/gpu/round55_nvml.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
host_facts
{ echo "kernel $(uname -r)"; ls -l /sys/kernel/btf/vmlinux; echo "tools: $(command -v strace ltrace gdb perf | tr '\n' ' ')"; } >>"$OUT/gpu.txt" 2>&1
"$PY" scripts/gpu/nvml_flags.py >"$OUT/nvml_flags.txt" 2>&1
D=/tmp/r55-demo
rm -rf "$D"
"$GS" demo --keep "$D" >"$OUT/demo.log" 2>&1 || { echo "demo failed"; exit 1; }
mkdir -p /tmp/no-nvml && echo "not a library" >/tmp/no-nvml/libnvidia-ml.so.1
LIB_PREFIX=/tmp/no-nvml: SMAPS="$OUT/smaps-nonvml.txt" bash scripts/idle_tracer_smaps.sh "$D/sim" "$GS" >"$OUT/idle.txt" 2>&1
SMAPS="$OUT/smaps-nvml.txt" bash scripts/idle_tracer_smaps.sh "$D/sim" "$GS" >>"$OUT/idle.txt" 2>&1
cat "$OUT/gpu.txt" "$OUT/nvml_flags.txt" "$OUT/idle.txt"
