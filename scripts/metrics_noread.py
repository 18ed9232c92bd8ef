#!/usr/bin/env python3
"""Clients that ask for /metrics and never read the reply (issue 16, round
55's tester: each connection held a rendered page of its own until its 10 s
deadline, so 100 of them took the tracer to 2.2 GB). Opens N connections
from distinct loopback addresses (127.0.x.y; the per-peer cap is 64), each
with a 1 KiB receive buffer, sends one request on each and never reads;
then, once a second for WAIT seconds, times a normal scrape and prints the
tracer's VmRSS/VmHWM.
  python3 scripts/metrics_noread.py HOST:PORT N WAIT TRACER_PID
"""
import socket
import sys
import time

host, port = sys.argv[1].rsplit(":", 1)
addr = (host, int(port))
n, wait, tracer = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


def status():
    out = {}
    with open(f"/proc/{tracer}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) // 1024
    return out


def scrape():
    t = time.monotonic()
    s = socket.create_connection(addr, timeout=15)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    size = 0
    while True:
        b = s.recv(1 << 16)
        if not b:
            break
        size += len(b)
    s.close()
    return size, time.monotonic() - t


size, took = scrape()
print(f"one scrape: {size} bytes in {took:.2f} s; tracer {status()} MiB")
held = []
for i in range(n):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.bind((f"127.0.{1 + i // 250}.{1 + i % 250}", 0))
    s.connect(addr)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    held.append(s)
print(f"{len(held)} clients asked and do not read")
peak = 0
for k in range(wait):
    time.sleep(1)
    size, took = scrape()
    st = status()
    peak = max(peak, st["VmHWM"])
    print(f"+{k + 1} s: a scrape of {size} bytes took {took:.2f} s; tracer {st} MiB")
print(f"tracer peak (VmHWM) {peak} MiB with {n} clients that do not read")
