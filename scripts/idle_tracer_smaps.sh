#!/usr/bin/env bash
# A system-wide tracer's memory map after 200 short-lived simulated CUDA
# processes (issue 16, round 55: what a 16-core GPU host's tracer holds that
# the 2-vCPU VM's does not): its /proc/PID/smaps into $SMAPS, then its
# threads, VmRSS/VmHWM/RssAnon/RssFile and the resident sizes of its largest
# mappings by kind. Needs root, eBPF and the simulated libraries
# (`gpusleuth demo --keep DIR`: SIM_DIR is DIR/sim). LIB_PREFIX: directories
# searched first (one whose libnvidia-ml.so.1 is no library: NVML made
# unavailable).
# Usage: sudo SMAPS=FILE [LIB_PREFIX=...] bash scripts/idle_tracer_smaps.sh SIM_DIR BIN
set -u
sim=$1 bin=$2
export PATH=$sim/bin:$PATH LD_LIBRARY_PATH=${LIB_PREFIX:-}$sim/lib
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin" trace --db "$work/run" --rotate 2s --keep 3 --quiet --precheck off --torch-allocator \
  --cuda-lib "$sim/lib/libcudart.so.13" --cuda-lib "$sim/lib/libcuda.so.1" \
  --cuda-lib "$sim/lib/libc10_cuda.so" --ready-file "$work/ready" >"$work/log" 2>&1 &
tracer=$!
while [ ! -e "$work/ready" ]; do sleep 0.1; done
for ((i = 1; i <= 200; i++)); do
  workload "malloc 1000000 a; torch_malloc 3000000 t; launch 10; churn 10" >/dev/null 2>&1
done
sleep 3
cp "/proc/$tracer/smaps" "$SMAPS"
echo "== ${LIB_PREFIX:+NVML unavailable}${LIB_PREFIX:-NVML as found}: threads $(ls "/proc/$tracer/task" | wc -l)" \
  "($(cat /proc/"$tracer"/task/*/comm | sort | uniq -c | tr -s ' ' | tr '\n' ','))"
grep -E "^(VmRSS|VmHWM|RssAnon|RssFile):" "/proc/$tracer/status" | tr -s ' ' | tr '\n' ' '
echo
# The resident MiB of each mapping over 512 KiB: name (or [anon]), perms.
awk '/^[0-9a-f]+-[0-9a-f]+ / {name = (NF >= 6 ? $6 : "[anon]"); perm = $2}
     /^Rss:/ && $2 > 512 {printf "  %7.1f MiB %s %s\n", $2 / 1024, perm, name}' "$SMAPS" | sort -rn | head -15
kill -INT "$tracer"; wait "$tracer"
