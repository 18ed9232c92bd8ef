#!/usr/bin/env bash
# Issue 19 + the GPU-activity part of issue 12 on a real GPU: attach with
# `trace --pid` to a running PyTorch loop that already holds HOLD_MIB, then
# compare gpusleuth's NVML baseline with nvidia-smi and the workload's own
# torch.cuda.memory_reserved(), and its stored GPU busy samples with the busy
# share the workload measured itself with CUDA events.
# Works in a scratch folder; the 8 files worth keeping (result.json, memory.txt/json,
# stats.json, explain.txt, workload.jsonl, attach.db, run.log) are copied to "$OUT"
# (or ./out/attach). Prints PASS/FAIL lines and a summary.
# Env: PY, GPUSLEUTH (binary), DURATION (trace seconds, default 10).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-/opt/torch/.venv/bin/python3}
GS=${GPUSLEUTH:-$HERE/../../target/release/gpusleuth}
DUR=${DURATION:-10}
KEEP=${OUT:-$HERE/../../out/attach}
mkdir -p "$KEEP"
DIR=$(mktemp -d /tmp/gs-attach.XXXXXX)
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true

PYTHONUNBUFFERED=1 "$PY" "$HERE/hold_loop.py" "$DIR/workload.jsonl" "$DIR/ready" "$DIR/stop" \
  > "$DIR/workload.out" 2>&1 &
WL=$!
trap 'touch "$DIR/stop"; sleep 1; kill $WL 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do [ -f "$DIR/ready" ] && break; sleep 0.5; done
[ -f "$DIR/ready" ] || { echo "FAIL: workload not ready"; cat "$DIR/workload.out"; exit 1; }
sleep 1
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$DIR/smi_before.csv"
date +%s.%N > "$DIR/trace_t0"
"$GS" trace --quiet --pid "$WL" --duration "${DUR}s" --db "$DIR/attach.db" > "$DIR/trace.out" 2>&1
echo "trace exit $?" >> "$DIR/trace.out"
date +%s.%N > "$DIR/trace_t1"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$DIR/smi_after.csv"
touch "$DIR/stop"
wait $WL
trap - EXIT
"$GS" memory --db "$DIR/attach.db" > "$DIR/memory.txt" 2>&1
"$GS" memory --json --db "$DIR/attach.db" > "$DIR/memory.json" 2>&1
"$GS" stats --json --db "$DIR/attach.db" > "$DIR/stats.json" 2>&1
"$GS" explain --db "$DIR/attach.db" > "$DIR/explain.txt" 2>&1
"$PY" "$HERE/attach_check.py" "$DIR" "$WL" > "$DIR/check.out" 2>&1
RC=$?
{ echo "== nvidia-smi before/after (pid, MiB)"; cat "$DIR/smi_before.csv" "$DIR/smi_after.csv"
  echo "== trace"; cat "$DIR/trace.out"; echo "== workload"; cat "$DIR/workload.out"
  echo "== checks"; cat "$DIR/check.out"; } > "$DIR/run.log"
for f in result.json memory.txt memory.json stats.json explain.txt workload.jsonl attach.db run.log; do
  cp "$DIR/$f" "$KEEP/" 2>/dev/null || true
done
cat "$DIR/check.out"
exit $RC
