#!/bin/bash
# The tracer's peak RSS against live PyTorch allocator blocks (issue 16,
# round 33): for each build, N live blocks (`torch_malloc` never freed) in a
# `--torch-allocator` trace, one file and `--rotate 1s` (the run's carried
# replays and the moments they view hold every live block), REPS times,
# builds interleaved. Needs root, eBPF and the simulated libraries
# (`gpusleuth demo --keep DIR`).
# MODES (default "single rot") picks the modes; TRACE_ARGS adds options to
# every trace (round 39: TRACE_ARGS="--ring-size 4M").
# Usage: sudo [NS="40000 90000 250000"] [MODES=rot] [TRACE_ARGS=...] bash scripts/torch_blocks_footprint.sh SIM_DIR REPS BIN [BIN ...]
set -u
sim=$1 reps=$2; shift 2
export PATH=$sim/bin:$PATH LD_LIBRARY_PATH=$sim/lib
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for n in ${NS:-40000 90000 250000}; do
  for mode in ${MODES:-single rot}; do
    for ((r = 1; r <= reps; r++)); do
      for bin in "$@"; do
        rm -rf "$work/out"
        args=()
        [ "$mode" = rot ] && args=(--rotate 1s)
        # shellcheck disable=SC2206 # options split on spaces on purpose
        args+=(${TRACE_ARGS:-})
        env GPUSLEUTH_PEAK_RSS_FILE="$work/peak" "$bin" trace --db "$work/out" "${args[@]}" \
          --torch-allocator --cuda-lib "$sim/lib/libcudart.so.13" --cuda-lib "$sim/lib/libcuda.so.1" \
          --cuda-lib "$sim/lib/libc10_cuda.so" --precheck off \
          -- workload "torch_malloc 4096 keep; repeat $n { torch_malloc 4096 }; sleep 1500" \
          > /dev/null 2>&1
        printf '%s | %s | %s | rep %d | %s kB\n' "$n" "$mode" "$bin" "$r" "$(cat "$work/peak")"
      done
    done
  done
done
