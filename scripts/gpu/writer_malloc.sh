#!/usr/bin/env bash
# Is the trace writer's CPU per event on this machine (1.2-1.7 us on the H200,
# 0.4 us on the 2-vCPU VM) page faults from glibc giving memory back and
# taking it again? The footprint flood with glibc's defaults, then with
# trimming and mmap'd chunks kept (GLIBC_TUNABLES), writer and poller CPU
# per event compared. Usage (device): OUT=$OUT bash scripts/gpu/writer_malloc.sh GS
set -u
GS=${1:-target/release/gpusleuth}
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
for variant in default keep default keep; do
  if [ $variant = keep ]; then
    export GLIBC_TUNABLES=glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=33554432:glibc.malloc.top_pad=16777216
  else
    unset GLIBC_TUNABLES
  fi
  echo "== $variant ${GLIBC_TUNABLES:-}" | tee -a "$OUT/malloc.txt"
  timeout 150 "$GS" bench --footprint-only --footprint-launches "${N:-200000}" --reps 1 2>&1 | grep -E "^ +[0-9]+ +o|per added" | tee -a "$OUT/malloc.txt"
done
