"""A running job for `trace --pid` (issue 19) that also measures its own GPU busy (issue 12).

It allocates HOLD_MIB of device memory through PyTorch, then loops until STOP_FILE exists:
each step runs MATMULS products of N x N on the GPU timed with CUDA events, synchronizes,
then sleeps IDLE_MS on the host. Every step is logged (JSON lines, wall-clock time.time()
before and after, GPU ms from the events), so the busy share of any wall-clock window is
known from the workload itself: sum of GPU time of the steps inside / window length.
It logs torch.cuda.memory_reserved()/memory_allocated() once the holding is in place and
writes READY_FILE then. Usage: hold_loop.py LOG READY_FILE STOP_FILE
Env: HOLD_MIB (1024), N (4096), MATMULS (8), IDLE_MS (60).
"""
import json
import os
import sys
import time

import torch

log_path, ready, stop = sys.argv[1], sys.argv[2], sys.argv[3]
hold_mib = int(os.environ.get("HOLD_MIB", "1024"))
n = int(os.environ.get("N", "4096"))
matmuls = int(os.environ.get("MATMULS", "8"))
idle_ms = float(os.environ.get("IDLE_MS", "60"))

log = open(log_path, "w", buffering=1)


def emit(**kw):
    log.write(json.dumps(kw) + "\n")


held = torch.empty(hold_mib * 1024 * 1024, dtype=torch.uint8, device="cuda")
a = torch.randn(n, n, device="cuda")
b = torch.randn(n, n, device="cuda")
c = a @ b  # warm up cuBLAS: its workspace is part of the holding
torch.cuda.synchronize()
emit(
    kind="holding",
    pid=os.getpid(),
    t=time.time(),
    reserved=torch.cuda.memory_reserved(),
    allocated=torch.cuda.memory_allocated(),
    held_tensor=held.numel(),
)
open(ready, "w").write(str(os.getpid()))
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
steps = 0
while not os.path.exists(stop):
    t0 = time.time()
    start.record()
    for _ in range(matmuls):
        c = a @ b
    end.record()
    end.synchronize()
    t1 = time.time()
    emit(kind="step", t0=t0, t1=t1, gpu_ms=start.elapsed_time(end))
    steps += 1
    time.sleep(idle_ms / 1000.0)
emit(
    kind="done",
    t=time.time(),
    steps=steps,
    reserved=torch.cuda.memory_reserved(),
    allocated=torch.cuda.memory_allocated(),
)
