#!/usr/bin/env python3
"""Scenario 4 (issue 7): two CUDA processes at once, each with its own known tensors.

The parent (no CUDA) starts two workers (children, so `gpusleuth trace --
multiproc.py` follows them). Each worker allocates a distinct set of tensors,
waits until the other has allocated too (both hold memory at the same time),
checkpoints, frees part of its set with empty_cache(), checkpoints again and
exits. Every worker logs its pid, the sizes it asked for and, at each
checkpoint, torch's allocated/reserved with CLOCK_MONOTONIC ns.

  multiproc.py --log FILE        # workers append to FILE (one JSON line per write, pid in each)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import CheckpointLog, log_path_from, settle  # noqa: E402

MiB = 1 << 20
# Distinct sizes per worker (bytes); both small-pool (<= 1 MiB) and large-pool requests.
SIZES = {
    0: [64 * MiB, 128 * MiB, 3 * MiB, 10 * MiB + 512, 300 * 1024],
    1: [256 * MiB, 33 * MiB, 1 * MiB, 7 * MiB, 4096],
}
# Indices freed (then empty_cache) before the second checkpoint.
FREED = {0: [1, 3], 1: [0, 2]}


def barrier(dirname, name, me, timeout=60):
    open(os.path.join(dirname, f"{name}.{me}"), "w").close()
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(dirname, f"{name}.{w}")) for w in SIZES):
        if time.monotonic() > deadline:
            raise SystemExit(f"worker {me}: barrier {name} timed out")
        time.sleep(0.01)


def worker(me, path, sync_dir):
    import torch

    settle()
    log = CheckpointLog(path, "multiproc", worker=me, sizes=SIZES[me], freed=FREED[me], torch=torch.__version__)
    tensors = []
    for n in SIZES[me]:
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        t.fill_(me + 1)
        tensors.append(t)
    barrier(sync_dir, "allocated", me)
    log.checkpoint("both allocated", worker=me)
    barrier(sync_dir, "checked", me)
    for i in FREED[me]:
        tensors[i] = None
    torch.cuda.empty_cache()
    log.checkpoint("after partial free", worker=me)
    barrier(sync_dir, "done", me)
    log.event("end", worker=me)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--sync-dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    path = log_path_from(a.log)
    if not path:
        ap.error("give --log FILE or GS_LOG")
    if a.worker is not None:
        worker(a.worker, path, a.sync_dir)
        return
    sync_dir = tempfile.mkdtemp(prefix="gs-multiproc-")
    procs = {w: subprocess.Popen([sys.executable, os.path.abspath(__file__), "--log", path, "--worker", str(w),
                                  "--sync-dir", sync_dir]) for w in SIZES}
    rcs = {w: p.wait() for w, p in procs.items()}
    print(json.dumps({"scenario": "multiproc", "parent_pid": os.getpid(),
                      "workers": {str(w): {"pid": procs[w].pid, "rc": rcs[w], "sizes": SIZES[w]} for w in SIZES}}),
          flush=True)
    sys.exit(0 if all(rc == 0 for rc in rcs.values()) else 1)


if __name__ == "__main__":
    main()
