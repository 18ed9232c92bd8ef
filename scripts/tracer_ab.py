#!/usr/bin/env python3
"""Tracer CPU per added event of two (or more) builds, interleaved (A B A B
...), so that all see the same machine load: `bench --footprint-only` (a flood of N
and 4N launches with placement on; needs root and eBPF) per build and rep,
reduced to poller, writer and completion µs per added event (4N run minus
N run, over the added events), then the median and range per build; with
builds since round 12 also the poller's and writer's kernel time and the
writer's time inside its commits.

A build may carry `@CPUS` (`target/release/gpusleuth@0,1`): that variant
runs under `taskset -c CPUS` (the bench pins its workload to CPU 0 and the
tracer's threads to the other allowed CPUs; `@0,1` puts the poller and the
writer on one CPU, as on a 2-CPU machine). The same build may be given
once, for repetitions of one build. Each build's summary ends with the
distribution-free interval of its p+w median (order statistics of the
reps; docs/benchmarks.md uses it for the issue's "interval's upper bound").

Usage: sudo python3 scripts/tracer_ab.py BIN_A [BIN_B ...] [--reps 5] [--launches 200000]
"""
import argparse
import json
import math
import statistics
import subprocess


def per_added(rows):
    on = sorted((r for r in rows if r["placement"]), key=lambda r: r["launches"])
    lo, hi = on[0], on[-1]
    added = hi["events_stored"] - lo["events_stored"]

    def d(key):
        return (hi[key] * hi["events_stored"] - lo[key] * lo["events_stored"]) / added

    return {
        "poller": d("poller_us_per_event"),
        "writer": d("writer_us_per_event"),
        "p+w": d("tracer_us_per_event"),
        "completion": d("completion_us_per_event"),
        # Builds since round 12 also say where the time went (0 before).
        "poller_sys": d("poller_sys_us_per_event") if "poller_sys_us_per_event" in hi else 0.0,
        "writer_sys": d("writer_sys_us_per_event") if "writer_sys_us_per_event" in hi else 0.0,
        "commit": d("writer_commit_us_per_event") if "writer_commit_us_per_event" in hi else 0.0,
        "drops": hi["drops"] + lo["drops"],
    }


def median_interval(values, level=0.95):
    """The order-statistic interval [x_(k), x_(n+1-k)] holding the median
    with probability >= level (binomial, p = 1/2), with that probability;
    None when there are too few values for the level."""
    v = sorted(values)
    n = len(v)
    cdf, below, best = 0.0, [], None
    for i in range(n + 1):
        below.append(cdf)  # P(B < i)
        cdf += math.comb(n, i) / 2 ** n
    for k in range(1, n // 2 + 1):
        coverage = 1 - 2 * below[k]
        if coverage >= level:
            best = (v[k - 1], v[n - k], coverage, k)
    return best


def run(variant, launches):
    binary, _, cpus = variant.partition("@")
    prefix = ["taskset", "-c", cpus] if cpus else []
    out = subprocess.run(
        prefix + [binary, "bench", "--footprint-only", "--footprint-launches", str(launches),
         "--reps", "1", "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    return per_added(json.loads(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("builds", nargs="+")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--launches", type=int, default=200000)
    args = ap.parse_args()
    got = {b: [] for b in args.builds}
    for rep in range(args.reps):
        order = list(got) if rep % 2 == 0 else list(reversed(got))
        for binary in order:
            r = run(binary, args.launches)
            got[binary].append(r)
            with open("/proc/loadavg") as f:
                load = f.read().split()[0]
            print(f"rep {rep + 1} {binary}: " + ", ".join(
                f"{k} {v:.3f}" for k, v in r.items() if k != "drops") + f", drops {r['drops']}, load {load}",
                flush=True)
    print(f"µs per added event ({args.launches} vs {4 * args.launches} launches, placement on), "
          f"median [min, max] over {args.reps} reps:")
    for binary, rows in got.items():
        parts = []
        for k in ("poller", "writer", "p+w", "completion", "poller_sys", "writer_sys", "commit"):
            v = [r[k] for r in rows]
            parts.append(f"{k} {statistics.median(v):.3f} [{min(v):.3f}, {max(v):.3f}]")
        print(f"  {binary}: " + ", ".join(parts))
        ci = median_interval([r["p+w"] for r in rows])
        if ci:
            lo, hi, cov, k = ci
            print(f"    p+w median {statistics.median([r['p+w'] for r in rows]):.3f}, "
                  f"{100 * cov:.1f}% interval of the median {lo:.3f}-{hi:.3f} "
                  f"(order statistics {k} and {len(rows) + 1 - k} of {len(rows)})")
        else:
            print(f"    too few reps ({len(rows)}) for a 95% interval of the median")


if __name__ == "__main__":
    main()
