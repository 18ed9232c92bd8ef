"""Reading what the scenarios left behind: JSON-lines logs, trace databases, gpusleuth's JSON answers.

The raw trace is read with Python's sqlite3 (read-only) so the checks do not
depend on the format of `gpusleuth query`; gpusleuth's own answers (`memory`,
`stats`, `explain`) are what is being checked against the workload's logs.
"""

import json
import os
import sqlite3
import subprocess

RUNTIME_ALLOC = ("cudaMalloc", "cudaMallocAsync")
RUNTIME_FREE = ("cudaFree", "cudaFreeAsync")
DRIVER_ALLOC = ("cuMemAlloc_v2", "cuMemAllocAsync")
DRIVER_FREE = ("cuMemFree_v2", "cuMemFreeAsync")
VMM_CREATE = ("cuMemCreate",)
VMM_RELEASE = ("cuMemRelease",)
LAUNCH_OPS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx")


def read_jsonl(path):
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def mb(n):
    return "?" if n is None else f"{n / 1e6:.1f} MB"


# Workload-log keys that hold CLOCK_MONOTONIC times (what the workloads stamp).
MONO_KEYS = ("mono_ns", "mono_before_ns", "attempt_start_ns", "attempt_end_ns", "start_mono_ns", "end_mono_ns")


def clock_base_of(conn):
    """meta.clock_base_ns of an open trace database (0 when absent)."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'clock_base_ns'").fetchone()
    return int(row[0]) if row else 0


def on_file_clock(record, base):
    """A workload-log record with its CLOCK_MONOTONIC times moved onto a trace's clock."""
    if isinstance(record, dict):
        return {k: (v - base if k in MONO_KEYS and isinstance(v, int) else on_file_clock(v, base))
                for k, v in record.items()}
    if isinstance(record, list):
        return [on_file_clock(v, base) for v in record]
    return record


class Trace:
    """Read-only view of one trace database."""

    def __init__(self, path):
        self.path = path
        self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)

    def q(self, sql, *args):
        return self.conn.execute(sql, args).fetchall()

    def one(self, sql, *args):
        rows = self.q(sql, *args)
        return rows[0][0] if rows else None

    def clock_base(self):
        """The trace's clock base: its stored times are CLOCK_MONOTONIC minus it
        (0 on a machine up less than an hour, and in files written before it)."""
        return clock_base_of(self.conn)

    def session(self):
        cols = [r[1] for r in self.q("PRAGMA table_info(session)")]
        rows = self.q("SELECT * FROM session")
        return dict(zip(cols, rows[0])) if rows else {}

    def stats_table(self):
        return dict(self.q("SELECT name, value FROM stats"))

    def notes(self):
        return [{"level": lvl, "text": text} for lvl, text in self.q("SELECT level, text FROM notes ORDER BY ts_ns")]

    def drops(self):
        return {k: v for k, v in self.stats_table().items() if k.startswith("drop_") or k == "decode_errors"}

    def processes(self):
        return {pid: comm for pid, comm in self.q("SELECT pid, comm FROM processes")}

    def op_counts(self, pid=None):
        """In-kernel counted ops (launches): {op: count}."""
        if pid is None:
            rows = self.q("SELECT op, sum(count) FROM op_counts GROUP BY op")
        else:
            rows = self.q("SELECT op, sum(count) FROM op_counts WHERE pid = ? GROUP BY op", pid)
        return dict(rows)

    def call_counts(self, pid=None, until_ns=None):
        """Per-call recorded ops: {op: count} (calls returning by until_ns when given)."""
        sql = "SELECT op, count(*) FROM calls WHERE 1=1"
        args = []
        if pid is not None:
            sql += " AND pid = ?"
            args.append(pid)
        if until_ns is not None:
            sql += " AND ts_ns + dur_ns <= ?"
            args.append(until_ns)
        return dict(self.q(sql + " GROUP BY op", *args))

    def mem_calls(self, pid, ops, nested=None):
        sql = ("SELECT ts_ns + dur_ns AS end_ns, op, ret, size, ptr FROM calls WHERE pid = ? AND op IN (%s)"
               % ",".join("?" * len(ops)))
        args = [pid, *ops]
        if nested is not None:
            sql += " AND nested = ?"
            args.append(1 if nested else 0)
        return self.q(sql + " ORDER BY end_ns, id", *args)

    def live_at(self, pid, at_ns, alloc_ops, free_ops, nested=None):
        """Replays alloc/free calls that returned by at_ns: {ptr_or_handle: bytes} still live.

        Failed calls change nothing; freeing NULL is a no-op; an allocation
        takes effect when its call returns (the same rules as the ledger).
        """
        live = {}
        for end_ns, op, ret, size, ptr in self.mem_calls(pid, alloc_ops + free_ops, nested):
            if at_ns is not None and end_ns > at_ns:
                break
            if ret != 0 or not ptr:
                continue
            if op in alloc_ops:
                if size is not None:
                    live[ptr] = size
            else:
                live.pop(ptr, None)
        return live

    def ok_count(self, pid, ops, until_ns=None, nonnull=False):
        sql = "SELECT count(*) FROM calls WHERE pid = ? AND ret = 0 AND op IN (%s)" % ",".join("?" * len(ops))
        args = [pid, *ops]
        if until_ns is not None:
            sql += " AND ts_ns + dur_ns <= ?"
            args.append(until_ns)
        if nonnull:
            sql += " AND ptr IS NOT NULL AND ptr != 0"
        return self.one(sql, *args)


class Gs:
    """Runs the gpusleuth binary and parses its JSON."""

    def __init__(self, binary):
        self.binary = binary
        self.at_style = None  # how --at TIME is spelled, found by trying

    def run(self, *args, timeout=120):
        try:
            p = subprocess.run([self.binary, *map(str, args)], capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            return 1, "", str(e)
        return p.returncode, p.stdout, p.stderr

    def json(self, *args):
        """(object, None) or (None, one-line error)."""
        rc, out, err = self.run(*args)
        if rc != 0:
            return None, (err.strip().splitlines() or [f"exit {rc}"])[-1][:300]
        try:
            return json.loads(out), None
        except ValueError as e:
            return None, f"not JSON ({e}): {out[:120]!r}"

    def memory_at(self, db, at_ns, session_start_ns):
        """`memory --json --at` for the absolute CLOCK_MONOTONIC at_ns; tries the plausible spellings of TIME."""
        rel = (at_ns - session_start_ns) / 1e9 if session_start_ns else None
        styles = {
            # The documented form: a duration since the trace started (a unit is required).
            "rel_ns": f"{at_ns - session_start_ns}ns" if session_start_ns else None,
            "abs_ns": f"{at_ns}ns",
            "rel_s": f"{rel:.9f}s" if rel is not None else None,
            "plus_rel_s": f"+{rel:.9f}s" if rel is not None else None,
        }
        order = [self.at_style] if self.at_style else list(styles)
        last_err = None
        for style in order:
            if styles.get(style) is None:
                continue
            obj, err = self.json("memory", "--db", db, "--json", "--at", styles[style])
            if obj is not None:
                self.at_style = style
                return obj, None, style
            last_err = err
        return None, last_err, None


def proc_entry(memory_json, pid):
    for p in (memory_json or {}).get("processes", []):
        if p.get("pid") == pid:
            return p
    return None


def allocator_fields(entry):
    """The allocator-level (issue 8) numbers of a `memory` process entry: its
    `allocator` object (a trace taken with `trace --torch-allocator`), empty
    without one. The entry's own `allocated_bytes` is the ledger's sum of all
    allocations made (docs/stats.md), not memory_allocated()."""
    view = (entry or {}).get("allocator") or {}
    return {k: v for k, v in view.items()
            if isinstance(v, (int, float)) and ("allocated" in k or "reserved" in k or "gap" in k)
            and not k.startswith("failed")}


def file_size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return None


class Checks:
    """Named pass/fail checks: one line each as they are made, the count last."""

    def __init__(self):
        self.results = []

    def __call__(self, name, ok, detail):
        self.results.append(bool(ok))
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")

    def summary(self):
        print(f"checks: {sum(self.results)}/{len(self.results)} passed")


def gs_json(gs, *args):
    """`gpusleuth ARGS` (which must succeed): its JSON answer and its stderr."""
    p = subprocess.run([gs, *args], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        print(p.stderr)
        raise SystemExit(f"{args}: rc {p.returncode}")
    return json.loads(p.stdout), p.stderr


def mcp_calls(gs, db, calls):
    """Tool calls `[(name, args)]` over `gpusleuth mcp --db DB` stdio: each
    JSON answer, or "error: TEXT" for a tool error."""
    p = subprocess.Popen([gs, "mcp", "--db", db], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def send(msg):
        p.stdin.write(json.dumps(msg) + "\n")
        p.stdin.flush()

    def answer(i):
        while True:
            m = json.loads(p.stdout.readline())
            if m.get("id") == i:
                return m

    send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
          "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "gs-check", "version": "0"}}})
    answer(0)
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    got = []
    for i, (name, args) in enumerate(calls, start=1):
        send({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": name, "arguments": args}})
        r = answer(i)["result"]
        text = r["content"][0]["text"]
        got.append(("error: " + text) if r.get("isError") else json.loads(text))
    p.kill()
    return got
