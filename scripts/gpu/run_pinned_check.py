"""Checks issue 16 round 19 on a `trace --rotate 2s` run of
run_pinned_workload.py: the tracer judged each file's copies against the
run's pinned ranges (stored totals == the program's own copy counts), so
`explain --db DIR` reads no copy again; the newest file alone knows the
buffer; `memory --at` and MCP `memory {at_ns}` over the run equal
torch.cuda.memory_reserved() at the program's checkpoints. With the
previous build's run of the same program beside it (OLD_*): what its files
stored, and the time of `explain --db DIR` for each build.

Usage: run_pinned_check.py GS RUN TRUTH [GS_OLD RUN_OLD TRUTH_OLD] OUT
Prints one line per check and `checks: P/T passed` last.
"""
import glob
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gslib import Checks, gs_json, mcp_calls  # noqa: E402

args = sys.argv[1:]
gs, run, truth_path = args[:3]
old = args[3:6] if len(args) == 7 else None
out = args[-1]
truth = json.load(open(truth_path))
check = Checks()
pid = truth["pid"]


def parts(d):
    return sorted(glob.glob(os.path.join(d, "part-*.db")))


def ro(f):
    return sqlite3.connect(f"file:{f}?mode=ro", uri=True)


def copies_from(f, buf):
    """Recorded copies (not nested, succeeded) whose host pointer lies in `buf`."""
    lo, n = buf
    c = ro(f)
    got = c.execute(
        "SELECT count(*) FROM call_host_ptrs h JOIN calls c ON c.id = h.call_id "
        "WHERE c.nested = 0 AND c.ret = 0 AND c.pid = ? AND h.host_ptr >= ? AND h.host_ptr < ?",
        (pid, lo, lo + n),
    ).fetchone()[0]
    c.close()
    return got


def judged(f, p):
    """The stored judgement of the file's copies of process `p`: (pageable, pinned)."""
    c = ro(f)
    rows = c.execute("SELECT inputs FROM finding_threads WHERE pid = ?", (p,)).fetchall()
    c.close()
    pg = [json.loads(r[0])["pageable"] for r in rows]
    return sum(x["count"] for x in pg), sum(x["pinned_copies"] for x in pg)


def meta(f, key):
    c = ro(f)
    r = c.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    c.close()
    return r[0] if r else None


def timed(binary, *a):
    t = time.monotonic()
    p = subprocess.run([binary, *a], capture_output=True, text=True, timeout=300)
    return p, time.monotonic() - t


files = parts(run)
print(f"program: pid {pid}, {truth['steps']} steps, {truth['pinned_copies']} pinned and "
      f"{truth['pageable_copies']} pageable copies; files {[os.path.basename(f) for f in files]}")
check("the run has at least 3 files", len(files) >= 3, f"{len(files)} files")
pin_sql = sum(copies_from(f, truth["pinned"]) for f in files)
page_sql = sum(copies_from(f, truth["pageable"]) for f in files)
check("capture: every copy the program made is recorded with its host pointer",
      pin_sql == truth["pinned_copies"] and page_sql == truth["pageable_copies"],
      f"SQL {pin_sql} from the pinned buffer, {page_sql} from the pageable one")
flags = [meta(f, "run_copies_judged") for f in files]
check("every file's copies were judged against the run's pinned ranges (meta.run_copies_judged)",
      all(v == "1" for v in flags), f"{flags}")


def pinning_file(fs, p):
    """The index of the first file holding a pinning call of process `p`."""
    for i, f in enumerate(fs):
        c = ro(f)
        n = c.execute("SELECT count(*) FROM calls WHERE pid = ? AND nested = 0 AND op IN "
                      "('cudaHostAlloc', 'cudaMallocHost', 'cuMemHostAlloc', 'cuMemAllocHost_v2')", (p,)).fetchone()[0]
        c.close()
        if n:
            return i
    return None


tot = [judged(f, pid) for f in files]
pinned = sum(p for _, p in tot)
pageable = sum(g for g, _ in tot)
pin_at = pinning_file(files, pid)
later_pinned = sum(p for _, p in tot[pin_at + 1:]) if pin_at is not None else 0
check("stored judgement: the copies from the buffer are pinned in every file, the ones after its pinning's too",
      pinned == truth["pinned_copies"] and later_pinned > 0,
      f"pinned {pinned} vs program {truth['pinned_copies']}, {later_pinned} of them in files after the pinning "
      f"(file {None if pin_at is None else pin_at + 1}); (pageable, pinned) per file {tot}")
check("stored judgement: the copies from the pageable buffer stay pageable",
      pageable >= truth["pageable_copies"],
      f"pageable {pageable} vs program {truth['pageable_copies']} (plus any torch made itself)")

e, _ = gs_json(gs, "explain", "--json", "--db", run)
json.dump(e, open(os.path.join(out, "explain_run.json"), "w"), indent=1)
f = [x for x in e["findings"] if x["kind"] == "pageable_copy"]
ev = f[0]["evidence"] if f else {}
check("explain --db DIR: pageable_copy (if any) counts the program's pinned copies pinned",
      not f or ev.get("pinned_copies") == truth["pinned_copies"],
      f"{'finding: ' + json.dumps({k: ev.get(k) for k in ('copies', 'pinned_copies')}) if f else 'no pageable_copy finding'}")
p, secs_new = timed(gs, "explain", "--json", "--db", run)
print(f"explain --db DIR, this build on its run: {secs_new:.2f} s")

# The newest finished file copied out of the run's directory: it knows the buffer.
away = os.path.join(out, "away")
os.makedirs(away, exist_ok=True)
# (the newest one holding copies: the last file may end with the program).
newest = [f for f, t in zip(files, tot) if t[1] > 0][-1]
copy = os.path.join(away, os.path.basename(newest))
shutil.copy(newest, copy)
a, _ = gs_json(gs, "explain", "--json", "--db", copy)
fa = [x for x in a["findings"] if x["kind"] == "pageable_copy"]
want = judged(newest, pid)[1]
notes = json.dumps(a.get("notes", []))
check("the newest file with copies, alone elsewhere: its copies from the buffer pinned earlier are pinned, no 'part N' note",
      want > 0 and "of a `trace --rotate` run: host memory" not in notes
      and (not fa or fa[0]["evidence"].get("pinned_copies") == want),
      f"{os.path.basename(newest)}: {len(fa)} pageable_copy finding(s)"
      f"{' with ' + str(fa[0]['evidence'].get('pinned_copies')) + ' pinned' if fa else ''}, stored pinned {want}")

# The memory at each checkpoint: CLI --at (from the oldest file's start) and MCP at_ns.
c = ro(files[0])
start = c.execute(  # on CLOCK_MONOTONIC, as the workload's stamps
        "SELECT start_mono_ns + coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'clock_base_ns'), 0) "
        "FROM session").fetchone()[0]
c.close()
good, lines = 0, []
for pt in truth["points"]:
    m, _ = gs_json(gs, "memory", "--json", "--db", run, "--at", f"{pt['ts_ns'] - start}ns")
    live = next((x["live_bytes"] for x in m["processes"] if x["pid"] == pid), None)
    good += live == pt["reserved"]
    lines.append(f"{pt['what']}: {live} vs {pt['reserved']} ({len(m.get('files', []))} files)")
check("memory --db DIR --at each checkpoint == memory_reserved()", good == len(truth["points"]),
      f"{good}/{len(truth['points'])}: " + "; ".join(lines))
mid = truth["points"][len(truth["points"]) // 2]
(ans,) = mcp_calls(gs, run, [("memory", {"at_ns": mid["ts_ns"], "pid": pid})])
live = None if isinstance(ans, str) else next((x["live_bytes"] for x in ans["processes"] if x["pid"] == pid), None)
check("MCP memory {at_ns} over the run == memory_reserved() at a middle checkpoint", live == mid["reserved"],
      f"{live} vs {mid['reserved']} at {mid['what']}")

if old:
    gs_old, run_old, truth_old_path = old
    t_old = json.load(open(truth_old_path))
    of = parts(run_old)
    tot_old = [judged(x, t_old["pid"]) for x in of]
    with_pinned = [i + 1 for i, (_, p) in enumerate(tot_old) if p > 0]
    check("the previous build's files judged each file's copies against its own pinning only",
          with_pinned == [pinning_file(of, t_old["pid"]) + 1] and sum(p for _, p in tot_old) < t_old["pinned_copies"],
          f"stored pinned per file {[p for _, p in tot_old]} of {t_old['pinned_copies']} (pinning in file {with_pinned})")
    p, secs_old = timed(gs_old, "explain", "--json", "--db", run_old)
    p2, secs_cross = timed(gs, "explain", "--json", "--db", run_old)
    same = p.returncode == 0 and p2.returncode == 0 and p.stdout == p2.stdout
    check("this build reads the previous build's run as it did (it judges the copies again)", same,
          f"previous build {secs_old:.2f} s, this build {secs_cross:.2f} s, byte-identical {same}")
    print(f"explain --db DIR: previous build on its run {secs_old:.2f} s; this build on its run {secs_new:.2f} s")
check.summary()
