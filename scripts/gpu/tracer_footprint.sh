#!/usr/bin/env bash
# Issue 16 (tracer out of the way, long runs) on the GPU host. Results under $OUT.
#  1. `bench --footprint-only`: a --launches full flood from a workload pinned
#     to CPU 0, placement on / off / on with 4x the launches: tracer CPU per
#     stored event (poller, writer), the workload's runnable time while a
#     tracer thread held its CPU, trace's peak RSS (should stay flat with 4x).
#     With 16 CPUs the placement row should say "pinned to CPU 1-15" and the
#     "by tracer ms" column should drop to ~0 with placement on.
#  2. `trace --rotate` on a real training loop: the run's stats must count the
#     same calls as one unrotated trace of the same loop (same op counts).
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
GS=${GPUSLEUTH:-target/release/gpusleuth}
PY=${PY:-/opt/torch/.venv/bin/python3}
N=${N:-200000}
$GS bench --footprint-only --footprint-launches "$N" > "$OUT/footprint.txt" 2>&1
$GS bench --footprint-only --footprint-launches "$N" --json > "$OUT/footprint.json" 2>>"$OUT/footprint.txt"
LOOP=${LOOP:-scripts/gpu/bench_train.py}
rm -rf /tmp/gs-run
$GS trace --rotate 5s --db /tmp/gs-run -q -- $PY "$LOOP" > "$OUT/rotate.txt" 2>&1
ls -la /tmp/gs-run >> "$OUT/rotate.txt"
$GS stats --db /tmp/gs-run --json > "$OUT/rotate_stats.json" 2>>"$OUT/rotate.txt"
$GS trace --db /tmp/gs-one.db --force -q -- $PY "$LOOP" >> "$OUT/rotate.txt" 2>&1
$GS stats --db /tmp/gs-one.db --json > "$OUT/one_stats.json" 2>>"$OUT/rotate.txt"
cat "$OUT/footprint.txt"
