#!/usr/bin/env python3
"""Where the tracer's resident memory is (issue 16: trace peak RSS <= 64 MB).

Traces a workload with `gpusleuth trace` and samples the tracer's
/proc/PID/smaps every 200 ms; prints the mappings of the sample with the
highest total Rss, largest first (anon, file-backed, BPF maps).

  [GS_TRACE_ARGS=...] tracer_smaps.py GPUSLEUTH -- WORKLOAD ARGS...   (as root, on the GPU machine)
"""
import os
import subprocess
import sys
import time


def smaps(pid):
    """[(name, rss_kb, range)] of every mapping, and the total."""
    out, name, span, total = [], None, None, 0
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                parts = line.split()
                if "-" in parts[0] and len(parts) >= 5 and ":" not in parts[0]:
                    name = parts[5] if len(parts) > 5 else "[anon]"
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    span = (parts[0], (hi - lo) // 1024)
                elif parts[0] == "Rss:":
                    kb = int(parts[1])
                    out.append((name, kb, span))
                    total += kb
    except OSError:
        return None, 0
    return out, total


def vm_hwm_kb(pid):
    """The kernel's peak resident set of the process so far (VmHWM), in kB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def main():
    gs, rest = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    db = "/tmp/gs-smaps.db"
    extra = os.environ.get("GS_TRACE_ARGS", "").split()  # e.g. --ring-size 4M
    p = subprocess.Popen([gs, "trace", "--db", db, "--force", "-q"] + extra + ["--"] + rest,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    best, best_total, hwm_kb = None, 0, 0
    while p.poll() is None:
        maps, total = smaps(p.pid)
        if maps and total > best_total:
            best, best_total = maps, total
        hwm_kb = max(hwm_kb, vm_hwm_kb(p.pid))
        time.sleep(0.2)
    err = p.stderr.read().decode(errors="replace")
    by_name = {}
    for name, kb, _ in best or []:
        by_name[name] = by_name.get(name, 0) + kb
    print(f"tracer peak sampled Rss {best_total / 1024:.1f} MiB, VmHWM at the last sample "
          f"{hwm_kb / 1024:.1f} MiB (rc {p.returncode})")
    for name, kb in sorted(by_name.items(), key=lambda x: -x[1])[:25]:
        print(f"{kb / 1024:8.1f} MiB  {name}")
    # The largest anonymous mappings one by one (arenas are 64 MiB
    # reservations, thread stacks 8 MiB, the heap its own line).
    anon = sorted((m for m in best or [] if m[0] == "[anon]"), key=lambda m: -m[1])[:10]
    for _, kb, (rng, size_kb) in anon:
        print(f"  anon {kb / 1024:6.1f} MiB resident of {size_kb / 1024:7.1f} MiB  {rng}")
    print(err[-600:])


if __name__ == "__main__":
    main()
