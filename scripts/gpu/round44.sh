#!/usr/bin/env bash
# Issue 16, round 44: a whole 10M-event export at this build alone on the
# device host's 16 cores (last measured there in round 38, before rounds
# 41-43 changed the keys pass and the readers): the bench's synthetic trace
# written there (with the bench's own timings of every analysis command),
# each format to stdout discarded, 2 reps, wall and peak RSS; then two
# windows.
# Usage (device, repo root, the release build carried):
#   OUT=$OUT bash scripts/gpu/round44.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
host_facts
E=$OUT/export.txt
db=/tmp/r44-f10.db
bench_trace "$db" 420 >"$E"
for rep in 1 2; do
  for fmt in json pftrace perfetto; do
    echo "rep $rep $fmt: $(timed "$GS" export --db "$db" --format "$fmt")" >>"$E"
  done
done
for w in "--from 20s --to 30s" "--from 20s --to 21s"; do
  # shellcheck disable=SC2086
  echo "window $w json: $(timed "$GS" export --db "$db" --format json $w)" >>"$E"
done
rm -f "$db"
{ cat "$OUT/gpu.txt"; grep -E "^  (export|stats|explain|report|memory) " "$OUT/bench10m.txt"; cat "$E"; } | tail -40
