#!/usr/bin/env python3
"""Benchmark (b): a small transformer training loop (forward + backward + AdamW step).

A token embedding + pre-norm causal transformer blocks (SDPA, bf16 autocast) + tied LM head,
fixed seed and fixed number of steps, so traced and untraced runs do the same
work. Prints one JSON line with the wall time of the timed steps (warm-up
steps excluded).

  bench_train.py [--steps 150] [--warmup 5] [--layers 8] [--d-model 1024] [--batch 32] [--seq 1024]
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import settle  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=int(os.environ.get("GS_TRAIN_STEPS", "150")))
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32000)
    a = ap.parse_args()
    import torch
    import torch.nn as nn

    settle()
    torch.manual_seed(0)

    F = nn.functional

    class Block(nn.Module):
        """Pre-norm causal self-attention + MLP."""

        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(y)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(a.vocab, a.d_model)
            self.blocks = nn.ModuleList(Block(a.d_model, a.d_model // 64) for _ in range(a.layers))
            self.norm = nn.LayerNorm(a.d_model)

        def forward(self, ids):
            h = self.emb(ids)
            for blk in self.blocks:
                h = blk(h)
            return self.norm(h) @ self.emb.weight.t()

    model = LM().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    data = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device="cuda", generator=g)
    ids, target = data[:, :-1], data[:, 1:]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids)
            loss = nn.functional.cross_entropy(logits.reshape(-1, a.vocab).float(), target.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.monotonic()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    wall = time.monotonic() - t0
    print(json.dumps({"bench": "train", "wall_s": round(wall, 4), "steps": a.steps,
                      "ms_per_step": round(1e3 * wall / a.steps, 3), "loss": round(float(loss), 4),
                      "params": sum(p.numel() for p in model.parameters()), "pid": os.getpid()}), flush=True)


if __name__ == "__main__":
    main()
