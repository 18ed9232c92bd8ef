#!/usr/bin/env bash
# Issue 17 acceptance on the 2 x H200 machine (device kind nvidia-h200-x2):
# a 2-rank DDP run under torchrun, rank 1's DataLoader slowed by SLOW_MS per
# batch. gpusleuth traces the whole job; the straggler finding must name
# rank 1, its pid and input_wait as the cause, and its lateness must agree
# within 10% with the ranks' own timestamps (nccl_check.py).
#
# Run from a folder holding the release binary and scripts/gpu/:
#   cd .dev-nccl && OUT=$OUT bash scripts/gpu/nccl_straggler.sh
# Results in $OUT (at most 8 files): check.txt, trace.log, explain.json,
# explain.txt, rank0.jsonl, rank1.jsonl, summary.txt, nccl.txt.
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
GS=${GPUSLEUTH:-./gpusleuth}
PY=${PY:-/opt/torch/.venv/bin/python3}
HERE=$(cd "$(dirname "$0")" && pwd)
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export SLOW_RANK=${SLOW_RANK:-1} SLOW_MS=${SLOW_MS:-60} STEPS=${STEPS:-40}
export GS_NCCL_LOG_DIR="$OUT"
DB=/tmp/gs-nccl-ddp.db
rm -f "$DB"

"$GS" check > "$OUT/check.txt" 2>&1
timeout 300 "$GS" trace --db "$DB" --quiet -- \
	"$PY" -m torch.distributed.run --nproc-per-node 2 "$HERE/nccl_ddp.py" > "$OUT/trace.log" 2>&1
echo "trace exit: $?" >> "$OUT/trace.log"
"$GS" explain --db "$DB" --json > "$OUT/explain.json" 2>> "$OUT/trace.log"
"$GS" explain --db "$DB" > "$OUT/explain.txt" 2>&1
{
	"$GS" query --db "$DB" "SELECT path, layer, probes, missing FROM libraries WHERE layer = 'nccl'"
	"$GS" query --db "$DB" "SELECT c.op, c.pid, count(*), sum(c.dur_ns)/1e6 AS ms FROM calls c WHERE layer='nccl' GROUP BY c.op, c.pid"
	"$GS" query --db "$DB" "SELECT c.pid, n.rank, n.nranks, n.unique_id FROM nccl_calls n JOIN calls c ON c.id = n.call_id WHERE n.rank IS NOT NULL"
	"$GS" query --db "$DB" "SELECT DISTINCT n.count, n.datatype, n.redop, c.stream FROM nccl_calls n JOIN calls c ON c.id = n.call_id WHERE c.op = 'ncclAllReduce' LIMIT 5"
	"$GS" query --db "$DB" "SELECT name, value FROM stats WHERE value > 0"
} > "$OUT/nccl.txt" 2>&1
"$PY" "$HERE/nccl_check.py" "$OUT/explain.json" "$DB" "$OUT/rank0.jsonl" "$OUT/rank1.jsonl" > "$OUT/summary.txt" 2>&1
echo "nccl_check exit: $?" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
