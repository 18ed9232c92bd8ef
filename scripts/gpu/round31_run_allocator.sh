#!/usr/bin/env bash
# Issue 16, round 31: the allocator acceptance (scripts/gpu/allocator_check.py:
# the seed's generate/del/empty_cache rounds, the ledger and the allocator
# views at every checkpoint against torch's own counters) on a run of files
# (`trace --rotate 2s --torch-allocator`): every answer is the run's, its
# allocator views rebuilt by passes over the files (none of their events
# held); then `memory` and `explain` of each run timed, with their peak RSS.
# Usage (device, repo root, the build carried as target/release/gpusleuth):
#   OUT=$OUT bash scripts/gpu/round31_run_allocator.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
timeout 500 "$PY" scripts/gpu/allocator_check.py --gs "$GS" --py "$PY" --out "$OUT/alloc" --rotate 2s >"$OUT/allocator_run.log" 2>&1
echo "allocator_check --rotate 2s rc=$?"
grep -E "RESULT|run of|memory --db|explain rc|run's end" "$OUT/allocator_run.log"
for mode in default expandable; do
  d="/tmp/alloc_${mode}_run"
  echo "$d: $(ls "$d" | grep -c '\.db$') files, $(du -sh "$d" | cut -f1)"
  for c in memory explain; do
    for i in 1 2; do
      /usr/bin/time -f "  $c --db DIR: %e s, %M KB" "$GS" $c --db "$d" >/dev/null 2>"$OUT/time.txt"
      tail -1 "$OUT/time.txt"
    done
  done
done
