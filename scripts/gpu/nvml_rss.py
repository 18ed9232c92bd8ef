#!/usr/bin/env python3
"""What NVML costs a process in resident memory (issue 16, round 50: the
tracer's peak on a GPU host sat ~14 MiB above the same run without NVML).
VmRSS after each step of what gpusleuth's sampler does (sleuth-gpu
activity.rs): init, the device handle, GPU utilization samples, process
utilization samples, the running compute processes; each sampling call
repeated 10 times as the tracer's 200 ms poll would.
  /opt/torch/.venv/bin/python3 scripts/gpu/nvml_rss.py   (on the GPU machine)
"""
import pynvml as n


def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def step(name, fn, times=1):
    before = rss_kb()
    err = ""
    for _ in range(times):
        try:
            fn()
        except n.NVMLError as e:
            err = f" ({e})"
    after = rss_kb()
    print(f"{name:36s} {before / 1024:7.1f} -> {after / 1024:7.1f} MiB  (+{(after - before) / 1024:.1f}){err}")


print(f"{'python + pynvml imported':36s} {rss_kb() / 1024:7.1f} MiB")
step("nvmlInit", n.nvmlInit)
h = {}
step("nvmlDeviceGetHandleByIndex(0)", lambda: h.update(d=n.nvmlDeviceGetHandleByIndex(0)))
step("nvmlDeviceGetSamples(GPU_UTIL) x10", lambda: n.nvmlDeviceGetSamples(h["d"], n.NVML_GPU_UTILIZATION_SAMPLES, 0), 10)
step("nvmlDeviceGetProcessUtilization x10", lambda: n.nvmlDeviceGetProcessUtilization(h["d"], 0), 10)
step("nvmlDeviceGetComputeRunningProcesses x10", lambda: n.nvmlDeviceGetComputeRunningProcesses(h["d"]), 10)
step("nvmlShutdown", n.nvmlShutdown)
