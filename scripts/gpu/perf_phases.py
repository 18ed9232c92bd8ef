#!/usr/bin/env python3
"""Splits a thread's perf samples into its steady phase and its busy tail.

Reads `perf script -F comm,tid,time,ip,sym,dso` on stdin. For every thread of
the comm given (default gpusleuth-db, the trace writer) the samples are put
in 0.25 s buckets; buckets above half the busiest one are "busy" (the
end-of-trace completion, which runs flat out), the others "steady" (the
writer keeping up with the flood). Prints each phase's seconds of CPU
(samples / frequency) and top symbols, so a per-event cost can be told
apart from the file's completion (`bench` reports only the steady part).
Usage: perf script -i DATA -F comm,tid,time,ip,sym,dso | perf_phases.py FREQ [COMM [TOP]]
"""
import collections
import re
import sys

freq = float(sys.argv[1]) if len(sys.argv) > 1 else 4999.0
want = sys.argv[2] if len(sys.argv) > 2 else "gpusleuth-db"
threads = collections.defaultdict(list)
for line in sys.stdin:
    parts = line.split()
    if len(parts) < 3 or parts[0] != want:
        continue
    try:
        tid, t = int(parts[1]), float(parts[2].rstrip(":"))
    except ValueError:
        continue
    # After the time: the address, the symbol, "(dso path)".
    sym = " ".join(parts[4:]) or "?"
    sym = re.sub(r"\((?:.*/)?([^/)]+)\)$", r"(\1)", sym)
    threads[tid].append((t, sym))

for tid, samples in sorted(threads.items()):
    samples.sort()
    t0 = samples[0][0]
    per = collections.Counter(int((t - t0) * 4) for t, _ in samples)
    top = max(per.values())
    phases = {"steady": collections.Counter(), "busy": collections.Counter()}
    spans = {"steady": set(), "busy": set()}
    for t, sym in samples:
        b = int((t - t0) * 4)
        ph = "busy" if per[b] > top / 2 else "steady"
        phases[ph][sym] += 1
        spans[ph].add(b)
    print(f"thread {tid}: {len(samples)} samples over {samples[-1][0] - t0:.2f} s")
    for ph in ("steady", "busy"):
        n = sum(phases[ph].values())
        if not n:
            continue
        print(f"  {ph}: {n / freq:.3f} s CPU over {len(spans[ph]) / 4:.2f} s")
        for sym, c in phases[ph].most_common(int(sys.argv[3]) if len(sys.argv) > 3 else 14):
            print(f"    {100 * c / n:5.1f}%  {sym}")
