#!/usr/bin/env python3
"""Checks the traced scenarios of issues 7 and 8 against the workloads' own logs.

Reads WORK/runs.jsonl (written by gsrun.py), each scenario's JSON-lines log
(WORK/<run name>.jsonl) and trace database, asks gpusleuth (`memory`, `stats`,
`explain`) and compares. Every check is PASS, FAIL or UNVERIFIED (something
needed is missing: the reason is given). Writes WORK/checks.json.

  check_results.py --work DIR --gs target/release/gpusleuth
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gslib import (on_file_clock, DRIVER_ALLOC, DRIVER_FREE, LAUNCH_OPS, RUNTIME_ALLOC, RUNTIME_FREE, VMM_CREATE,  # noqa: E402
                   VMM_RELEASE, Gs, Trace, allocator_fields, proc_entry, read_jsonl)

# Scenario 2: the quiet phase may hold at most this share of its wall time as runnable-waiting.
QUIET_MAX_RUNNABLE_SHARE = 0.01
CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation == CUDA_ERROR_OUT_OF_MEMORY == 2
ROUND_LARGE = 2 << 20


class Checks:
    def __init__(self, scenario):
        self.scenario = scenario
        self.items = []

    def add(self, name, ok, detail, **data):
        self.items.append({"name": name, "ok": ok, "detail": detail, **({"data": data} if data else {})})
        tag = {True: "PASS", False: "FAIL", None: "UNVERIFIED"}[ok]
        print(f"  [{tag:10s}] {self.scenario}: {name}: {detail}", flush=True)

    def to_json(self):
        return {"checks": self.items}


def load_runs(work):
    runs = {}
    for r in read_jsonl(os.path.join(work, "runs.jsonl")):
        runs[r["name"]] = r  # the last run of a name wins
    return runs


def checkpoints(log, pid):
    return [r for r in log if r.get("pid") == pid and "reserved" in r]


def open_run(c, runs, name, work):
    """(run, trace, log) or None after recording why."""
    run = runs.get(name)
    if not run:
        c.add("ran", False, f"no run named {name} in runs.jsonl (the scenario did not run)")
        return None
    if run.get("rc") != 0:
        c.add("ran", False, f"exit code {run.get('rc')} (see {run.get('stderr')})")
    else:
        c.add("ran", True, f"exit 0 in {run['wall_s']:.1f}s")
    if not run.get("db") or not os.path.exists(run["db"]):
        c.add("trace database", None, "no trace database")
        return None
    try:
        tr = Trace(run["db"])
        tr.session()
    except Exception as e:  # a broken database is a finding, not a crash of the checker
        c.add("trace database", False, f"cannot read {run['db']}: {e}")
        return None
    # The workload stamps CLOCK_MONOTONIC; the trace stores its own clock.
    log = on_file_clock(read_jsonl(os.path.join(work, f"{name}.jsonl")), tr.clock_base())
    if not log:
        c.add("workload log", None, f"empty or missing {name}.jsonl")
    return run, tr, log


def check_capture_health(c, tr):
    drops = tr.drops()
    lost = {k: v for k, v in drops.items() if v}
    c.add("no drops", not lost, "none" if not lost else f"lost events: {lost}", drops=drops)
    warns = [n["text"] for n in tr.notes() if n["level"].lower().startswith("warn")]
    late = [w for w in warns if "not seen" in w]
    c.add("every library probed before first use", not late, "yes" if not late else late[0][:200],
          warnings=warns[:10])


def check_ledger_at_checkpoints(c, gs, tr, db, cps, pid, label_prefix=""):
    """At every checkpoint: trace's device memory (runtime cudaMalloc + cuMemCreate) == memory_reserved()."""
    start = tr.session().get("start_mono_ns")
    rows = []
    all_ok, cli_ok, seg_ok = True, True, True
    cli_err = None
    for cp in cps:
        at = cp["mono_ns"]
        rt = tr.live_at(pid, at, RUNTIME_ALLOC, RUNTIME_FREE)
        vmm = tr.live_at(pid, at, VMM_CREATE, VMM_RELEASE)
        drv = tr.live_at(pid, at, DRIVER_ALLOC, DRIVER_FREE, nested=False)
        rt_b, vmm_b, drv_b = sum(rt.values()), sum(vmm.values()), sum(drv.values())
        traced = rt_b + vmm_b
        ok = traced == cp["reserved"]
        all_ok &= ok
        row = {"label": cp["label"], "mono_ns": at, "reserved": cp["reserved"], "allocated": cp["allocated"],
               "runtime_live": rt_b, "vmm_live": vmm_b, "driver_direct_live": drv_b, "equal": ok}
        # Segment by segment (non-expandable segments are one cudaMalloc each).
        segs = [s for s in cp.get("segments", []) if not s.get("is_expandable")]
        if segs and not vmm:
            want = {s["address"]: s["total_size"] for s in segs}
            row["segments_missing_in_trace"] = sum(1 for a, n in want.items() if rt.get(a) != n)
            row["allocations_not_segments"] = sum(1 for a in rt if a not in want)
            seg_ok &= row["segments_missing_in_trace"] == 0 and row["allocations_not_segments"] == 0
        mem, err, style = gs.memory_at(db, at, start)
        entry = proc_entry(mem, pid)
        if entry is None:
            cli_ok = False
            cli_err = err or f"pid {pid} not in `memory --at` output"
        else:
            row["gpusleuth_live_bytes"] = entry.get("live_bytes")
            row["gpusleuth_vmm_bytes"] = entry.get("vmm_bytes")
            row["gpusleuth_at_style"] = style
            row["gpusleuth_allocator_fields"] = allocator_fields(entry)
            # gpusleuth's ledger is the process's whole device memory: PyTorch's
            # segments plus what other libraries (cuBLAS workspaces, ...) took
            # with direct driver calls. It must equal exactly that sum.
            cli_ok &= entry.get("live_bytes") == cp["reserved"] + drv_b
        rows.append(row)
        mark = "==" if ok else "!="
        print(f"      {label_prefix}{cp['label']:32s} reserved={cp['reserved']:>12} {mark} trace={traced:>12} "
              f"(runtime {rt_b}, vmm {vmm_b}; direct driver {drv_b}) gpusleuth memory={row.get('gpusleuth_live_bytes')}",
              flush=True)
    if not cps:
        c.add(f"{label_prefix}ledger == memory_reserved()", None, "no checkpoints logged")
        return rows
    bad = [r for r in rows if not r["equal"]]
    c.add(f"{label_prefix}trace ledger == memory_reserved() to the byte at every checkpoint", all_ok,
          f"{len(rows) - len(bad)}/{len(rows)} equal" + (
              "" if not bad else f"; first miss at '{bad[0]['label']}': reserved {bad[0]['reserved']} vs "
                                 f"runtime {bad[0]['runtime_live']} + vmm {bad[0]['vmm_live']}"), rows=rows)
    if any("segments_missing_in_trace" in r for r in rows):
        c.add(f"{label_prefix}live cudaMalloc set == torch's segments (address and size)", seg_ok,
              "identical at every checkpoint" if seg_ok else "differs (see rows)")
    if cli_err:
        c.add(f"{label_prefix}`gpusleuth memory --at` == memory_reserved()", None, f"not available: {cli_err}")
    else:
        miss = [r for r in rows if r.get("gpusleuth_live_bytes") != r["reserved"] + r["driver_direct_live"]]
        c.add(f"{label_prefix}`gpusleuth memory --at` == memory_reserved() + other libraries' direct driver allocations", not miss,
              f"{len(rows) - len(miss)}/{len(rows)} equal (--at spelled {rows[0].get('gpusleuth_at_style')})" + (
                  "" if not miss else f"; first miss '{miss[0]['label']}': gpusleuth {miss[0].get('gpusleuth_live_bytes')}"
                                      f" vs reserved {miss[0]['reserved']} (direct driver allocations "
                                      f"{miss[0]['driver_direct_live']})"))
    # Issue 8: allocator-level "allocated", if gpusleuth reports one.
    fields = rows[-1].get("gpusleuth_allocator_fields") or {}
    alloc_key = next((k for k in fields if "allocated" in k), None)
    if alloc_key:
        miss = [r for r in rows if (r.get("gpusleuth_allocator_fields") or {}).get(alloc_key) != r["allocated"]]
        c.add(f"{label_prefix}gpusleuth {alloc_key} == memory_allocated() (issue 8)", not miss,
              f"{len(rows) - len(miss)}/{len(rows)} equal")
    else:
        c.add(f"{label_prefix}gpusleuth allocated == memory_allocated() (issue 8)", None,
              "gpusleuth reports no allocator-level 'allocated' (no libc10_cuda probes yet); torch's numbers and "
              "segments are logged for a later comparison")
    return rows


def gap_breakdown(cps):
    """Issue 8 from torch's own snapshot: reserved - allocated split by segment; must sum exactly."""
    out = []
    for cp in cps:
        segs = cp.get("segments")
        if segs is None:
            continue
        gap = cp["reserved"] - cp["allocated"]
        per = []
        for s in segs:
            free = (s.get("total_size") or 0) - (s.get("allocated_size") or 0)
            per.append({"total": s.get("total_size"), "allocated": s.get("allocated_size"), "gap": free,
                        "pool": s.get("segment_type"), "expandable": s.get("is_expandable"),
                        "live_blocks": s.get("n_used_blocks"),
                        "live_block_sizes": [b[0] for b in s.get("blocks", []) if b[2] != "inactive"][:8]})
        per.sort(key=lambda p: -p["gap"])
        stats = cp.get("stats", {})
        out.append({"label": cp["label"], "reserved": cp["reserved"], "allocated": cp["allocated"], "gap": gap,
                    "sum_of_segment_gaps": sum(p["gap"] for p in per), "segments": len(per),
                    "small_pool": {"reserved": stats.get("reserved_bytes.small_pool.current"),
                                   "allocated": stats.get("allocated_bytes.small_pool.current")},
                    "large_pool": {"reserved": stats.get("reserved_bytes.large_pool.current"),
                                   "allocated": stats.get("allocated_bytes.large_pool.current")},
                    "rounding_bytes": (stats.get("allocated_bytes.all.current", 0)
                                       - stats.get("requested_bytes.all.current", 0))
                    if "requested_bytes.all.current" in stats else None,
                    "top_segments": per[:5]})
    return out


def check_counts(c, gs, tr, db, cps, pid, mode):
    last = cps[-1] if cps else None
    if last is None:
        c.add("op counts", None, "no checkpoints")
        return
    st = last.get("stats", {})
    until = last["mono_ns"]
    n_malloc = tr.ok_count(pid, RUNTIME_ALLOC, until)
    n_free = tr.ok_count(pid, RUNTIME_FREE, until, nonnull=True)
    n_create = tr.ok_count(pid, VMM_CREATE, until)
    n_release = tr.ok_count(pid, VMM_RELEASE, until)
    seg_alloc, seg_free = st.get("segment.all.allocated"), st.get("segment.all.freed")
    data = {"cudaMalloc_ok": n_malloc, "cudaFree_nonnull_ok": n_free, "cuMemCreate_ok": n_create,
            "cuMemRelease_ok": n_release, "torch_segment_allocated": seg_alloc, "torch_segment_freed": seg_free,
            "torch_num_device_alloc": st.get("num_device_alloc"), "torch_num_device_free": st.get("num_device_free"),
            "torch_num_alloc_retries": st.get("num_alloc_retries")}
    if mode == "default":
        ok = n_malloc == seg_alloc and n_free == seg_free
        c.add("cudaMalloc/cudaFree counts == torch segment.all.allocated/freed", ok,
              f"cudaMalloc {n_malloc} vs {seg_alloc}, cudaFree(non-NULL) {n_free} vs {seg_free}", **data)
    else:
        nda, ndf = st.get("num_device_alloc"), st.get("num_device_free")
        # torch's num_device_alloc/free do not count cuMemCreate handles one to one,
        # so a difference is not evidence either way: unverified, not failed.
        ok = True if (nda is not None and n_create == nda and n_release == ndf) else None
        c.add("cuMemCreate/cuMemRelease counts vs torch num_device_alloc/free", ok,
              f"cuMemCreate {n_create} vs {nda}, cuMemRelease {n_release} vs {ndf} (torch's counters may count "
              f"map calls, not handles: informational unless equal)", **data)
    # gpusleuth stats vs the database it read (every op, per process).
    obj, err = gs.json("stats", "--db", db, "--pid", pid, "--json")
    if obj is None:
        obj, err2 = gs.json("stats", "--db", db, "--json")
        err = err if obj is None else None
    if obj is None:
        c.add("`gpusleuth stats` counts == database", None, f"stats unavailable: {err}")
        return
    recorded, counted = tr.call_counts(pid), tr.op_counts(pid)
    diffs, table = [], {}
    for o in obj.get("ops", []):
        op = o.get("op")
        want = recorded.get(op, 0) + counted.get(op, 0)
        table[op] = o.get("count")
        if o.get("count") != want:
            diffs.append(f"{op}: stats {o.get('count')} vs db {want}")
    c.add("`gpusleuth stats` counts == database (recorded + counted)", not diffs,
          "all equal" if not diffs else "; ".join(diffs[:5]), stats_counts=table)
    launches = {op: counted.get(op, recorded.get(op)) for op in LAUNCH_OPS}
    drv = sum(v or 0 for k, v in launches.items() if k != "cudaLaunchKernel")
    rt = launches.get("cudaLaunchKernel")
    c.add("launch counts (runtime vs driver)", None,
          f"cudaLaunchKernel {rt}, cuLaunchKernel {launches.get('cuLaunchKernel')}, cuLaunchKernelEx "
          f"{launches.get('cuLaunchKernelEx')}; driver total {drv}"
          + (f", {drv - rt} launched without the runtime (cuBLAS etc.)" if rt is not None else
             " (cudaLaunchKernel not probed in this mode)")
          + "; no independent launch count in this scenario (bench (c) checks launch counting exactly)",
          launches=launches, per_op=dict(recorded))


def check_explain_no_os_blame(c, gs, db):
    obj, err = gs.json("explain", "--db", db, "--json")
    if obj is None:
        c.add("explain does not blame the OS for blocked waits", None, f"explain unavailable: {err}")
        return None
    kinds = [f.get("kind") for f in obj.get("findings", [])]
    pre = [f for f in obj.get("findings", []) if f.get("kind") == "cpu_preemption"]
    c.add("explain does not blame the OS for blocked waits", not pre,
          f"findings: {kinds}" if not pre else f"cpu_preemption reported: {pre[0].get('summary')}", kinds=kinds)
    frag = [f for f in obj.get("findings", []) if f.get("kind") == "fragmentation"]
    c.add("explain reports a fragmentation finding (issue 8)", True if frag else None,
          frag[0].get("summary") if frag else "no 'fragmentation' finding (allocator probes not there yet)")
    return obj


def scenario(check):
    """A scenario's checks: opens its run (recording why not, then stopping) and
    calls check(c, gs, run, trace, log, *extra); the result is the checks' JSON."""
    def wrapped(gs, runs, work, name, *extra):
        c = Checks(name)
        opened = open_run(c, runs, name, work)
        if not opened:
            return c.to_json()
        return check(c, gs, *opened, *extra)
    return wrapped


def by_label(log):
    """The workload log's labelled records, by label (the last one wins)."""
    return {r["label"]: r for r in log if "label" in r}


@scenario
def scenario_seed(c, gs, run, tr, log, mode):
    start = next((r for r in log if r.get("label") == "start"), {})
    pid = start.get("pid")
    if pid is None:
        c.add("workload log", None, "no start record with a pid")
        return c.to_json()
    check_capture_health(c, tr)
    cps = checkpoints(log, pid)
    rows = check_ledger_at_checkpoints(c, gs, tr, run["db"], cps, pid)
    gaps = gap_breakdown(cps)
    bad = [g for g in gaps if g["gap"] != g["sum_of_segment_gaps"]]
    c.add("torch snapshot: segment gaps sum to reserved - allocated", (not bad) if gaps else None,
          f"{len(gaps) - len(bad)}/{len(gaps)} checkpoints sum exactly" if gaps else "no segments logged")
    check_counts(c, gs, tr, run["db"], cps, pid, mode)
    check_explain_no_os_blame(c, gs, run["db"])
    # `gpusleuth query` once, so its JSON path is exercised on real data.
    n = tr.one("SELECT count(*) FROM calls")
    rc, out, err = gs.run("query", "--db", run["db"], "--json", "SELECT count(*) AS n FROM calls")
    c.add("`gpusleuth query` answers", (str(n) in out) if rc == 0 else None,
          f"count(*) {n} {'found' if str(n) in out else 'not found'} in its output" if rc == 0 else
          f"query unavailable: {(err.strip().splitlines() or ['?'])[-1][:200]}")
    res = c.to_json()
    res.update({"pid": pid, "ledger_rows": rows, "gap_breakdown": gaps, "torch": start.get("torch"),
                "cuda": start.get("cuda"), "transformers": start.get("transformers"),
                "alloc_conf": start.get("alloc_conf"), "result": run.get("result")})
    return res


def window_runnable(tr, pid, a, b):
    """(runnable ns of the process's recorded calls starting in [a, b), runnable ns in its waits, culprits)."""
    calls = tr.one("SELECT coalesce(sum(runnable_ns), 0) FROM calls WHERE pid = ? AND ts_ns >= ? AND ts_ns < ?",
                   pid, a, b)
    waits = tr.one("SELECT coalesce(sum(runnable_ns), 0) FROM waits WHERE pid = ? AND on_ns >= ? AND on_ns < ?",
                   pid, a, b)
    culprits = tr.q("SELECT k.pid, k.comm, sum(k.ns) FROM wait_culprits k JOIN waits w ON w.id = k.wait_id "
                    "WHERE w.pid = ? AND w.on_ns >= ? AND w.on_ns < ? GROUP BY k.pid, k.comm ORDER BY 3 DESC",
                    pid, a, b)
    return calls, waits, [{"pid": p, "comm": cm, "ns": ns} for p, cm, ns in culprits]


@scenario
def scenario_contention(c, gs, run, tr, log):
    ev = by_label(log)
    needed = ["quiet_start", "quiet_end", "contended_start", "contended_end"]
    if not all(k in ev for k in needed):
        c.add("phases logged", None, f"missing {[k for k in needed if k not in ev]}")
        return c.to_json()
    pid = ev["start"]["pid"]
    npid, ncomm = ev["contended_start"].get("neighbour_pid"), ev["contended_start"].get("neighbour_comm")
    check_capture_health(c, tr)
    q0, q1 = ev["quiet_start"]["mono_ns"], ev["quiet_end"]["mono_ns"]
    b0, b1 = ev["contended_start"]["mono_ns"], ev["contended_end"]["mono_ns"]
    qc, qw, qcul = window_runnable(tr, pid, q0, q1)
    bc, bw, bcul = window_runnable(tr, pid, b0, b1)
    q_share = max(qc, qw) / max(1, q1 - q0)
    b_share = max(bc, bw) / max(1, b1 - b0)
    c.add("quiet phase shows ~no runnable time", q_share <= QUIET_MAX_RUNNABLE_SHARE,
          f"runnable {max(qc, qw) / 1e6:.2f} ms in {(q1 - q0) / 1e9:.2f} s ({100 * q_share:.3f}%, limit "
          f"{100 * QUIET_MAX_RUNNABLE_SHARE:.1f}%); culprits {qcul[:3]}", calls_ns=qc, waits_ns=qw)
    n_in_busy = sum(x["ns"] for x in bcul if x["pid"] == npid)
    c.add("contended phase: runnable time appears, the neighbour holds the CPU", b_share > q_share and n_in_busy > 0,
          f"runnable {max(bc, bw) / 1e6:.1f} ms in {(b1 - b0) / 1e9:.2f} s ({100 * b_share:.2f}%); neighbour "
          f"{npid} ({ncomm}) held {n_in_busy / 1e6:.1f} ms of it; culprits {bcul[:3]}",
          calls_ns=bc, waits_ns=bw, culprits=bcul[:5])
    n_in_quiet = sum(x["ns"] for x in qcul if x["pid"] == npid)
    c.add("quiet phase: the neighbour is not blamed", n_in_quiet == 0, f"{n_in_quiet} ns attributed to it")
    obj, err = gs.json("explain", "--db", run["db"], "--json")
    if obj is None:
        c.add("explain names the neighbour (pid, comm, share)", None, f"explain unavailable: {err}")
    else:
        found = None
        for f in obj.get("findings", []):
            if f.get("kind") != "cpu_preemption":
                continue
            for k in f.get("culprits", []):
                if k.get("pid") == npid or (k.get("comm") or "").startswith("gs-neighbour"):
                    found = (f, k)
                    break
            if found:
                break
        if found:
            f, k = found
            top = (f.get("culprits") or [{}])[0]
            c.add("explain names the neighbour (pid, comm, share)",
                  k.get("pid") == npid and k.get("comm", "").startswith("gs-neighbour") and (k.get("share") or 0) > 0,
                  f"pid {k.get('pid')} comm {k.get('comm')} share {k.get('share')}; top culprit pid "
                  f"{top.get('pid')} ({top.get('comm')}); summary: {f.get('summary')}", finding=f)
        else:
            c.add("explain names the neighbour (pid, comm, share)", False,
                  f"no cpu_preemption finding naming pid {npid}; kinds {[f.get('kind') for f in obj.get('findings', [])]}")
    res = c.to_json()
    res.update({"pid": pid, "neighbour_pid": npid, "neighbour_comm": ncomm, "quiet_runnable_share": q_share,
                "contended_runnable_share": b_share, "result": run.get("result"),
                "neighbour_is_descendant": ev["contended_start"].get("neighbour_is_descendant")})
    return res


@scenario
def scenario_oom(c, gs, run, tr, log):
    ev = by_label(log)
    if "oom attempt" not in ev or "before oom" not in ev:
        c.add("oom logged", None, "no 'oom attempt' record")
        return c.to_json()
    pid = ev["start"]["pid"]
    att, before = ev["oom attempt"], ev["before oom"]
    req = att["requested_bytes"]
    c.add("the workload saw an OOM error", bool(att.get("raised")), (att.get("error") or "no error raised")[:200])
    check_capture_health(c, tr)
    failed = tr.q("SELECT op, size, ret, ts_ns, nested FROM calls WHERE pid = ? AND ret != 0 AND ts_ns >= ? AND "
                  "ts_ns <= ? AND op IN ('cudaMalloc', 'cudaMallocAsync', 'cuMemAlloc_v2', 'cuMemCreate') "
                  "ORDER BY ts_ns", pid, att["attempt_start_ns"], att["attempt_end_ns"])
    rt = [f for f in failed if f[0].startswith("cuda")]
    good = [f for f in rt if f[1] is not None and req <= f[1] < req + ROUND_LARGE and f[2] == CUDA_ERROR_MEMORY_ALLOCATION]
    c.add("failed cudaMalloc recorded with its size and error 2", bool(good) and len(good) == len(rt),
          f"{len(rt)} failed runtime allocation(s) in the attempt window: "
          + ", ".join(f"{op} size={sz} ret={ret}" for op, sz, ret, _, _ in rt[:4]) + f"; requested {req}",
          failed=[list(f) for f in failed[:8]])
    mem, err = gs.json("memory", "--db", run["db"], "--json")
    entry = proc_entry(mem, pid)
    if entry is None:
        c.add("`gpusleuth memory` lists the failed allocation", None, err or f"pid {pid} not in memory output")
    else:
        fa = [f for f in entry.get("failed_allocs", []) if f.get("error") == CUDA_ERROR_MEMORY_ALLOCATION
              and req <= (f.get("bytes") or 0) < req + ROUND_LARGE]
        c.add("`gpusleuth memory` lists the failed allocation", bool(fa),
              f"{len(fa)} matching of {len(entry.get('failed_allocs', []))} failed_allocs"
              + (f"; first: {fa[0]}" if fa else ""))
        if fa and "live_bytes_at" in fa[0]:
            c.add("live bytes at the failure == memory_reserved() before it", fa[0]["live_bytes_at"] == before["reserved"],
                  f"gpusleuth {fa[0]['live_bytes_at']} vs torch reserved {before['reserved']} "
                  f"(allocated {before['allocated']})")
    obj, err = gs.json("explain", "--db", run["db"], "--json")
    if obj is None:
        c.add("explain reports allocation_failure", None, f"explain unavailable: {err}")
    else:
        af = [f for f in obj.get("findings", []) if f.get("kind") == "allocation_failure"]
        c.add("explain reports allocation_failure", bool(af),
              af[0].get("summary", "")[:300] if af else f"kinds {[f.get('kind') for f in obj.get('findings', [])]}",
              finding=af[0] if af else None)
    cps = checkpoints(log, pid)
    rows = check_ledger_at_checkpoints(c, gs, tr, run["db"], cps, pid)
    res = c.to_json()
    res.update({"pid": pid, "requested_bytes": req, "reserved_before": before["reserved"],
                "allocated_before": before["allocated"], "ledger_rows": rows, "result": run.get("result"),
                "num_alloc_retries": (ev.get("after oom", {}).get("stats") or {}).get("num_alloc_retries")})
    return res


@scenario
def scenario_multiproc(c, gs, run, tr, log):
    starts = [r for r in log if r.get("label") == "start" and "worker" in r]
    if len(starts) != 2:
        c.add("two workers logged", False, f"{len(starts)} worker start records")
        if not starts:
            return c.to_json()
    check_capture_health(c, tr)
    procs = tr.processes()
    workers = {}
    for s in starts:
        pid, w = s["pid"], s["worker"]
        c.add(f"worker {w} (pid {pid}) is a process of the trace", pid in procs, f"comm {procs.get(pid)}")
        cps = checkpoints(log, pid)
        rows = check_ledger_at_checkpoints(c, gs, tr, run["db"], cps, pid, label_prefix=f"worker {w}: ")
        last = cps[-1] if cps else None
        if last:
            n_malloc = tr.ok_count(pid, RUNTIME_ALLOC, last["mono_ns"])
            seg = last.get("stats", {}).get("segment.all.allocated")
            c.add(f"worker {w}: cudaMalloc count == torch segment.all.allocated", n_malloc == seg,
                  f"{n_malloc} vs {seg}")
            obj, err = gs.json("stats", "--db", run["db"], "--pid", pid, "--json")
            if obj is None:
                c.add(f"worker {w}: `gpusleuth stats --pid` cudaMalloc count", None, f"unavailable: {err}")
            else:
                got = next((o.get("count") for o in obj.get("ops", []) if o.get("op") == "cudaMalloc"), 0)
                total = tr.ok_count(pid, RUNTIME_ALLOC) + (tr.one(
                    "SELECT count(*) FROM calls WHERE pid = ? AND op = 'cudaMalloc' AND ret != 0", pid) or 0)
                c.add(f"worker {w}: `gpusleuth stats --pid` cudaMalloc count", got == total,
                      f"stats {got} vs database {total} (torch's own: {seg})")
        workers[str(w)] = {"pid": pid, "sizes": s.get("sizes"), "ledger_rows": rows}
    res = c.to_json()
    res.update({"workers": workers, "result": run.get("result")})
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--gs", required=True)
    ap.add_argument("--out", help="default: WORK/checks.json")
    a = ap.parse_args()
    gs = Gs(a.gs)
    runs = load_runs(a.work)
    results = {}
    steps = [
        ("s1_default", lambda n: scenario_seed(gs, runs, a.work, n, "default")),
        ("s1_expandable", lambda n: scenario_seed(gs, runs, a.work, n, "expandable")),
        ("s2_contention", lambda n: scenario_contention(gs, runs, a.work, n)),
        ("s3_oom", lambda n: scenario_oom(gs, runs, a.work, n)),
        ("s4_multiproc", lambda n: scenario_multiproc(gs, runs, a.work, n)),
    ]
    for name, fn in steps:
        print(f"== checking {name}", flush=True)
        try:
            results[name] = fn(name)
        except Exception as e:  # one broken scenario must not hide the others' results
            import traceback

            traceback.print_exc()
            results[name] = {"checks": [{"name": "checker", "ok": False, "detail": f"checker crashed: {e!r}"}]}
    out = a.out or os.path.join(a.work, "checks.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"checks written to {out}")


if __name__ == "__main__":
    main()
