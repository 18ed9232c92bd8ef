#!/usr/bin/env bash
# Issue 16, round 24 on the H200 (one device call, ~2 minutes): the file a
# trace is still writing, read streamed (stats, explain, report) against the
# same file loaded by the build before, on a real PyTorch program
# (live_file_workload.py, --launches full). A consistent copy of the file is
# taken mid-run with SQLite's backup API (live_file_check.py judges it).
# Usage (device, repo root): OUT=$OUT bash scripts/gpu/round24_live_file.sh NEW_BIN BASE_BIN
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
NEW=$(readlink -f "$1"); BASE=$(readlink -f "$2"); chmod +x "$NEW" "$BASE"
PY=${PY:-/opt/torch/.venv/bin/python3}
CUDART=${CUDART:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13}
LIBCUDA=${LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
W=/tmp/gs-live; rm -rf "$W"; mkdir -p "$W"
{
echo "== trace $(date -u +%FT%TZ)"
timeout 120 "$NEW" trace --quiet --launches full --db "$W/t.db" --cuda-lib "$CUDART" --cuda-lib "$LIBCUDA" \
  -- "$PY" scripts/gpu/live_file_workload.py 25 &
TP=$!
sleep 20
python3 - "$W/t.db" "$W/snap.db" <<'PYEOF'
import sqlite3, sys
src = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
dst = sqlite3.connect(sys.argv[2])
src.backup(dst)
dst.close(); src.close()
print("snapshot taken")
PYEOF
wait $TP; echo "trace rc=$?"
ls -la "$W"
echo "== checks"
timeout 400 python3 scripts/gpu/live_file_check.py "$NEW" "$BASE" "$W/snap.db" "$OUT"
} >"$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
