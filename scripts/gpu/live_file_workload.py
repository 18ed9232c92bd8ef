"""A launch-heavy PyTorch loop for the file-being-written check
(round24_live_file.sh): tiny kernels on two threads, a sync every 10 steps,
a device-to-host copy every 20, a fresh 4 MiB tensor every 50 (the caching
allocator's blocks), for DURATION seconds.

    python3 live_file_workload.py DURATION
"""
import sys
import threading
import time

import torch

DURATION = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0


def loop(seed):
    x = torch.full((1024,), float(seed), device="cuda")
    t0, i = time.time(), 0
    while time.time() - t0 < DURATION:
        for _ in range(50):
            x.add_(1)
        if i % 10 == 0:
            torch.cuda.synchronize()
        if i % 20 == 0:
            x.cpu()
        if i % 50 == 0:
            y = torch.empty(1 << 20, device="cuda")
            del y
        i += 1
    return i


if __name__ == "__main__":
    torch.cuda.init()
    other = threading.Thread(target=loop, args=(2,))
    other.start()
    steps = loop(1)
    other.join()
    print(f"steps {steps}")
