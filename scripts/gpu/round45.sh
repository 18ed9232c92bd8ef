#!/usr/bin/env bash
# Issue 16, round 45: a whole 10M-event export into a file (`-o`), which
# since round 45 reads its calls straight through the reorder buffer
# without the keys pass first, against the build before, on the device
# host's 16 cores (where round 44 found the export's main thread the
# bound). The bench's synthetic trace written there; each format into a
# file, the two builds alternated, 2 reps, outputs compared with cmp; then
# a ten-second window as `json`, both builds.
# Usage (device, repo root, both builds carried):
#   OUT=$OUT bash scripts/gpu/round45.sh target/release/gpusleuth target/release/gpusleuth-before
set -u
. scripts/gpu/device_env.sh "$1"
OLD=$(readlink -f "$2"); chmod +x "$OLD"
host_facts
E=$OUT/export.txt
db=/tmp/r45-f10.db
bench_trace "$db" 300 >"$E"
for rep in 1 2; do
  for fmt in json pftrace perfetto; do
    for b in "$OLD" "$GS"; do
      out=/tmp/r45-$(basename "$b").$fmt
      echo "rep $rep $fmt -o $(basename "$b"): $(timed "$b" export --db "$db" --format "$fmt" --force -o "$out")" >>"$E"
    done
    cmp -s "/tmp/r45-$(basename "$OLD").$fmt" "/tmp/r45-$(basename "$GS").$fmt" \
      && echo "  $fmt outputs byte-identical ($(stat -c %s "/tmp/r45-$(basename "$GS").$fmt") bytes)" >>"$E" \
      || echo "  $fmt outputs DIFFER" >>"$E"
  done
done
rm -f /tmp/r45-*.json /tmp/r45-*.pftrace /tmp/r45-*.perfetto
for b in "$OLD" "$GS"; do
  echo "window 20s-30s json -o $(basename "$b"): $(timed "$b" export --db "$db" --format json --from 20s --to 30s --force -o /tmp/r45-w.json)" >>"$E"
done
rm -f "$db" /tmp/r45-w.json
{ cat "$OUT/gpu.txt"; cat "$E"; } | tail -30
