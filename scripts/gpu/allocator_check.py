#!/usr/bin/env python3
"""Issue 8 acceptance on the GPU machine: trace the seed scenario with
`--torch-allocator` (default allocator and expandable_segments), then at every
checkpoint compare gpusleuth's rebuilt allocator state with PyTorch's own
numbers: allocated == memory_allocated(), allocator reserved ==
memory_reserved(), and the per-segment free bytes summing to the gap.

Usage: allocator_check.py --gs target/release/gpusleuth --py PYTHON --out DIR [--rotate 2s]
With --rotate the trace is a run of files (`trace --rotate`, a directory) and
every answer is the run's (`memory --db DIR --at`, counted from its first
file's start; the run's end too: `memory --db DIR` against the last
checkpoint; issue 16, round 31). Prints PASS/FAIL lines and writes DIR/allocator_check.txt and the
`memory --segments` view at the seed's question (after round 1's
del + empty_cache) to DIR/segments_<mode>.txt.
"""
import argparse, json, os, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gs", required=True)
    ap.add_argument("--py", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rotate", default=None, help="trace as a run of files rotated this often")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    lines, fails = [], 0

    def say(s):
        print(s, flush=True)
        lines.append(s)

    for mode, conf in [("default", None), ("expandable", "expandable_segments:True")]:
        db = f"/tmp/alloc_{mode}" + ("_run" if a.rotate else ".db")
        log = f"/tmp/alloc_{mode}.jsonl"
        for p in (db, log):
            if os.path.isdir(p):
                import shutil
                shutil.rmtree(p)
            elif os.path.exists(p):
                os.remove(p)
        # A run's times count from its first file's start.
        first = os.path.join(db, "part-000001.db") if a.rotate else db
        rotate = ["--rotate", a.rotate] if a.rotate else []
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        t0 = time.time()
        r = run([a.gs, "trace", "--db", db, *rotate, "--force", "--quiet", "--torch-allocator", "--",
                 a.py, os.path.join(HERE, "seed_empty_cache.py"), "--log", log, "--rounds", str(a.rounds)], env=env)
        say(f"== {mode}: trace rc={r.returncode} in {time.time() - t0:.1f}s; {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}")
        if r.returncode != 0:
            say(r.stderr[-2000:])
            fails += 1
            continue
        # The session's start on CLOCK_MONOTONIC (the trace's clock plus its base), as the checkpoints are.
        start = json.loads(run([a.gs, "query", "--db", first, "--json",
                                "SELECT start_mono_ns + coalesce((SELECT CAST(value AS INTEGER) FROM meta "
                                "WHERE key = 'clock_base_ns'), 0) FROM session"]).stdout)["rows"][0][0]
        if a.rotate:
            say(f"  run of {len([f for f in os.listdir(db) if f.endswith('.db')])} files")
        cps = [c for c in (json.loads(l) for l in open(log) if l.strip()) if "allocated" in c and "mono_ns" in c]
        say(f"{'checkpoint':34s} {'torch alloc':>12s} {'gs alloc':>12s} {'torch resv':>12s} {'gs resv':>12s} {'gap':>10s} {'seg free':>10s}  verdict")
        for cp in cps:
            at = cp["mono_ns"] - start
            m = run([a.gs, "memory", "--db", db, "--json", "--at", f"{at}ns"])
            try:
                procs = json.loads(m.stdout)["processes"]
            except Exception:
                say(f"  {cp['label']}: memory failed: {m.stderr.strip()[:300]}")
                fails += 1
                continue
            p = next((x for x in procs if x["pid"] == cp["pid"]), None)
            al = (p or {}).get("allocator") or {}
            if "allocated_bytes" not in al:
                say(f"  {cp['label']}: no allocator view: {json.dumps(al)[:400]}")
                fails += 1
                continue
            # The gap PyTorch reports, explained by the free bytes of the allocator's own segments.
            seg_free = sum(s["free_bytes"] for s in al.get("segments", []) if s.get("allocator_owned", True))
            ok = (al["allocated_bytes"] == cp["allocated"] and al["allocator_reserved_bytes"] == cp["reserved"]
                  and al["gap_bytes"] == cp["reserved"] - cp["allocated"] and seg_free == al["gap_bytes"])
            fails += 0 if ok else 1
            say(f"{cp['label'][:34]:34s} {cp['allocated']:12d} {al['allocated_bytes']:12d} {cp['reserved']:12d} "
                f"{al['allocator_reserved_bytes']:12d} {al['gap_bytes']:10d} {seg_free:10d}  {'PASS' if ok else 'FAIL'}")
            if cp["label"].startswith("round 1: after del"):
                seg = run([a.gs, "memory", "--db", db, "--pid", str(cp["pid"]), "--at", f"{at}ns", "--segments"])
                open(os.path.join(a.out, f"segments_{mode}.txt"), "w").write(seg.stdout + seg.stderr)
        t0 = time.time()
        end = run([a.gs, "memory", "--db", db, "--json"])
        say(f"memory --db at the end: rc={end.returncode} in {time.time() - t0:.2f}s")
        cal = json.loads(end.stdout)["processes"]
        if a.rotate and cps:
            # The program's last checkpoint is its state at the end.
            last = cps[-1]
            p = next((x for x in cal if x["pid"] == last["pid"]), None)
            al = (p or {}).get("allocator") or {}
            # Informational: the program may allocate or free after its last checkpoint.
            same = al.get("allocated_bytes") == last["allocated"] and al.get("allocator_reserved_bytes") == last["reserved"]
            say(f"run's end vs {last['label'][:30]}: torch {last['allocated']} / {last['reserved']}, "
                f"gs {al.get('allocated_bytes')} / {al.get('allocator_reserved_bytes')}  {'same' if same else 'differs'}")
        for p in cal:
            if p.get("allocator"):
                say(f"calibration pid {p['pid']}: {json.dumps(p['allocator'].get('calibration'))[:400]}")
        t0 = time.time()
        ex = run([a.gs, "explain", "--db", db])
        say(f"explain rc={ex.returncode} in {time.time() - t0:.2f}s")
        frag = [l for l in ex.stdout.splitlines() if "fragmentation" in l]
        say(f"explain fragmentation lines: {frag[:3] if frag else 'none'}")
        ev = run([a.gs, "query", "--db", first, "SELECT op, count(*) FROM allocator_events GROUP BY op"])
        say(ev.stdout.strip())
    say(f"RESULT: {'PASS' if fails == 0 else 'FAIL'} ({fails} failing checks)")
    open(os.path.join(a.out, "allocator_check.txt"), "w").write("\n".join(lines) + "\n")
    return 0 if fails == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
