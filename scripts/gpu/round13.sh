#!/usr/bin/env bash
# Issue 16, round 13 on the H200 (one device call, ~6 minutes): the capture
# now settles a wait whose switch-in the sched_switch program never saw
# (stat `switch_in_unseen`) and stores the kernel's skipped program runs
# (`bpf_skipped_runs`). Re-runs round 11's acceptance (allocator ledger,
# verdicts, sites, MCP findings by op) on this build, then lists both
# counters and the waits of every trace it made, to see how often the GPU
# machine's kernel shows the same gap.
# Usage (device, repo root, the build carried as target/gs13/new):
#   OUT=$OUT bash scripts/gpu/round13.sh target/gs13/new
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
bash scripts/gpu/round11.sh "$1" >/dev/null 2>&1
S=$OUT/summary.txt
echo "== kernel gaps per trace (switch_in_unseen, bpf_skipped_runs, waits)" >>"$S"
shopt -s nullglob
python3 - /tmp/gs-verdict/*.db /tmp/alloc_*.db /tmp/gs-sites.*/*.db >>"$S" 2>&1 <<'PYEOF'
import sqlite3, sys
tot = [0, 0, 0]
for p in sys.argv[1:]:
    try:
        c = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        st = dict(c.execute("SELECT name, value FROM stats"))
        waits = c.execute("SELECT count(*) FROM waits").fetchone()[0]
    except Exception as e:
        print(f"{p}: unreadable ({e})")
        continue
    u = st.get("switch_in_unseen", st.get("drop_switch_in_unseen", -1))
    k = st.get("bpf_skipped_runs", -1)
    print(f"{p}: switch_in_unseen {u} bpf_skipped_runs {k} waits {waits}")
    tot = [tot[0] + max(u, 0), tot[1] + max(k, 0), tot[2] + waits]
print(f"TOTAL switch_in_unseen {tot[0]} bpf_skipped_runs {tot[1]} waits {tot[2]} over {len(sys.argv) - 1} traces")
PYEOF
cat "$S"
