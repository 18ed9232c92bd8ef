#!/usr/bin/env python3
"""Scenario 3 (issue 7): an allocation larger than what the card has left.

Holds a 1 GiB tensor (so the process has live device memory), then asks for
one tensor of (free memory + --extra-gib) bytes, which must fail with
torch.OutOfMemoryError; the error is caught. Logs the requested size, the
size PyTorch's allocator asks cudaMalloc for (rounded up to 2 MiB), torch's
allocated/reserved just before and after, and CLOCK_MONOTONIC ns around the
attempt.

Plain cudaMalloc only (no managed memory), so a failed request cannot hang the GPU.

  oom.py --log FILE
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CheckpointLog, log_path_from, settle  # noqa: E402

ROUND_LARGE = 2 << 20  # PyTorch's caching allocator rounds large cudaMalloc sizes up to 2 MiB


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log")
    ap.add_argument("--hold-gib", type=float, default=1.0)
    ap.add_argument("--extra-gib", type=float, default=1.0)
    a = ap.parse_args()
    path = log_path_from(a.log)
    if not path:
        ap.error("give --log FILE or GS_LOG")

    import torch

    settle()
    log = CheckpointLog(path, "oom", torch=torch.__version__)
    held = torch.empty(int(a.hold_gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    held.fill_(1)
    free, total = torch.cuda.mem_get_info()
    requested = free + int(a.extra_gib * (1 << 30))
    requested -= requested % 512
    before = log.checkpoint("before oom", free=free, total=total, requested_bytes=requested,
                            expected_cudamalloc_bytes=-(-requested // ROUND_LARGE) * ROUND_LARGE)
    err = None
    t_attempt = time.monotonic_ns()
    try:
        x = torch.empty(requested, dtype=torch.uint8, device="cuda")
        del x
    except torch.OutOfMemoryError as e:
        err = str(e).splitlines()[0][:400]
    t_after = time.monotonic_ns()
    log.event("oom attempt", attempt_start_ns=t_attempt, attempt_end_ns=t_after, requested_bytes=requested,
              raised=err is not None, error=err)
    after = log.checkpoint("after oom")
    del held
    torch.cuda.empty_cache()
    log.checkpoint("after release")
    log.event("end")
    print(json.dumps({"scenario": "oom", "pid": os.getpid(), "requested_bytes": requested, "raised": err is not None,
                      "free_before": free, "total": total, "reserved_before": before["reserved"],
                      "reserved_after": after["reserved"], "num_alloc_retries": after["stats"].get("num_alloc_retries"),
                      "num_ooms": after["stats"].get("num_ooms")}), flush=True)
    sys.exit(0 if err is not None else 1)


if __name__ == "__main__":
    main()
