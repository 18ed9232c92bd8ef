#!/usr/bin/env python3
"""Times each MCP trace tool of `gpusleuth mcp` on one trace (issue 16: every
tool within 2 s and 200 MB on a 10M-event trace).

Each tool runs in a fresh server (stdio, the official Python MCP client), so
the server's peak RSS (VmHWM, read from /proc before the server exits) is that
tool's alone; the wall time is the tool call's round trip.

With `--follow-up`, each server answers the same call twice: `wall_s` is the first call's,
`follow_up_s` the second's (what an assistant's next question about the same file costs once
the server remembers the file's checks, docs/mcp.md).

The server runs with this script's environment: with `GPUSLEUTH_CACHE_DIR=` (empty) it keeps
no checks between runs, so each first call pays the file's checks (docs/mcp.md).

With `--only TOOL[:KEY]` (repeatable), only the calls of those tools (with that argument key,
e.g. `memory:at_ns`); `--answers FILE` writes each call's answer text there (JSON lines), to
compare two builds' answers; `--op NAME` puts that op in every filtered call that takes one.

Usage: bench_mcp_tools.py --bin target/release/gpusleuth --db TRACE.db [--pid N] [--filtered] [--follow-up]
       [--only TOOL[:KEY]]... [--op NAME] [--pause S] [--answers FILE] [--json]
"""

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import time

from mcp import ClientSession, StdioServerParameters, stdio_client

# Whole-trace calls, as an assistant's first questions would make them.
CALLS = [
    ("overview", {}),
    ("latency_stats", {}),
    ("findings", {}),
    ("slow_calls", {"limit": 10}),
    ("memory", {}),
    ("timeline", {"pid": None, "at_ns": None}),  # --pid, the trace's middle
    ("gpu_activity", {}),
    ("call_sites", {}),
    ("sql", {"query": "SELECT pid, comm FROM processes LIMIT 5"}),
]

# With `--filtered`: the same tools narrowed as a follow-up question would
# narrow them (a process, an op, a window of one second from the middle, a
# moment). None is filled in from the trace as for `timeline`.
FILTERED = [
    ("latency_stats", {"pid": None}),
    ("latency_stats", {"op": "cudaMalloc"}),
    ("latency_stats", {"since_ns": None, "until_ns": None}),
    ("findings", {"pid": None}),
    ("findings", {"op": "cudaMemcpy"}),
    ("findings", {"since_ns": None, "until_ns": None}),
    ("slow_calls", {"pid": None, "limit": 10}),
    ("slow_calls", {"op": "cudaMalloc", "limit": 10}),
    ("memory", {"pid": None}),
    ("memory", {"at_ns": None}),
    ("call_sites", {"pid": None}),
    ("sql", {"query": "SELECT count(*) FROM calls WHERE op = 'cudaMalloc'"}),
]


def server_pid(exe):
    """The pid of the running `gpusleuth mcp` child (the only one we started)."""
    me = os.getpid()
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == me and os.path.realpath(f"/proc/{p}/exe") == os.path.realpath(exe):
                return int(p)
        except OSError:
            continue
    return None


def hwm_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


async def one(exe, db, name, args, follow_up=False, pause=0.0):
    # The server gets this environment (the client's default passes only a
    # few variables): `GPUSLEUTH_CACHE_DIR=` times first reads of a file,
    # a cache directory that holds it times calls after an earlier run.
    params = StdioServerParameters(command=exe, args=["mcp", "--db", db], env=dict(os.environ))
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            # A client that asks its first question later (an assistant
            # started before the user asks): the server checks its trace ahead.
            await asyncio.sleep(pause)
            t0 = time.perf_counter()
            res = await s.call_tool(name, args)
            wall = time.perf_counter() - t0
            again = None
            if follow_up:
                t1 = time.perf_counter()
                res2 = await s.call_tool(name, args)
                again = round(time.perf_counter() - t1, 3)
                if "".join(getattr(c, "text", "") for c in res2.content) != "".join(
                        getattr(c, "text", "") for c in res.content):
                    again = f"{again} (answer differs)"
            pid = server_pid(exe)
            rss = hwm_mb(pid) if pid else float("nan")
            text = "".join(getattr(c, "text", "") for c in res.content)
            err = bool(getattr(res, "isError", False) or getattr(res, "is_error", False))
            row = {"tool": name, "args": args, "wall_s": round(wall, 3), "peak_rss_mb": round(rss, 1),
                   "error": text[:200] if err else None, "answer_bytes": len(text)}
            if follow_up:
                row["follow_up_s"] = again
            return row, text


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--pid", type=int, default=100, help="process for `timeline` (the bench trace's is 100)")
    ap.add_argument("--filtered", action="store_true",
                    help="the tools with a filter (process, op, window, moment) instead")
    ap.add_argument("--follow-up", action="store_true",
                    help="call each tool twice in one server and time the second call too")
    ap.add_argument("--only", action="append", metavar="TOOL[:KEY]",
                    help="only this tool's calls (TOOL or TOOL:KEY, e.g. memory:at_ns; repeatable)")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds between the server's start and the first call")
    ap.add_argument("--op", help="the op of every filtered call that takes one (default: each call's own)")
    ap.add_argument("--answers", help="write each call's answer text to this file (JSON lines)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    # The middle of the trace (session times), read-only.
    con = sqlite3.connect(f"file:{a.db}?mode=ro", uri=True)
    start, end = con.execute("SELECT start_mono_ns, end_mono_ns FROM session").fetchone()
    con.close()
    mid = (start + (end or start)) // 2
    fill = {"pid": a.pid, "at_ns": mid, "since_ns": mid, "until_ns": mid + 1_000_000_000}
    rows = []
    answers = []
    for n, args in FILTERED if a.filtered else CALLS:
        if a.only and not any(
            n == tool and (not key or key in args)
            for tool, _, key in (o.partition(":") for o in a.only)
        ):
            continue
        args = {k: (fill[k] if v is None else v) for k, v in args.items()}
        if a.op and "op" in args:
            args["op"] = a.op
        row, text = await one(a.bin, a.db, n, args, a.follow_up, a.pause)
        rows.append(row)
        answers.append({"tool": n, "args": args, "answer": text})
    if a.answers:
        with open(a.answers, "w") as f:
            for ans in answers:
                f.write(json.dumps(ans) + "\n")
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    again = "  follow-up s" if a.follow_up else ""
    print(f"{'tool':<14} {'filter':<24} {'wall s':>8} {'peak RSS MB':>12} {'answer B':>10}{again}  error")
    for r in rows:
        shown = ",".join(k for k in r["args"] if k not in ("limit", "query", "until_ns")) or "-"
        f = f"  {str(r['follow_up_s']):>11}" if a.follow_up else ""
        print(f"{r['tool']:<14} {shown:<24} {r['wall_s']:>8.3f} {r['peak_rss_mb']:>12.1f} {r['answer_bytes']:>10}{f}  {r['error'] or ''}")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
