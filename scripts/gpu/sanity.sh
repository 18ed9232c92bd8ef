#!/usr/bin/env bash
# Quick first contact with a GPU machine: can gpusleuth attach to the real
# CUDA libraries, what does a tiny PyTorch program look like traced, and
# which caching-allocator symbols does this torch build export.
# Usage (device): bash scripts/gpu/sanity.sh   (results under $OUT)
set -u
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
GS=${GPUSLEUTH:-target/release/gpusleuth}
PY=${PY:-/opt/torch/.venv/bin/python3}
TORCHLIB=$($PY -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
{
echo "== check"; $GS check --load
echo "== tiny torch program"
cat > /tmp/tiny.py <<'PY'
import torch, time
x = torch.empty(1024*1024, device="cuda")
y = torch.randn(2048, 2048, device="cuda")
for _ in range(20):
    z = y @ y
torch.cuda.synchronize()
del x
torch.cuda.empty_cache()
print("allocated", torch.cuda.memory_allocated(), "reserved", torch.cuda.memory_reserved())
PY
/usr/bin/time -v $GS trace --db /tmp/tiny.db --force -- $PY /tmp/tiny.py 2>&1 | grep -v "^\s*\(Average\|Exit\|Swaps\|File\|Socket\|Signals\|Page size\|Minor\|Major\|Volun\|Invol\|Percent\)"
$GS stats --db /tmp/tiny.db
$GS memory --db /tmp/tiny.db
$GS explain --db /tmp/tiny.db
$GS query --db /tmp/tiny.db "SELECT path, layer, probes, missing, attached_mono_ns - (SELECT start_mono_ns FROM session) AS after_ns FROM libraries"
$GS query --db /tmp/tiny.db "SELECT level, text FROM notes"
echo "== c10 allocator symbols"
nm -C "$TORCHLIB/libc10_cuda.so" 2>/dev/null | grep -E "CachingAllocator.*(malloc|free|release_block|emptyCache|free_block|allocate|raw_delete)" | head -40
echo "== c10 Block symbols"
nm -C "$TORCHLIB/libc10_cuda.so" 2>/dev/null | grep -E " Block::| BlockPool" | head -10
} 2>&1 | tee "$OUT/sanity.log"
cp /tmp/tiny.db "$OUT/tiny.db" 2>/dev/null
echo "sanity done"
