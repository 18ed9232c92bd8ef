#!/usr/bin/env python3
"""Overhead claims that hold (issue 16): interleaved repetitions with intervals.

  scripts/gpu/overhead_reps.py ./gpusleuth        (as root, on the GPU machine)

Workloads (each times its own steady section, process start-up excluded):
  generate  bench_generate.py: the seed generate() workload      modes: untraced, traced (--launches driver)
  train     bench_train.py --steps N: the training loop           modes: untraced, traced (--launches driver)
  launch    bench_launch.py --launches N: x.add_(1) launch loop    modes: untraced, driver, all

Every repetition runs every workload in every mode, the mode order rotating
per repetition, so drift hits all modes alike. Per workload and repetition
the ratio is traced / untraced of the same repetition (a paired design).

Reported per workload: the median ratio, its spread (min..max) and a 95%
interval of the ratio: a t-interval on the log ratios (mean +- t(0.975,n-1)
* sd/sqrt(n)), exponentiated. A target counts as met only when the interval's
upper bound is under it: train overhead <= 0.5% (ratio upper bound < 1.005);
launch loop <= 1.1 traps per launch, where per repetition
  probe = (t[all] - t[driver]) / launches   ('all' adds one probe per runtime launch)
  traps = (t[driver] - t[untraced]) / launches / probe
and the interval is a t-interval on the per-repetition traps. That estimate
is a cost, and on the H200 it is noise-limited (the untraced loop alone varies
by 15% between runs). The traps themselves are also counted exactly: each
traced launch run's own trace gives every probed op's count, an op recorded
per call costing two traps (entry and return uprobes) and one counted in the
kernel one (entry only); divided by all add_ launches of the process (warm-up
and start-up calls included, so an upper bound per timed launch). The target
is judged on that count, the estimate is printed beside it.

Settings (environment): GS_PY (default /opt/torch/.venv/bin/python3), OUT
(results directory, default /tmp/gs-overhead), GS_REPS (default 5),
GS_BUDGET_S (default 330: a run that would end later is skipped and the
workload reports the repetitions it completed; fewer than 5 is "not assessed"),
GS_TRAIN_STEPS (default 40), GS_LAUNCHES (default 100000), GS_WORKLOADS (a comma list
of the workloads to run, default generate,train,launch: e.g. launch,train to spend a
budget on the launch loop's traps with more launches per repetition).
Writes $OUT/overhead_reps.json and $OUT/overhead_reps.log; the summary is printed last.
"""

import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gsrun  # noqa: E402

# Two-sided 95% critical values of Student's t by degrees of freedom.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
        18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}
MIN_REPS = 5


def t975(df):
    if df in T975:
        return T975[df]
    below = [k for k in T975 if k <= df]
    return T975[max(below)] if below else T975[1]


def t_interval(xs):
    """(mean, low, high) of a 95% t-interval, or None for fewer than 2 values."""
    if len(xs) < 2:
        return None
    m = statistics.mean(xs)
    h = t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - h, m + h


def find_cuda_libs(py, work):
    """The libcudart/libcuda files PyTorch really maps (probed before the first CUDA call)."""
    code = ("import os, torch\ntorch.zeros(1, device='cuda')\n"
            "for line in open('/proc/self/maps'):\n"
            "    p = line.split()[-1]\n"
            "    if os.path.basename(p).startswith(('libcudart.so', 'libcuda.so')): print(os.path.realpath(p))\n")
    r = gsrun.run("find_libs", [py, "-c", code], work, timeout=120)
    try:
        with open(r["stdout"]) as f:
            return sorted({line.strip() for line in f if line.strip()})
    except OSError:
        return []


def count_traps(gs, db, work, tag):
    """The probe traps the trace itself counted: an op recorded per call costs
    two (its entry uprobe and its return uprobe), an op counted in the kernel
    one (entry only). Exact, unlike the wall-time estimate; it covers the whole
    process (start-up and warm-up included), so per timed launch it is an
    upper bound."""
    r = gsrun.run(tag + "_stats", [gs, "stats", "--json", "--db", db], work, timeout=120)
    try:
        with open(r["stdout"]) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    traps, by_op = 0, {}
    for op in doc.get("ops", []):
        per = 1 if op.get("measured") == "counted" else 2
        n = int(op.get("count") or 0)
        traps += per * n
        by_op[op.get("op")] = {"count": n, "traps_per_call": per}
    return {"traps": traps, "ops": by_op, "drops": doc.get("drops")}


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print(__doc__)
        sys.exit(2)
    gs = os.path.abspath(sys.argv[1])
    if not os.access(gs, os.X_OK):
        sys.exit(f"overhead_reps: {gs} is not an executable gpusleuth binary")
    py = os.environ.get("GS_PY", "/opt/torch/.venv/bin/python3")
    out = os.environ.get("OUT") or "/tmp/gs-overhead"
    work = os.path.join(out, "work")
    os.makedirs(work, exist_ok=True)
    reps = int(os.environ.get("GS_REPS", "5"))
    budget = float(os.environ.get("GS_BUDGET_S", "330"))
    steps = os.environ.get("GS_TRAIN_STEPS", "40")
    launches = int(os.environ.get("GS_LAUNCHES", "100000"))
    t_end = time.time() + budget
    libs = find_cuda_libs(py, work)
    gsrun.log(f"gpusleuth {gs}; CUDA libraries: {libs or 'none found (gpusleuth discovers them)'}")
    benches = {
        "launch": ([py, os.path.join(HERE, "bench_launch.py"), "--launches", str(launches)],
                   ["untraced", "driver", "all"]),
        "train": ([py, os.path.join(HERE, "bench_train.py"), "--steps", steps], ["untraced", "driver"]),
        "generate": ([py, os.path.join(HERE, "bench_generate.py")], ["untraced", "driver"]),
        # No CUDA at all: the tracer's own footprint (attach, symbols, ring buffer) for RSS.
        "idle": (["sleep", "5"], ["driver"]),
    }
    wanted = [w for w in os.environ.get("GS_WORKLOADS", "generate,train,launch,idle").split(",") if w]
    unknown = [w for w in wanted if w not in benches]
    if unknown:
        sys.exit(f"overhead_reps: unknown workload(s) {unknown}: choose from {sorted(benches)}")
    benches = {k: v for k, v in benches.items() if k in wanted}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    walls = {name: {} for name in ("generate", "train", "launch")}  # name -> rep -> mode -> wall_s
    took = {}  # name -> longest process time seen, for the budget
    runs, skipped = [], []
    for rep in range(reps):
        for name, (cmd, modes) in benches.items():
            k = rep % len(modes)
            for mode in modes[k:] + modes[:k]:
                tag = f"{name}_{mode}_{rep}"
                if time.time() + took.get(name, 60) * 1.2 > t_end:
                    skipped.append(tag)
                    gsrun.log(f"{tag}: skipped (budget)")
                    continue
                if mode == "untraced":
                    r = gsrun.run(tag, cmd, work, env=env, timeout=240)
                else:
                    db = os.path.join(work, tag + ".db")
                    r = gsrun.run(tag, cmd, work, env=env, timeout=240, gs=gs, db=db, launches=mode,
                                  cuda_libs=libs)
                    if name == "launch" and r["rc"] == 0:
                        r["traps"] = count_traps(gs, db, work, tag)
                    try:
                        os.remove(db)  # only the timings matter here; keep $OUT small
                    except OSError:
                        pass
                took[name] = max(took.get(name, 0), r["wall_s"])
                w = (r.get("result") or {}).get("wall_s")
                gsrun.log(f"{tag}: rc={r['rc']} timed={w}s process={r['wall_s']:.1f}s"
                          + (f" tracer_cpu={(r.get('gs_cpu_user_s') or 0) + (r.get('gs_cpu_sys_s') or 0):.2f}s"
                             f" tracer_rss={r.get('gs_peak_rss_kb')}kB split_max={r.get('gs_rss_split_max_kb')}"
                         if r.get("traced") else "")
                         + (f" traps={r['traps']['traps']}" if r.get("traps") else ""))
                if r["rc"] != 0:
                    sys.stdout.write(gsrun.stderr_tail(r["stderr"]))
                elif w:
                    walls[name].setdefault(rep, {})[mode] = w
                runs.append({k: v for k, v in r.items() if k != "argv"}
                            | {"bench": name, "mode": mode, "rep": rep,
                               "result_launches": (r.get("result") or {}).get("add_launches_total")})

    summary = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpusleuth": gs, "reps_asked": reps,
               "train_steps": int(steps), "launches": launches, "skipped": skipped, "workloads": {}}
    lines = []
    for name in ("generate", "train"):
        if name not in benches:
            continue
        ratios = [m["driver"] / m["untraced"] for m in walls[name].values()
                  if m.get("driver") and m.get("untraced")]
        s = {"n": len(ratios), "ratios": [round(x, 5) for x in ratios]}
        if ratios:
            s["median_ratio"] = statistics.median(ratios)
            s["min"], s["max"] = min(ratios), max(ratios)
        ci = t_interval([math.log(x) for x in ratios])
        if ci:
            s["ci95"] = [math.exp(ci[1]), math.exp(ci[2])]
        if name == "train":
            if len(ratios) < MIN_REPS or not ci:
                s["target"] = f"not assessed ({len(ratios)} < {MIN_REPS} paired reps)"
            else:
                s["target"] = "met" if s["ci95"][1] < 1.005 else "not met"
        summary["workloads"][name] = s
        if ratios:
            lines.append(f"{name:9s} n={len(ratios)} median ratio {s['median_ratio']:.4f} "
                         f"(spread {s['min']:.4f}..{s['max']:.4f})"
                         + (f", 95% CI [{s['ci95'][0]:.4f}, {s['ci95'][1]:.4f}]" if ci else "")
                         + (f"; target <= 0.5%: {s['target']}" if name == "train" else ""))
        else:
            lines.append(f"{name:9s} no complete repetition")
    traps = []
    for m in walls["launch"].values() if "launch" in benches else []:
        if all(m.get(k) for k in ("untraced", "driver", "all")) and m["all"] > m["driver"]:
            traps.append((m["driver"] - m["untraced"]) / (m["all"] - m["driver"]))
    probes_ns = [1e9 * (m["all"] - m["driver"]) / launches for m in walls["launch"].values()
                 if m.get("all") and m.get("driver")]
    s = {"n": len(traps), "traps_per_launch": [round(x, 4) for x in traps],
         "probe_ns": [round(x, 1) for x in probes_ns]}
    ci = t_interval(traps)
    if traps:
        s["median"] = statistics.median(traps)
        s["min"], s["max"] = min(traps), max(traps)
    if ci:
        s["ci95"] = [ci[1], ci[2]]
    s["target"] = (f"not assessed ({len(traps)} < {MIN_REPS} reps)" if len(traps) < MIN_REPS or not ci
                   else ("met" if s["ci95"][1] <= 1.1 else "not met"))
    exact = []
    for r in runs:
        if r["bench"] == "launch" and r["mode"] == "driver" and r.get("traps"):
            total = int(r.get("result_launches") or 0)
            if total:
                exact.append(r["traps"]["traps"] / total)
    if exact:
        s["exact_traps_per_launch"] = [round(x, 4) for x in exact]
        s["exact_target"] = "met" if max(exact) <= 1.1 else "not met"
    summary["workloads"]["launch"] = s
    if exact:
        lines.append(f"launch    exact traps per launch (counted by the trace, whole process / all add_ launches, "
                     f"driver mode): n={len(exact)} min {min(exact):.4f} max {max(exact):.4f}; "
                     f"target <= 1.1: {s['exact_target']}")
    if "launch" not in benches:
        pass
    elif traps:
        lines.append(f"launch    wall-time estimate (a cost, noise-limited): n={len(traps)} traps/launch median {s['median']:.3f} "
                     f"(spread {s['min']:.3f}..{s['max']:.3f})"
                     + (f", 95% CI [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]" if ci else "")
                     + f"; probe {statistics.median(probes_ns):.0f} ns; target <= 1.1: {s['target']}")
    else:
        lines.append("launch    no complete repetition")
    rss, parts = {}, {}
    for r in runs:
        if r.get("traced") and r.get("gs_peak_rss_kb"):
            rss.setdefault(r["bench"], []).append(int(r["gs_peak_rss_kb"]))
            for k, v in (r.get("gs_rss_split_max_kb") or {}).items():
                parts.setdefault(r["bench"], {}).setdefault(k, []).append(v)
    for name, kbs in sorted(rss.items()):
        split = ", ".join(f"{k} max {max(v) / 1024:.1f}" for k, v in sorted(parts.get(name, {}).items()))
        lines.append(f"tracer peak RSS ({name}): median {statistics.median(kbs) / 1024:.1f} MiB, "
                     f"max {max(kbs) / 1024:.1f} MiB over {len(kbs)} traced runs ({split} MiB)")
    summary["tracer_peak_rss_kb"] = rss
    summary["runs"] = runs
    with open(os.path.join(out, "overhead_reps.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    with open(os.path.join(out, "overhead_reps.log"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if skipped:
        print(f"skipped (budget): {', '.join(skipped)}")
    print("SUMMARY (traced/untraced per repetition, paired):")
    print("\n".join("  " + line for line in lines))


if __name__ == "__main__":
    main()
