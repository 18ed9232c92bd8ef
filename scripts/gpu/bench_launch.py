#!/usr/bin/env python3
"""Benchmark (c): a launch-bound micro loop, `x.add_(1)` on a 16-element tensor.

Each add_ is one kernel launch (cudaLaunchKernel -> cuLaunchKernel). Prints
one JSON line with the wall time of the timed loop and the number of add_
launches issued in the whole process (warm-up included), which the checker
compares with gpusleuth's launch counts.

  bench_launch.py [--launches 200000] [--warmup 1000]
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import settle  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=200_000)
    ap.add_argument("--warmup", type=int, default=1000)
    a = ap.parse_args()
    import torch

    settle()
    x = torch.zeros(16, device="cuda")
    for _ in range(a.warmup):
        x.add_(1)
    torch.cuda.synchronize()
    t0 = time.monotonic()
    for _ in range(a.launches):
        x.add_(1)
    torch.cuda.synchronize()
    wall = time.monotonic() - t0
    # Every add_ ran: the value is the number of adds (exact in fp32 below 2**24).
    value = int(x.max().item())
    adds = a.warmup + a.launches
    print(json.dumps({"bench": "launch", "wall_s": round(wall, 5), "timed_launches": a.launches,
                      "add_launches_total": adds, "value_ok": value == adds,
                      "us_per_launch": round(1e6 * wall / a.launches, 4), "pid": os.getpid()}), flush=True)
    sys.exit(0 if value == adds else 1)


if __name__ == "__main__":
    main()
