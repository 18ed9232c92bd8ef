#!/usr/bin/env bash
# Issue 8 first contact: are PyTorch's caching-allocator entry points found
# and do Block events come through? Dumps a few raw Block words next to
# torch's own view of the same blocks. Results under $OUT.
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
GS=${GPUSLEUTH:-target/release/gpusleuth}
PY=${PY:-/opt/torch/.venv/bin/python3}
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
cat > /tmp/alloc.py <<'PY'
import torch, json, time, sys
xs = [torch.empty(1000 * (i + 1), dtype=torch.uint8, device="cuda") for i in range(100)]
big = [torch.empty(5 * 2**20, dtype=torch.uint8, device="cuda") for _ in range(4)]
torch.cuda.synchronize()
snap = torch.cuda.memory_snapshot()
blocks = [(s["address"], b["size"], b["requested_size"], b["state"]) for s in snap for b in s["blocks"] if b["state"] == "active_allocated"]
print(json.dumps({"mono_ns": time.monotonic_ns(), "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
                  "xs0": xs[0].data_ptr(), "big0": big[0].data_ptr(), "n_blocks": len(blocks)}), file=sys.stderr)
del xs
torch.cuda.empty_cache()
print(json.dumps({"after_empty_cache_allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}), file=sys.stderr)
PY
{
$GS trace --db /tmp/alloc.db --force --torch-allocator -q -- $PY /tmp/alloc.py
$GS query --db /tmp/alloc.db "SELECT path, layer, probes, missing FROM libraries"
$GS query --db /tmp/alloc.db "SELECT op, count(*) FROM allocator_events GROUP BY op"
$GS query --db /tmp/alloc.db "SELECT name, value FROM stats WHERE value > 0"
$GS query --db /tmp/alloc.db --json "SELECT op, requested, printf('0x%x', block) AS block, printf('%x %x %x %x %x %x %x %x %x %x %x %x %x %x %x %x', w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15) AS words FROM allocator_events ORDER BY end_ns LIMIT 8"
$GS query --db /tmp/alloc.db --json "SELECT op, requested, printf('0x%x', block) AS block, printf('%x %x %x %x %x %x %x %x %x %x %x %x %x %x %x %x', w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15) AS words FROM allocator_events WHERE requested >= 5000000 ORDER BY end_ns LIMIT 2"
$GS query --db /tmp/alloc.db --json "SELECT op, printf('0x%x', ptr) AS ptr, size FROM calls WHERE op IN ('cudaMalloc','cudaFree') ORDER BY ts_ns"
} 2>&1 | tee "$OUT/alloc.log"
echo "allocator probe done"
