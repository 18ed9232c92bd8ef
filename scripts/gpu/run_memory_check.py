"""Checks `memory --db DIR` and MCP `memory` of a `trace --rotate 2s --keep 3`
run of run_memory_workload.py against the program's own counters (issue 16,
round 17): the run's ledger at the program's exit equals
torch.cuda.memory_reserved() at its last checkpoint, though the model's
allocations were made in files --keep deleted.

Usage: run_memory_check.py GS RUN_DIR TRUTH_JSON OUT_DIR [ONE_DB ONE_TRUTH_JSON]
(ONE_DB: the same program traced into one file: its exited process's NVML lines.)
Prints one line per check and `checks: P/T passed` last.
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gslib import Checks, gs_json, mcp_calls  # noqa: E402

gs, run, truth_path, out = sys.argv[1:5]
truth = json.load(open(truth_path))
check = Checks()


def gsjson(*args):
    return gs_json(gs, *args)


def mcp(db, calls):
    return mcp_calls(gs, db, calls)


files = sorted(glob.glob(os.path.join(run, "part-*.db")))
numbers = [int(os.path.basename(f)[5:11]) for f in files]
check("--keep 3 pruned files", len(files) == 3 and numbers[0] > 1, f"kept {[os.path.basename(f) for f in files]}")
pid = truth["pid"]
end = truth["points"][-1]
print(f"program: {truth['steps']} steps, {truth['kept']} tensors kept; last checkpoint reserved {end['reserved']} "
      f"allocated {end['allocated']}")

doc, err = gsjson("memory", "--json", "--db", run)
json.dump(doc, open(os.path.join(out, "memory_run.json"), "w"), indent=1)
procs = [p for p in doc["processes"] if p["pid"] == pid]
check("the program is in the run's ledger", len(procs) == 1, f"pids {[p['pid'] for p in doc['processes']]}")
l = procs[0] if procs else {}
check("live at exit == memory_reserved() at the last checkpoint", l.get("live_bytes") == end["reserved"],
      f"ledger {l.get('live_bytes')} vs torch {end['reserved']}")
model = 6 * (256 << 20)
check("the model (made in a deleted file) is unfreed in the ledger",
      sum(u["bytes"] for u in l.get("unfreed", [])) >= model and l.get("unmatched_frees") == 0,
      f"unfreed {sum(u['bytes'] for u in l.get('unfreed', []))} B in {len(l.get('unfreed', []))}, "
      f"unmatched frees {l.get('unmatched_frees')}")
check("the ledger says it covers the deleted files", "no longer in the directory" in json.dumps(doc.get("notes")),
      f"{doc.get('notes')}")
peak = max(p["reserved"] for p in truth["points"])
check("peak >= the largest reserved checkpoint", l.get("peak_bytes", 0) >= peak,
      f"ledger peak {l.get('peak_bytes')} vs torch max checkpoint {peak}")

text = subprocess.run([gs, "memory", "--db", run], capture_output=True, text=True, timeout=300).stdout
open(os.path.join(out, "memory_run.txt"), "w").write(text)
held = l.get("held") or {}
check("NVML's reading before tracing is unknown, not 0 (its file was deleted)",
      held.get("before_trace_bytes") is None and held.get("start_lost") is True,
      f"before_trace_bytes {held.get('before_trace_bytes')}, start_lost {held.get('start_lost')}")
check("the exited program is not compared with NVML's 0 after its exit",
      held.get("exited") is True and held.get("unexplained_change_bytes") is None
      and "NVML after the process exited" in text and "less than the ledger explains" not in text,
      f"exited {held.get('exited')}, unexplained {held.get('unexplained_change_bytes')}")

mem, stats, found, over = mcp(run, [("memory", {}), ("latency_stats", {}), ("findings", {}), ("overview", {})])
m = [p for p in mem["processes"] if p["pid"] == pid] if isinstance(mem, dict) else []
check("MCP memory of the run == the command's", bool(m) and all(m[0][k] == l.get(k) for k in
      ("live_bytes", "peak_bytes", "allocs", "frees", "unmatched_frees")), f"{m[0]['live_bytes'] if m else mem}")
cli_stats, _ = gsjson("stats", "--json", "--db", run)
check("MCP latency_stats of the run == stats --db DIR", isinstance(stats, dict) and stats["ops"] == cli_stats["ops"],
      f"{len(cli_stats['ops'])} ops")
cli_exp, _ = gsjson("explain", "--json", "--db", run)
json.dump(cli_exp, open(os.path.join(out, "explain_run.json"), "w"), indent=1)
check("MCP findings of the run == explain --db DIR",
      isinstance(found, dict) and found["findings"] == cli_exp["findings"],
      f"kinds {[f['kind'] for f in cli_exp['findings']]}")
growth = [f for f in cli_exp["findings"] if f["kind"] == "memory_growth"]
groups = growth[0]["evidence"]["groups"] if growth else []
kept = [g for g in groups if g["bytes"] == 32 << 20]
span_s = growth[0]["evidence"]["span_ns"] / 1e9 if growth else 0
check("memory_growth: the kept 32 MiB tensors, over the time they were made",
      len(kept) == 1 and kept[0]["count"] == truth["kept"] and span_s >= truth["kept"] - 1,
      f"{kept} over {span_s:.1f} s; {growth[0]['summary'] if growth else 'no finding'}")
check("MCP overview lists the kept files", isinstance(over, dict) and len(over["run"]["files"]) == len(files),
      f"{[f['number'] for f in over['run']['files']] if isinstance(over, dict) else over}")
# Round 20: at each checkpoint inside the kept files, the run's memory then
# (MCP `memory {at_ns}`: from the state the file holding it stored when it
# began) equals memory_reserved(), the model made in deleted files included.
at = mcp(run, [("memory", {"at_ns": p["ts_ns"]}) for p in truth["points"]])
inside = []
for p, r in zip(truth["points"], at):
    if isinstance(r, dict):
        mine = [q for q in r["processes"] if q["pid"] == pid]
        inside.append((p["what"], p["reserved"], mine[0]["live_bytes"] if mine else None))
check("memory at_ns at each checkpoint inside the kept files == memory_reserved(), deleted files' model included",
      bool(inside) and all(want == got for _, want, got in inside),
      f"{len(inside)} of {len(truth['points'])} checkpoints inside: "
      + "; ".join(f"{w}: {got} vs {want}" for w, want, got in inside))
if len(sys.argv) > 6:
    one, one_truth = sys.argv[5], json.load(open(sys.argv[6]))
    doc, _ = gsjson("memory", "--json", "--db", one)
    p1 = [p for p in doc["processes"] if p["pid"] == one_truth["pid"]]
    h1 = (p1[0].get("held") or {}) if p1 else {}
    text1 = subprocess.run([gs, "memory", "--db", one], capture_output=True, text=True, timeout=300).stdout
    open(os.path.join(out, "memory_one.txt"), "w").write(text1)
    check("one file: live at exit == memory_reserved() at the last checkpoint",
          bool(p1) and p1[0]["live_bytes"] == one_truth["points"][-1]["reserved"],
          f"ledger {p1[0]['live_bytes'] if p1 else None} vs torch {one_truth['points'][-1]['reserved']}")
    check("one file: the exited program is not compared with NVML's 0 after exit",
          h1.get("exited") is True and h1.get("unexplained_change_bytes") is None
          and "NVML after the process exited" in text1,
          f"held {json.dumps({k: h1.get(k) for k in ('before_trace_bytes', 'at_end_bytes', 'max_bytes', 'exited', 'unexplained_change_bytes')})}")
check.summary()
