"""Issue 16 round 16: a PyTorch program for `--last` over several files of a
`trace --rotate` run. It pins one host buffer at its start, then copies
host-to-device from a pageable tensor for PAGEABLE_S seconds, then only from
the pinned buffer for PINNED_S seconds (a small kernel after each copy).
Ground truth in argv[1] (JSON): every copy's CLOCK_MONOTONIC start (the
tracer's clock) and kind, the pinned buffer's address and size.
"""
import json
import sys
import time

import torch

PAGEABLE_S = 5.0
PINNED_S = 17.0
N = 1 << 24  # floats: 64 MiB per copy (a pageable one is staged on the CPU: a finding)

out = sys.argv[1]
dev = torch.device("cuda")
pinned = torch.ones(N, pin_memory=True)
pageable = torch.ones(N)
assert pinned.is_pinned() and not pageable.is_pinned()
gpu = torch.empty(N, device=dev)
torch.cuda.synchronize()
copies = []


def phase(src, kind, seconds, nap):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        copies.append((time.monotonic_ns(), kind))
        gpu.copy_(src, non_blocking=(kind == "pinned"))
        gpu.mul_(1.0001)
        torch.cuda.synchronize()
        time.sleep(nap)


phase(pageable, "pageable", PAGEABLE_S, 0.001)
switch_ns = time.monotonic_ns()
phase(pinned, "pinned", PINNED_S, 0.01)
json.dump(
    {
        "copies": copies,
        "switch_ns": switch_ns,
        "pinned_ptr": pinned.data_ptr(),
        "pinned_bytes": pinned.numel() * pinned.element_size(),
    },
    open(out, "w"),
)
print(f"{len(copies)} copies, {sum(1 for _, k in copies if k == 'pageable')} pageable")
