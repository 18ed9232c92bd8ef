#!/usr/bin/env python3
"""Merges env.json, checks.json and bench.json into OUT/results.json and OUT/summary.txt.

Prints the summary, ending with one PASS/FAIL line (FAIL when any check failed).

  report.py --work DIR --out OUTDIR
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gslib import read_jsonl  # noqa: E402


def load(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def med(xs):
    xs = [x for x in (xs or []) if x is not None]
    return statistics.median(xs) if xs else None


def launch_reproducibility(checks, bench):
    """Independent-ish confirmation for (a): every traced generate run counts the same driver launches."""
    counts = []
    s1 = checks.get("s1_default", {})
    for c in s1.get("checks", []):
        if c["name"].startswith("launch counts") and c.get("data", {}).get("launches"):
            la = c["data"]["launches"]
            counts.append(("s1_default", (la.get("cuLaunchKernel") or 0) + (la.get("cuLaunchKernelEx") or 0)))
    for r in bench.get("runs", []):
        if r.get("bench") == "generate" and r.get("mode") in ("driver", "all") and r.get("db_facts"):
            counts.append((f"bench {r['mode']} rep {r['rep']}", r["db_facts"].get("driver_launches")))
    if len(counts) < 2:
        return None
    vals = {v for _, v in counts}
    return {"name": "generate: driver launch count identical across traced runs (same deterministic workload)",
            "ok": len(vals) == 1, "detail": ", ".join(f"{k}={v}" for k, v in counts)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    env = load(os.path.join(a.work, "env.json"), {})
    checks = load(os.path.join(a.work, "checks.json"), {})
    bench = load(os.path.join(a.work, "bench.json"), {})
    runs = read_jsonl(os.path.join(a.work, "runs.jsonl"))

    all_checks = []
    for scen, res in checks.items():
        for c in res.get("checks", []):
            all_checks.append((scen, c))
    for c in bench.get("checks", []):
        all_checks.append(("bench", c))
    rep = launch_reproducibility(checks, bench)
    if rep:
        all_checks.append(("bench", rep))

    lines = []
    p = lines.append
    p("gpusleuth on the GPU machine (issues 7 and 8)")
    for k in ("date", "gpu", "driver", "kernel", "torch", "torch_cuda", "transformers", "gpusleuth", "python"):
        if env.get(k):
            p(f"  {k:12s} {env[k]}")
    p("")
    p("Scenario runs:")
    for r in runs:
        extra = ""
        if r.get("gs_cpu_user_s") is not None:
            extra = (f"  gpusleuth cpu {r['gs_cpu_user_s'] + r['gs_cpu_sys_s']:.2f}s"
                     f" peak rss {(r.get('gs_peak_rss_kb') or 0) / 1024:.1f} MB")
        p(f"  {r['name']:16s} rc={r['rc']} wall={r['wall_s']:.1f}s{extra}")
    p("")
    p("Checks:")
    for scen, c in all_checks:
        tag = {True: "PASS", False: "FAIL", None: "UNVERIFIED"}[c.get("ok")]
        p(f"  [{tag:10s}] {scen}: {c['name']}: {str(c.get('detail'))[:400]}")
    for scen in ("s1_default", "s1_expandable"):
        res = checks.get(scen, {})
        if res.get("ledger_rows"):
            p("")
            p(f"{scen} ({res.get('alloc_conf') or 'default allocator'}): ledger at each checkpoint (bytes)")
            p(f"  {'checkpoint':32s} {'allocated':>12s} {'reserved':>12s} {'gap':>10s} {'trace':>12s} {'gpusleuth':>12s}")
            for r in res["ledger_rows"]:
                p(f"  {r['label']:32s} {r['allocated']:>12} {r['reserved']:>12} {r['reserved'] - r['allocated']:>10} "
                  f"{r['runtime_live'] + r['vmm_live']:>12} {str(r.get('gpusleuth_live_bytes')):>12s}")
        for g in res.get("gap_breakdown", [])[-1:]:
            p(f"  gap at '{g['label']}': {g['gap']} B over {g['segments']} segments "
              f"(sum of segment gaps {g['sum_of_segment_gaps']}); small pool {g['small_pool']}, large pool "
              f"{g['large_pool']}, rounding {g['rounding_bytes']}")
            for s in g["top_segments"][:3]:
                p(f"    segment {s['total']} B ({s['pool']}): {s['gap']} B free, live blocks {s['live_blocks']} "
                  f"{s['live_block_sizes']}")
    b = bench.get("benches", {})
    if b:
        p("")
        p(f"Overhead (median of reps; probe cost from (c): {bench.get('probe_ns')} ns per hit)")
        p(f"  {'workload':9s} {'mode':9s} {'median s':>9s} {'ratio':>7s} {'ovh %':>7s} {'traps/l':>7s} "
          f"{'events/s':>9s} {'drops':>6s} {'gs cpu s':>8s} {'gs rss MB':>9s}")
        for name, s in b.items():
            for mode, m in s["modes"].items():
                rss = med(m.get("gs_peak_rss_kb"))
                p(f"  {name:9s} {mode:9s} {fmt(m.get('median_s'), '9.4f')} {fmt(m.get('ratio'), '7.4f')} "
                  f"{fmt(m.get('overhead_pct'), '+7.2f')} {fmt(m.get('traps_per_launch'), '7.3f')} "
                  f"{fmt(med(m.get('events_per_s')), '9.0f')} {fmt(max(m.get('drops') or [0], key=lambda x: x or 0), '6')} "
                  f"{fmt(med(m.get('gs_cpu_s')), '8.3f')} {fmt(rss / 1024 if rss else None, '9.1f')}")
        if bench.get("skipped"):
            p(f"  skipped for time: {', '.join(bench['skipped'])}")
    n_pass = sum(1 for _, c in all_checks if c.get("ok") is True)
    n_fail = sum(1 for _, c in all_checks if c.get("ok") is False)
    n_unv = sum(1 for _, c in all_checks if c.get("ok") is None)
    p("")
    for scen in list(checks) + ["bench"]:
        cs = [c for s, c in all_checks if s == scen]
        if cs:
            f = sum(1 for c in cs if c.get("ok") is False)
            ok = sum(1 for c in cs if c.get("ok"))
            p(f"  {scen:14s} {'FAIL' if f else ('PASS' if ok else 'INCOMPLETE')}  ({sum(1 for c in cs if c.get('ok'))} pass, {f} fail, "
              f"{sum(1 for c in cs if c.get('ok') is None)} unverified)")
    verdict = "FAIL" if n_fail or not all_checks else "PASS"
    p(f"RESULT: {verdict} ({n_pass} pass, {n_fail} fail, {n_unv} unverified)")
    text = "\n".join(lines) + "\n"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write(text)
    results = {"env": env, "runs": runs, "checks": checks,
               "bench": {k: v for k, v in bench.items() if k != "runs"},
               "verdict": {"result": verdict, "pass": n_pass, "fail": n_fail, "unverified": n_unv}}
    if rep:
        results["bench"]["reproducibility"] = rep
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
