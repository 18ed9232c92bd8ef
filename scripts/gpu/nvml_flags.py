#!/usr/bin/env python3
"""Where NVML's ~16 MiB comes from (issue 16, round 55; round 51 found that
`nvmlInit` alone adds 18.0 MiB to a process, 15.7 MiB of it one anonymous
mapping). Each variant runs in a fresh process: RSS, the threads, glibc's
own count of its memory (`mallinfo2`: heap arena and malloc's mmapped
chunks) and every anonymous mapping over 1 MiB (address, size, resident,
flags) after each step. Variants: plain `nvmlInit`; `nvmlInitWithFlags`
with NO_ATTACH (no GPU attached at init) then the device handle and the
sampler's four calls; with NO_GPUS.
  /opt/torch/.venv/bin/python3 scripts/gpu/nvml_flags.py   (on the GPU machine)
"""
import ctypes
import os
import subprocess
import sys


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]


def facts(label):
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    m = libc.mallinfo2()
    rss = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    threads = len(os.listdir("/proc/self/task"))
    maps, cur = [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and ":" not in parts[0]:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                name = parts[5] if len(parts) > 5 else "[anon]"
                cur = {"range": parts[0], "size": (hi - lo) // 1024, "name": name, "perm": parts[1]}
                maps.append(cur)
            elif parts[0] == "Rss:":
                cur["rss"] = int(parts[1])
            elif parts[0] == "VmFlags:":
                cur["flags"] = " ".join(parts[1:])
    print(f"{label:44s} rss {rss / 1024:6.1f} MiB threads {threads} "
          f"malloc: heap {m.arena / 1048576:.1f} mmapped {m.hblkhd / 1048576:.1f} MiB in {m.hblks} chunks, "
          f"in use {m.uordblks / 1048576:.1f}")
    for mp in maps:
        if mp["name"] in ("[anon]", "[heap]") and mp.get("rss", 0) > 1024:
            print(f"    {mp['name']:7s} {mp['range']} {mp['perm']} size {mp['size'] / 1024:.1f} "
                  f"rss {mp['rss'] / 1024:.1f} MiB flags {mp.get('flags', '')}")
    sys.stdout.flush()


def variant(name):
    import pynvml as n
    facts(f"{name}: before")
    if name == "init":
        n.nvmlInit()
    elif name == "noattach":
        n.nvmlInitWithFlags(2)
    elif name == "nogpus":
        n.nvmlInitWithFlags(1)
    facts(f"{name}: after init")
    try:
        h = n.nvmlDeviceGetHandleByIndex(0)
        facts(f"{name}: after the device handle")
        for call in (lambda: n.nvmlDeviceGetSamples(h, n.NVML_GPU_UTILIZATION_SAMPLES, 0),
                     lambda: n.nvmlDeviceGetProcessUtilization(h, 0),
                     lambda: n.nvmlDeviceGetComputeRunningProcesses(h),
                     lambda: n.nvmlDeviceGetGraphicsRunningProcesses(h),
                     lambda: n.nvmlDeviceGetMemoryInfo(h)):
            try:
                call()
            except n.NVMLError as e:
                print(f"    ({e})")
        facts(f"{name}: after the sampler's calls")
    except n.NVMLError as e:
        print(f"    handle: {e}")


if len(sys.argv) > 1:
    variant(sys.argv[1])
else:
    for v in ("init", "noattach", "nogpus"):
        subprocess.run([sys.executable, __file__, v])
