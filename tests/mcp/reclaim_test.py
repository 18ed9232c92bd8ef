#!/usr/bin/env python3
"""Drives `gpusleuth mcp --allow-reclaim` over stdio with the official Python
MCP client against a simulated NVML and real holder processes built by
crates/gpusleuth/tests/mcp_reclaim.rs: a crashed CUDA parent (dead, still
listed by NVML) whose forked worker keeps its memory, and a bystander holder
that is alive and must survive.

Usage: reclaim_test.py --bin PATH/gpusleuth --truth TRUTH.json
TRUTH holds the pids, byte counts and the environment the server needs
(GPUSLEUTH_NVML_LIB, SIM_NVML_SCENARIO, GPUSLEUTH_DEV_PREFIX).
Exits non-zero on the first failed check.
"""

import argparse
import asyncio
import json

from mcp import ClientSession, StdioServerParameters, stdio_client

from mcp_checks import attr, check, checks_done, ok_json


def alive(pid):
    """Present and neither zombie nor dead (same rule as the Rust tests and the simulated NVML)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X", "x")


def holders_by_pid(answer):
    return {h["pid"]: h for h in answer["report"]["holders"]}


def gpu0(answer):
    gpus = answer["report"]["gpus"]
    check(len(gpus) == 1, f"one simulated GPU: {gpus}")
    return gpus[0]


def check_holders_before(gh, t):
    check(gh["report"]["nvml"]["available"] is True, f"simulated NVML loaded: {gh['report']['nvml']}")
    hs = holders_by_pid(gh)
    check(set(hs) == {t["dead"], t["worker"], t["bystander"]}, f"holders are exactly the scene's: {sorted(hs)}")
    dead = hs[t["dead"]]
    check(dead["class"] == "exited_but_listed", f"dead pid class {dead['class']}")
    check(dead["held_by"] == [{"pid": t["worker"], "evidence": "process_group"}],
          f"dead pid {t['dead']} is held by its worker {t['worker']}: {dead['held_by']}")
    check(dead["gpus"][0]["used_bytes"] == t["dead_bytes"], f"dead pid's listed bytes {dead['gpus']}")
    worker = hs[t["worker"]]
    check(worker["class"] == "orphaned_worker", f"worker class {worker['class']}")
    check(worker["holds_memory_of"] == [t["dead"]], f"worker holds the dead pid's memory: {worker['holds_memory_of']}")
    check(hs[t["bystander"]]["class"] == "active", f"bystander class {hs[t['bystander']]['class']}")
    g = gpu0(gh)
    check(g["used_bytes"] == t["base_bytes"] + t["bystander_bytes"] + t["dead_bytes"], f"GPU used before {g['used_bytes']}")


def check_dry_run(rp, t, args):
    check(rp["executed"] is False and rp["execution_allowed"] is True, f"{args}: a dry run on a server that allows reclaim")
    check("outcome" not in rp, f"{args}: a dry run has no outcome")
    targets = rp["plan"]["targets"]
    check([x["pid"] for x in targets] == [t["worker"]], f"{args}: the orphans plan targets only the worker: {targets}")
    check(targets[0]["class"] == "orphaned_worker", f"{args}: target class {targets[0]['class']}")
    check(t["dead"] in targets[0]["frees_listed_pids"], f"{args}: ending the worker frees the dead pid's listing")
    check(rp["plan"]["expected_free_bytes"] == {"0": t["dead_bytes"]}, f"{args}: expected free {rp['plan']['expected_free_bytes']}")
    check(alive(t["worker"]) and alive(t["bystander"]), f"{args}: a dry run signals nobody")


def check_execution(rx, t):
    check(rx["executed"] is True, "execute=true with --allow-reclaim executes")
    check([x["pid"] for x in rx["plan"]["targets"]] == [t["worker"]], f"executed plan targets only the worker: {rx['plan']['targets']}")
    out = rx["outcome"]
    results = {r["pid"]: r["status"] for r in out["results"]}
    check(results == {t["worker"]: "terminated"}, f"the worker ended on SIGTERM, nobody else signalled: {out['results']}")
    check(out["memory_released"] is True and out["still_held"] == [], f"release verified: {out}")
    before = t["base_bytes"] + t["bystander_bytes"] + t["dead_bytes"]
    after = t["base_bytes"] + t["bystander_bytes"]
    check(out["freed"] == [{"gpu": 0, "used_before_bytes": before, "used_after_bytes": after,
                            "freed_bytes": t["dead_bytes"]}], f"freed bytes as the simulated NVML saw them: {out['freed']}")
    check(not alive(t["worker"]), f"worker {t['worker']} is gone")
    check(alive(t["bystander"]), f"bystander {t['bystander']} is alive")


def check_holders_after(gh, t):
    hs = holders_by_pid(gh)
    check(set(hs) == {t["bystander"]}, f"only the bystander holds memory now: {sorted(hs)}")
    check(gpu0(gh)["used_bytes"] == t["base_bytes"] + t["bystander_bytes"], "GPU used after")


async def run(args, t):
    params = StdioServerParameters(command=args.bin, args=["mcp", "--allow-reclaim"], env=t["env"])
    async with stdio_client(params) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            init = await session.initialize()
            check(attr(init, "server_info", "serverInfo").name == "gpusleuth", "server name")
            check_holders_before(await ok_json(session, "gpu_holders"), t)
            print("[reclaim] gpu_holders names the worker of the dead pid")
            for dry_args in ({}, {"execute": False}):
                check_dry_run(await ok_json(session, "reclaim_plan", dry_args), t, dry_args)
            print("[reclaim] dry runs signalled nobody")
            check_execution(await ok_json(session, "reclaim_plan", {"execute": True}), t)
            print("[reclaim] execute ended exactly the worker, memory freed")
            check_holders_after(await ok_json(session, "gpu_holders"), t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--truth", required=True)
    args = ap.parse_args()
    with open(args.truth) as f:
        truth = json.load(f)
    asyncio.run(run(args, truth))
    print(f"ALL CHECKS PASSED ({checks_done()} checks)")


if __name__ == "__main__":
    main()
