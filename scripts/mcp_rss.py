"""Peak RSS and wall time of `gpusleuth mcp` answering each trace tool once:
one server per tool, run under /usr/bin/time (peak RSS of the server process).

Usage: python3 scripts/mcp_rss.py GPUSLEUTH_BINARY TRACE_DB
(needs `pip install "mcp>=1.9"`; the timeline call asks for pid 100 at 5 s,
which is a process of `gpusleuth bench --analysis-only --keep-trace` traces)."""
import asyncio, json, sys, time
from mcp import ClientSession, StdioServerParameters, stdio_client

async def one(binary, db, tool, args):
    out = f"/tmp/mcp-rss-{tool}.txt"
    params = StdioServerParameters(command="/usr/bin/time",
                                   args=["-o", out, "-f", "%M", binary, "mcp", "--db", db])
    async with stdio_client(params) as s:
        async with ClientSession(s[0], s[1]) as session:
            await session.initialize()
            t = time.monotonic()
            r = await session.call_tool(tool, args)
            wall = time.monotonic() - t
            text = r.content[0].text if r.content else ""
    await asyncio.sleep(0.5)
    rss = open(out).read().strip().splitlines()[-1]
    err = " ERROR: " + text[:120] if r.is_error else ""
    print(f"{tool:14s} {wall*1000:8.0f} ms wall {int(rss)/1024:8.1f} MB peak RSS (server){err}", flush=True)

async def main():
    binary, db = sys.argv[1], sys.argv[2]
    for tool, args in [("overview", {}), ("latency_stats", {}), ("slow_calls", {"limit": 10}),
                       ("memory", {}), ("gpu_activity", {}), ("call_sites", {}),
                       ("timeline", {"pid": 100, "at_ns": 5_000_000_000})]:
        await one(binary, db, tool, args)

asyncio.run(main())
