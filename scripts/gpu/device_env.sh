# Sourced by the device scripts (round 18 on): the H200 machine's paths
# (../shared/GPU.md), $OUT, the gpusleuth binary given as $1 in $GS, and
# tracefs mounted for the scheduler tracepoints. Each may be overridden
# from the environment.
OUT=${OUT:-/tmp/gs-out}; mkdir -p "$OUT"
GS=$(readlink -f "$1"); chmod +x "$GS"
PY=${PY:-/opt/torch/.venv/bin/python3}
CUDART=${CUDART:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13}
LIBCUDA=${LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
# `timed CMD...`: wall seconds, peak RSS (MB) and exit status of one command
# whose standard output is discarded (the export timings).
timed() {
  "$PY" - "$@" <<'PYEOF'
import resource, subprocess, sys, time
t = time.monotonic()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
wall = time.monotonic() - t
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f"{wall:.2f} s {rss:.0f} MB rc={rc}")
PYEOF
}
# `host_facts`: the GPU, its driver and the host's CPUs, into $OUT/gpu.txt.
host_facts() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1
  echo "cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo)" >>"$OUT/gpu.txt"
}
# `bench_trace DB SECONDS`: the bench's synthetic 10M-event trace written to
# DB (its own timings in $OUT/bench10m.txt); prints its exit status and time.
bench_trace() {
  local t0; t0=$(date +%s); rm -f "$1"
  timeout "$2" "$GS" bench --analysis-only --analysis-calls 10000000 --keep-trace "$1" >"$OUT/bench10m.txt" 2>&1
  echo "bench rc=$? in $(( $(date +%s) - t0 )) s"
}
