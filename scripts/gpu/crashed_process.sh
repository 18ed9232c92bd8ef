#!/usr/bin/env bash
# Reproduces GPU.md's crashed-process case on a real GPU and checks that
# gpusleuth names the forked worker as the holder of the dead pid's memory,
# then frees it with `reclaim --orphans --yes` (nvidia-smi back to baseline).
# Results go to "$OUT/crashed_process[_VARIANT]" (or ./out/...); prints PASS/FAIL lines.
# Usage: crashed_process.sh [group|setsid|daemon]   (issue 14: the worker stays in
# the parent's group, calls setsid(), or is a double-fork daemon).
# A stand-in monitoring agent holding /dev/nvidiactl and /dev/nvidia0 (opened,
# not mapped) runs throughout and must survive.
# Env: PY (python with torch), GPUSLEUTH (binary), TOLERANCE_MIB (default 64).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${PY:-/opt/torch/.venv/bin/python3}
GS=${GPUSLEUTH:-$ROOT/target/release/gpusleuth}
[ -x "$GS" ] || GS=$(command -v gpusleuth || echo "$GS")
TOL=${TOLERANCE_MIB:-64}
VARIANT=${1:-group}
case "$VARIANT" in group) SUFFIX="" ;; setsid|daemon) SUFFIX="_$VARIANT" ;; *) echo "unknown variant $VARIANT"; exit 2 ;; esac
DIR=${OUT:-$ROOT/out}/crashed_process$SUFFIX
mkdir -p "$DIR"
FAILS=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | tr -d ' '; }
pyfield() { "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$DIR/pids.json" "$1"; }

WORKER=""
AGENT=""
cleanup() {
  # Leave nothing behind if a step failed: end the worker only if it is still our workload.
  for p in $WORKER $AGENT; do
    if grep -q crashed_process "/proc/$p/cmdline" 2>/dev/null; then
      kill -9 "$p" 2>/dev/null || true
    fi
  done
}
trap cleanup EXIT

[ -x "$GS" ] || { echo "FAIL: gpusleuth binary not found (set GPUSLEUTH)"; exit 1; }
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command: $0 $VARIANT"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$GS" --version
} > "$DIR/machine.txt" 2>&1
cat "$DIR/machine.txt"

BASE=$(used_mib)
echo "baseline used: ${BASE} MiB"
nvidia-smi > "$DIR/nvidia-smi-before.txt" 2>&1
"$PY" "$HERE/crashed_process.py" agent /dev/nvidiactl /dev/nvidia0 > "$DIR/agent.log" 2>&1 &
AGENT=$!
rm -f "$DIR/pids.json"
PYTHONUNBUFFERED=1 "$PY" "$HERE/crashed_process.py" workload "$DIR/pids.json" "$VARIANT" > "$DIR/workload.log" 2>&1 &
LAUNCHED=$!
for _ in $(seq 1 240); do [ -s "$DIR/pids.json" ] && break; sleep 0.5; done
[ -s "$DIR/pids.json" ] || { fail "workload did not start (see workload.log)"; cat "$DIR/workload.log"; exit 1; }
PARENT=$(pyfield parent); WORKER=$(pyfield worker)
echo "torch $(pyfield torch); parent $PARENT (launched $LAUNCHED), worker $WORKER"
sleep 2
echo "with the workload: $(used_mib) MiB used"
echo "worker $WORKER: $(cut -d' ' -f4-6 /proc/$WORKER/stat) (ppid pgid sid)" | tee "$DIR/worker.txt"
grep -c /dev/nvidia "/proc/$WORKER/maps" | sed 's/^/device mappings: /' | tee -a "$DIR/worker.txt"
grep /dev/nvidia "/proc/$WORKER/maps" | awk '{print $6}' | sort | uniq -c >> "$DIR/worker.txt"
ls -l "/proc/$WORKER/fd" 2>/dev/null | grep /dev/nvidia | awk '{print $NF}' | sort | uniq -c | sed 's/^/fd /' >> "$DIR/worker.txt"
ls -l "/proc/$AGENT/fd" 2>/dev/null | grep /dev/nvidia | awk '{print $NF}' | sed 's/^/agent fd /' >> "$DIR/worker.txt"

# The crash: SIGKILL the CUDA parent and reap it.
kill -9 "$PARENT"; wait "$LAUNCHED" 2>/dev/null
sleep 3
nvidia-smi > "$DIR/nvidia-smi-after-crash.txt" 2>&1
AFTER_CRASH=$(used_mib)
echo "after the crash: ${AFTER_CRASH} MiB used"
if grep -qw "$PARENT" "$DIR/nvidia-smi-after-crash.txt"; then
  pass "nvidia-smi still lists dead pid $PARENT (the GPU.md case reproduced)"
else
  echo "note: nvidia-smi does not list dead pid $PARENT (driver behaviour differs from GPU.md)"
fi
kill -0 "$PARENT" 2>/dev/null && fail "parent $PARENT still exists" || pass "parent $PARENT is gone (kill says no such process)"

"$GS" vram > "$DIR/vram.txt" 2>&1; echo "vram exit $?" >> "$DIR/vram.txt"
"$GS" vram --json > "$DIR/vram.json" 2> "$DIR/vram.err" && pass "vram --json ran" || fail "vram --json failed: $(cat "$DIR/vram.err")"
cat "$DIR/vram.txt"
"$PY" "$HERE/crashed_process.py" check-vram "$DIR/vram.json" "$PARENT" "$WORKER" "$VARIANT" || FAILS=$((FAILS + 1))

"$GS" reclaim --orphans --json > "$DIR/plan.json" 2> "$DIR/plan.err"
"$GS" reclaim --orphans > "$DIR/plan.txt" 2>&1; cat "$DIR/plan.txt"
"$PY" "$HERE/crashed_process.py" check-plan "$DIR/plan.json" "$WORKER" || FAILS=$((FAILS + 1))
kill -0 "$WORKER" 2>/dev/null && pass "dry run left worker $WORKER alive" || fail "dry run ended worker $WORKER"

"$GS" reclaim --orphans --yes --json > "$DIR/reclaim.json" 2> "$DIR/reclaim.err"
RC=$?
echo "reclaim --orphans --yes exit $RC"; cat "$DIR/reclaim.json"
[ "$RC" -eq 0 ] && pass "reclaim exit code 0" || fail "reclaim exit code $RC"
"$PY" "$HERE/crashed_process.py" check-reclaim "$DIR/reclaim.json" "$WORKER" || FAILS=$((FAILS + 1))

FINAL=$AFTER_CRASH
for _ in $(seq 1 60); do FINAL=$(used_mib); [ "$FINAL" -le $((BASE + TOL)) ] && break; sleep 0.5; done
echo "final used: ${FINAL} MiB (baseline ${BASE} MiB, tolerance ${TOL} MiB)"
[ "$FINAL" -le $((BASE + TOL)) ] && pass "nvidia-smi used memory back to baseline" || fail "used memory ${FINAL} MiB > baseline ${BASE} + ${TOL} MiB"
nvidia-smi > "$DIR/nvidia-smi-final.txt" 2>&1
kill -0 "$AGENT" 2>/dev/null && pass "agent $AGENT (nvidiactl + nvidia0 opened) was not touched" || fail "agent $AGENT was ended"

{
  cat "$DIR/machine.txt"
  echo "variant=$VARIANT baseline=${BASE}MiB after_crash=${AFTER_CRASH}MiB final=${FINAL}MiB parent=$PARENT worker=$WORKER failures=$FAILS"
} > "$DIR/summary.txt"
echo "summary: $(tail -1 "$DIR/summary.txt")"
[ "$FAILS" -eq 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL ($FAILS)"
exit $([ "$FAILS" -eq 0 ] && echo 0 || echo 1)
