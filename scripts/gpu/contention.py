#!/usr/bin/env python3
"""Scenario 2 (issue 7): CPU contention on a real GPU.

A bf16 matmul + torch.cuda.synchronize() loop pinned to --cpus. After
--quiet-s seconds the CPU-burning neighbour (neighbour.py, comm
`gs-neighbour`, pinned to the same CPUs) is released through --fifo, and the
loop runs --busy-s more seconds. Phase boundaries (CLOCK_MONOTONIC ns) and the
neighbour's pid go to the JSON-lines log.

The neighbour is started by run_all.sh before the trace, so it is not a
descendant of the traced command (a real neighbour). Without a reader on the
FIFO the script spawns one itself and logs `neighbour_is_descendant: true`.

  contention.py --log FILE --cpus 3 --fifo /tmp/w/go.fifo --pid-file /tmp/w/neighbour.pid
"""

import argparse
import errno
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import CheckpointLog, log_path_from, settle  # noqa: E402
from neighbour import parse_cpus  # noqa: E402


def release_neighbour(a):
    """Wakes the external neighbour, or spawns one. Returns (pid, is_descendant)."""
    if a.fifo:
        try:
            fd = os.open(a.fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
            print("contention: no neighbour waiting on the FIFO; spawning one", file=sys.stderr)
        else:
            os.write(fd, b"go\n")
            os.close(fd)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    with open(a.pid_file) as f:
                        return int(f.read().strip()), False
                except (OSError, ValueError):
                    time.sleep(0.005)
            raise SystemExit("contention: the neighbour did not write its pid file within 10 s")
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "neighbour.py"), "--cpus", a.cpus,
                          "--max-burn-s", str(a.busy_s + 5)])
    return p.pid, True


def loop(torch, x, y, seconds):
    times = []
    end = time.monotonic() + seconds
    while True:
        t = time.monotonic()
        if t >= end:
            break
        torch.matmul(x, y)
        torch.cuda.synchronize()
        times.append(time.monotonic() - t)
    return times


def phase_summary(times):
    if not times:
        return {"iterations": 0}
    return {"iterations": len(times), "mean_ms": round(1e3 * statistics.fmean(times), 4),
            "p50_ms": round(1e3 * statistics.median(times), 4), "max_ms": round(1e3 * max(times), 4)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log")
    ap.add_argument("--cpus", default=None, help="CPU list, e.g. 3 or 2-3 (default: the last allowed CPU)")
    ap.add_argument("--quiet-s", type=float, default=6)
    ap.add_argument("--busy-s", type=float, default=6)
    ap.add_argument("--n", type=int, default=8192, help="matmul size (n x n, bf16)")
    ap.add_argument("--fifo")
    ap.add_argument("--pid-file")
    a = ap.parse_args()
    if a.cpus is None:
        a.cpus = str(max(os.sched_getaffinity(0)))
    if a.fifo and not a.pid_file:
        ap.error("--fifo needs --pid-file")
    path = log_path_from(a.log)
    if not path:
        ap.error("give --log FILE or GS_LOG")
    # Pinned before torch starts its threads, so they inherit the affinity.
    os.sched_setaffinity(0, parse_cpus(a.cpus))

    import torch

    settle()
    log = CheckpointLog(path, "contention", cpus=a.cpus, n=a.n, torch=torch.__version__)
    x = torch.randn(a.n, a.n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(a.n, a.n, device="cuda", dtype=torch.bfloat16)
    loop(torch, x, y, 0.5)  # warm-up: cuBLAS handles, kernels chosen
    log.event("quiet_start")
    quiet = loop(torch, x, y, a.quiet_s)
    log.event("quiet_end")
    npid, descendant = release_neighbour(a)
    time.sleep(0.05)  # let it get on the CPU before the contended phase is timed
    try:
        with open(f"/proc/{npid}/comm") as f:
            ncomm = f.read().strip()
    except OSError:
        ncomm = "?"
    log.event("contended_start", neighbour_pid=npid, neighbour_comm=ncomm, neighbour_is_descendant=descendant)
    busy = loop(torch, x, y, a.busy_s)
    log.event("contended_end", neighbour_pid=npid)
    try:
        os.kill(npid, signal.SIGTERM)
    except OSError:
        pass
    log.event("end")
    print(json.dumps({"scenario": "contention", "pid": os.getpid(), "cpus": a.cpus, "neighbour_pid": npid,
                      "neighbour_comm": ncomm, "quiet": phase_summary(quiet), "contended": phase_summary(busy)}),
          flush=True)


if __name__ == "__main__":
    main()
