#!/usr/bin/env python3
"""MCP `findings` with an op, from the writer's rollups of that op's scope,
against the same question streamed from the calls and waits, on real traces.

For each trace given, every op it recorded is asked of `gpusleuth mcp --db
TRACE` twice: on the trace itself (answered from `finding_op_threads` /
`finding_op_hist`), and on a copy without `meta.finding_op_rollups` (what a
file written before them gets: the op's calls and each thread's waits
streamed). The answers must be equal but for `call_rows_read`. A plain
JSON-RPC client over stdio (no MCP package needed on the device).

Usage: op_scopes_check.py --gs PATH/gpusleuth TRACE.db [TRACE.db ...]
Prints one line per (trace, op) and `SUMMARY op_scopes: N/M equal`; exits 1
on a difference or an error.
"""

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time


def first_difference(a, b, at=""):
    """The path and values of the first place `a` and `b` differ (None: equal)."""
    if type(a) is not type(b):
        return f"{at}: {str(a)[:200]} != {str(b)[:200]}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            d = first_difference(a.get(k), b.get(k), f"{at}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{at}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{at}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{at}: {str(a)[:200]} != {str(b)[:200]}"


class Server:
    """`gpusleuth mcp --db DB` over stdio, newline-delimited JSON-RPC."""

    def __init__(self, gs, db):
        env = dict(os.environ, GPUSLEUTH_CACHE_DIR="")
        self.p = subprocess.Popen([gs, "mcp", "--db", db], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=env, text=True)
        self.next_id = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "op_scopes_check", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg):
        self.p.stdin.write(json.dumps(msg) + "\n")
        self.p.stdin.flush()

    def request(self, method, params):
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError(f"server ended during {method}")
            msg = json.loads(line)
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def findings(self, op):
        t0 = time.perf_counter()
        r = self.request("tools/call", {"name": "findings", "arguments": {"op": op}})
        wall = time.perf_counter() - t0
        text = "".join(c.get("text", "") for c in r.get("content", []))
        if r.get("isError"):
            raise RuntimeError(f"findings {op}: {text[:300]}")
        return json.loads(text), wall

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gs", required=True)
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args()
    equal = total = 0
    for db in a.traces:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        has = con.execute("SELECT value FROM meta WHERE key = 'finding_op_rollups'").fetchone()
        ops = [r[0] for r in con.execute("SELECT DISTINCT op FROM calls ORDER BY op")]
        con.close()
        if not has or has[0] != "1":
            print(f"{db}: no op scope rollups (meta.finding_op_rollups absent)")
            total += 1
            continue
        tmp = tempfile.mkdtemp(prefix="opscopes.")
        streamed = os.path.join(tmp, "streamed.db")
        shutil.copy(db, streamed)
        con = sqlite3.connect(streamed)
        con.execute("DELETE FROM meta WHERE key = 'finding_op_rollups'")
        con.commit()
        con.close()
        stored_srv, streamed_srv = Server(a.gs, db), Server(a.gs, streamed)
        try:
            for op in ops:
                total += 1
                try:
                    got, tg = stored_srv.findings(op)
                    want, tw = streamed_srv.findings(op)
                except RuntimeError as e:
                    print(f"FAIL {os.path.basename(db)} {op}: {e}")
                    continue
                read = (got.pop("call_rows_read", None), want.pop("call_rows_read", None))
                same = got == want
                equal += same
                kinds = [f["kind"] for f in want.get("findings", [])]
                print(f"{'PASS' if same else 'FAIL'} {os.path.basename(os.path.dirname(db))}/"
                      f"{os.path.basename(db)} {op}: rollups {tg:.3f} s, streamed {tw:.3f} s, "
                      f"call_rows_read {read}, findings {kinds}")
                if not same:
                    print(f"  first difference (rollups != streamed) {first_difference(got, want)}")
        finally:
            stored_srv.close()
            streamed_srv.close()
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"SUMMARY op_scopes: {equal}/{total} equal")
    return 0 if equal == total and total > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
