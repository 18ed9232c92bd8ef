"""Judges `report --from/--to` on a trace of window_workload.py.

    python3 report_window_check.py GPUSLEUTH TRACE_DB TRUTH_JSON OUT_DIR

For each phase's window (as window_check.py names it) the report is written
to OUT_DIR/report-PHASE.html and checked against `explain`/`stats` of the
same window: its findings section holds exactly the kinds `explain --json`
gives, its latency rows carry the per-op counts `stats --json` gives, its
summary shows the kernel-counted estimate `stats` places in the window, and
with NVML samples it has the window's own GPU busy line. The whole trace's
report is written too (report-whole.html). One PASS/FAIL line per check.
"""
import json
import os
import re
import sqlite3
import subprocess
import sys

# A finding in the report: its severity badge, then its kind in bold.
FINDING = re.compile(r'<span class="sev [a-z]+">[a-z]+</span><b>([a-z_]+)</b>')


def run(gs, *args, json_out=True):
    p = subprocess.run([gs, *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{args}: exit {p.returncode}: {p.stderr.strip()}")
    return json.loads(p.stdout) if json_out else p.stdout


def main():
    gs, db, truth_path, out = sys.argv[1:5]
    os.makedirs(out, exist_ok=True)
    truth = json.load(open(truth_path))
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    start = c.execute(  # on CLOCK_MONOTONIC, as the workload's stamps
        "SELECT start_mono_ns + coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'clock_base_ns'), 0) "
        "FROM session").fetchone()[0]
    run(gs, "report", "--force", "-o", f"{out}/report-whole.html", "--db", db, json_out=False)
    ok = True
    for ph in truth["phases"]:
        w = ["--from", f"{ph['start_mono_ns'] - start}ns", "--to", f"{ph['end_mono_ns'] - start}ns",
             "--db", db]
        path = f"{out}/report-{ph['name']}.html"
        run(gs, "report", "--force", "-o", path, *w, json_out=False)
        html = open(path).read()
        e = run(gs, "explain", "--json", *w)
        s = run(gs, "stats", "--json", *w)
        findings = html[html.index("<h2>Findings"):html.index("<h2>GPU activity")]
        kinds = sorted(f["kind"] for f in e["findings"])
        shown = sorted(FINDING.findall(findings))
        est = sum(p["estimate"] for p in s.get("counted_in_window", []))
        rows = {o["op"]: o["count"] for o in s["ops"] if o.get("measured") != "counted"}
        checks = [
            (f"findings {shown} = explain's {kinds}", shown == kinds),
            (f"latency rows carry stats' counts ({len(rows)} ops)",
             all(f"{op}: n={n} " in html for op, n in rows.items())),
            (f"summary shows the {est} kernel-counted calls stats estimates",
             f" calls, {est} kernel-counted calls" in html),
            ("the window's own GPU busy line (NVML sampled)",
             "<p>In the window: GPU " in html or "not measured" in html),
        ]
        for what, passed in checks:
            ok &= passed
            print(f"{'PASS' if passed else 'FAIL'} {ph['name']}: {what}")
        m = re.search(r"<p>In the window: (GPU [^<]*)</p>", html)
        print(f"     {m.group(1)[:60] if m else 'no window busy line'}; {len(html)} bytes")
    print("ALL PASS" if ok else "SOME FAIL")


if __name__ == "__main__":
    main()
