#!/usr/bin/env bash
# Issue 16, round 39: does a smaller kernel ring buffer drop events when
# many processes flood it at once? Each run traces PROCS copies of the
# simulated workload, each making LAUNCHES launches (`--launches full`: a
# runtime and a driver call each), all at once and unpinned, with
# `--ring-size` 8M (the default), 4M, 2M and 1M, and prints the calls
# stored and the drops the trace counted. Needs root and eBPF; builds the
# simulated libraries with `gpusleuth demo --keep`.
# Usage (repo root; on a device machine too):
#   OUT=$OUT [PROCS="8 16"] [LAUNCHES=50000] bash scripts/ring_drops.sh [BIN]
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
G=${1:-target/release/gpusleuth}; chmod +x "$G"
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
D=$(mktemp -d); trap 'rm -rf "$D"' EXIT
"$G" demo --keep "$D" > "$OUT/demo.log" 2>&1 || { echo "demo failed"; tail -3 "$OUT/demo.log"; exit 1; }
S=$D/sim; N=${LAUNCHES:-50000}
{
  date -u; echo "nproc $(nproc)"
  for p in ${PROCS:-8 16}; do
    body="for i in \$(seq $p); do $S/bin/workload 'launch $N' & done; wait"
    for rep in 1 2; do
      for rs in 8M 4M 2M 1M; do
        "$G" trace --quiet --force --db "$D/f.db" --ring-size "$rs" \
          --cuda-lib "$S/lib/libcudart.so.13" --cuda-lib "$S/lib/libcuda.so.1" \
          --launches full --precheck off -- bash -c "$body" > "$D/t.log" 2>&1
        saved=$(grep -o 'trace saved.*' "$D/t.log" | grep -o '[0-9][0-9]* calls\|dropped: [0-9]* (ring buffer full)' | tr '\n' ' ')
        echo "procs $p launches $N rep $rep ring $rs: ${saved:-$(tail -1 "$D/t.log")}"
      done
    done
  done
} | tee "$OUT/ring.txt"
