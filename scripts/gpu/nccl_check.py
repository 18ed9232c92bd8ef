"""Issue 17 acceptance check: does gpusleuth's straggler finding name the
slowed rank, its pid and "input" as the cause, and does its lateness agree
within 10% with the lateness the ranks measured themselves?

Usage: nccl_check.py EXPLAIN_JSON TRACE_DB RANK0_JSONL RANK1_JSONL
Prints a summary; exit 0 when every check passes.

Truth: per collective each rank logged (barriers, per-step all-reduces), the
slow rank's lateness is its time minus the other rank's, counted (like
gpusleuth) when it was last by at least 1 ms. gpusleuth's own per-step
entries are also read from the trace (the k-th ncclAllReduce of each pid
after its logged time) to compare step by step.
"""
import json
import sqlite3
import sys

MIN_NS = 1_000_000


def load(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def main():
    explain, db, r0, r1 = sys.argv[1:5]
    logs = {0: load(r0), 1: load(r1)}
    pids = {r: logs[r][0]["pid"] for r in logs}
    report = json.load(open(explain))
    found = [f for f in report["findings"] if f["kind"] == "straggler"]
    ok = True
    lines = []
    if not found:
        print("FAIL: no straggler finding")
        for f in report["findings"]:
            print(" ", f["kind"], f["summary"])
        return 1
    f = found[0]
    e = f["evidence"]
    slow = max(logs, key=lambda r: sum(
        max(0, a["t_ns"] - b["t_ns"]) for a, b in zip(logs[r], logs[1 - r])))
    # Truth over every collective the ranks logged.
    truth = 0
    per_step = []
    for a, b in zip(logs[slow], logs[1 - slow]):
        late = a["t_ns"] - b["t_ns"]
        if late >= MIN_NS:
            truth += late
        # Barriers are all-reduces under NCCL too: every logged collective is compared.
        per_step.append((a["step"], late, a["t_ns"], b["t_ns"]))
    got = e["lateness_ns"]
    err = (got - truth) / truth if truth else float("inf")
    checks = [
        ("rank", e["rank"] == slow, f"finding rank {e['rank']}, slowed rank {slow}"),
        ("pid", e["pid"] == pids[slow], f"finding pid {e['pid']}, slowed rank's pid {pids[slow]}"),
        ("cause", e["cause"] == "input_wait", f"cause {e['cause']}"),
    ]
    # The finding's total against the logged total: informational (different sets).
    lines.append(f"finding total {got / 1e6:.1f} ms vs ranks' own {truth / 1e6:.1f} ms "
                 f"({err * 100:+.1f}%), over all matched collectives")
    # Step by step: gpusleuth's ncclAllReduce entries nearest after each logged hook time.
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    entries = {}
    for r, pid in pids.items():
        entries[r] = [t for (t,) in con.execute(
            "SELECT ts_ns FROM calls WHERE op='ncclAllReduce' AND pid=? ORDER BY ts_ns", (pid,))]
    diffs = []
    traced_on_logged = 0
    for step, late, ts_slow, ts_fast in per_step:
        def after(r, t):
            c = [x for x in entries[r] if t <= x < t + 50_000_000]
            return c[0] if c else None
        a, b = after(slow, ts_slow), after(1 - slow, ts_fast)
        if a is not None and b is not None:
            diffs.append(((a - b) - late) / 1e6)
            if a - b >= MIN_NS:
                traced_on_logged += a - b
    if diffs:
        diffs.sort()
        lines.append(f"per step ({len(diffs)} steps): traced lateness - logged lateness: "
                     f"median {diffs[len(diffs) // 2]:+.3f} ms, max |.| {max(abs(d) for d in diffs):.3f} ms")
    # Like with like: gpusleuth's lateness on the collectives the ranks logged.
    # The finding's total also counts collectives the workload cannot log (DDP's
    # own broadcasts and all-gather while it is constructed).
    err2 = (traced_on_logged - truth) / truth if truth else float("inf")
    checks.append(("logged", len(diffs) == len(per_step) and abs(err2) <= 0.10,
                   f"traced lateness on the {len(diffs)} of {len(per_step)} logged collectives "
                   f"{traced_on_logged / 1e6:.1f} ms vs ranks' own {truth / 1e6:.1f} ms ({err2 * 100:+.1f}%)"))
    unlogged = e.get("matched_collectives", 0) - len(per_step)
    lines.append(f"the finding matched {e.get('matched_collectives')} collectives, "
                 f"{unlogged} more than the ranks logged; worst: {e.get('worst_collectives')}")
    split = e["thread"]
    lines.append("straggler thread split (ms): " + ", ".join(
        f"{k[:-3]} {split[k] / 1e6:.1f}" for k in
        ["host_compute_ns", "input_wait_ns", "preemption_ns", "gpu_wait_ns", "window_ns"]))
    print("finding:", f["summary"])
    for name, passed, detail in checks:
        ok &= passed
        print(f"{'ok  ' if passed else 'FAIL'} {name:<9} {detail}")
    for line in lines:
        print("     ", line)
    print("verdict:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
