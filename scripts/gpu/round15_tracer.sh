#!/usr/bin/env bash
# Issue 16, round 15 on the H200: the tracer's CPU per added event
# (poller + writer), the build alone or against a variant, by
# scripts/tracer_ab.py, with the machine's CPU topology (on the VM the
# bench's tracer threads share one CPU, on the device they spread over 15).
# Before round 40 the device's LD_LIBRARY_PATH made the flood's workload load
# the real libcuda.so.1 and every launch failed (~2x the writer's cost per
# event); the stand-ins are now linked so that it cannot, and the bench
# refuses a flood whose launches failed or went missing.
# Usage (device, repo root):
#   OUT=$OUT bash scripts/gpu/round15_tracer.sh REPS LAUNCHES BUILD[@CPUS] [BUILD[@CPUS] ...]
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
REPS=$1; LAUNCHES=$2; shift 2
for b in "$@"; do chmod +x "${b%@*}"; done
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
S=$OUT/summary.txt
{
  date -u; uname -r; nproc; grep -m1 "model name" /proc/cpuinfo
  lscpu | grep -E "^(Thread|Core|Socket|NUMA node|L1d|L2|L3|CPU max MHz|CPU MHz|BogoMIPS)" 
  lscpu -e=CPU,NODE,SOCKET,CORE,CACHE 2>/dev/null | head -20
  echo "loadavg $(cat /proc/loadavg)"
} >"$S" 2>&1
echo "== tracer_ab reps $REPS launches $LAUNCHES: $*" >>"$S"
timeout 570 python3 scripts/tracer_ab.py "$@" --reps "$REPS" --launches "$LAUNCHES" >"$OUT/ab.log" 2>&1
echo "rc=$?" >>"$S"
sed -n '/^µs per added/,$p' "$OUT/ab.log" >>"$S"
cat "$S"
