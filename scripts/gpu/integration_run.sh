#!/usr/bin/env bash
# One device call that re-runs every GPU acceptance script of this round on
# one integrated binary (2 x H200 kind: the NCCL straggler needs two GPUs; the
# others use GPU 0). Each suite writes into its own folder; $OUT gets one
# log per suite (at most 8 files) and summary.txt.
#   cd DIR_WITH_gpusleuth_AND_scripts && OUT=$OUT bash scripts/gpu/integration_run.sh [SUITE...]
# Suites: verdict attach reclaim sites nccl overhead footprint (default: all but overhead
# and footprint (scripts/gpu/tracer_footprint.sh: tracer CPU per event, placement, RSS, --rotate),
# which takes GS_BUDGET_S seconds, 330 by default: scripts/gpu/overhead_reps.py).
set -u
ROOT=$(pwd)
export GPUSLEUTH=$ROOT/gpusleuth PY=${PY:-/opt/torch/.venv/bin/python3} PYTHONUNBUFFERED=1
OUT=${OUT:-$ROOT/out}; mkdir -p "$OUT"
G=$ROOT/scripts/gpu
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
suites=${*:-verdict attach reclaim sites nccl}
S=$OUT/summary.txt
{ date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; } >"$S" 2>&1
for s in $suites; do
  W=$(mktemp -d /tmp/gs-$s.XXXXXX)
  t0=$(date +%s)
  case $s in
    verdict) OUT=$W timeout 240 bash "$G/verdict_run.sh" >"$OUT/verdict.log" 2>&1
             tail -12 "$W/verdict-h200.txt" >>"$S" 2>&1 ;;
    attach)  OUT=$W timeout 90 bash "$G/attach_baseline.sh" >"$OUT/attach.log" 2>&1
             grep -E "PASS|FAIL|summary|SUMMARY" "$OUT/attach.log" | tail -15 >>"$S" ;;
    reclaim) OUT=$W timeout 200 bash "$G/reclaim_variants.sh" >"$OUT/reclaim.log" 2>&1
             cat "$W/summary.txt" >>"$S" 2>&1 ;;
    sites)   # Known-line attribution only (the overhead benchmarks of sites_run.sh are not repeated).
             ( cd "$ROOT" && OUT=$W PY=$PY bash "$G/sites_leak_loop.sh"
               cat "$W/check.json"; head -20 "$W/by_site.txt"; head -30 "$W/explain.txt" ) >"$OUT/sites.log" 2>&1
             grep '^SUMMARY' "$OUT/sites.log" | sed 's/^SUMMARY/sites:/' >>"$S" ;;
    overhead) ( cd "$ROOT" && OUT=$W timeout $(( ${GS_BUDGET_S:-330} + 60 )) "$PY" "$G/overhead_reps.py" "$GPUSLEUTH" ) >"$OUT/overhead.log" 2>&1
             grep -E "SUMMARY|target|traps" "$OUT/overhead.log" | tail -12 >>"$S"
             cp "$W/overhead_reps.json" "$OUT/overhead_reps.json" 2>/dev/null ;;
    footprint) ( cd "$ROOT" && OUT=$W GPUSLEUTH=$GPUSLEUTH PY=$PY timeout 240 bash "$G/tracer_footprint.sh" ) >"$OUT/footprint.log" 2>&1
             tail -25 "$OUT/footprint.log" >>"$S"
             python3 - "$W" >>"$S" 2>&1 <<'PYEOF'
import json, sys, os
w = sys.argv[1]
def counts(name):
    try:
        d = json.load(open(os.path.join(w, name)))
    except (OSError, ValueError) as e:
        return f"unreadable ({e})"
    return {o["op"]: o["count"] for o in d.get("ops", [])}
a, b = counts("rotate_stats.json"), counts("one_stats.json")
print("rotate: run-long stats ops", len(a) if isinstance(a, dict) else a, "| one trace ops", len(b) if isinstance(b, dict) else b)
if isinstance(a, dict) and isinstance(b, dict):
    for op in sorted(set(a) | set(b)):
        print(f"  {op:32s} rotated-run {a.get(op, 0):>8} one-trace {b.get(op, 0):>8}")
PYEOF
             ;;
    nccl)    ( cd "$ROOT" && OUT=$W GPUSLEUTH=$GPUSLEUTH timeout 200 bash "$G/nccl_straggler.sh" ) >"$OUT/nccl.log" 2>&1
             cat "$W/summary.txt" >>"$S" 2>&1 ;;
  esac
  echo "== $s: $(( $(date +%s) - t0 )) s" >>"$S"
done
cat "$S"
