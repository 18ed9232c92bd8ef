#!/bin/bash
# The tracer's peak RSS against live and failed allocations (issue 16, round 21):
# for each build, a single-file and a `--rotate 1s` trace of the simulated
# workload allocating N buffers of 1 KiB (the simulated driver keeps at most
# 65,536 live; later allocations fail), N = 65,536, 200,000 and 1,000,000.
# Needs root, eBPF and the simulated libraries (`gpusleuth demo --keep DIR`).
# Usage: sudo bash scripts/live_allocations_footprint.sh SIM_DIR BIN [BIN ...]
set -u
sim=$1; shift
export PATH=$sim/bin:$PATH LD_LIBRARY_PATH=$sim/lib
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for n in 65536 200000 1000000; do
  for mode in single rot; do
    for bin in "$@"; do
      rm -rf "$work/out"
      args=()
      [ "$mode" = rot ] && args=(--rotate 1s)
      start=$(date +%s.%N)
      env GPUSLEUTH_PEAK_RSS_FILE="$work/peak" "$bin" trace --db "$work/out" "${args[@]}" \
        --precheck off --launches full -- workload "repeat $n { malloc 1024 a }; sleep 2000" \
        > /dev/null 2>&1
      end=$(date +%s.%N)
      printf '%s | %s | %s | %s kB | %.1f s\n' "$n" "$mode" "$bin" "$(cat "$work/peak")" \
        "$(echo "$end - $start" | bc)"
    done
  done
done
