#!/usr/bin/env bash
# Issue 16, round 10 on the H200 (one device call, ~9 minutes): the file's
# completion changed (each op's scope kept for MCP `findings {op}`) and the
# tracer checks the files it wrote, so the memory and verdict acceptance
# re-run on the round's build, MCP `findings` with each op of the real
# traces is compared with the streamed answer (scripts/gpu/op_scopes_check.py),
# and the tracer's CPU per event and completion are measured again.
# Usage (device, repo root, the build carried as target/gs10/gs):
#   OUT=$OUT bash scripts/gpu/round10.sh target/gs10/gs
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
GS=$(readlink -f "$1"); chmod +x "$GS"
PY=${PY:-/opt/torch/.venv/bin/python3}
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
ln -sf "$GS" gpusleuth
S=$OUT/summary.txt
{ date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; } >"$S" 2>&1
echo "== allocator_check" >>"$S"
timeout 200 "$PY" scripts/gpu/allocator_check.py --gs "$GS" --py "$PY" --out "$OUT/alloc" >"$OUT/allocator.log" 2>&1
echo "rc=$?" >>"$S"; grep -E "PASS|FAIL" "$OUT/allocator.log" | tail -6 >>"$S"
echo "== verdict sites" >>"$S"
OUT=$OUT/integ timeout 300 bash scripts/gpu/integration_run.sh verdict sites >"$OUT/integration.log" 2>&1
echo "rc=$?" >>"$S"; cat "$OUT/integ/summary.txt" >>"$S" 2>/dev/null
echo "== op scopes (MCP findings {op}: rollups vs streamed, the traces above)" >>"$S"
shopt -s nullglob
timeout 200 "$PY" scripts/gpu/op_scopes_check.py --gs "$GS" /tmp/gs-verdict/*.db /tmp/alloc_*.db /tmp/gs-sites.*/*.db >"$OUT/op_scopes.log" 2>&1
shopt -u nullglob
echo "rc=$?" >>"$S"; grep -E "FAIL|first difference|SUMMARY" "$OUT/op_scopes.log" | tail -24 >>"$S"
echo "== footprint" >>"$S"
(cd /tmp && timeout 280 "$GS" bench --footprint-only --footprint-launches "${N:-200000}" --reps "${REPS:-3}") >"$OUT/footprint.txt" 2>&1
echo "rc=$?" >>"$S"; grep -E "launches|^ +[0-9]+ +(on|off)|per added" "$OUT/footprint.txt" >>"$S"
# The verdict traces and answers come back (one file: at most 8 come back),
# so a verdict can be looked into on the development machine.
tar czf "$OUT/verdict_traces.tgz" -C /tmp/gs-verdict . "$OUT/integ" 2>/dev/null
ls -la "$OUT/verdict_traces.tgz" >>"$S"
rm -rf "$OUT/alloc" "$OUT/integ" 2>/dev/null
cat "$S"
