#!/usr/bin/env python3
"""Checks the call-site run against the workload's truth and prints a summary.

  sites_check.py TRUTH BY_SITE_JSON EXPLAIN_TXT

right-line share = bytes gpusleuth attributes to each truth line (its
cudaMalloc bytes at that file:line), capped at the truth's bytes for the
line, summed, over all truth bytes. Also: is the leaking line the first
site of `memory --by-site`, and does `explain` name it.
"""

import json
import sys
from collections import defaultdict


def main():
    truth = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    by_site = json.load(open(sys.argv[2]))
    explain = open(sys.argv[3]).read()
    want = defaultdict(int)
    for t in truth:
        want[(t["file"], t["line"], t["func"])] += t["bytes"]
    got = defaultdict(int)
    for s in by_site["sites"]:
        got[s["site"]] += s["alloc_bytes"]
    right = 0
    lines = []
    for (f, line, func), b in want.items():
        label = f"{f}:{line} {func}"
        g = got.get(label, 0)
        right += min(g, b)
        lines.append({"site": label, "truth_bytes": b, "attributed_bytes": g})
    total = sum(want.values())
    leak = next(t for t in truth if t["kind"] == "leak")
    leak_label = f'{leak["file"]}:{leak["line"]} {leak["func"]}'
    first = by_site["sites"][0]["site"] if by_site["sites"] else None
    summary = {
        "truth_bytes": total,
        "right_line_bytes": right,
        "right_line_share": round(right / total, 4) if total else None,
        "leak_site": leak_label,
        "by_site_first": first,
        "leak_first_in_by_site": first == leak_label,
        "explain_names_leak": f"allocated at {leak_label}" in explain,
        "sites_listed": len(by_site["sites"]),
        "lines": lines,
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
