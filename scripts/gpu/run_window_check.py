"""Checks `stats`/`explain --last` over several files of a rotated run of
run_window_workload.py against its ground truth (issue 16, round 16).

Usage: run_window_check.py GS RUN_DIR TRUTH_JSON OUT_DIR
Prints one line per check and `checks: P/T passed` last.
"""
import glob
import json
import os
import sqlite3
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gslib import Checks, gs_json  # noqa: E402

gs, run, truth_path, out = sys.argv[1:5]
truth = json.load(open(truth_path))
copies = truth["copies"]
check = Checks()


def gsjson(*args):
    return gs_json(gs, *args)


def finding(doc, kind):
    return [f for f in doc["findings"] if f["kind"] == kind]


files = sorted(glob.glob(os.path.join(run, "part-*.db")))
check("rotated", len(files) >= 5, f"{len(files)} files")
ptr = truth["pinned_ptr"]


def stores_buffer(f):
    c = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
    return any(s <= ptr < e for s, e in c.execute("SELECT start_ptr, end_ptr FROM run_pinned"))


stored = [os.path.basename(f) for f in files if stores_buffer(f)]
print(f"files storing the pinned buffer ({ptr:#x}) as live at their end: {stored}")

# The pinned phase's last 12 s: several files, no file holds the pinning.
doc, err = gsjson("explain", "--json", "--last", "12s", "--db", run)
json.dump(doc, open(os.path.join(out, "explain_last12s.json"), "w"), indent=1)
since = doc["window"]["since_mono_ns"]
spanned = doc.get("files", [])
check("--last 12s spans several files", len(spanned) >= 3, f"{spanned} ({err.strip()})")
before = f"part-{int(spanned[0][5:11]) - 1:06}.db" if spanned else ""
check(
    "the file before the window stores the buffer as pinned (the window's start state)",
    before in stored,
    f"{before} in {stored[:3]}...",
)
check(
    "the window is in the pinned phase",
    since > truth["switch_ns"],
    f"since {since}, switch {truth['switch_ns']}",
)
check(
    "no pageable_copy in a window of copies from pinned memory",
    not finding(doc, "pageable_copy"),
    f"findings {[f['kind'] for f in doc['findings']]}",
)

# The same window's stats count every copy once.
sdoc, _ = gsjson("stats", "--json", "--last", "12s", "--db", run)
json.dump(sdoc, open(os.path.join(out, "stats_last12s.json"), "w"), indent=1)
copy_ops = [o for o in sdoc["ops"] if o["op"] in ("cudaMemcpyAsync", "cudaMemcpy")]
got = sum(o["count"] for o in copy_ops)
sql = 0
for f in files:
    if os.path.basename(f) in spanned:
        c = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        sql += c.execute(
            "SELECT count(*) FROM calls WHERE op IN ('cudaMemcpyAsync', 'cudaMemcpy') AND ts_ns >= ?",
            (sdoc["window"]["since_mono_ns"],),
        ).fetchone()[0]
made = sum(1 for t, _ in copies if t >= sdoc["window"]["since_mono_ns"])
check("stats counts the window's copies as the files hold them", got == sql, f"stats {got}, SQL {sql}")
check(
    "...and as the program made them (within one at the window's edge)",
    abs(got - made) <= 1,
    f"stats {got}, program {made} ({[o['op'] for o in copy_ops]})",
)

# The whole run as one window: the pageable phase's copies, all of them.
adoc, _ = gsjson("explain", "--json", "--last", "1h", "--db", run)
json.dump(adoc, open(os.path.join(out, "explain_last1h.json"), "w"), indent=1)
pc = finding(adoc, "pageable_copy")
pageable = sum(1 for _, k in copies if k == "pageable")
pinned = len(copies) - pageable
ev = pc[0]["evidence"] if pc else {}
check(
    "--last 1h: pageable_copy counts the pageable phase's copies",
    bool(pc) and ev.get("copies") == pageable,
    f"program {pageable} pageable, {pinned} pinned; evidence copies {ev.get('copies')}, pinned_copies {ev.get('pinned_copies')}",
)
check(
    "--last 1h: the pinned copies are counted pinned",
    ev.get("pinned_copies") == pinned,
    f"program {pinned}, evidence {ev.get('pinned_copies')}",
)
wdoc, _ = gsjson("explain", "--json", "--db", run)
wpc = finding(wdoc, "pageable_copy")
wev = wpc[0]["evidence"] if wpc else {}
check(
    "the whole run's explain agrees",
    (wev.get("copies"), wev.get("pinned_copies")) == (ev.get("copies"), ev.get("pinned_copies")),
    f"whole run {wev.get('copies')}/{wev.get('pinned_copies')}",
)

# Round 23: the whole run as one window takes up the ledger the tracer stored
# as the last finished file began (run_ledger_begin); a copy of the run without
# those states replays every file's memory calls: the same answer.
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

bare = os.path.join(tempfile.mkdtemp(prefix="gs-runwin-bare-"), "run")
shutil.copytree(run, bare)
stripped = 0
for f in sorted(glob.glob(os.path.join(bare, "part-*.db"))):
    c = sqlite3.connect(f)
    stripped += c.execute("DELETE FROM meta WHERE key = 'run_ledger_begin'").rowcount
    c.commit()
    c.close()


def timed_explain(d):
    t = time.monotonic()
    r = subprocess.run([gs, "explain", "--json", "--last", "1h", "--db", d], capture_output=True, text=True)
    return r.stdout, time.monotonic() - t


carried_out, carried_s = timed_explain(run)
replayed_out, replayed_s = timed_explain(bare)
check(
    "--last 1h from the carried ledger == every file replayed",
    stripped > 0 and carried_out == replayed_out and carried_out.strip() != "",
    f"{stripped} states removed from the copy; {carried_s:.2f} s vs {replayed_s:.2f} s replayed",
)
notes = [n for n in json.loads(carried_out).get("notes", []) if "device memory" in n]
print(f"--last 1h memory notes: {notes[:2]}")
check.summary()
