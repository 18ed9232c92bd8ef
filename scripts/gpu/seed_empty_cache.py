#!/usr/bin/env python3
"""Scenario 1 (issues 7 and 8): the seed's empty_cache investigation.

A random-initialised Qwen2-0.5B-shaped model in bf16 (no weights needed),
three generate(max_new_tokens=64) rounds, `del` + `torch.cuda.empty_cache()`
after each. At every checkpoint it logs, as JSON lines, CLOCK_MONOTONIC ns,
torch's memory_allocated()/memory_reserved(), memory_stats() and a summary of
memory_snapshot()'s segments (for the gap breakdown of issue 8).

Works unchanged with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.

  seed_empty_cache.py --log FILE            # the scenario (or env GS_LOG=FILE)
  seed_empty_cache.py --bench               # benchmark (a): no log, prints {"bench":"generate","wall_s":...}
"""

import argparse
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CheckpointLog, log_path_from, settle  # noqa: E402

PROMPT_TOKENS = 32


def build_model(torch):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
    torch.manual_seed(0)
    # Initialised and converted to bf16 on the CPU, then moved: the GPU only ever sees bf16 tensors.
    model = Qwen2ForCausalLM(config).to(dtype=torch.bfloat16)
    return model.to("cuda").eval(), config


def generate_round(torch, model, config, new_tokens):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (1, PROMPT_TOKENS), generator=g).to("cuda")
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=0)
    del ids, mask
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", help="JSON-lines checkpoint log (default: env GS_LOG)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--bench", action="store_true", help="no checkpoints; print the timed wall as JSON")
    a = ap.parse_args()

    t_start = time.monotonic()
    import torch

    settle()
    path = None if a.bench else log_path_from(a.log)
    if not a.bench and not path:
        ap.error("give --log FILE or GS_LOG (or --bench)")
    import transformers

    log = CheckpointLog(path, "seed_empty_cache", torch=torch.__version__, cuda=torch.version.cuda,
                        transformers=transformers.__version__, rounds=a.rounds, new_tokens=a.new_tokens)
    cp = (lambda *args, **kw: None) if a.bench else log.checkpoint

    model, config = build_model(torch)
    cp("after model load")
    torch.cuda.synchronize()
    t0 = time.monotonic()
    tokens = 0
    for r in range(1, a.rounds + 1):
        out = generate_round(torch, model, config, a.new_tokens)
        tokens += out.shape[1] - PROMPT_TOKENS
        cp(f"round {r}: after generate")
        del out
        torch.cuda.empty_cache()
        cp(f"round {r}: after del+empty_cache")
    torch.cuda.synchronize()
    t_rounds = time.monotonic() - t0
    del model
    gc.collect()
    torch.cuda.empty_cache()
    cp("after del model+gc")
    log.event("end")
    print(json.dumps({"bench": "generate", "wall_s": round(t_rounds, 4), "rounds": a.rounds,
                      "new_tokens": tokens, "total_s": round(time.monotonic() - t_start, 3),
                      "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "pid": os.getpid()}), flush=True)


if __name__ == "__main__":
    main()
