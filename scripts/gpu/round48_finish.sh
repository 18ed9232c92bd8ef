#!/usr/bin/env bash
# Issue 16, round 48: `gpusleuth finish` on real captures. The training loop
# (bench_train.py) traced with --torch-allocator, in one file and as a
# `--rotate 2s` run, the tracer SIGKILLed mid-run (the workload ended after
# it). The file's answers before `finish` (from its rows) and after (from
# what finish stored) compared; the run's `stats` before (the killed files
# left out) and after (every file); every file's tracer_pid.
# Usage (device, repo root, the release build carried):
#   OUT=$OUT bash scripts/gpu/round48_finish.sh target/release/gpusleuth
set -u
. "$(dirname "$0")/device_env.sh"
host_facts
W=/tmp/r48f; rm -rf "$W"; mkdir -p "$W"
S=$OUT/finish.txt; : >"$S"
killed_trace() { # DB SECONDS [trace args...]: trace the loop, SIGKILL the tracer after SECONDS
  local db=$1 secs=$2; shift 2
  "$GS" trace --quiet --precheck off --torch-allocator --db "$db" "$@" -- \
    "$PY" scripts/gpu/bench_train.py --steps 100000 >"$W/trace.log" 2>&1 &
  local tp=$!
  sleep "$secs"; kill -KILL "$tp"; wait "$tp" 2>/dev/null
  pkill -KILL -f "bench_train.py --steps 100000"; sleep 2
}
answers() { # DB TAG: explain/memory/stats as JSON into $W/TAG.*
  "$GS" explain --json --db "$1" >"$W/$2.explain.json" 2>"$W/$2.explain.err"
  "$GS" memory --json --db "$1" >"$W/$2.memory.json" 2>"$W/$2.memory.err"
  "$GS" stats --json --db "$1" >"$W/$2.stats.json" 2>"$W/$2.stats.err"
}
q() { # DB SQL: one value (python's sqlite3: the device may lack the sqlite3 shell)
  "$PY" -c 'import sqlite3,sys; r=sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchone(); print(r[0] if r else "")' "$1" "$2" 2>/dev/null
}
same() { # what A B
  if cmp -s "$2" "$3"; then echo "$1: identical"; else echo "$1: DIFFERS ($(diff "$2" "$3" | grep -c '^[<>]') lines)"; fi
}
{
  echo "== one file, killed after 40 s"
  killed_trace "$W/one.db" 40
  ls -la "$W" | grep one
  answers "$W/one.db" before
  timed "$GS" finish --db "$W/one.db"
  "$GS" finish --db "$W/one.db" 2>&1 | tail -1
  answers "$W/one.db" after
  for k in explain memory; do same "$k --json" "$W/before.$k.json" "$W/after.$k.json"; done
  "$PY" - "$W/before.stats.json" "$W/after.stats.json" <<'PYEOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
key = lambda o: (o["layer"], o["op"])
ops = {key(o): o for o in a["ops"]}
worst, diff = 0.0, []
for o in b["ops"]:
    p = ops.get(key(o))
    if p is None:
        diff.append(key(o)); continue
    for f in ("count", "errors", "total_ns", "max_ns"):
        if o.get(f) != p.get(f): diff.append((key(o), f))
    for f in ("p50_ns", "p95_ns", "p99_ns"):
        if o.get(f) and p.get(f): worst = max(worst, abs(o[f] - p[f]) / p[f])
print(f"stats --json: {len(b['ops'])} ops, exact fields differ: {diff[:5]}, percentiles worst relative gap {worst:.5f}")
PYEOF
  echo "tracer_pid: $(q "$W/one.db" "SELECT value FROM stats WHERE name='tracer_pid'")"
  echo "== --rotate 2s run, killed after 25 s"
  killed_trace "$W/run" 25 --rotate 2s
  ls "$W/run" | tr '\n' ' '; echo
  "$GS" stats --db "$W/run" >/dev/null 2>"$W/run_before.err"; grep -c "not finished" "$W/run_before.err" | sed 's/^/unfinished notes before: /'
  timed "$GS" finish --db "$W/run"
  "$GS" finish --db "$W/run" 2>&1 | tail -1
  "$GS" stats --db "$W/run" >/dev/null 2>"$W/run_after.err"; echo "unfinished notes after: $(grep -c 'not finished' "$W/run_after.err")"
  "$GS" memory --db "$W/run" 2>&1 | head -12
  for f in "$W"/run/part-*.db; do printf '%s tracer_pid=%s rollups=%s\n' "$(basename "$f")" \
    "$(q "$f" "SELECT value FROM stats WHERE name='tracer_pid'")" \
    "$(q "$f" "SELECT value FROM meta WHERE key='rollups'")"; done
} >>"$S" 2>&1
cat "$OUT/gpu.txt" "$S"
