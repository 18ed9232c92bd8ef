#!/bin/bash
# The system-wide tracer's RSS while many short-lived CUDA processes come
# and go (issue 16, round 45: a node agent's run): `gpusleuth trace --rotate`
# of every process that uses the simulated libraries, while N workloads
# run one after another, each allocating without freeing and exiting; the
# tracer's VmRSS, VmHWM and RssAnon every 500 processes, its peak RSS once
# it ended (the last file's completion included), then the run's files
# (processes named, run-ledger rows, size). Needs root, eBPF and the
# simulated libraries (`gpusleuth demo --keep DIR`: SIM_DIR is DIR/sim).
# WL replaces each workload's script; ROT the rotation period; TRACE_ARGS
# adds options (e.g. "--metrics 127.0.0.1:9464 --torch-allocator"); ROT=none
# traces into one file (no rotation); KEEP the files kept (default 3); HOLD a
# workload script run beside the churn, from its start to its end (a
# long-lived process, e.g. "malloc 67108864; repeat 400 { launch ; sleep 100 }");
# WORK a directory to keep the trace in (emptied first; else a temporary one).
# Usage: sudo [WL=...] [ROT=1s] [KEEP=3] [HOLD=...] [WORK=DIR] [TRACE_ARGS=...] \
#   bash scripts/process_churn_footprint.sh SIM_DIR N BIN
set -u
sim=$1 n=$2 bin=$3
# LIB_PREFIX: directories searched first (e.g. one whose libnvidia-ml.so.1
# is no library: NVML made unavailable to the tracer).
export PATH=$sim/bin:$PATH LD_LIBRARY_PATH=${LIB_PREFIX:-}$sim/lib
if [ -n "${WORK:-}" ]; then
  work=$WORK
  rm -rf "$work" && mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
rot=(--db "$work/run" --rotate "${ROT:-1s}" --keep "${KEEP:-3}")
[ "${ROT:-}" = none ] && rot=(--db "$work/one.db")
# shellcheck disable=SC2086 # TRACE_ARGS split on spaces on purpose
GPUSLEUTH_PEAK_RSS_FILE="$work/peak" "$bin" trace "${rot[@]}" --quiet --precheck off ${TRACE_ARGS:-} \
  --cuda-lib "$sim/lib/libcudart.so.13" --cuda-lib "$sim/lib/libcuda.so.1" \
  --cuda-lib "$sim/lib/libc10_cuda.so" --ready-file "$work/ready" >"$work/log" 2>&1 &
tracer=$!
while [ ! -e "$work/ready" ]; do sleep 0.1; done
# The default workload: one allocation left behind, then 20 launches, 20
# copies and 20 syncs (what round 45 measured: its script wrote the default
# inside ${WL:-...}, whose first `}` ended it, so it ran this, not the
# "repeat 20 { launch }; memcpy 4096; sync_device" it seemed to say).
default_wl="malloc 4096; repeat 20 { launch ; memcpy 4096; sync_device }"
wl=${WL:-$default_wl}
status() { awk -v k="$1" '$1 == k ":" {print $2}' "/proc/$tracer/status"; }
[ -n "${HOLD:-}" ] && { workload "$HOLD" >/dev/null 2>&1 & holder=$!; }
for ((i = 1; i <= n; i++)); do
  workload "$wl" >/dev/null 2>&1
  if ((i % 500 == 0)); then
    echo "processes $i: rss $(status VmRSS) kB, peak $(status VmHWM) kB, anon $(status RssAnon) kB"
  fi
done
[ -n "${HOLD:-}" ] && wait "$holder"
kill -INT "$tracer"; wait "$tracer"
echo "the tracer's peak RSS, its file's completion included: $(cat "$work/peak") kB"
for f in "$work"/run/part-*.db "$work"/one.db; do
  [ -e "$f" ] || continue
  echo "$(basename "$f"): $(sqlite3 "$f" 'SELECT count(*) FROM processes') processes named," \
    "$(sqlite3 "$f" 'SELECT count(*) FROM run_ledger') in the run's ledger, $(stat -c %s "$f") bytes," \
    "$(sqlite3 "$f" "SELECT group_concat(key || '=' || value, ' ') FROM meta WHERE key IN ('run_ledger_from', 'run_ledger_retired')")"
done
grep -h "trace saved\|events dropped" "$work/log" | cut -c1-260
