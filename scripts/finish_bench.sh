#!/bin/bash
# `gpusleuth finish` on a large file a killed tracer left (issue 16, round 48):
# the bench's synthetic trace (CALLS calls) as a tracer killed before its
# completion leaves it (scripts/unfinish.sql), each read command timed on it
# before `finish`, `finish` itself, and the same commands after; wall time
# and peak RSS by /usr/bin/time. Needs root (finish reads /proc/*/fd).
# Usage: sudo bash scripts/finish_bench.sh BIN [CALLS]
set -eu
bin=$(readlink -f "$1"); n=${2:-3500000}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$bin" bench --analysis-only --analysis-calls "$n" --keep-trace "$work/done.db" > /dev/null
cp "$work/done.db" "$work/killed.db"
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.executescript(open(sys.argv[2]).read()); c.commit()" \
  "$work/killed.db" "$here/unfinish.sql"
timed() { # label, command...
  local label=$1; shift
  /usr/bin/time -f "%e s %M KB" -o "$work/t" "$@" > /dev/null 2> "$work/err" || true
  printf '%-28s %s\n' "$label" "$(cat "$work/t" | tail -1)"
}
reads() {
  timed "$1 stats" "$bin" stats --db "$work/killed.db"
  timed "$1 explain" "$bin" explain --db "$work/killed.db"
  timed "$1 memory" "$bin" memory --db "$work/killed.db"
  timed "$1 report" "$bin" report --force --db "$work/killed.db" -o "$work/r.html"
  timed "$1 explain --last 2s" "$bin" explain --db "$work/killed.db" --last 2s
}
echo "$n calls, $(stat -c %s "$work/killed.db") bytes; $(date -u)"
reads before
timed "finish" "$bin" finish --db "$work/killed.db"
reads after
for c in stats explain; do
  diff <("$bin" $c --json --db "$work/killed.db" 2>/dev/null) <("$bin" $c --json --db "$work/done.db" 2>/dev/null) > /dev/null \
    && echo "$c --json: finished file = the tracer's own" || echo "$c --json: DIFFERS from the tracer's own"
done
