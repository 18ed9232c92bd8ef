"""Compares gpusleuth's verdict with each workload's own truth (verdict_run.sh).

    python3 verdict_check.py WORK_DIR OUT_JSON MODE...

Per mode: the first finding (and the first one that is not cpu_preemption),
the expected kind, GPU busy from the workload (steps x GPU time per step /
loop wall time) and from gpusleuth (NVML, when the trace has samples), and for
`workers` whether the wakers named are the DataLoader worker pids.
"""
import json
import os
import re
import sys

EXPECTED = {"starved": "host_bound", "workers": "input_wait", "launch": "launch_bound",
            "item": "sync_stall", "pageable": "pageable_copy", "healthy": None,
            "item_full": "sync_stall", "queued": None, "queued_full": None}
GPU_PER_STEP = {"starved": "loader_step_gpu_s", "workers": "loader_step_gpu_s",
                "launch": "launch_1000_gpu_s", "item": "item_step_gpu_s", "healthy": "healthy_step_gpu_s",
                "item_full": "item_step_gpu_s", "queued": "item_step_gpu_s", "queued_full": "item_step_gpu_s"}


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    work, out_path, modes = sys.argv[1], sys.argv[2], sys.argv[3:]
    measure = load(os.path.join(work, "measure.json"))
    rows, full = [], {"measure": measure, "modes": {}}
    for m in modes:
        truth = load(os.path.join(work, f"{m}.json"))
        ex = load(os.path.join(work, f"{m}.explain.json"))
        findings = ex.get("findings", [])
        first = findings[0]["kind"] if findings else None
        verdict = next((f for f in findings if f["kind"] != "cpu_preemption"), None)
        key = GPU_PER_STEP.get(m)
        busy_truth = truth["steps"] * measure[key] / truth["loop_wall_s"] if key else None
        busy_tool = None
        if verdict and verdict["evidence"].get("gpu_busy"):
            busy_tool = verdict["evidence"]["gpu_busy"]["busy"]
        elif ex.get("summary"):
            # No verdict: the summary line carries GPU busy over the main thread's window.
            hit = re.match(r"GPU busy (\d+)%", ex["summary"])
            busy_tool = int(hit.group(1)) / 100 if hit else None
        expected = EXPECTED[m]
        ok = (verdict is None) if expected is None else (verdict is not None and verdict["kind"] == expected)
        row = {"mode": m, "expected": expected, "verdict": verdict["kind"] if verdict else None,
               "first_finding": first, "verdict_share": verdict.get("wall_share") if verdict else None,
               "summary": ex.get("summary"), "gpu_busy_truth": busy_truth, "gpu_busy_tool": busy_tool,
               "match": ok, "findings": [f["kind"] for f in findings]}
        if m == "workers":
            try:
                pids = sorted({int(x) for x in open(os.path.join(work, "workers.workers")).read().split()})
            except OSError:
                pids = []
            named = [c["pid"] for c in (verdict or {}).get("culprits", [])]
            row["worker_pids"] = pids
            row["wakers_named"] = named
            row["wakers_are_workers"] = bool(named) and all(p in pids for p in named[:2])
        rows.append(row)
        full["modes"][m] = {"truth": truth, "explain": ex, "row": row}
    with open(out_path, "w") as f:
        json.dump(full, f, indent=1)
    print("== summary")
    for r in rows:
        bt = "-" if r["gpu_busy_truth"] is None else f"{r['gpu_busy_truth']*100:.0f}%"
        bg = "not measured" if r["gpu_busy_tool"] is None else f"{r['gpu_busy_tool']*100:.0f}%"
        share = "" if r["verdict_share"] is None else f" ({r['verdict_share']*100:.0f}% of wall)"
        extra = f" wakers={r['wakers_named']} workers={r['worker_pids']}" if r["mode"] == "workers" else ""
        print(f"{r['mode']:9} expected={r['expected']} verdict={r['verdict']}{share} first={r['first_finding']} "
              f"gpu_busy truth={bt} gpusleuth={bg} {'OK' if r['match'] else 'MISMATCH'}{extra}")


if __name__ == "__main__":
    main()
