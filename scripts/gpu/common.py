"""Shared helpers of the GPU workloads: JSON-lines checkpoint log, allocator state.

Every checkpoint records CLOCK_MONOTONIC (`time.monotonic_ns()`, the clock
gpusleuth's timestamps use), so the checker can ask the trace for the ledger
at exactly that moment. A checkpoint synchronises the device first, so no
allocation or free is in flight when the numbers are read.
"""

import json
import os
import sys
import time

# Blocks listed per segment in a checkpoint (the counts and byte sums are always complete).
MAX_BLOCKS_PER_SEGMENT = 64


def log_path_from(argv_value, env_name="GS_LOG"):
    return argv_value or os.environ.get(env_name) or None


def settle():
    """Pause before the first CUDA call (GS_SETTLE_S, default 0.3 s).

    gpusleuth attaches libraries it finds in a process's memory map within
    about 200 ms; run_all.sh passes the CUDA libraries with --cuda-lib so this
    is a second line of defence, not the mechanism.
    """
    time.sleep(float(os.environ.get("GS_SETTLE_S", "0.3")))


class CheckpointLog:
    """Appends JSON lines to a file (or nowhere when path is None)."""

    def __init__(self, path, scenario, **meta):
        self.path = path
        # One os.write per line on an O_APPEND descriptor: lines of processes sharing the file never interleave.
        self.f = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else None
        self.write({"label": "start", "scenario": scenario, "pid": os.getpid(), "mono_ns": time.monotonic_ns(),
                    "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), **meta})

    def write(self, rec):
        if self.f is not None:
            os.write(self.f, (json.dumps(rec, separators=(",", ":")) + "\n").encode())

    def event(self, label, **extra):
        """A timestamped marker without allocator state (phase boundaries)."""
        rec = {"label": label, "pid": os.getpid(), "mono_ns": time.monotonic_ns(), **extra}
        self.write(rec)
        return rec

    def checkpoint(self, label, segments=True, quiet=False, **extra):
        import torch

        torch.cuda.synchronize()
        mono_before = time.monotonic_ns()
        allocated = torch.cuda.memory_allocated()
        reserved = torch.cuda.memory_reserved()
        stats = {k: v for k, v in torch.cuda.memory_stats().items() if isinstance(v, int)}
        mono_ns = time.monotonic_ns()
        rec = {"label": label, "pid": os.getpid(), "mono_ns": mono_ns, "mono_before_ns": mono_before,
               "allocated": allocated, "reserved": reserved, "stats": stats, **extra}
        if segments and self.f is not None:
            rec["segments"] = segment_summary()
        self.write(rec)
        if not quiet:
            print(f"[{label:34s}] allocated={allocated / 1e6:9.1f} MB reserved={reserved / 1e6:9.1f} MB "
                  f"gap={(reserved - allocated) / 1e6:6.1f} MB", file=sys.stderr, flush=True)
        return rec


def segment_summary():
    """PyTorch's own view of its segments: what issue 8's gap breakdown is computed from.

    Per segment: address, total size, allocated/active/requested bytes, pool
    (small/large), whether expandable, and its blocks (size, requested size,
    state), the blocks capped at MAX_BLOCKS_PER_SEGMENT (in-use blocks first).
    """
    import torch

    out = []
    for s in torch.cuda.memory_snapshot():
        blocks = s.get("blocks", [])
        used = [b for b in blocks if b.get("state") != "inactive"]
        free = [b for b in blocks if b.get("state") == "inactive"]
        listed = (used + free)[:MAX_BLOCKS_PER_SEGMENT]
        out.append({
            "address": s.get("address"),
            "total_size": s.get("total_size"),
            "allocated_size": s.get("allocated_size"),
            "active_size": s.get("active_size"),
            "requested_size": s.get("requested_size"),
            "segment_type": s.get("segment_type"),
            "is_expandable": s.get("is_expandable", False),
            "device": s.get("device"),
            "n_blocks": len(blocks),
            "n_used_blocks": len(used),
            "used_block_bytes": sum(b.get("size", 0) for b in used),
            "blocks": [[b.get("size"), b.get("requested_size"), b.get("state")] for b in listed],
            "blocks_truncated": len(blocks) > len(listed),
        })
    return out
