"""Checks attach_baseline.sh's results. Usage: attach_check.py DIR PID

Memory: gpusleuth's NVML baseline (memory --json, held.before_trace_bytes) against
nvidia-smi's per-process used memory (MiB) read just before the trace, within 1 MiB
(nvidia-smi's unit), and the workload's torch.cuda.memory_reserved() must be within
the baseline (the rest is the CUDA context and libraries' memory).
GPU busy: gpusleuth's stored samples (gpu_samples) over the trace against the busy share
the workload measured with CUDA events in the same wall-clock window.
"""
import json
import sqlite3
import sys

d, pid = sys.argv[1], int(sys.argv[2])
fails = 0


def check(ok, text):
    global fails
    print(("PASS: " if ok else "FAIL: ") + text)
    fails += 0 if ok else 1


def smi(path):
    for line in open(path):
        try:
            p, mib = [int(x.strip()) for x in line.split(",")]
        except ValueError:
            continue
        if p == pid:
            return mib
    return None


mem = json.load(open(f"{d}/memory.json"))
proc = next((p for p in mem["processes"] if p["pid"] == pid), None)
check(proc is not None, f"memory lists pid {pid}")
held = (proc or {}).get("held") or {}
base = held.get("before_trace_bytes")
smi_before, smi_after = smi(f"{d}/smi_before.csv"), smi(f"{d}/smi_after.csv")
log = [json.loads(l) for l in open(f"{d}/workload.jsonl")]
holding = next(e for e in log if e["kind"] == "holding")
print(
    f"baseline (NVML via gpusleuth) {base} B = {base / 2**20 if base else 0:.1f} MiB; "
    f"nvidia-smi before {smi_before} MiB, after {smi_after} MiB; "
    f"torch reserved {holding['reserved']} B = {holding['reserved'] / 2**20:.1f} MiB, "
    f"allocated {holding['allocated'] / 2**20:.1f} MiB"
)
check(base is not None and smi_before is not None and abs(base / 2**20 - smi_before) <= 1.0,
      "baseline matches nvidia-smi within its 1 MiB granularity")
check(base is not None and holding["reserved"] <= base,
      "torch.cuda.memory_reserved() is within the baseline")
check(held.get("at_end_bytes") is not None and smi_after is not None
      and abs(held["at_end_bytes"] / 2**20 - smi_after) <= 1.0,
      f"NVML at trace end ({held.get('at_end_bytes')} B) matches nvidia-smi after ({smi_after} MiB)")
stats = json.load(open(f"{d}/stats.json"))
print("drops", stats["drops"], "attach_edges", stats["attach_edges"])
check(stats["drops"]["total"] == 0, "no dropped events")
explain = open(f"{d}/explain.txt").read()
check("may be incomplete" not in explain, "no 'incomplete' note")

db = sqlite3.connect(f"file:{d}/attach.db?mode=ro", uri=True)
off = db.execute("SELECT realtime_offset_ns FROM session").fetchone()[0]
samples = db.execute("SELECT ts_ns, busy_pct, period_ns FROM gpu_samples WHERE gpu = 0 ORDER BY ts_ns").fetchall()
check(len(samples) > 0, f"{len(samples)} GPU busy samples stored")
if samples:
    lo = (samples[0][0] - samples[0][2] + off) / 1e9
    hi = (samples[-1][0] + off) / 1e9
    span = sum(p for _, _, p in samples) / 1e9
    tool = sum(b * p for _, b, p in samples) / sum(p for _, _, p in samples)
    # The workload's own busy share in the same wall-clock window [lo, hi].
    gpu_s = 0.0
    for e in log:
        if e["kind"] == "step" and e["t1"] > lo and e["t0"] < hi:
            inside = max(0.0, min(e["t1"], hi) - max(e["t0"], lo)) / max(e["t1"] - e["t0"], 1e-9)
            gpu_s += e["gpu_ms"] / 1000.0 * inside
    own = 100.0 * gpu_s / (hi - lo)
    periods = sorted({p for _, _, p in samples})
    print(f"samples cover {span:.2f} s (periods {periods[:3]} ns); gpusleuth busy {tool:.1f}%, "
          f"workload's CUDA events {own:.1f}% over the same {hi - lo:.2f} s")
    check(abs(tool - own) <= 10.0, f"GPU busy within 10 points of the workload's own ({tool:.1f} vs {own:.1f})")
    result = {"samples": len(samples), "covered_s": span, "gpusleuth_busy_pct": tool,
              "workload_busy_pct": own, "window_s": hi - lo}
else:
    result = {}
result.update({"pid": pid, "baseline_bytes": base, "smi_before_mib": smi_before, "smi_after_mib": smi_after,
               "torch_reserved": holding["reserved"], "torch_allocated": holding["allocated"],
               "at_end_bytes": held.get("at_end_bytes"), "drops": stats["drops"]["total"],
               "attach_edges": stats["attach_edges"]})
json.dump(result, open(f"{d}/result.json", "w"), indent=1)
print(json.dumps(result))
print("SUMMARY:", "all checks passed" if fails == 0 else f"{fails} check(s) failed")
sys.exit(1 if fails else 0)
