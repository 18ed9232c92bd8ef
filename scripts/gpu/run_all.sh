#!/usr/bin/env bash
# Issues 7 and 8 on the GPU machine, in one call: the four traced scenarios,
# their checks, the interleaved overhead benchmarks, a small example trace.
#
#   scripts/gpu/run_all.sh            (as root, from anywhere; results go to $OUT, default /tmp/gs-out)
#
# Needs target/release/gpusleuth (built elsewhere and carried) and PyTorch at
# /opt/torch/.venv/bin/python3 (override: GS_PY, GS_BIN). Budget: GS_BUDGET_S
# seconds in all (default 530); benchmark runs that would end later are
# skipped and listed. GS_REPS sets the benchmark repetitions (default 2).
# One failed scenario does not stop the others. The last line printed is the
# PASS/FAIL verdict; the full log, results.json, summary.txt, the example
# trace and the scenario logs (logs.tar.gz) are written to $OUT.
set -u

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 2
T0=$(date +%s)
OUT=${OUT:-/tmp/gs-out}
W=${GS_WORK:-/tmp/gs-work}
PY=${GS_PY:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
GS=${GS_BIN:-$ROOT/target/release/gpusleuth}
BUDGET=${GS_BUDGET_S:-530}
REPS=${GS_REPS:-2}
EXAMPLE_MAX_BYTES=$((8 * 1024 * 1024))
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
rm -rf "$W"
mkdir -p "$W"

say() { echo "[$(date +%H:%M:%S) +$(($(date +%s) - T0))s] $*"; }

# Traces one scenario: run_scn NAME LAUNCHES [--env K=V ...] -- CMD...
run_scn() {
    local name=$1 launches=$2
    shift 2
    local opts=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
    shift
    say "scenario $name (launches=$launches)"
    "$PY" scripts/gpu/gsrun.py --name "$name" --work "$W" --gs "$GS" --db "$W/$name.db" \
        --launches "$launches" "${LIBARGS[@]}" "${opts[@]}" --timeout 150 -- "$@"
    local rc=$?
    [ $rc -eq 0 ] || say "scenario $name ended with rc=$rc (the checks say what that cost)"
    return 0
}

main() {
    say "gpusleuth GPU run: root $ROOT, work $W, out $OUT, budget ${BUDGET}s"
    if [ ! -x "$GS" ]; then
        say "FATAL: no gpusleuth binary at $GS (build it with cargo build --release and carry target/release/gpusleuth)"
        echo "RESULT: FAIL (no binary)"
        return 2
    fi
    if ! grep -q " /sys/kernel/tracing tracefs " /proc/mounts; then
        mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null && say "mounted tracefs" || say "tracefs not mounted (gpusleuth may not need it)"
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 | sed 's/^/  gpu: /'

    say "gpusleuth check"
    "$GS" --version
    timeout 60 "$GS" check --load 2>&1 | sed 's/^/  /'
    timeout 60 "$GS" check --json >"$W/check.json" 2>/dev/null || true

    say "finding the CUDA libraries PyTorch maps"
    "$PY" - "$W" <<'EOF'
import json, os, platform, subprocess, sys, time
w = sys.argv[1]
import torch
torch.zeros(1, device="cuda")
libs = set()
with open("/proc/self/maps") as f:
    for line in f:
        p = line.split()[-1]
        b = os.path.basename(p)
        if b.startswith(("libcudart.so", "libcuda.so", "libc10_cuda.so")):
            libs.add(os.path.realpath(p))
with open(os.path.join(w, "libs.txt"), "w") as f:
    for p in sorted(libs):
        f.write(p + "\n")
def sh(*a):
    try:
        return subprocess.run(a, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e:
        return f"? ({e})"
try:
    import transformers
    tv = transformers.__version__
except Exception as e:
    tv = f"? ({e})"
env = {
    "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    "gpu": sh("nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"),
    "driver": sh("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"),
    "kernel": platform.release(),
    "torch": torch.__version__, "torch_cuda": torch.version.cuda, "transformers": tv,
    "python": sys.version.split()[0],
    "gpusleuth": sh(os.environ.get("GS", "gpusleuth"), "--version"),
    "cpus": os.cpu_count(), "libraries": sorted(libs),
    "command": "scripts/gpu/run_all.sh",
}
json.dump(env, open(os.path.join(w, "env.json"), "w"), indent=1)
print("\n".join("  mapped: " + p for p in sorted(libs)))
EOF
    LIBARGS=()
    while read -r lib; do
        case "$(basename "$lib")" in
            libcudart.so* | libcuda.so*) LIBARGS+=(--cuda-lib "$lib") ;;
        esac
    done <"$W/libs.txt"
    [ ${#LIBARGS[@]} -gt 0 ] || say "warning: no CUDA library found in PyTorch's maps; relying on gpusleuth's discovery"

    # Scenario 1: default allocator (with --launches all, so runtime and driver launch counts both show) and expandable segments.
    run_scn s1_default all -- "$PY" scripts/gpu/seed_empty_cache.py --log "$W/s1_default.jsonl"
    run_scn s1_expandable driver --env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- \
        "$PY" scripts/gpu/seed_empty_cache.py --log "$W/s1_expandable.jsonl"

    # Scenario 2: the neighbour is started here (not a child of the traced command) and waits on a FIFO.
    local cpu=$(($(nproc) - 1))
    mkfifo "$W/go.fifo"
    "$PY" scripts/gpu/neighbour.py --cpus "$cpu" --fifo "$W/go.fifo" --pid-file "$W/neighbour.pid" \
        --max-burn-s 30 --max-wait-s 200 &
    local npid=$!
    run_scn s2_contention driver -- "$PY" scripts/gpu/contention.py --log "$W/s2_contention.jsonl" --cpus "$cpu" \
        --fifo "$W/go.fifo" --pid-file "$W/neighbour.pid"
    kill "$npid" 2>/dev/null
    wait "$npid" 2>/dev/null

    run_scn s3_oom driver -- "$PY" scripts/gpu/oom.py --log "$W/s3_oom.jsonl"
    run_scn s4_multiproc driver -- "$PY" scripts/gpu/multiproc.py --log "$W/s4_multiproc.jsonl"

    say "checking the scenarios"
    timeout 180 "$PY" scripts/gpu/check_results.py --work "$W" --gs "$GS" || say "checker ended with rc=$?"

    local deadline=$((T0 + BUDGET - 30))
    say "benchmarks (reps $REPS, no run starts that would end after +$((deadline - T0))s)"
    "$PY" scripts/gpu/bench.py --work "$W" --gs "$GS" --py "$PY" --reps "$REPS" --deadline "$deadline" \
        "${LIBARGS[@]}" || say "bench ended with rc=$?"

    say "example trace"
    "$PY" - "$W" "$OUT" "$EXAMPLE_MAX_BYTES" <<'EOF'
import os, sqlite3, sys
w, out, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
for name in ("s2_contention", "s1_expandable", "s1_default"):
    src = os.path.join(w, name + ".db")
    if not os.path.exists(src):
        continue
    dst = os.path.join(w, f"example-{name}.db")
    try:
        if os.path.exists(dst):
            os.remove(dst)
        s = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
        d = sqlite3.connect(dst)
        s.backup(d)
        d.execute("PRAGMA journal_mode=DELETE")
        d.execute("VACUUM")
        d.close()
        s.close()
    except Exception as e:
        print(f"  {name}: cannot copy ({e})")
        continue
    size = os.path.getsize(dst)
    if size <= cap:
        os.replace(dst, os.path.join(out, f"example-{name}.db"))
        print(f"  example-{name}.db: {size} bytes")
        break
    print(f"  {name}: {size} bytes, over {cap}: not copied")
EOF
    (cd "$W" && tar czf "$OUT/logs.tar.gz" ./*.jsonl ./*.stderr ./*.stdout ./check.json ./env.json ./libs.txt \
        ./checks.json ./bench.json 2>/dev/null)
    ls -la "$OUT"
    say "report"
    "$PY" scripts/gpu/report.py --work "$W" --out "$OUT"
}

export GS
main 2>&1 | tee "$OUT/run_all.log"
exit "${PIPESTATUS[0]}"
