#!/usr/bin/env bash
# Issue 13 on the H200: call sites of a PyTorch workload with known lines,
# the per-capture cost, and the overhead of sites on the seed generate() and
# the training loop (traced with sites on vs --sites off vs untraced).
# Run from a folder holding gpusleuth and these scripts: bash sites_run.sh OUT
set -u
OUT=${1:-out}
mkdir -p "$OUT"
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
export PYTHONUNBUFFERED=1
GS=./gpusleuth
PY=/opt/torch/.venv/bin/python3
SP=/opt/torch/.venv/lib/python3.12/site-packages
LIBS=(--cuda-lib "$SP/nvidia/cu13/lib/libcudart.so.13" --cuda-lib /usr/local/nvidia/lib64/libcuda.so.1)
LOG="$OUT/run.log"
: >"$LOG"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; $PY -c 'import torch; print("torch", torch.__version__)'; } >>"$LOG" 2>&1

# 1. Sites of known lines.
$GS trace --db "$OUT/sites.db" --force --quiet "${LIBS[@]}" -- $PY sites_workload.py --truth "$OUT/truth.jsonl" >>"$LOG" 2>&1
echo "trace rc=$?" >>"$LOG"
$GS memory --by-site --db "$OUT/sites.db" >"$OUT/by_site.txt" 2>&1
$GS memory --by-site --json --db "$OUT/sites.db" >"$OUT/by_site.json" 2>>"$LOG"
$GS explain --db "$OUT/sites.db" >"$OUT/explain.txt" 2>&1
$PY sites_check.py "$OUT/truth.jsonl" "$OUT/by_site.json" "$OUT/explain.txt" >"$OUT/check.json" 2>>"$LOG"

# 2. Per-capture cost and 3. overhead, interleaved per workload.
B="$OUT/bench.jsonl"
: >"$B"
run() { # name mode cmd...
  local name=$1 mode=$2; shift 2
  local line
  case $mode in
    untraced) line=$("$@" 2>>"$LOG" | grep '^{' | tail -1) ;;
    on) line=$($GS trace --db "$OUT/b.db" --force --quiet "${LIBS[@]}" -- "$@" 2>>"$LOG" | grep '^{' | tail -1) ;;
    off) line=$($GS trace --db "$OUT/b.db" --force --quiet --sites off "${LIBS[@]}" -- "$@" 2>>"$LOG" | grep '^{' | tail -1) ;;
  esac
  echo "{\"name\":\"$name\",\"mode\":\"$mode\",\"result\":${line:-null}}" >>"$B"
}
for m in untraced on off; do run sites "$m" $PY sites_bench.py "$SP/nvidia/cu13/lib/libcudart.so.13" 2000; done
for m in untraced on off; do run generate "$m" $PY bench_generate.py; done
for m in untraced on off; do GS_TRAIN_STEPS=60 run train "$m" $PY bench_train.py; done
cat "$OUT/by_site.txt" | head -30
cat "$B"
$PY - "$OUT/check.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
print("SUMMARY right_line_share=%s leak_first=%s explain_names_leak=%s" % (c["right_line_share"], c["leak_first_in_by_site"], c["explain_names_leak"]))
PY
rm -f "$OUT/b.db"
