#!/usr/bin/env bash
# Issue 16, round 11 on the H200, the acceptance part (one device call, ~6
# minutes): the file's completion changed (call groups and call-only
# processes from the per-thread pass, hashed per-op histograms), readers
# check an unchecked file's tables concurrently, and a rotated run carries
# its memory ledger across files; so the memory and verdict acceptance
# re-run on the round's build, and MCP `findings` with each op of the real
# traces is compared with the streamed answer again. The tracer's CPU per
# event is measured apart, two builds interleaved (scripts/tracer_ab.py).
# Usage (device, repo root, the build carried as target/gs11/new):
#   OUT=$OUT bash scripts/gpu/round11.sh target/gs11/new
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
rm -rf "$OUT/alloc" "$OUT/integ" 2>/dev/null
cat "$S"
