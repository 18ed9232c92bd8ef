#!/usr/bin/env bash
# Issue 16, round 55: the metrics endpoint on a GPU host with a real PyTorch
# process (round 55's fixes: names from the tracer's read, live bytes 0 at
# exit, shared pages): `trace --metrics` of a python that allocates 256 MiB
# on the GPU, holds it 3 s and exits, under a shell that waits 3 s more;
# one scrape while it holds the memory, one after its exit. Prints the
# python process's series from both scrapes and PASS/FAIL lines.
# Usage (device, repo root): OUT=$OUT bash scripts/gpu/metrics_check.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
W=/tmp/gs-metrics; rm -rf "$W"; mkdir -p "$W"
"$GS" trace --quiet --db "$W/t.db" --metrics 127.0.0.1:9464 --cuda-lib "$CUDART" --cuda-lib "$LIBCUDA" -- \
  sh -c "$PY -c \"import torch,time; x=torch.empty(256<<20,dtype=torch.uint8,device='cuda'); torch.cuda.synchronize(); open('$W/held','w').close(); time.sleep(3)\"; touch $W/exited; sleep 3" \
  >"$W/trace.log" 2>&1 &
tracer=$!
for _ in $(seq 1 600); do [ -e "$W/held" ] && break; sleep 0.1; done
sleep 1.2
curl -s 127.0.0.1:9464/metrics >"$W/alive.txt"
for _ in $(seq 1 100); do [ -e "$W/exited" ] && break; sleep 0.1; done
sleep 1.5
curl -s -H 'Accept: application/openmetrics-text' 127.0.0.1:9464/metrics >"$W/exited.txt"
wait "$tracer"
pid=$("$GS" query --db "$W/t.db" "SELECT pid FROM calls WHERE op = 'cudaMalloc' LIMIT 1" --json 2>/dev/null | grep -o '[0-9]\+' | head -1)
{
  echo "python pid $pid; its series while it held 256 MiB, then after its exit:"
  grep -E "pid=\"$pid\"" "$W/alive.txt" | grep -E "device_live_bytes|process_gpu_memory_bytes|cuda_calls_total\{op=\"cudaMalloc\"" | head -6
  echo "--"
  grep -E "pid=\"$pid\"" "$W/exited.txt" | grep -E "device_live_bytes|device_peak_bytes|process_gpu_memory_bytes" | head -6
  live=$(grep -E "^gpusleuth_device_live_bytes\{pid=\"$pid\"" "$W/alive.txt" | awk '{print $2}')
  gone=$(grep -E "^gpusleuth_device_live_bytes\{pid=\"$pid\"" "$W/exited.txt" | awk '{print $2}')
  [ "${live:-0}" -ge $((256 << 20)) ] 2>/dev/null && echo "PASS live bytes while held: $live" || echo "FAIL live bytes while held: ${live:-none}"
  [ "${gone:-x}" = 0 ] && echo "PASS live bytes after exit: 0" || echo "FAIL live bytes after exit: ${gone:-none}"
  grep -q "comm=\"?\"" "$W/alive.txt" "$W/exited.txt" && echo "FAIL a comm=\"?\" label" || echo "PASS no comm=\"?\" label"
  grep -o "pid=\"$pid\",comm=\"[^\"]*\"" "$W/alive.txt" | sort -u | head -2
  tail -1 "$W/exited.txt" | grep -q "# EOF" && echo "PASS OpenMetrics ends with # EOF" || echo "FAIL no # EOF"
  grep -q "# EOF" "$W/alive.txt" && echo "FAIL 0.0.4 has # EOF" || echo "PASS 0.0.4 without # EOF"
} >"$OUT/metrics.txt" 2>&1
cat "$OUT/metrics.txt"
