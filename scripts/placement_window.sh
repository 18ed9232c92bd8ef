#!/usr/bin/env bash
# How much CPU the tracer's own threads take from a traced program that pins
# itself to CPU 0 as it starts, before the tracer's placement moves them off
# that CPU (issue 16, round 10). Alternates two builds tracing the same flood
# of simulated launches; with BUSY=1 a busy loop runs on each of CPUs 0 and 1
# (a loaded machine: the tracer's threads wait longer for their turn).
# Prints per run the workload's runnable time that the tracer's process (by
# its pid) held its CPU: culprit rows, total, and the latest, in ms after the
# first call. Needs root and eBPF (as `trace`), and the simulated CUDA world
# (`gpusleuth demo --keep DIR` or the tests' sim folder) under SIM.
#   BASE=old/gpusleuth NEW=target/release/gpusleuth SIM=/tmp/gsdemo/sim [N=5] [BUSY=1] scripts/placement_window.sh
set -u
S=${SIM:?the simulated CUDA world (lib/, bin/)}
hogs=()
if [ "${BUSY:-0}" = 1 ]; then
  for cpu in 0 1; do taskset -c $cpu sh -c 'while :; do :; done' & hogs+=($!); done
  trap 'kill ${hogs[*]} 2>/dev/null' EXIT
fi
db=$(mktemp -u /tmp/placement.XXXXXX.db)
for i in $(seq 1 "${N:-5}"); do
  for b in base new; do
    if [ $b = base ]; then bin=${BASE:?}; else bin=${NEW:?}; fi
    rm -f "$db"
    "$bin" trace -q --force --launches full --cuda-lib "$S/lib/libcudart.so.13" --cuda-lib "$S/lib/libcuda.so.1" \
      --db "$db" -- "$S/bin/workload" "pin 0; launch 100000" >/dev/null 2>&1
    echo "$b load=$(cut -d' ' -f1 /proc/loadavg) $(sqlite3 "$db" "SELECT count(*) || ' culprit rows, ' ||
      coalesce(sum(c.ns) / 1000, 0) || ' us, last at ' ||
      coalesce(max((w.wake_ns - (SELECT min(ts_ns) FROM calls)) / 1000000), 0) || ' ms'
      FROM waits w JOIN wait_culprits c ON c.wait_id = w.id
      WHERE c.pid = (SELECT value FROM stats WHERE name = 'tracer_pid')")"
  done
done
rm -f "$db"
