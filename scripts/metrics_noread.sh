#!/usr/bin/env bash
# The metrics endpoint under clients that never read their reply (issue 16,
# round 55): `gpusleuth trace --metrics` of 200 short-lived simulated
# processes each making 28 different calls (200 labelled processes: a page
# of ~20 MB), then scripts/metrics_noread.py with N such clients. Needs
# root, eBPF and the simulated libraries (`gpusleuth demo --keep DIR`:
# SIM_DIR is DIR/sim).
# Usage: sudo bash scripts/metrics_noread.sh SIM_DIR BIN [N] [PORT]
set -u
sim=$1 bin=$2 n=${3:-100} port=${4:-9464}
export PATH=$sim/bin:$PATH LD_LIBRARY_PATH=$sim/lib
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
S='malloc 4096 a; free a; memcpy 64 h2d; memcpy 64 d2h; memcpy 64 d2d; memcpy 64 h2h; memcpy_async 64 h2d; memcpy_async 64 d2h; memset 64; memset_async 64; sync_stream; sync_device; sync_event; graph_launch; set_device 0; malloc_host 4096 h; free_host h; malloc_managed 4096 m; free m; malloc_async 4096 q; free_async q; vmm 2097152; cu_malloc 4096 c; cu_free c; host_alloc 4096 ha; launch 2; cu_launch 2; launch_ex 2'
"$bin" trace --quiet --launches full --db "$work/t.db" --metrics "127.0.0.1:$port" \
  --cuda-lib "$sim/lib/libcudart.so.13" --cuda-lib "$sim/lib/libcuda.so.1" \
  --ready-file "$work/ready" >"$work/log" 2>&1 &
tracer=$!
while [ ! -e "$work/ready" ]; do sleep 0.1; done
for ((i = 1; i <= 200; i++)); do workload "$S" >/dev/null 2>&1; done
sleep 1
python3 "$(dirname "$0")/metrics_noread.py" "127.0.0.1:$port" "$n" 12 "$tracer"
kill -INT "$tracer"; wait "$tracer"
