#!/usr/bin/env bash
# Issue 16, round 33: the trace's clock and schema version 6 on real
# PyTorch. Every trace here is recorded with GPUSLEUTH_CLOCK_MARGIN_S=1, so
# its clock base is not 0 even on a machine up less than an hour (the
# device): the allocator acceptance (scripts/gpu/allocator_check.py, one
# file, then --rotate 2s in round 32's script) then also checks that the scripts' CLOCK_MONOTONIC
# checkpoints and the stored times meet (gslib.on_file_clock, the session
# start plus the base), with round 32's check of the views carried across
# a run's files (not run in round 32: no device was lent); last, per trace
# written: its schema version, clock base and bytes per event (77.0-77.1
# before, version 5).
# Usage (device, repo root, the build carried as target/release/gpusleuth):
#   OUT=$OUT bash scripts/gpu/round33_clock_v6.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
export GPUSLEUTH_CLOCK_MARGIN_S=1
timeout 300 "$PY" scripts/gpu/allocator_check.py --gs "$GS" --py "$PY" --out "$OUT/alloc1" >"$OUT/allocator_single.log" 2>&1
echo "allocator_check (one file) rc=$?"
grep -E "RESULT" "$OUT/allocator_single.log"
bash scripts/gpu/round32_carried_views.sh "$GS"
"$PY" - <<'EOF'
import glob, os, sqlite3
for db in sorted(glob.glob("/tmp/alloc_*.db")) + sorted(glob.glob("/tmp/alloc_*_run/part-*.db"))[:2]:
    c = sqlite3.connect(db)
    meta = dict(c.execute("SELECT key, value FROM meta"))
    n = lambda t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
    events = n("call_rows") + n("waits") + n("allocator_rows")
    size = os.path.getsize(db)
    print(f"{db}: schema {meta.get('schema_version')}, clock base {meta.get('clock_base_ns')}, "
          f"{events} events, {size} B = {size / max(events, 1):.1f} B/event")
EOF
# Round 37: each real trace (and a rotated run) as Perfetto's protobuf,
# checked against its perfetto JSON with Perfetto's own Python classes
# (the wheels carried in .whl/: perfetto, protobuf; installed aside).
"$PY" -m pip install -q --no-index --target /tmp/pfpy .whl/*.whl >/dev/null 2>&1 || echo "pftrace: wheels not installed"
for db in /tmp/alloc_*.db $(ls -d /tmp/alloc_*_run 2>/dev/null | head -1); do
  [ -e "$db" ] || continue
  if "$GS" export --db "$db" --format perfetto --force -o /tmp/r37.json 2>/dev/null &&
     "$GS" export --db "$db" --format pftrace --force -o /tmp/r37.pftrace 2>/dev/null; then
    echo "pftrace $(basename "$db"): $(PYTHONPATH=/tmp/pfpy "$PY" tests/perfetto/pftrace_check.py /tmp/r37.json /tmp/r37.pftrace 2>&1 | head -4) ($(stat -c %s /tmp/r37.pftrace) B against $(stat -c %s /tmp/r37.json) B of JSON)"
  else
    echo "pftrace $(basename "$db"): export failed"
  fi
done
rm -f /tmp/r37.json /tmp/r37.pftrace
