#!/bin/bash
# Issue 16, round 33: crafted changes of a schema version 6 trace (its
# computed columns' stored inputs: pid_gap, kind_id, blocked_for, runnable_for;
# the clock base) through the commands: prints BAD for a panic, a hang or an
# error of more than one line, and counts errors and warnings.
# Usage: bash scripts/hostile_v6_mutations.sh BIN TRACE.db (a copy is mutated)
set -u
G=$(readlink -f "$1"); base=$(readlink -f "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
: > warn.txt; : > errs.txt
muts=(
"UPDATE call_rows SET pid_gap = 'x' WHERE id % 7 = 0"
"UPDATE call_rows SET pid_gap = 9223372036854775807 WHERE id % 7 = 0"
"UPDATE call_rows SET pid_gap = -5000000000 WHERE id % 7 = 0"
"UPDATE call_rows SET pid_gap = NULL WHERE id % 7 = 0"
"UPDATE waits SET kind_id = 'blocked' WHERE id % 3 = 0"
"UPDATE waits SET blocked_for = 'x' WHERE id % 3 = 0"
"UPDATE waits SET blocked_for = -9223372036854775807 WHERE id % 3 = 0"
"UPDATE waits SET runnable_for = 9223372036854775807, off_ns = 9223372036854775807 WHERE id % 3 = 0"
"UPDATE waits SET pid_gap = 3.5 WHERE id % 3 = 0"
"UPDATE meta SET value = 'abc' WHERE key = 'clock_base_ns'"
"UPDATE meta SET value = '-5' WHERE key = 'clock_base_ns'"
)
for m in "${muts[@]}"; do
  cp $base mut.db
  sqlite3 mut.db "$m" 2>&1 | head -2
  for c in "stats" "stats --json" "explain" "explain --json" "memory --json" "report -o mut.html --force" "export -o mut.json --force" "explain --from 1ms --to 2s" "stats --from 1ms --to 2s" "memory --at 1s --json" "query SELECT_count(*)_FROM_waits"; do
    cc=${c//_/ }
    if [[ $c == query* ]]; then GPUSLEUTH_CACHE_DIR= timeout 60 $G query --db mut.db "SELECT count(*), sum(pid), sum(on_ns) FROM waits" > o.txt 2> e.txt; else GPUSLEUTH_CACHE_DIR= timeout 60 $G $cc --db mut.db > o.txt 2> e.txt; fi
    rc=$?
    lines=$(grep -c . e.txt)
    pan=$(grep -c "panicked\|RUST_BACKTRACE" e.txt)
    if [ $pan -gt 0 ] || [ $rc -ge 124 ] || { [ $rc -ne 0 ] && [ $lines -ne 1 ]; }; then echo "BAD [$m] [$c] rc=$rc lines=$lines: $(head -c 300 e.txt)"; fi
    [ $rc -eq 0 ] && [ $lines -gt 0 ] && echo "ok-warn [$m] [$c]: $(head -c 150 e.txt | tr '\n' '|')" >> warn.txt
    [ $rc -ne 0 ] && echo "err [$m] [$c]: $(head -c 150 e.txt)" >> errs.txt
  done
done
echo "done: $(wc -l < errs.txt) one-line errors, $(wc -l < warn.txt) answers with a warning"
