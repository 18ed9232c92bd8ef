"""Workloads for the bottleneck verdict (issue 12), each measuring its own truth.

    python3 verdict_workloads.py MODE OUT_JSON     # the loop (traced by gpusleuth)
    python3 verdict_workloads.py measure OUT_JSON  # GPU time per step of every mode (untraced)

Modes and the verdict expected first:
  starved  DataLoader num_workers=0 with a slow transform (CPU burn per sample)  -> host_bound
  workers  DataLoader num_workers=2, each worker too slow for the GPU            -> input_wait (worker pids)
  launch   200k tiny kernels (x.add_(1) on 16 elements), a sync every 1000      -> launch_bound
  item     a matmul chain, loss.item() every step, then host bookkeeping         -> sync_stall
  pageable H2D copies of 128 MiB from pageable memory every step                 -> pageable_copy
  healthy  large bf16 matmuls, one .item() per step                              -> no finding
  queued   item's matmul chain queued first, then the host bookkeeping while the
           GPU runs it, then loss.item(): the host work overlaps the GPU         -> no finding
  item_full, queued_full: the same loops, traced with --launches full (verdict_run.sh):
           every launch placed, the host stretch after a sync ends at the first one

Truth: perf_counter around the host phases (waiting for a batch, the transform,
the copies, the host bookkeeping) and the whole loop; GPU busy = steps x GPU
time per step / loop wall time, where the GPU time per step is measured by the
`measure` mode replaying the same GPU work as a CUDA graph timed with CUDA
events (a graph keeps the GPU fed, so launch gaps are not counted as busy).
"""
import json
import os
import sys
import time

import torch

DEV = "cuda"


def burn(seconds):
    """CPU work of a given duration (a slow transform, host bookkeeping)."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1
    return x


# ---------------------------------------------------------------- the GPU work

class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        layers = [torch.nn.Linear(1024, 8192)] + [torch.nn.Linear(8192, 8192) for _ in range(3)]
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x):
        for l in self.layers:
            x = torch.relu(l(x))
        return x.float().mean()


BATCH = 2048


class SlowDataset(torch.utils.data.Dataset):
    """Each sample costs `per_sample_s` of CPU (decode + augment stand-in)."""

    def __init__(self, n, per_sample_s):
        self.n, self.per_sample_s = n, per_sample_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        burn(self.per_sample_s)
        return torch.full((1024,), float(i % 7), dtype=torch.float32)


def worker_init(_):
    path = os.environ.get("GS_WORKER_PIDS")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")


def model():
    return MLP().to(DEV, dtype=torch.bfloat16).eval()


# ---------------------------------------------------------------- loops

def loop_loader(num_workers, per_sample_s, steps):
    m = model()
    ds = SlowDataset(BATCH * (steps + 2), per_sample_s)
    dl = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=num_workers,
                                     worker_init_fn=worker_init if num_workers else None)
    it = iter(dl)
    wait_s = 0.0
    with torch.no_grad():
        x = next(it).to(DEV).to(torch.bfloat16)
        m(x).item()  # warm-up
        t0 = time.perf_counter()
        for _ in range(steps):
            a = time.perf_counter()
            batch = next(it)
            wait_s += time.perf_counter() - a
            x = batch.to(DEV).to(torch.bfloat16)
            loss = m(x).item()
        wall = time.perf_counter() - t0
    return {"steps": steps, "loop_wall_s": wall, "batch_wait_s": wait_s, "loss": loss}


def loop_launch(n=200_000, every=1000):
    x = torch.zeros(16, device=DEV)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        x.add_(1)
        if (i + 1) % every == 0:
            torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {"steps": n // every, "launches": n, "loop_wall_s": wall}


def item_step(a, b):
    c = a
    for _ in range(10):
        c = (c @ b) * 0.01
    return c.float().mean()


def item_operands():
    """The item loops' matrices, one step run first (kernels loaded)."""
    a = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
    item_step(a, b).item()
    return a, b


def loop_item(steps=600, host_s=0.0015):
    a, b = item_operands()
    host = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        v = item_step(a, b).item()  # the sync every step
        h = time.perf_counter()
        burn(host_s)  # logging, metrics: host work after the sync
        host += time.perf_counter() - h
    wall = time.perf_counter() - t0
    return {"steps": steps, "loop_wall_s": wall, "host_after_sync_s": host, "last": v}


def loop_queued(steps=600, host_s=0.0015):
    a, b = item_operands()
    host = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = item_step(a, b)  # queued: the GPU starts on it now
        h = time.perf_counter()
        burn(host_s)  # logging, metrics: host work while the GPU runs the step
        host += time.perf_counter() - h
        v = loss.item()  # the sync every step, after the host work
    wall = time.perf_counter() - t0
    return {"steps": steps, "loop_wall_s": wall, "host_while_queued_s": host, "last": v}


def loop_pageable(steps=30, mib=128):
    src = torch.randn(mib * 2**20 // 4)  # pageable host memory
    dst = torch.empty_like(src, device=DEV)
    dst.copy_(src)
    torch.cuda.synchronize()
    copy_s = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        c = time.perf_counter()
        dst.copy_(src)
        copy_s += time.perf_counter() - c
        dst.mul_(0.5)
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {"steps": steps, "loop_wall_s": wall, "copy_s": copy_s, "bytes_per_copy": mib * 2**20}


def healthy_step(a, b):
    c = a
    for _ in range(10):
        c = (c @ b) * 0.001
    return c.float().mean()


def loop_healthy(steps=100):
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    healthy_step(a, b).item()
    t0 = time.perf_counter()
    for _ in range(steps):
        v = healthy_step(a, b).item()
    wall = time.perf_counter() - t0
    return {"steps": steps, "loop_wall_s": wall, "last": v}


# ---------------------------------------------------------------- GPU time per step

def graph_time(fn, replays=20):
    """GPU time of fn's kernels: captured as a CUDA graph, replayed back to back."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / replays


def measure():
    out = {}
    with torch.no_grad():
        m = model()
        x = torch.randn(BATCH, 1024, device=DEV, dtype=torch.bfloat16)
        out["loader_step_gpu_s"] = graph_time(lambda: m(x))
        y = torch.zeros(16, device=DEV)

        def thousand():
            for _ in range(1000):
                y.add_(1)
        out["launch_1000_gpu_s"] = graph_time(thousand, replays=10)
        a = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
        out["item_step_gpu_s"] = graph_time(lambda: item_step(a, b))
        a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
        out["healthy_step_gpu_s"] = graph_time(lambda: healthy_step(a, b), replays=5)
    return out


def main():
    mode, out_path = sys.argv[1], sys.argv[2]
    if mode == "measure":
        res = measure()
    else:
        # Nothing touches CUDA before this point: the trace's window (first to
        # last CUDA call of the thread) starts here.
        t_cuda0 = time.perf_counter()
        torch.cuda.init()
        res = {
            "starved": lambda: loop_loader(0, 12e-6, 100),
            "workers": lambda: loop_loader(2, 60e-6, 40),
            "launch": loop_launch,
            "item": loop_item,
            "item_full": loop_item,
            "queued": loop_queued,
            "queued_full": loop_queued,
            "pageable": loop_pageable,
            "healthy": loop_healthy,
        }[mode]()
        torch.cuda.synchronize()
        res["cuda_phase_wall_s"] = time.perf_counter() - t_cuda0
        res["pid"] = os.getpid()
    res["mode"] = mode
    with open(out_path, "w") as f:
        json.dump(res, f)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
