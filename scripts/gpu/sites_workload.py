#!/usr/bin/env python3
"""Call sites on the GPU (issue 13): the seed scenario's model, tensors
allocated at known lines, then a loop of generate rounds that leaks one
tensor per step (live memory rising across the run), then del model.

Every tensor of the truth is large (≥ 2 MiB, a multiple of 2 MiB) and made
while no cached block can serve it, so PyTorch's caching allocator asks
cudaMalloc for exactly its size: the truth is "this line allocated these
bytes". Each truth record is written by the line that allocates (`here()`
reads the caller's frame), as JSON lines.

  sites_workload.py --truth FILE [--leaks 16] [--new-tokens 16]
"""

import argparse
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MIB = 1 << 20


def here():
    f = sys._getframe(1)
    return f.f_lineno, getattr(f.f_code, "co_qualname", f.f_code.co_name)


class Truth:
    def __init__(self, path):
        self.f = open(path, "w")

    def add(self, where, nbytes, kind):
        # t: wall time of the allocation; code: the code object's address
        # (CPython's id()), to compare with what the tracer captured.
        f = sys._getframe(1)
        self.f.write(json.dumps({"file": os.path.abspath(__file__), "line": where[0], "func": where[1],
                                 "bytes": nbytes, "kind": kind, "t": time.time(),
                                 "code": hex(id(f.f_code))}) + "\n")
        self.f.flush()


class Net:
    def weights(self, torch, truth, n):
        w = torch.empty(n, dtype=torch.uint8, device="cuda"); where = here()
        truth.add(where, n, "kept")
        return w


def leak(torch, truth, keep, rounds):
    for _ in range(rounds):
        t = torch.empty(32 * MIB, dtype=torch.uint8, device="cuda"); where = here()
        truth.add(where, 32 * MIB, "leak")
        keep.append(t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--truth", required=True)
    # 16 steps: the loop then spans most of the process's CUDA activity after
    # the model load and the first (warm-up) round; with 8 it covered only
    # the last two of its four quarters on the H200 (docs/findings.md).
    ap.add_argument("--leaks", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=16)
    a = ap.parse_args()
    import torch

    truth = Truth(a.truth)
    time.sleep(1.0)  # gpusleuth attaches the CUDA libraries and registers this interpreter
    # The seed scenario's model first: initialised on the CPU, then moved (the
    # process's CUDA activity starts here).
    import seed_empty_cache as seed

    model, config = seed.build_model(torch)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    a64 = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda"); where = here()
    truth.add(where, 64 * MIB, "freed")
    w = Net().weights(torch, truth, 96 * MIB)
    del a64, w
    torch.cuda.empty_cache()
    # A leak in the loop: every step generates, frees what it should, and keeps
    # one 32 MiB tensor by mistake, so live memory rises across the whole run
    # (a leak, not memory held once at exit). empty_cache() before each leak:
    # no cached block can serve it, cudaMalloc is called from that line.
    keep = []
    for _ in range(a.leaks):
        out = seed.generate_round(torch, model, config, a.new_tokens)
        del out
        torch.cuda.empty_cache()
        leak(torch, truth, keep, 1)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    print(json.dumps({"workload": "sites", "leaked_bytes": a.leaks * 32 * MIB,
                      "allocated_end": torch.cuda.memory_allocated(), "t_end": time.time(),
                      "code": {"main": hex(id(main.__code__)), "leak": hex(id(leak.__code__)),
                               "generate_round": hex(id(seed.generate_round.__code__))}}), flush=True)
    time.sleep(0.5)  # sites are resolved from the live process


if __name__ == "__main__":
    main()
