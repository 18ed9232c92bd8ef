#!/usr/bin/env python3
"""Drives `gpusleuth mcp` with the official Python MCP client, over stdio and
streamable HTTP, and checks every tool against a trace whose ground truth is
known by construction (crates/gpusleuth/tests/mcp_client.rs writes it).

Usage: client_test.py --bin PATH/gpusleuth --db TRACE.db --truth TRUTH.json
Traffic goes only to 127.0.0.1. Exits non-zero on the first failed check.
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

from mcp import ClientSession, StdioServerParameters, stdio_client
import mcp.client.streamable_http as sh

EXPECTED_TOOLS = {
    "overview", "latency_stats", "findings", "slow_calls", "memory",
    "timeline", "gpu_holders", "reclaim_plan", "sql", "gpu_activity", "call_sites",
}
from mcp_checks import attr, check, checks_done, is_error, ok_json, text_of


async def expect_error(session, name, args, needle=None):
    """A bad call must give an error (tool error result or JSON-RPC error), never kill the server."""
    try:
        r = await session.call_tool(name, args)
    except Exception as e:  # JSON-RPC error (unknown tool, invalid params)
        msg = str(e)
    else:
        check(is_error(r), f"{name}({args}) is an error result, got {text_of(r)[:200]}")
        msg = text_of(r)
    if needle:
        check(needle.lower() in msg.lower(), f"error of {name}({args}) mentions {needle!r}: {msg[:300]}")
    # The next request still works.
    again = await ok_json(session, "overview")
    check(again["counts"]["calls"] > 0, "server answers after a bad request")
    return msg


async def check_session(session, truth, label, transcript=None):
    init = await session.initialize()
    check(attr(init, "server_info", "serverInfo").name == "gpusleuth", "server name")
    tools = await session.list_tools()
    names = {t.name for t in tools.tools}
    check(names == EXPECTED_TOOLS, f"tool list {sorted(names)}")
    for t in tools.tools:
        check(t.description and attr(t, "input_schema", "inputSchema").get("type") == "object", f"{t.name} has description and schema")

    prompts = await session.list_prompts()
    check("investigate" in {p.name for p in prompts.prompts}, "investigate prompt listed")
    p = await session.get_prompt("investigate", {"question": "why is training slow?"})
    ptext = "".join(getattr(m.content, "text", "") for m in p.messages)
    check("overview" in ptext and "findings" in ptext and "why is training slow?" in ptext, "prompt text")

    ov = await ok_json(session, "overview")
    check(ov["counts"]["calls"] == truth["calls"], f"overview calls {ov['counts']['calls']}")
    check(ov["counts"]["failed_calls"] == 1, "overview failed calls")
    procs = {p["pid"]: p for p in ov["processes"]}
    check(procs.get(truth["pid"], {}).get("comm") == truth["comm"], "overview names the process")
    check(ov["drops"].get("total") == 0, f"no drops: {ov['drops']}")
    # The test's trace runs without NVML: GPU activity is said to be not measured.
    check(ov["gpu_activity"]["measured"] is False, f"overview gpu_activity {ov['gpu_activity']}")
    ga = await ok_json(session, "gpu_activity")
    check(ga["summary"]["measured"] is False and ga["samples_total"] == 0, f"gpu_activity {ga['summary']}")
    if transcript is not None:
        transcript["overview"] = {k: ov[k] for k in ("time_range", "counts")}

    st = await ok_json(session, "latency_stats", {"op": "cudaMalloc"})
    check(len(st["ops"]) == 1 and st["ops"][0]["op"] == "cudaMalloc", "latency_stats filtered by op")
    check(st["ops"][0]["count"] == truth["malloc_calls"], "cudaMalloc count")
    check(st["ops"][0]["errors"] == truth["malloc_errors"], "cudaMalloc errors")
    st_all = await ok_json(session, "latency_stats", {"pid": truth["pid"], "since_ns": 9_000_000})
    ops = {o["op"]: o for o in st_all["ops"]}
    check(set(ops) == {"cudaMemcpy", "cudaStreamSynchronize"}, f"time window keeps later ops: {sorted(ops)}")
    check(ops["cudaMemcpy"]["runnable_ns"] == truth["slow_copy"]["runnable_ns"], "copy runnable split")
    check(ops["cudaStreamSynchronize"]["blocked_ns"] == truth["sync_blocked_ns"], "sync blocked split")
    if transcript is not None:
        transcript["latency_stats"] = ops["cudaMemcpy"]

    fd = await ok_json(session, "findings")
    kinds = {f["kind"] for f in fd["findings"]}
    check("allocation_failure" in kinds, f"allocation_failure found: {kinds}")
    check("cpu_preemption" in kinds, f"cpu_preemption found: {kinds}")
    pre = next(f for f in fd["findings"] if f["kind"] == "cpu_preemption")
    check(pre["culprits"] and pre["culprits"][0]["pid"] == truth["slow_copy"]["culprit_pid"], "preemption culprit")
    if transcript is not None:
        transcript["findings"] = [f"{f['severity']} {f['kind']}: {f['summary']}" for f in fd["findings"]]

    sc = await ok_json(session, "slow_calls", {"op": "cudaMemcpy", "limit": 5})
    c0 = sc["calls"][0]
    want = truth["slow_copy"]
    check(c0["dur_ns"] == want["dur_ns"] and c0["runnable_ns"] == want["runnable_ns"], "slow copy split")
    check(c0["on_cpu_ns"] + c0["runnable_ns"] + c0["blocked_ns"] == c0["dur_ns"], "split adds up")
    check(c0["culprits"] and c0["culprits"][0]["pid"] == want["culprit_pid"]
          and c0["culprits"][0]["comm"] == want["culprit_comm"]
          and c0["culprits"][0]["ns"] == want["culprit_ns"], f"slow copy culprit {c0['culprits']}")
    sc_any = await ok_json(session, "slow_calls", {"limit": 2})
    check([c["op"] for c in sc_any["calls"]] == ["cudaMemcpy", "cudaStreamSynchronize"], "slowest of any op")
    if transcript is not None:
        transcript["slow_calls"] = c0

    mem = await ok_json(session, "memory")
    m = next(p for p in mem["processes"] if p["pid"] == truth["pid"])
    check(m["live_bytes"] == truth["live_bytes"], f"live bytes {m['live_bytes']}")
    check(m["peak_bytes"] == truth["peak_bytes"], f"peak bytes {m['peak_bytes']}")
    check(len(m["unfreed"]) == truth["unfreed"], "unfreed count")
    check(len(m["failed_allocs"]) == 1 and m["failed_allocs"][0]["bytes"] == truth["failed_bytes"]
          and m["failed_allocs"][0]["error"] == truth["failed_error"], "failed allocation")
    check(m["unfreed"][0]["site"] == truth["site"], "unfreed allocations carry their site")
    check(mem["sites"][0]["site"] == truth["site"] and mem["sites"][0]["unfreed_bytes"] == truth["site_unfreed_bytes"],
          "memory lists sites")
    cs = await ok_json(session, "call_sites", {"limit": 5})
    top = cs["memory_by_site"][0]
    check(cs["captured"] and top["site"] == truth["site"] and top["unfreed_bytes"] == truth["site_unfreed_bytes"]
          and top["allocs"] == 5 and top["stack"] == [truth["site"]], f"call_sites {top}")
    await expect_error(session, "call_sites", {"limit": 0})
    at = await ok_json(session, "memory", {"at_ns": 5_500_000, "timeline_points": 0})
    m_at = next(p for p in at["processes"] if p["pid"] == truth["pid"])
    check(m_at["live_bytes"] == truth["live_at_5_5ms"] and m_at["timeline"] == [], "ledger at a time")

    tl = await ok_json(session, "timeline", {"pid": truth["pid"], "at_ns": 11_000_000, "window_ns": 4_000_000})
    evs = tl["events"]
    check(any(e["event"] == "call" and e["op"] == "cudaMemcpy" for e in evs), "timeline has the copy")
    waits = [e for e in evs if e["event"] == "wait"]
    check(waits and waits[0]["culprits"][0]["comm"] == "cpuhog", "timeline has the wait and its culprit")
    check(not tl["truncated"], "timeline not truncated")
    tl1 = await ok_json(session, "timeline", {"pid": truth["pid"], "at_ns": 11_000_000, "window_ns": 4_000_000, "limit": 1})
    check(tl1["truncated"] and len(tl1["events"]) == 1, "timeline cap")

    q = await ok_json(session, "sql", {"query": "SELECT count(*) AS n FROM calls WHERE op = 'cudaMalloc'"})
    check(q["columns"] == ["n"] and q["rows"] == [[truth["malloc_calls"]]], f"sql answer {q}")
    if transcript is not None:
        transcript["sql"] = q

    gh = await ok_json(session, "gpu_holders")
    check("report" in gh and "gpus" in gh["report"] and "holders" in gh["report"], "gpu_holders report shape")
    rp = await ok_json(session, "reclaim_plan")
    check(rp["executed"] is False and rp["execution_allowed"] is False, "reclaim is a dry run")
    check("targets" in rp["plan"] and "refused" in rp["plan"], "reclaim plan shape")
    rp1 = await ok_json(session, "reclaim_plan", {"pids": [1]})
    check(not rp1["plan"]["targets"] and any(r["pid"] == 1 for r in rp1["plan"]["refused"]), "pid 1 refused")

    # Bad inputs: each an error, and the server keeps answering.
    await expect_error(session, "no_such_tool", {})
    await expect_error(session, "slow_calls", {"limit": "ten"})
    await expect_error(session, "timeline", {"pid": "x", "at_ns": 1})
    await expect_error(session, "latency_stats", {"op": "cudaMallocc"}, "unknown op")
    await expect_error(session, "sql", {"query": "DELETE FROM calls"})
    await expect_error(session, "sql", {"query": "CREATE TABLE t(a)"})
    await expect_error(session, "sql", {"query": "SELECT 1; DROP TABLE calls"})
    await expect_error(session, "sql", {"query": "ATTACH DATABASE '/tmp/x.db' AS x"})
    t0 = time.monotonic()
    await expect_error(session, "sql", {"query":
        "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT count(*) FROM r"}, "time limit")
    check(time.monotonic() - t0 < 30, "runaway CTE stopped")
    await expect_error(session, "overview", {"db": "/nonexistent/trace.db"}, "not served")
    await expect_error(session, "sql", {"db": "/etc/passwd", "query": "SELECT 1"}, "not served")
    await expect_error(session, "reclaim_plan", {"execute": True}, "--allow-reclaim")
    after = await ok_json(session, "sql", {"query": "SELECT count(*) FROM calls"})
    check(after["rows"] == [[truth["calls"]]], "nothing was written by the bad SQL")
    print(f"[{label}] tool checks passed")


async def run_stdio(args, truth):
    params = StdioServerParameters(command=args.bin, args=["mcp", "--db", args.db])
    transcript = {}
    async with stdio_client(params) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await check_session(session, truth, "stdio", transcript)
    return transcript


def raw_stdio_malformed(args):
    """Garbage and invalid JSON-RPC on stdin: answered or ignored, never fatal; stdout stays JSON-RPC."""
    p = subprocess.Popen([args.bin, "mcp", "--db", args.db], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    def send(obj):
        p.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        p.stdin.flush()
    def read_until(id_):
        while True:
            line = p.stdout.readline()
            check(line, f"server still running while waiting for id {id_}")
            msg = json.loads(line)  # every stdout line must be JSON
            check(msg.get("jsonrpc") == "2.0", "stdout carries JSON-RPC only")
            if msg.get("id") == id_:
                return msg
    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}})
        check("result" in read_until(1), "raw initialize")
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send("this is not json {{{")
        send('{"jsonrpc": "2.0", "id": 2, "method": ')  # truncated
        send({"jsonrpc": "2.0", "id": 3, "method": 42})
        send({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "slow_calls", "arguments": {"limit": "x"}}})
        r4 = read_until(4)
        check("error" in r4 or r4.get("result", {}).get("isError"), f"bad arguments answered with an error: {r4}")
        send({"jsonrpc": "2.0", "id": 5, "method": "tools/list"})
        r5 = read_until(5)
        check(len(r5["result"]["tools"]) == len(EXPECTED_TOOLS), "tools/list works after malformed input")
    finally:
        p.stdin.close()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
    print("[stdio-raw] malformed input checks passed")


def start_http(args, addr, env_token=None):
    env = dict(os.environ)
    env.pop("GPUSLEUTH_MCP_TOKEN", None)
    if env_token:
        env["GPUSLEUTH_MCP_TOKEN"] = env_token
    p = subprocess.Popen([args.bin, "mcp", "--db", args.db, "--http", addr],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = p.stderr.readline()
    check("listening on http://" in line, f"server started: {line!r}")
    url = line.split("listening on ", 1)[1].strip()
    port = url.split(":")[2].split("/")[0]
    return p, port


def raw_post(url, headers):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}).encode()
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    h.update(headers)
    req = urllib.request.Request(url, data=body, headers=h, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def http_client(url, headers=None):
    """The SDK's streamable HTTP client, across SDK versions (1.x: streamablehttp_client)."""
    if hasattr(sh, "streamable_http_client"):
        hx = getattr(sh, "httpx2", None) or getattr(sh, "httpx")
        client = hx.AsyncClient(headers=headers or {}, timeout=60)
        return sh.streamable_http_client(url, http_client=client)
    return sh.streamablehttp_client(url, headers=headers or {})


async def run_http(args, truth):
    p, port = start_http(args, "127.0.0.1:0")
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        async with http_client(url) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await check_session(session, truth, "http")
        check(raw_post(url, {"Origin": "http://evil.example"}) == 403, "foreign Origin -> 403")
        check(raw_post(url, {"Host": "evil.example"}) == 403, "foreign Host -> 403")
        check(raw_post(url, {"Origin": f"http://localhost:{port}"}) == 200, "local Origin accepted")
    finally:
        p.terminate()
        p.wait(timeout=10)
    print("[http] origin/host checks passed")

    # Any non-loopback bind needs a token; without one the server refuses to start.
    r = subprocess.run([args.bin, "mcp", "--db", args.db, "--http", "0.0.0.0:0"], capture_output=True,
                       text=True, timeout=20, env={k: v for k, v in os.environ.items() if k != "GPUSLEUTH_MCP_TOKEN"})
    check(r.returncode != 0 and "token" in r.stderr, f"0.0.0.0 without token refused: {r.stderr.strip()}")

    token = "t0k-" + os.urandom(8).hex()
    p, port = start_http(args, "0.0.0.0:0", env_token=token)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        check(raw_post(url, {}) == 401, "no token -> 401")
        check(raw_post(url, {"Authorization": "Bearer wrong"}) == 401, "wrong token -> 401")
        check(raw_post(url, {"Authorization": f"Bearer {token}", "Origin": "http://evil.example"}) == 403,
              "token but foreign Origin -> 403")
        async with http_client(url, {"Authorization": f"Bearer {token}"}) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                ov = await ok_json(session, "overview")
                check(ov["counts"]["calls"] == truth["calls"], "works with the token")
    finally:
        p.terminate()
        p.wait(timeout=10)
    print("[http] token checks passed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--truth", required=True)
    ap.add_argument("--transcript", help="write the stdio answers here (for docs/mcp.md)")
    args = ap.parse_args()
    with open(args.truth) as f:
        truth = json.load(f)
    transcript = asyncio.run(run_stdio(args, truth))
    raw_stdio_malformed(args)
    asyncio.run(run_http(args, truth))
    if args.transcript:
        with open(args.transcript, "w") as f:
            json.dump(transcript, f, indent=1)
    print(f"ALL CHECKS PASSED ({checks_done()} checks)")


if __name__ == "__main__":
    main()
