#!/usr/bin/env python3
"""Run one command traced by gpusleuth (or untraced) and measure it.

Used by run_all.sh for the scenarios and by bench.py for the overhead runs.
Measures, per run: wall time, exit code, the workload's last JSON line on
stdout, and gpusleuth's *own* CPU time and peak RSS (its traced children
excluded: CPU time is read from /proc/PID/stat of the gpusleuth process while
it is a zombie, i.e. after it exited and before it is reaped, so the final
database flush is counted; peak RSS is VmHWM sampled while it runs).

As a command:
  gsrun.py --name NAME --work DIR [--db F --launches MODE --cuda-lib P ...] [--timeout S] -- CMD...
appends one JSON line describing the run to DIR/runs.jsonl and exits with
the command's exit code (124 on timeout).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def now():
    return time.strftime("%H:%M:%S")


def log(msg):
    print(f"[{now()}] {msg}", flush=True)


def _read_stat_times(pid):
    """(utime_s, stime_s) of pid itself (not its children), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rfind(")") + 2:].split()
    # rest[0] is field 3 (state); utime is field 14, stime field 15.
    try:
        return int(rest[11]) / CLK_TCK, int(rest[12]) / CLK_TCK
    except (IndexError, ValueError):
        return None


RSS_FIELDS = ("VmHWM", "RssAnon", "RssFile", "RssShmem")


def _read_rss_kb(pid):
    """VmHWM (the kernel's peak) and the current RSS split: anonymous (heap,
    stacks), file-backed (mapped library files), shared memory (e.g. the BPF
    ring buffer's mapping), in kB; {} once the process is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in RSS_FIELDS:
                    out[key] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return out


def _descendants(pid):
    """Pids whose parent chain leads to pid (best effort, from /proc)."""
    parent = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
            parent[int(d)] = int(s[s.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out.extend(kids)
        frontier.extend(kids)
    return out


def _last_json_line(path):
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def trace_argv(gs, db, launches, cuda_libs, cmd):
    argv = [gs, "trace", "--db", db, "--force", "--quiet", "--launches", launches]
    for lib in cuda_libs:
        argv += ["--cuda-lib", lib]
    return argv + ["--"] + list(cmd)


def run(name, cmd, work, env=None, timeout=180, gs=None, db=None, launches="driver", cuda_libs=()):
    """Runs cmd (traced when gs and db are given). Returns a dict describing the run."""
    traced = bool(gs and db)
    argv = trace_argv(gs, db, launches, cuda_libs, cmd) if traced else list(cmd)
    out_path = os.path.join(work, f"{name}.stdout")
    err_path = os.path.join(work, f"{name}.stderr")
    t0 = time.monotonic()
    start_mono_ns = time.monotonic_ns()
    with open(out_path, "wb") as fo, open(err_path, "wb") as fe:
        p = subprocess.Popen(argv, stdout=fo, stderr=fe, env=env, start_new_session=True)
    hwm, times, timed_out = None, None, False
    split_max = {}  # the largest value of each RSS part seen while polling
    deadline = t0 + timeout
    while True:
        try:
            # WNOWAIT: the process stays a zombie, so its /proc/PID/stat can still be read.
            info = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
            break
        if info is not None:
            break
        rss = _read_rss_kb(p.pid)
        if "VmHWM" in rss:
            hwm = max(hwm or 0, rss["VmHWM"])
        for k in RSS_FIELDS[1:]:
            if k in rss:
                split_max[k] = max(split_max.get(k, 0), rss[k])
        if time.monotonic() > deadline and not timed_out:
            timed_out = True
            log(f"{name}: timeout after {timeout}s, stopping it")
            # The workload first (gpusleuth stops once its command is gone), then gpusleuth.
            for k in _descendants(p.pid):
                try:
                    os.kill(k, signal.SIGKILL)
                except OSError:
                    pass
            for _ in range(2):
                try:
                    os.kill(p.pid, signal.SIGTERM)
                except OSError:
                    pass
            deadline = time.monotonic() + 15
        elif timed_out and time.monotonic() > deadline:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            deadline = time.monotonic() + 3600
        time.sleep(0.02)
    if traced:
        times = _read_stat_times(p.pid)
    rc = p.wait()
    wall = time.monotonic() - t0
    res = {
        "name": name,
        "traced": traced,
        "launches": launches if traced else None,
        "db": db if traced else None,
        "argv": argv,
        "rc": 124 if timed_out else rc,
        "timed_out": timed_out,
        "wall_s": round(wall, 4),
        "start_mono_ns": start_mono_ns,
        "stdout": out_path,
        "stderr": err_path,
        "result": _last_json_line(out_path),
    }
    if traced:
        res["gs_cpu_user_s"] = times[0] if times else None
        res["gs_cpu_sys_s"] = times[1] if times else None
        res["gs_peak_rss_kb"] = hwm
        # Polled every 20 ms: the maxima of the parts, not an exact split of VmHWM.
        res["gs_rss_split_max_kb"] = split_max
    return res


def stderr_tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--gs", help="gpusleuth binary (traced when given with --db)")
    ap.add_argument("--db")
    ap.add_argument("--launches", default="driver")
    ap.add_argument("--cuda-lib", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE added to the command's environment")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        ap.error("no command after --")
    env = dict(os.environ)
    for kv in a.env:
        k, _, v = kv.partition("=")
        env[k] = v
    log(f"{a.name}: start ({'traced, launches=' + a.launches if a.gs and a.db else 'untraced'})")
    res = run(a.name, cmd, a.work, env=env, timeout=a.timeout, gs=a.gs, db=a.db, launches=a.launches,
              cuda_libs=a.cuda_lib)
    res["env_extra"] = a.env
    with open(os.path.join(a.work, "runs.jsonl"), "a") as f:
        f.write(json.dumps(res) + "\n")
    extra = ""
    if res.get("gs_cpu_user_s") is not None:
        extra = f", gpusleuth cpu {res['gs_cpu_user_s'] + res['gs_cpu_sys_s']:.2f}s rss {res['gs_peak_rss_kb']} kB"
    log(f"{a.name}: rc={res['rc']} wall={res['wall_s']:.1f}s{extra}")
    if res["rc"] != 0:
        sys.stdout.write(stderr_tail(res["stderr"]))
    sys.exit(res["rc"])


if __name__ == "__main__":
    main()
