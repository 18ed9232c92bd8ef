#!/usr/bin/env bash
# Where the trace writer's CPU goes on this machine (issue 16: tracer CPU
# per event): a flat perf profile of `bench --footprint-only`, split by
# thread, the writer's (gpusleuth-db) DSOs (kernel against user space) and
# top symbols (split into the steady phase and the completion by
# perf_phases.py), once with the trace on /tmp and once on /dev/shm (is the
# filesystem under the trace part of the cost?).
# The device has no perf: carry a kit made on the development machine by
# scripts/gpu/make_perf_kit.sh (perf with its own loader and libraries).
# Usage (device): OUT=$OUT PERF_KIT=target/perfkit bash scripts/gpu/writer_profile.sh GS
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
GS=$(readlink -f "${1:-target/release/gpusleuth}")
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
if [ -n "${PERF_KIT:-}" ] && [ -x "$PERF_KIT/perf" ]; then
  KIT=$(readlink -f "$PERF_KIT")
  chmod +x "$KIT"/* 2>/dev/null
  perf() { "$KIT/ld-linux-x86-64.so.2" --library-path "$KIT" "$KIT/perf" "$@"; }
elif ! command -v perf >/dev/null; then
  echo "no perf (set PERF_KIT)"; exit 0
fi
echo "perf: $(perf --version 2>&1); kernel $(uname -r); $(nproc) CPUs; /tmp on $(df -T /tmp | tail -1 | awk '{print $2}')"
grep -m1 "model name" /proc/cpuinfo
echo "kptr_restrict=$(cat /proc/sys/kernel/kptr_restrict) perf_event_paranoid=$(cat /proc/sys/kernel/perf_event_paranoid)"
chmod +x "$GS"
for where in /tmp /dev/shm; do
  tag=$(basename "$where")
  echo "== trace under $where"
  TMPDIR=$where perf record -F 4999 -o "/tmp/fp-$tag.data" "$GS" bench --footprint-only \
    --footprint-launches "${N:-200000}" --reps 1 > "$OUT/fp-$tag.txt" 2>&1
  tail -6 "$OUT/fp-$tag.txt"
  perf report -i "/tmp/fp-$tag.data" --sort comm --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -8
  echo "-- writer (gpusleuth-db) by DSO"
  perf report -i "/tmp/fp-$tag.data" --comm gpusleuth-db --sort dso --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -8
  echo "-- writer: steady phase (keeping up with the flood) and busy tail (the file's completion)"
  perf script -i "/tmp/fp-$tag.data" -F comm,tid,time,ip,sym,dso 2>/dev/null \
    | python3 "$HERE/perf_phases.py" 4999 gpusleuth-db 25 | tee "$OUT/phases-$tag.txt" | head -70
  echo "-- writer top symbols (both phases)"
  perf report -i "/tmp/fp-$tag.data" --comm gpusleuth-db --sort dso,sym --stdio 2>/dev/null \
    | grep -E "^ +[0-9]" | head -50 | tee "$OUT/writer_syms-$tag.txt" | head -30
done
