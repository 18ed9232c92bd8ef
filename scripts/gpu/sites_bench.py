#!/usr/bin/env python3
"""Cost of one call-site capture on the GPU machine: N x (cudaMalloc 1 MiB,
cudaFree) through ctypes on the real libcudart, timed by the workload itself.
Run untraced, traced (sites on) and traced with --sites off: the difference
between the two traced runs, per call, is what a capture adds (native frames
plus a short Python stack).

  sites_bench.py LIBCUDART [N]
"""

import ctypes
import json
import sys
import time


def main():
    lib = ctypes.CDLL(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    p = ctypes.c_void_p()
    time.sleep(1.0)  # gpusleuth registers this interpreter
    assert lib.cudaMalloc(ctypes.byref(p), 1 << 20) == 0  # context creation, not timed
    lib.cudaFree(p)
    t0 = time.perf_counter()
    for _ in range(n):
        lib.cudaMalloc(ctypes.byref(p), 1 << 20)
        lib.cudaFree(p)
    dt = time.perf_counter() - t0
    print(json.dumps({"bench": "sites", "pairs": n, "wall_s": round(dt, 6),
                      "us_per_call": round(dt * 1e6 / (2 * n), 3)}), flush=True)


if __name__ == "__main__":
    main()
