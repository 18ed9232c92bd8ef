"""Judges `stats/explain --from/--to` on a trace of window_workload.py.

    python3 window_check.py GPUSLEUTH TRACE_DB TRUTH_JSON OUT_JSON

For each phase, the window from its start to its end (time since the trace
began, from the trace's session start and the phase's CLOCK_MONOTONIC
bounds): the healthy phases must have no finding; the launch phase must be
launch_bound, and its kernel-counted launches' bounds must hold the add_
kernels the phase launched (at_least <= truth <= at_most; a few other
kernels of the phase may add to it). Prints one PASS/FAIL line per check.
"""
import json
import sqlite3
import subprocess
import sys


def run(gs, *args):
    p = subprocess.run([gs, *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{args}: exit {p.returncode}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def main():
    gs, db, truth_path, out = sys.argv[1:5]
    truth = json.load(open(truth_path))
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    start = c.execute("SELECT start_mono_ns FROM session").fetchone()[0]
    results, ok = [], True
    for ph in truth["phases"]:
        frm = ph["start_mono_ns"] - start
        to = ph["end_mono_ns"] - start
        w = ["--from", f"{frm}ns", "--to", f"{to}ns", "--db", db]
        e = run(gs, "explain", "--json", *w)
        s = run(gs, "stats", "--json", *w)
        kinds = [f["kind"] for f in e["findings"]]
        placed = s.get("counted_in_window", [])
        lo = sum(p["at_least"] for p in placed)
        hi = sum(p["at_most"] for p in placed)
        est = sum(p["estimate"] for p in placed)
        checks = []
        if ph["name"].startswith("healthy"):
            checks.append(("no finding in a healthy phase", kinds == []))
        else:
            n = ph["launches"]
            checks.append(("launch_bound", "launch_bound" in kinds))
            checks.append((f"at_least {lo} <= {n} add_ kernels <= at_most {hi}", lo <= n <= hi + 0))
        for what, passed in checks:
            ok &= passed
            print(f"{'PASS' if passed else 'FAIL'} {ph['name']} ({ph['wall_s']:.2f} s, window {frm / 1e9:.3f}s..{to / 1e9:.3f}s): {what}")
        print(f"     summary: {e.get('summary')}; findings {kinds}; launches placed {lo}..{hi}, estimate {est}")
        results.append({"phase": ph, "findings": kinds, "summary": e.get("summary"),
                        "counted_in_window": placed, "notes": e.get("notes", []),
                        "checks": [{"what": w_, "pass": p_} for w_, p_ in checks]})
    json.dump(results, open(out, "w"), indent=1)
    print("ALL PASS" if ok else "SOME FAIL")


if __name__ == "__main__":
    main()
