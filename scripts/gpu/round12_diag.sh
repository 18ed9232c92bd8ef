#!/usr/bin/env bash
# Issue 16, round 12 on the H200: where the tracer's CPU per event goes
# (the bench's new split: the poller's and writer's kernel time, the
# writer's CPU inside its commits) for two builds interleaved
# (scripts/tracer_ab.py), and the machine facts that could make the writer
# ~3x slower per event than on the development VM (transparent huge pages,
# clock source, CPU flags).
# Usage (device, repo root): OUT=$OUT bash scripts/gpu/round12_diag.sh BIN_A BIN_B [REPS]
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
A=$(readlink -f "$1"); B=$(readlink -f "$2"); REPS=${3:-3}
chmod +x "$A" "$B"
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
S=$OUT/summary.txt
{
  date -u; uname -r; nproc; grep -m1 "model name" /proc/cpuinfo
  echo "thp: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>&1) defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag 2>&1)"
  echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>&1)"
  echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(hypervisor|pdpe1gb|invpcid|pcid|la57|avx512f|constant_tsc|nonstop_tsc)$' | tr '\n' ' ')"
  echo "/tmp on $(df -T /tmp | tail -1 | awk '{print $2}'); loadavg $(cat /proc/loadavg)"
} >"$S" 2>&1
echo "== tracer_ab $A $B reps $REPS" >>"$S"
timeout 560 python3 scripts/tracer_ab.py "$A" "$B" --reps "$REPS" --launches 200000 >"$OUT/ab.log" 2>&1
echo "rc=$?" >>"$S"
tail -3 "$OUT/ab.log" >>"$S"
cat "$S"
