#!/usr/bin/env bash
# Where the trace writer's CPU goes on this machine (issue 16: tracer CPU
# per event): a flat perf profile of `bench --footprint-only`, split by
# thread, the writer's (gpusleuth-db) top symbols. Needs perf.
# Usage (device): OUT=$OUT bash scripts/gpu/writer_profile.sh GS
set -u
GS=${1:-target/release/gpusleuth}
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
PERF=$(command -v perf || ls /usr/lib/linux-tools*/perf /usr/bin/perf* 2>/dev/null | head -1)
echo "perf: ${PERF:-none}; kernel $(uname -r); $(nproc) CPUs; /tmp on $(df -T /tmp | tail -1 | awk '{print $2}')"
if [ -z "$PERF" ]; then
  exit 0
fi
cd /tmp
"$PERF" record -F 4999 -o /tmp/fp.data "$OLDPWD/$GS" bench --footprint-only --footprint-launches "${N:-200000}" --reps 1 > "$OUT/fp.txt" 2>&1
cat "$OUT/fp.txt" | tail -6
"$PERF" report -i /tmp/fp.data --sort comm --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -6
echo "== writer (gpusleuth-db) top symbols"
"$PERF" report -i /tmp/fp.data --comm gpusleuth-db --sort dso,sym --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -45 | tee "$OUT/writer_syms.txt"
