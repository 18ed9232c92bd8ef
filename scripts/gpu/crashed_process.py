"""The crashed-process case from GPU.md, and the checks on gpusleuth's answers.

  crashed_process.py workload PIDS_JSON [VARIANT]
      Becomes a session/group leader (as a job started from an interactive
      shell is), allocates 2 GiB on cuda:0, forks a worker AFTER CUDA init (the
      worker inherits the /dev/nvidia* fds and just sleeps), writes
      {"parent": P, "worker": W} to PIDS_JSON, then sleeps until killed.
      VARIANT (issue 14): "group" (default: the worker stays in the parent's
      process group), "setsid" (the worker calls setsid(): its own session
      and group), "daemon" (double fork: a child calls setsid() and forks the
      worker, then exits, so the worker's parent is init).
  crashed_process.py agent PATH...
      A stand-in monitoring agent: opens the given device files (no mapping,
      no CUDA) and sleeps. It must never be ended.
  crashed_process.py check-vram VRAM_JSON PARENT WORKER [VARIANT]
  crashed_process.py check-plan PLAN_JSON WORKER
  crashed_process.py check-reclaim RECLAIM_JSON WORKER
      Print PASS/FAIL lines; exit 1 on any FAIL.
"""
import json
import os
import sys
import time


def fork_worker(variant):
    """Forks the worker that inherits the CUDA context's device files; returns its pid."""
    if variant == "daemon":
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            os.setsid()
            daemon = os.fork()
            if daemon == 0:
                os.write(w, str(os.getpid()).encode())
                os.close(w)
                time.sleep(3600)
                os._exit(0)
            os._exit(0)
        os.close(w)
        pid = int(os.read(r, 32).decode())
        os.close(r)
        os.waitpid(child, 0)
        return pid
    worker = os.fork()
    if worker == 0:
        # The forked worker: holds the inherited device files, never touches CUDA.
        if variant == "setsid":
            os.setsid()
        time.sleep(3600)
        os._exit(0)
    return worker


def workload(pids_path, variant="group"):
    try:
        os.setsid()
    except OSError:
        pass  # already a session leader
    import torch

    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda:0")
    x.fill_(1)
    torch.cuda.synchronize()
    worker = fork_worker(variant)
    time.sleep(0.5)  # let a setsid() in the worker land before anyone looks
    tmp = pids_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"parent": os.getpid(), "worker": worker, "variant": variant,
                   "torch": torch.__version__}, f)
    os.rename(tmp, pids_path)
    print(f"parent {os.getpid()} worker {worker} allocated 2 GiB", flush=True)
    time.sleep(3600)


FAILS = 0


def check(ok, what):
    global FAILS
    print(("PASS: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        FAILS += 1


def holder(report, pid):
    return next((h for h in report.get("holders", []) if h.get("pid") == pid), None)


def agent(paths):
    fds = [os.open(p, os.O_RDWR) for p in paths]
    print(f"agent {os.getpid()} holds {paths} ({len(fds)} fds)", flush=True)
    time.sleep(3600)


def check_vram(path, parent, worker, variant="group"):
    r = json.load(open(path))
    check(r["nvml"]["available"], "NVML available")
    dead = holder(r, parent)
    check(dead is not None, f"vram lists the dead parent {parent}")
    if dead:
        # The script reaps the parent, so it is gone; "zombie" would mean it was not reaped yet.
        check(dead["class"] in ("exited_but_listed", "zombie"),
              f"parent {parent} is exited_but_listed (got {dead['class']})")
        held = [h["pid"] for h in dead.get("held_by", [])]
        check(worker in held, f"worker {worker} named as holder of parent's memory (held_by={dead.get('held_by')})")
        if variant in ("setsid", "daemon"):
            ev = [h["evidence"] for h in dead.get("held_by", []) if h["pid"] == worker]
            check(ev == ["inherited_mapping"], f"evidence for the {variant} worker is its inherited mapping (got {ev})")
        mib = sum((g.get("used_bytes") or 0) for g in dead.get("gpus", [])) >> 20
        check(mib >= 2048, f"NVML memory of the dead parent >= 2048 MiB (got {mib} MiB)")
    w = holder(r, worker)
    check(w is not None and w["class"] == "orphaned_worker",
          f"worker {worker} is orphaned_worker (got {w and w['class']})")
    if w:
        check(parent in w.get("holds_memory_of", []), f"worker holds_memory_of includes {parent}")
        check("open_fds" in w.get("known_by", []), f"worker known by open fds ({w.get('known_by')})")


def check_plan(path, worker):
    r = json.load(open(path))
    targets = [t["pid"] for t in r["plan"]["targets"]]
    check(r["dry_run"] is True, "reclaim without --yes is a dry run")
    check(worker in targets, f"dry-run plan targets worker {worker} (targets={targets})")
    exp = r["plan"]["expected_free_bytes"].get("0", 0) >> 20
    check(exp >= 2048, f"plan expects >= 2048 MiB freed on GPU 0 (got {exp} MiB)")


def check_reclaim(path, worker):
    r = json.load(open(path))
    out = r.get("outcome") or {}
    res = {x["pid"]: x["status"] for x in out.get("results", [])}
    check(res.get(worker) in ("terminated", "killed"), f"worker {worker} ended ({res.get(worker)})")
    check(out.get("memory_released") is True, f"gpusleuth verified release (still_held={out.get('still_held')})")
    freed = [(g["gpu"], g["freed_bytes"] >> 20) for g in out.get("freed", [])]
    check(any(g == 0 and mib >= 2048 for g, mib in freed), f"reported >= 2048 MiB freed on GPU 0 ({freed})")
    check(r.get("exit_code") == 0, f"exit code 0 (got {r.get('exit_code')})")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "workload":
        workload(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "group")
    elif cmd == "agent":
        agent(sys.argv[2:])
    elif cmd == "check-vram":
        check_vram(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                   sys.argv[5] if len(sys.argv) > 5 else "group")
    elif cmd == "check-plan":
        check_plan(sys.argv[2], int(sys.argv[3]))
    elif cmd == "check-reclaim":
        check_reclaim(sys.argv[2], int(sys.argv[3]))
    else:
        print(__doc__)
        sys.exit(2)
    sys.exit(1 if FAILS else 0)
