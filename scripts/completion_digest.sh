#!/bin/bash
# Digests of every table a trace's completion writes (rows sorted), one line
# per table: two builds' completions of the same events compare line by line
# (issue 16, round 46: the completion stores each process's rows as its
# threads are done, and must store exactly what it stored before). `bench`'s
# synthetic trace is deterministic, so each build writes the same events:
#   bash scripts/completion_digest.sh BIN OUT_DIR [bench options...]
# writes OUT_DIR/trace (and the run OUT_DIR/trace.run/ with --analysis-run-files) and
# prints "file table rows md5" for every table of every file, `stats` and
# `meta` left out (CPU times and the run's random id differ run to run).
set -eu
bin=$1 out=$2
shift 2
rm -rf "$out"
mkdir -p "$out"
"$bin" bench --analysis-only --keep-trace "$out/trace" "$@" >"$out/bench.log" 2>&1 || {
  cat "$out/bench.log" >&2
  exit 1
}
files=$(find "$out" -name "*.db" | sort)
files="$out/trace $files"
for f in $files; do
  for t in $(sqlite3 "$f" "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT IN ('stats', 'meta') ORDER BY name"); do
    n=$(sqlite3 "$f" "SELECT count(*) FROM \"$t\"")
    sum=$(sqlite3 "$f" "SELECT * FROM \"$t\"" | sort | md5sum | cut -c1-12)
    echo "$(basename "$f") $t $n $sum"
  done
done
