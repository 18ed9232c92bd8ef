#!/usr/bin/env bash
# Issue 14 on the H200: the three reclaim variants (the worker stays in the
# dead parent's group, calls setsid(), or is a double-fork daemon), each with
# nvidia-smi before and after and a monitoring-agent stand-in that must
# survive. Leaves in $OUT (at most 5 files): summary.txt, log_<variant>.txt,
# reclaim_variants.tar.gz (every file of every run).
# Env: GPUSLEUTH (the release binary), PY.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
FINAL_OUT=${OUT:-$PWD/out}
mkdir -p "$FINAL_OUT"
WORK=$(mktemp -d)
export OUT=$WORK
RESULT=0
for v in group setsid daemon; do
  echo "=== variant $v"
  timeout 150 bash "$HERE/crashed_process.sh" "$v" > "$FINAL_OUT/log_$v.txt" 2>&1
  rc=$?
  grep -E "^(PASS|FAIL|RESULT|summary)" "$FINAL_OUT/log_$v.txt"
  [ $rc -eq 0 ] || RESULT=1
done
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  command: scripts/gpu/reclaim_variants.sh"
  for v in group setsid daemon; do
    d="$WORK/crashed_process"; [ "$v" = group ] || d="${d}_$v"
    tail -1 "$d/summary.txt" 2>/dev/null || echo "variant=$v: no summary"
    sed 's/^/  /' "$d/worker.txt" 2>/dev/null
  done
} > "$FINAL_OUT/summary.txt"
cp "$FINAL_OUT"/log_*.txt "$WORK"/ 2>/dev/null
tar -czf "$FINAL_OUT/reclaim_variants.tar.gz" -C "$WORK" . 2>/dev/null
cat "$FINAL_OUT/summary.txt"
exit $RESULT
