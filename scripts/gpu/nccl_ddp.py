"""Issue 17 workload: 2-rank DDP training, one rank's DataLoader slowed.

Run with `torchrun --nproc-per-node 2 nccl_ddp.py`. Env: SLOW_RANK (1),
SLOW_MS (60: the slow rank's dataset sleeps this long per batch, like a
loader waiting on storage), STEPS (40), GS_NCCL_LOG_DIR (where each rank
writes rank<R>.jsonl).

Ground truth: each rank logs, with time.monotonic_ns() (CLOCK_MONOTONIC, the
clock of gpusleuth's timestamps), the moment it issues every collective it
makes itself: the warm-up barriers and, through a DDP comm hook, each step's
gradient all-reduce (one bucket per step). The model is small enough for a
single bucket, so step k's all-reduce is each rank's k-th hook call.
"""
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

SLOW_RANK = int(os.environ.get("SLOW_RANK", "1"))
SLOW_MS = float(os.environ.get("SLOW_MS", "60"))
STEPS = int(os.environ.get("STEPS", "40"))
LOG_DIR = os.environ.get("GS_NCCL_LOG_DIR", ".")


class Batches(torch.utils.data.IterableDataset):
    """Synthetic batches; the slow rank's loader waits SLOW_MS for each."""

    def __init__(self, rank):
        self.rank = rank

    def __iter__(self):
        g = torch.Generator().manual_seed(self.rank)
        while True:
            if self.rank == SLOW_RANK:
                time.sleep(SLOW_MS / 1000.0)
            yield torch.randn(256, 1024, generator=g), torch.randn(256, 1024, generator=g)


def main():
    rank = int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    log = open(os.path.join(LOG_DIR, f"rank{rank}.jsonl"), "w")

    def mark(what, step):
        log.write(json.dumps({"rank": rank, "pid": os.getpid(), "what": what, "step": step,
                              "t_ns": time.monotonic_ns()}) + "\n")

    for i in range(2):
        mark("barrier", -2 + i)
        dist.barrier()
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).cuda()
    ddp = DDP(model, device_ids=[local], bucket_cap_mb=256)
    step = {"k": 0}

    def hook(state, bucket):
        mark("allreduce", step["k"])
        step["k"] += 1
        buf = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Batches(rank), batch_size=None, num_workers=0)
    it = iter(loader)
    t0 = time.monotonic()
    for _ in range(STEPS):
        x, y = next(it)
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()  # the host waits for the step (and so for the all-reduce)
    elapsed = time.monotonic() - t0
    log.close()
    print(f"rank {rank} pid {os.getpid()}: {STEPS} steps in {elapsed:.2f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
