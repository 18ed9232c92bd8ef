"""Checks `report`, `memory --by-site` and `export --last` of a
`trace --rotate 2s --keep 3` run of run_memory_workload.py (issue 16, round
18) against the program's own counters and SQL over the run's files.

Usage: run_report_check.py GS RUN_DIR TRUTH_JSON OUT_DIR
Prints one line per check and `checks: P/T passed` last.
"""
import glob
import json
import os
import sqlite3
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gslib import Checks, gs_json, mcp_calls  # noqa: E402

gs, run, truth_path, out = sys.argv[1:5]
truth = json.load(open(truth_path))
check = Checks()
pid = truth["pid"]
end = truth["points"][-1]
files = sorted(glob.glob(os.path.join(run, "part-*.db")))


def sql_sum(query, *args):
    total = 0
    for f in files:
        c = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        total += c.execute(query, args).fetchone()[0] or 0
        c.close()
    return total


def gs_run(*args):
    t = time.monotonic()
    p = subprocess.run([gs, *args], capture_output=True, text=True, timeout=300)
    return p, time.monotonic() - t


print(f"program: pid {pid}, {truth['steps']} steps, {truth['kept']} kept; reserved at exit {end['reserved']}")
print(f"files: {[os.path.basename(f) for f in files]}")

# The per-site table of the run: what the program left unfreed, by line.
sites, _ = gs_json(gs, "memory", "--by-site", "--json", "--db", run)
json.dump(sites, open(os.path.join(out, "sites_run.json"), "w"), indent=1)
rows = sites["sites"]
unfreed = sum(s["unfreed_bytes"] for s in rows)
check("sites: unfreed over the run == memory_reserved() at exit", unfreed == end["reserved"],
      f"{unfreed} vs torch {end['reserved']} over {len(rows)} sites")
model = [s for s in rows if "run_memory_workload.py:35" in s["site"]]
check("sites: the model's line holds its 1.5 GiB, made in a file --keep deleted",
      len(model) == 1 and model[0]["unfreed_bytes"] >= 6 * (256 << 20),
      f"{[(s['site'], s['unfreed_bytes']) for s in rows[:4]]}")
check("sites: the peak column is said unknown over a run", sites.get("at_peak_known") is False,
      f"at_peak_known {sites.get('at_peak_known')}")
allocs = sum(s["allocs"] for s in rows)
want = sql_sum("SELECT count(*) FROM calls WHERE op IN ('cudaMalloc', 'cuMemAlloc_v2', 'cuMemCreate') "
               "AND nested = 0 AND ret = 0")
check("sites: allocations == the kept files' successful allocations (SQL)", allocs == want,
      f"{allocs} vs SQL {want}")
[mem] = mcp_calls(gs, run, [("memory", {})])
check("MCP memory of the run: its sites are the command's",
      isinstance(mem, dict) and mem["sites"] == rows[:len(mem["sites"])] and len(mem["sites"]) > 0,
      f"{len(mem['sites']) if isinstance(mem, dict) else mem} sites")

# The report of the whole run.
html = os.path.join(out, "run.html")
p, secs = gs_run("report", "--force", "--db", run, "-o", html)
text = open(html).read() if p.returncode == 0 else ""
calls = sql_sum("SELECT count(*) FROM calls")
check("report --db DIR: every kept file's calls counted", f"<td>{calls} calls, " in text,
      f"rc {p.returncode}, {secs:.2f} s, SQL {calls} calls; {p.stderr.strip()[-200:]}")
exp, _ = gs_json(gs, "explain", "--json", "--db", run)
kinds = [f["kind"] for f in exp["findings"]]
check("report --db DIR: explain --db DIR's findings", all(f">{k}<" in text for k in kinds), f"{kinds}")
check("report --db DIR: the model's line in the sites table", "run_memory_workload.py:35" in text, "")

# A window over the files it spans: report and export.
stats, err = gs_json(gs, "stats", "--json", "--last", "5s", "--db", run)
since = stats["window"]["since_mono_ns"]
in_window = sql_sum("SELECT count(*) FROM calls WHERE ts_ns >= ?", since)
spans = stats.get("files", [])
print(f"--last 5s: since {since}, files {spans}, {in_window} calls (SQL)")
html = os.path.join(out, "last.html")
p, secs = gs_run("report", "--force", "--last", "5s", "--db", run, "-o", html)
text = open(html).read() if p.returncode == 0 else ""
check("report --last 5s over the files it spans: the window's calls", len(spans) > 1 and f"<td>{in_window} calls, " in text,
      f"rc {p.returncode}, {secs:.2f} s, {p.stderr.strip()[-160:]}")
dst = os.path.join(out, "last.json")
p, secs = gs_run("export", "--force", "--format", "json", "--last", "5s", "--db", run, "-o", dst)
got = json.load(open(dst)) if p.returncode == 0 else []
check("export --last 5s (json): every call of the window once", len(got) == in_window,
      f"{len(got)} vs SQL {in_window}, {secs:.2f} s")
dst = os.path.join(out, "last.perfetto.json")
p, secs = gs_run("export", "--force", "--last", "5s", "--db", run, "-o", dst)
doc = json.load(open(dst)) if p.returncode == 0 else {"traceEvents": []}
slices = [e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("cat", "")).startswith("cuda.")]
track = [e for e in doc["traceEvents"] if e.get("name") == "device memory (bytes)" and e.get("pid") == pid]
last_live = track[-1]["args"]["live_bytes"] if track else None
check("export --last 5s (perfetto): a slice per call, the memory track ends at memory_reserved()",
      len(slices) == in_window and last_live == end["reserved"],
      f"{len(slices)} slices, track ends at {last_live} vs torch {end['reserved']}, {secs:.2f} s")
os.remove(dst)
check.summary()
