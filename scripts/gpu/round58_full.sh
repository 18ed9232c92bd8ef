#!/usr/bin/env bash
# Round 58: are a recorded call's traps measured as a launch pays them? The
# launch workload of verdict_workloads.py untraced, traced with the default
# --launches driver and with --launches full (interleaved): the traps the
# trace measured (probe_trap_ns, probe_call_trap_ns) and the window the
# verdict judged without them against the untraced loop's own wall time.
#   OUT=/tmp/out scripts/gpu/round58_full.sh target/release/gpusleuth [REPS]
set -u
here=$(cd "$(dirname "$0")" && pwd)
REPS=${2:-3}
. "$here/device_env.sh" "${1:-target/release/gpusleuth}"
W=${WORK:-/tmp/gs-full}; rm -rf "$W"; mkdir -p "$W"
python3 "$here/entry_bytes.py" "$GS" gpusleuth_trap_push gpusleuth_trap_endbr gpusleuth_trap_other -- "$LIBCUDA" cuLaunchKernel -- "$CUDART" cudaLaunchKernel
for i in $(seq "$REPS"); do
  $PY "$here/verdict_workloads.py" launch "$W/u$i.json" > /dev/null 2>&1
  python3 -c "import json; print('untraced        loop_wall_s', round(json.load(open('$W/u$i.json'))['loop_wall_s'], 3))"
  for mode in driver full; do
    $GS trace --quiet --force --db "$W/$mode$i.db" --launches $mode --cuda-lib "$CUDART" --cuda-lib "$LIBCUDA" -- \
        $PY "$here/verdict_workloads.py" launch "$W/$mode$i.json" > /dev/null 2>&1
    $GS explain --json --db "$W/$mode$i.db" > "$W/$mode$i.explain.json"
    python3 - "$mode" "$W/$mode$i.json" "$W/$mode$i.db" "$W/$mode$i.explain.json" <<'PY'
import json, sqlite3, sys
mode, truth = sys.argv[1], json.load(open(sys.argv[2]))
db = sqlite3.connect(sys.argv[3])
stat = lambda n: (db.execute("select value from stats where name=?", (n,)).fetchone() or [None])[0]
e = json.load(open(sys.argv[4]))
f = e['findings'][0] if e['findings'] else {'kind': None, 'wall_share': 0, 'evidence': {}}
ev = f['evidence']
g = lambda k: ev.get(k) or 0
print(f"traced {mode:6s} loop_wall_s {truth['loop_wall_s']:.3f} trap_ns {stat('probe_trap_ns')} call_trap_ns {stat('probe_call_trap_ns')} "
      f"window_s {g('window_ns')/1e9:.3f} judged_s {g('steady_window_ns')/1e9:.3f} traps_s {g('probe_traps_ns')/1e9:.3f} "
      f"call_traps_s {g('probe_call_traps_ns')/1e9:.3f} launches {g('launches')} {f['kind']} {f['wall_share']:.2f} "
      f"host_ns_per_launch {ev.get('host_ns_per_launch')}")
PY
  done
done
