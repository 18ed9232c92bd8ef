#!/usr/bin/env bash
# Round 57: is the probes' trap measured as a launch pays it? The launch
# workload of verdict_workloads.py untraced and traced (interleaved), the
# trap cost the trace measured (probe_trap_ns), and the window the verdict
# judged without the traps against the untraced loop's own wall time.
#   OUT=/tmp/out scripts/gpu/round57_traps.sh target/release/gpusleuth [REPS]
set -u
here=$(cd "$(dirname "$0")" && pwd)
REPS=${2:-3}
. "$here/device_env.sh" "${1:-target/release/gpusleuth}"
W=${WORK:-/tmp/gs-traps}; rm -rf "$W"; mkdir -p "$W"
python3 "$here/entry_bytes.py" "$GS" gpusleuth_trap_push gpusleuth_trap_endbr gpusleuth_trap_other -- "$LIBCUDA" cuLaunchKernel -- "$CUDART" cudaLaunchKernel
for i in $(seq "$REPS"); do
  $PY "$here/verdict_workloads.py" launch "$W/u$i.json" > /dev/null 2>&1
  python3 -c "import json; print('untraced loop_wall_s', round(json.load(open('$W/u$i.json'))['loop_wall_s'], 3))"
  $GS trace --quiet --force --db "$W/t$i.db" --cuda-lib "$CUDART" --cuda-lib "$LIBCUDA" -- \
      $PY "$here/verdict_workloads.py" launch "$W/t$i.json" > /dev/null 2>&1
  $GS explain --json --db "$W/t$i.db" > "$W/t$i.explain.json"
  python3 - "$W/t$i.json" "$W/t$i.db" "$W/t$i.explain.json" <<'PY'
import json, sqlite3, sys
truth = json.load(open(sys.argv[1]))
trap = sqlite3.connect(sys.argv[2]).execute("select value from stats where name='probe_trap_ns'").fetchone()
e = json.load(open(sys.argv[3]))
f = e['findings'][0]
ev = f['evidence']
print(f"traced loop_wall_s {truth['loop_wall_s']:.3f} trap_ns {trap[0] if trap else None} "
      f"window_s {ev['window_ns']/1e9:.3f} judged_s {ev['steady_window_ns']/1e9:.3f} "
      f"traps_s {ev['probe_traps_ns']/1e9:.3f} launches {ev['launches']} {f['kind']} {f['wall_share']:.2f} "
      f"host_ns_per_launch {ev.get('host_ns_per_launch')}")
print('   ', e['summary'])
PY
done
