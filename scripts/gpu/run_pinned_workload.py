"""Issue 16 round 19: a PyTorch program that pins a host buffer at its start
and copies from it in every step of a `trace --rotate 2s` run, so every
later file's copies come from memory pinned in the run's first file. It
also copies from a pageable buffer every fifth step (what must stay
pageable), allocates a 1 GiB "model" at the start and keeps a few MiB more
now and then (the memory at each checkpoint).
Ground truth in argv[1] (JSON): the copies it made from each buffer, the
buffers' addresses and sizes, torch.cuda.memory_reserved() at checkpoints
(CLOCK_MONOTONIC ns, the tracer's clock) and the pid.
"""
import json
import os
import sys
import time

import torch

out = sys.argv[1]
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
dev = torch.device("cuda")
points = []


def checkpoint(what):
    torch.cuda.synchronize()
    points.append({"what": what, "ts_ns": time.monotonic_ns(), "reserved": torch.cuda.memory_reserved()})


model = [torch.ones(64 << 20, device=dev) for _ in range(4)]  # 4 x 256 MiB, in file 1
pinned = torch.ones(4 << 20).pin_memory()  # 16 MiB, pinned at the start
pageable = torch.ones(4 << 20)  # 16 MiB, never pinned
checkpoint("model")
kept = []
pinned_copies = pageable_copies = 0
start = last_cp = time.monotonic()
step = 0
while time.monotonic() - start < seconds:
    x = pinned.to(dev, non_blocking=True)
    pinned_copies += 1
    if step % 5 == 0:
        y = pageable.to(dev)
        pageable_copies += 1
        del y
    z = x * 2.0
    del x, z
    if step % 100 == 0:
        kept.append(torch.empty((1 + step % 3) << 20, device=dev))
    if time.monotonic() - last_cp >= 1.5:
        checkpoint(f"step {step}")
        time.sleep(0.05)  # a quiet moment around the checkpoint
        last_cp = time.monotonic()
    step += 1
    time.sleep(0.002)
checkpoint("end")
json.dump(
    {
        "pid": os.getpid(),
        "points": points,
        "steps": step,
        "pinned_copies": pinned_copies,
        "pageable_copies": pageable_copies,
        "pinned": [pinned.data_ptr(), pinned.nbytes],
        "pageable": [pageable.data_ptr(), pageable.nbytes],
    },
    open(out, "w"),
)
print(f"{step} steps, {pinned_copies} pinned and {pageable_copies} pageable copies, reserved {points[-1]['reserved']}")
