#!/usr/bin/env python3
"""Benchmark (a): the seed generate() workload (scenario 1 without checkpoints).

Prints one JSON line: {"bench": "generate", "wall_s": <time of the generate rounds>, ...}.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seed_empty_cache  # noqa: E402

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "--bench"] + sys.argv[1:]
    seed_empty_cache.main()
