#!/usr/bin/env python3
"""The CPU-burning neighbour of scenario 2, a process of its own (not a child of the traced workload).

It names itself `gs-neighbour` (prctl PR_SET_NAME, so the scheduler shows
that comm), pins itself to the given CPUs, then blocks (no CPU used) opening
a FIFO until the workload writes to it; then writes its pid to --pid-file and
burns CPU until SIGTERM or --max-burn-s.

  neighbour.py --cpus 3 --fifo /tmp/w/go.fifo --pid-file /tmp/w/neighbour.pid
"""

import argparse
import ctypes
import os
import signal
import sys
import time

NAME = b"gs-neighbour"
PR_SET_NAME = 15


def set_name():
    try:
        import setproctitle  # optional; also rewrites argv for ps

        setproctitle.setproctitle(NAME.decode())
    except ImportError:
        pass
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(NAME), 0, 0, 0)
    except OSError as e:
        print(f"neighbour: cannot set its name: {e}", file=sys.stderr)


def parse_cpus(s):
    cpus = set()
    for part in s.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cpus.update(range(int(lo), int(hi) + 1))
        elif part:
            cpus.add(int(part))
    return cpus


def burn(max_s):
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    end = time.monotonic() + max_s
    x = 0
    while not stop[0]:
        for _ in range(20000):
            x += 1
        if time.monotonic() > end:
            break
    return x


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpus", required=True)
    ap.add_argument("--fifo", help="block on this FIFO until the workload writes (else start burning at once)")
    ap.add_argument("--pid-file")
    ap.add_argument("--max-burn-s", type=float, default=30)
    ap.add_argument("--max-wait-s", type=float, default=300, help="give up waiting for the FIFO after this long")
    a = ap.parse_args()
    set_name()
    os.sched_setaffinity(0, parse_cpus(a.cpus))
    if a.fifo:
        signal.signal(signal.SIGALRM, lambda *_: sys.exit(3))
        signal.alarm(int(a.max_wait_s))
        with open(a.fifo, "rb") as f:  # blocks until a writer opens it
            f.read(16)
        signal.alarm(0)
    if a.pid_file:
        tmp = a.pid_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()}\n")
        os.rename(tmp, a.pid_file)
    burn(a.max_burn_s)


if __name__ == "__main__":
    main()
