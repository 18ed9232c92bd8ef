#!/usr/bin/env bash
# Issue 13: the leak-in-a-generate-loop workload alone: known-line
# attribution (check.json), the by-site table and explain. The truth records
# carry each allocation's time and code object address (CPython's id()), to
# compare with the stacks' notes when frames could not be read.
#   cd DIR_WITH_gpusleuth_AND_scripts && OUT=$OUT bash scripts/gpu/sites_leak_loop.sh
set -u
ROOT=$(pwd)
PY=${PY:-/opt/torch/.venv/bin/python3}
OUT=${OUT:-$ROOT/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
SP=/opt/torch/.venv/lib/python3.12/site-packages
W=$(mktemp -d /tmp/gs-leak.XXXXXX)
cd scripts/gpu
timeout 300 "$ROOT/gpusleuth" trace --db "$W/sites.db" --force --quiet \
  --cuda-lib "$SP/nvidia/cu13/lib/libcudart.so.13" --cuda-lib /usr/local/nvidia/lib64/libcuda.so.1 \
  -- "$PY" sites_workload.py --truth "$W/truth.jsonl" >"$OUT/trace.log" 2>&1
echo "trace rc=$?" >>"$OUT/trace.log"
"$ROOT/gpusleuth" memory --by-site --db "$W/sites.db" >"$OUT/by_site.txt" 2>&1
"$ROOT/gpusleuth" memory --by-site --json --db "$W/sites.db" >"$W/by_site.json" 2>>"$OUT/trace.log"
"$ROOT/gpusleuth" explain --db "$W/sites.db" >"$OUT/explain.txt" 2>&1
"$PY" sites_check.py "$W/truth.jsonl" "$W/by_site.json" "$OUT/explain.txt" >"$OUT/check.json" 2>>"$OUT/trace.log"
cp "$W/truth.jsonl" "$OUT/truth.jsonl"
"$PY" -c 'import json,sys; c=json.load(open(sys.argv[1])); print("SUMMARY right_line_share=%s leak_first=%s explain_names_leak=%s" % (c["right_line_share"], c["leak_first_in_by_site"], c["explain_names_leak"]))' "$OUT/check.json"
