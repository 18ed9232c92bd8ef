#!/usr/bin/env bash
# Issue 16, round 35: a whole 10M-event export on the H200 machine's CPUs
# (16 cores: the calls read on helper connections side by side, batches
# serialized on up to 4 threads), against the build before round 35, on
# the bench's synthetic trace written there; outputs compared with cmp.
# Usage (device, repo root, both builds carried):
#   OUT=$OUT bash scripts/gpu/round35_export.sh target/release/gpusleuth target/release/gpusleuth-before
set -u
. scripts/gpu/device_env.sh "$1"
OLD=$(readlink -f "$2"); chmod +x "$OLD"
echo "cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"
db=/tmp/r35-f10.db; rm -f "$db"
timeout 400 "$GS" bench --analysis-only --analysis-calls 10000000 --keep-trace "$db" >"$OUT/bench10m.txt" 2>&1
echo "bench rc=$?"; head -1 "$OUT/bench10m.txt"; grep -E "^  (export|stats|explain) " "$OUT/bench10m.txt"
for rep in 1 2; do
  for fmt in perfetto json; do
    for b in "$OLD" "$GS"; do
      echo "rep $rep $fmt $(basename "$b"): $(timed "$b" export --db "$db" --format "$fmt")"
    done
  done
done
for b in "$OLD" "$GS"; do
  echo "-o file $(basename "$b"): $(timed "$b" export --db "$db" --force -o "/tmp/r35-$(basename "$b").json")"
done
# Round 37: Perfetto's protobuf (the new build only), to a pipe and to a file.
if "$GS" export --help | grep -q pftrace; then
  for rep in 1 2; do
    echo "rep $rep pftrace $(basename "$GS"): $(timed "$GS" export --db "$db" --format pftrace)"
  done
  echo "-o file pftrace: $(timed "$GS" export --db "$db" --format pftrace --force -o /tmp/r37.pftrace) $(stat -c %s /tmp/r37.pftrace) bytes"
  rm -f /tmp/r37.pftrace
fi
cmp "/tmp/r35-$(basename "$OLD").json" "/tmp/r35-$(basename "$GS").json" && echo "outputs byte-identical ($(stat -c %s "/tmp/r35-$(basename "$GS").json") bytes)"
rm -f /tmp/r35-*.json "$db"
