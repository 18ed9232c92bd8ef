#!/usr/bin/env bash
# Issue 16, round 32: a run's allocator views carried by the tracer
# (`run_allocator`) on real PyTorch. The allocator acceptance
# (scripts/gpu/allocator_check.py --rotate 2s: the seed's generate/del/
# empty_cache rounds as a run of files, the ledger and the views at every
# checkpoint against torch's own counters), then, per allocator mode: which
# files carried which process, the notes of processes carried no further,
# each file's completion CPU, and `memory --json` (at the end and at two
# moments) and `explain --json` of the run with its carried views and begin
# states against the same run replayed (a copy whose files'
# `meta.run_allocator` and `meta.run_allocator_begin` are deleted):
# byte-identical or not, and both timed twice.
# Usage (device, repo root, the build carried as target/release/gpusleuth):
#   OUT=$OUT bash scripts/gpu/round32_carried_views.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
timeout 500 "$PY" scripts/gpu/allocator_check.py --gs "$GS" --py "$PY" --out "$OUT/alloc" --rotate 2s >"$OUT/allocator_run.log" 2>&1
echo "allocator_check --rotate 2s rc=$?"
grep -E "RESULT|run of|memory --db|explain rc|run's end" "$OUT/allocator_run.log"
for mode in default expandable; do
  d="/tmp/alloc_${mode}_run"
  r="/tmp/replayed_${mode}/alloc_${mode}_run"
  rm -rf "$(dirname "$r")" && mkdir -p "$(dirname "$r")" && cp -r "$d" "$r"
  "$PY" - "$d" "$r" <<'EOF'
import os, sqlite3, sys
run, replayed = sys.argv[1], sys.argv[2]
files = sorted(f for f in os.listdir(run) if f.endswith(".db"))
print(f"{run}: {len(files)} files")
for f in files:
    c = sqlite3.connect(os.path.join(run, f))
    meta = dict(c.execute("SELECT key, value FROM meta WHERE key LIKE 'run_%'"))
    try:
        pids = [r[0] for r in c.execute("SELECT DISTINCT pid FROM run_allocator WHERE at_ns IS NULL")]
    except sqlite3.Error as e:
        pids = f"({e})"
    alloc = c.execute("SELECT count(*) FROM allocator_rows").fetchone()[0]
    cpu = c.execute("SELECT value FROM stats WHERE name = 'tracer_cpu_ns_completion'").fetchone()
    notes = [r[0] for r in c.execute("SELECT text FROM notes WHERE text LIKE 'run allocator views%'")]
    print(f"  {f}: run_allocator={meta.get('run_allocator')} carried pids {pids}, {alloc} allocator events, "
          f"completion {cpu[0] / 1e6 if cpu else -1:.0f} ms" + (f", notes {notes}" if notes else ""))
for f in files:
    c = sqlite3.connect(os.path.join(replayed, f))
    c.execute("DELETE FROM meta WHERE key IN ('run_allocator', 'run_allocator_begin')")
    c.commit()
EOF
  n=$(ls "$d" | grep -c '\.db$')
  # Two moments in the run's last third, where the allocator events are.
  for c in memory explain "memory --at $((n * 2 * 70 / 100))s" "memory --at $((n * 2 * 85 / 100))s"; do
    for i in 1 2; do
      for way in carried replayed; do
        case $way in carried) dir=$(dirname "$d") ;; replayed) dir=$(dirname "$r") ;; esac
        (cd "$dir" && /usr/bin/time -f "  $c --json --db DIR ($way): %e s, %M KB" "$GS" $c --json --db "alloc_${mode}_run" >"$OUT/$way.json" 2>"$OUT/time.txt")
        tail -1 "$OUT/time.txt"
      done
      cmp -s "$OUT/carried.json" "$OUT/replayed.json" && echo "  $c: same answer" || { echo "  $c: ANSWERS DIFFER"; diff <(tr ',' '\n' <"$OUT/carried.json") <(tr ',' '\n' <"$OUT/replayed.json") | head -20; }
    done
  done
done
rm -f "$OUT/carried.json" "$OUT/replayed.json" "$OUT/time.txt"
