"""Three phases for `stats/explain --from/--to` (issue 16, round 14), each
logging its own bounds on CLOCK_MONOTONIC (the trace's clock) and its truth.

    python3 window_workload.py OUT_JSON

  healthy  large bf16 matmuls, one .item() per step (GPU-bound)       ~3 s
  launch   tiny kernels (x.add_(1) on 16 elements), a sync every 1000  N launches
  healthy  the same as the first                                       ~3 s

Truth per phase: monotonic start and end (ns), steps, and for `launch` the
number of add_ kernels launched (one kernel each); perf_counter wall time.
"""
import json
import sys
import time

import torch

DEV = "cuda"
LAUNCHES = 200_000
HEALTHY_S = 3.0


def healthy(a, b):
    steps = 0
    end = time.perf_counter() + HEALTHY_S
    while time.perf_counter() < end:
        c = a @ b
        c = c @ b
        c.float().mean().item()
        steps += 1
    return {"steps": steps}


def launch():
    x = torch.zeros(16, device=DEV)
    for i in range(LAUNCHES):
        x.add_(1)
        if (i + 1) % 1000 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return {"launches": LAUNCHES}


def main():
    out = sys.argv[1]
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    # Warm up both kinds of work (cuBLAS handles, the add kernel) outside the phases.
    healthy_warm = (a @ b).float().mean().item()
    torch.zeros(16, device=DEV).add_(1)
    torch.cuda.synchronize()
    phases = []
    for name, run in [
        ("healthy1", lambda: healthy(a, b)),
        ("launch", launch),
        ("healthy2", lambda: healthy(a, b)),
    ]:
        t0, w0 = time.monotonic_ns(), time.perf_counter()
        truth = run()
        torch.cuda.synchronize()
        t1, w1 = time.monotonic_ns(), time.perf_counter()
        phases.append({"name": name, "start_mono_ns": t0, "end_mono_ns": t1, "wall_s": w1 - w0, **truth})
        print(f"{name}: {w1 - w0:.2f} s {truth}", flush=True)
    with open(out, "w") as f:
        json.dump({"phases": phases, "warm": float(healthy_warm)}, f)


if __name__ == "__main__":
    main()
