#!/usr/bin/env python3
"""What NVML costs a process in resident memory (issue 16, round 50: the
tracer's peak on a GPU host sat ~14 MiB above the same run without NVML).
VmRSS after each step of what gpusleuth's sampler does (sleuth-gpu
activity.rs): init, the device handle, GPU utilization samples, process
utilization samples, the running compute and graphics processes; each sampling call
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


def big_anon_kb():
    """Sizes (resident kB) of anonymous mappings over 1 MiB, largest first."""
    out, anon = [], False
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and ":" not in parts[0]:
                anon = len(parts) <= 5
            elif parts[0] == "Rss:" and anon and int(parts[1]) > 1024:
                out.append(int(parts[1]))
    return sorted(out, reverse=True)


def step(name, fn, times=1):
    before = rss_kb()
    err = ""
    for _ in range(times):
        try:
            fn()
        except n.NVMLError as e:
            err = f" ({e})"
    after = rss_kb()
    anon = " ".join(f"{kb / 1024:.1f}" for kb in big_anon_kb()[:4])
    print(f"{name:36s} {before / 1024:7.1f} -> {after / 1024:7.1f} MiB  (+{(after - before) / 1024:.1f}){err}"
          f"  anon>1MiB: [{anon}]")


print(f"{'python + pynvml imported':36s} {rss_kb() / 1024:7.1f} MiB")
step("nvmlInit", n.nvmlInit)
h = {}
step("nvmlDeviceGetHandleByIndex(0)", lambda: h.update(d=n.nvmlDeviceGetHandleByIndex(0)))
step("nvmlDeviceGetSamples(GPU_UTIL) x10", lambda: n.nvmlDeviceGetSamples(h["d"], n.NVML_GPU_UTILIZATION_SAMPLES, 0), 10)
step("nvmlDeviceGetProcessUtilization x10", lambda: n.nvmlDeviceGetProcessUtilization(h["d"], 0), 10)
step("nvmlDeviceGetComputeRunningProcesses x10", lambda: n.nvmlDeviceGetComputeRunningProcesses(h["d"]), 10)
step("nvmlDeviceGetGraphicsRunningProcesses x10", lambda: n.nvmlDeviceGetGraphicsRunningProcesses(h["d"]), 10)


def poll_once():
    """One poll as the sampler makes it; a call NVML refuses does not stop the others."""
    for call in (lambda: n.nvmlDeviceGetSamples(h["d"], n.NVML_GPU_UTILIZATION_SAMPLES, 0),
                 lambda: n.nvmlDeviceGetProcessUtilization(h["d"], 0),
                 lambda: n.nvmlDeviceGetComputeRunningProcesses(h["d"]),
                 lambda: n.nvmlDeviceGetGraphicsRunningProcesses(h["d"])):
        try:
            call()
        except n.NVMLError:
            pass


step("all four x300 (a minute of 200 ms polls)", poll_once, 300)
step("nvmlShutdown", n.nvmlShutdown)
