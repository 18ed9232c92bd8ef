#!/usr/bin/env python3
"""Overhead benchmarks of issue 7: each workload untraced and traced, interleaved.

Workloads: (a) generate (bench_generate.py), (b) train (bench_train.py),
(c) launch (bench_launch.py). Modes: untraced, traced with the default
`--launches driver`, and per workload `off` (no launch probes: the mode that
does not trap every launch) and `all` (one more probe per runtime launch,
which gives the cost of one probe hit on this machine).

Per repetition the mode order rotates, so no mode always runs first. Each
workload times its own steady section (process start-up excluded) and
prints it as JSON; this script also records gpusleuth's own CPU time and peak
RSS, events stored, drops and launch counts. A run that would end after
--deadline (epoch seconds) is skipped and listed as skipped.

Derived numbers:
  probe_ns   = (t[all] - t[driver]) / cudaLaunchKernel count   on (c): one extra entry probe per launch
  extra_ns   = (t[mode] - t[untraced]) / driver launches         per workload and mode
  traps/launch = extra_ns / probe_ns

  bench.py --work DIR --gs target/release/gpusleuth --py PYTHON [--reps 2] [--deadline EPOCH] [--cuda-lib P ...]
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gsrun  # noqa: E402
from gslib import Trace, file_size  # noqa: E402

BENCHES = {
    # name: (script, modes, rough seconds per run including start-up, for the deadline)
    "launch": ("bench_launch.py", ["untraced", "driver", "all", "off"], 12),
    "generate": ("bench_generate.py", ["untraced", "driver", "off"], 30),
    "train": ("bench_train.py", ["untraced", "driver"], 35),
}


def db_facts(db, pid):
    """Launch counts, events and drops of one traced bench run."""
    try:
        tr = Trace(db)
        st = tr.stats_table()
        counted = tr.op_counts(pid) if pid else tr.op_counts()
        recorded = tr.call_counts(pid) if pid else tr.call_counts()
    except Exception as e:
        return {"error": str(e)}
    launches = {op: counted.get(op, recorded.get(op, 0)) for op in ("cudaLaunchKernel", "cuLaunchKernel",
                                                                    "cuLaunchKernelEx")}
    return {
        "launches": launches,
        "driver_launches": launches["cuLaunchKernel"] + launches["cuLaunchKernelEx"],
        "events": sum(st.get(k, 0) for k in ("events_call", "events_wait", "events_proc")),
        "drops": sum(v for k, v in st.items() if k.startswith("drop_")),
        "db_bytes": file_size(db),
    }


def median(xs):
    return statistics.median(xs) if xs else None


def summarize(runs):
    out = {}
    for name in BENCHES:
        per = {}
        for r in runs:
            if r["bench"] != name or r.get("rc") != 0 or not r.get("result"):
                continue
            per.setdefault(r["mode"], []).append(r)
        if not per:
            continue
        s = {"modes": {}}
        base = median([r["result"]["wall_s"] for r in per.get("untraced", [])])
        for mode, rs in per.items():
            walls = [r["result"]["wall_s"] for r in rs]
            m = {"wall_s": walls, "median_s": median(walls)}
            if mode != "untraced":
                m["ratio"] = m["median_s"] / base if base else None
                m["overhead_pct"] = 100 * (m["ratio"] - 1) if m["ratio"] else None
                facts = [r.get("db_facts", {}) for r in rs]
                m["driver_launches"] = [f.get("driver_launches") for f in facts]
                m["runtime_launches"] = [f.get("launches", {}).get("cudaLaunchKernel") for f in facts]
                m["drops"] = [f.get("drops") for f in facts]
                m["events"] = [f.get("events") for f in facts]
                m["events_per_s"] = [round(f.get("events", 0) / r["wall_s"], 1) if f.get("events") is not None else None
                                     for f, r in zip(facts, rs)]
                m["gs_cpu_s"] = [round((r.get("gs_cpu_user_s") or 0) + (r.get("gs_cpu_sys_s") or 0), 3) for r in rs]
                m["gs_cpu_share_of_wall"] = [round(c / r["wall_s"], 4) for c, r in zip(m["gs_cpu_s"], rs)]
                m["gs_peak_rss_kb"] = [r.get("gs_peak_rss_kb") for r in rs]
                m["db_bytes"] = [f.get("db_bytes") for f in facts]
            s["modes"][mode] = m
        out[name] = s
    # The cost of one probe hit, from (c): 'all' adds exactly one counted entry probe per runtime launch.
    probe_ns = None
    lm = out.get("launch", {}).get("modes", {})
    if "all" in lm and "driver" in lm:
        n = median([x for x in lm["all"].get("runtime_launches", []) if x])
        if n:
            probe_ns = 1e9 * (lm["all"]["median_s"] - lm["driver"]["median_s"]) / n
    for name, s in out.items():
        base = s["modes"].get("untraced", {}).get("median_s")
        for mode, m in s["modes"].items():
            if mode == "untraced" or base is None:
                continue
            # Launch counts come from the traced runs themselves; 'off' counts none, so borrow driver's.
            nl = median([x for x in m.get("driver_launches", []) if x]) or median(
                [x for x in s["modes"].get("driver", {}).get("driver_launches", []) if x])
            if nl:
                m["extra_ns_per_launch"] = round(1e9 * (m["median_s"] - base) / nl, 1)
                if probe_ns and probe_ns > 0:
                    m["traps_per_launch"] = round(m["extra_ns_per_launch"] / probe_ns, 3)
    return {"probe_ns": round(probe_ns, 1) if probe_ns else None, "benches": out}


def launch_count_check(runs):
    """(c) issues a known number of add_ launches: the counts must cover exactly those (+ a few setup kernels)."""
    checks = []
    for r in runs:
        if r["bench"] != "launch" or r["mode"] not in ("driver", "all") or not r.get("result"):
            continue
        adds = r["result"].get("add_launches_total")
        la = r.get("db_facts", {}).get("launches", {})
        for op in (("cudaLaunchKernel", "cuLaunchKernel") if r["mode"] == "all" else ("cuLaunchKernel",)):
            n = la.get(op)
            ok = n is not None and adds is not None and adds <= n <= adds + 8
            checks.append({"name": f"bench launch ({r['mode']}, rep {r['rep']}): {op} count covers the {adds} add_ "
                                   f"launches (+ <= 8 setup kernels)", "ok": ok, "detail": f"{op}={n}"})
    return checks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--gs", required=True)
    ap.add_argument("--py", default=sys.executable)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--deadline", type=float, default=None, help="epoch seconds; later runs are skipped")
    ap.add_argument("--only", default=",".join(BENCHES), help="comma-separated subset of " + ",".join(BENCHES))
    ap.add_argument("--cuda-lib", action="append", default=[])
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n in BENCHES]
    runs, skipped = [], []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for rep in range(a.reps):
        for name in names:
            script, modes, est = BENCHES[name]
            k = rep % len(modes)
            for mode in modes[k:] + modes[:k]:
                tag = f"bench_{name}_{mode}_{rep}"
                if a.deadline and time.time() + est > a.deadline:
                    skipped.append(tag)
                    gsrun.log(f"{tag}: skipped (deadline)")
                    continue
                cmd = [a.py, os.path.join(HERE, script)]
                if mode == "untraced":
                    r = gsrun.run(tag, cmd, a.work, env=env, timeout=est * 4)
                else:
                    db = os.path.join(a.work, tag + ".db")
                    r = gsrun.run(tag, cmd, a.work, env=env, timeout=est * 4, gs=a.gs, db=db, launches=mode,
                                  cuda_libs=a.cuda_lib)
                    r["db_facts"] = db_facts(db, (r.get("result") or {}).get("pid"))
                r.update({"bench": name, "mode": mode, "rep": rep})
                runs.append(r)
                w = (r.get("result") or {}).get("wall_s")
                extra = ""
                if "db_facts" in r:
                    f = r["db_facts"]
                    extra = f" launches={f.get('driver_launches')} events={f.get('events')} drops={f.get('drops')}"
                gsrun.log(f"{tag}: rc={r['rc']} timed={w}s process={r['wall_s']:.1f}s{extra}")
                if r["rc"] != 0:
                    sys.stdout.write(gsrun.stderr_tail(r["stderr"]))
    summary = summarize(runs)
    summary["skipped"] = skipped
    summary["checks"] = launch_count_check(runs)
    summary["runs"] = [{k: v for k, v in r.items() if k not in ("argv",)} for r in runs]
    with open(os.path.join(a.work, "bench.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    print(f"probe cost (one hit, from (c)): {summary['probe_ns']} ns")
    for name, s in summary["benches"].items():
        for mode, m in s["modes"].items():
            print(f"  {name:9s} {mode:9s} median {m['median_s']:.4f}s"
                  + (f"  ratio {m['ratio']:.4f} ({m['overhead_pct']:+.2f}%)" if m.get("ratio") else "")
                  + (f"  traps/launch {m['traps_per_launch']}" if m.get("traps_per_launch") is not None else ""))
    for c in summary["checks"]:
        print(f"  [{'PASS' if c['ok'] else 'FAIL':10s}] {c['name']}: {c['detail']}")


if __name__ == "__main__":
    main()
