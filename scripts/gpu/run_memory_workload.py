"""Issue 16 round 17: a PyTorch program whose memory outlives the files of a
`trace --rotate 2s --keep 3` run. At its start it allocates a "model" (six
256 MiB tensors, kept to the end: made in files --keep deletes); then for
about 12 s it makes and drops working buffers of varied sizes, empties the
cache every 2 s (segments allocated in one file are freed in a later one)
and keeps one more 32 MiB tensor every second (growth).
Ground truth in argv[1] (JSON): torch.cuda.memory_reserved() and
memory_allocated() at checkpoints (CLOCK_MONOTONIC ns, the tracer's clock),
the last one right before exit, and the pid.
"""
import json
import os
import sys
import time

import torch

out = sys.argv[1]
dev = torch.device("cuda")
points = []


def checkpoint(what):
    torch.cuda.synchronize()
    points.append(
        {
            "what": what,
            "ts_ns": time.monotonic_ns(),
            "reserved": torch.cuda.memory_reserved(),
            "allocated": torch.cuda.memory_allocated(),
        }
    )


model = [torch.ones(64 << 20, device=dev) for _ in range(6)]  # 6 x 256 MiB
checkpoint("model")
kept = []
start = time.monotonic()
last_empty = start
last_keep = start
step = 0
while time.monotonic() - start < 12.0:
    size = (1 + step % 7) << 20  # 1..7 Mi floats: 4..28 MiB working buffers
    a = torch.empty(size, device=dev)
    b = a * 2.0
    del a, b
    now = time.monotonic()
    if now - last_keep >= 1.0:
        kept.append(torch.zeros(8 << 20, device=dev))  # 32 MiB kept
        last_keep = now
    if now - last_empty >= 2.0:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        last_empty = now
        checkpoint(f"emptied at step {step}")
    step += 1
    time.sleep(0.005)
checkpoint("end")
json.dump({"pid": os.getpid(), "points": points, "kept": len(kept), "steps": step}, open(out, "w"))
print(f"{step} steps, {len(kept)} kept, reserved {points[-1]['reserved']} allocated {points[-1]['allocated']}")
