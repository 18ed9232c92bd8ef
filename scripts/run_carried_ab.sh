#!/usr/bin/env bash
# A `trace --rotate --torch-allocator` run read two ways by one build: with
# the allocator views the tracer carried across its files (`run_allocator`,
# `run_allocator_begin`, round 32) and without them (the keys
# `meta.run_allocator` and `meta.run_allocator_begin` deleted from a copy's
# files: the reader replays every file, as before round 32).
# Prints wall time and peak RSS of `memory` (also `--at`), `explain` and `report` over the
# run's directory, whether both ways answer byte for byte the same, and the
# completion CPU of each file (`tracer_cpu_ns_completion`) against BASE_BIN's
# recording of the same workload (docs/benchmarks.md "A run's allocator views
# carried by the tracer (round 32)"). Records as root with the simulated CUDA
# libraries of `gpusleuth demo --keep` unless WORK already holds the runs.
# Usage:
#   scripts/run_carried_ab.sh BASE_BIN NEW_BIN WORK N [REPS]
# N: the workload's iterations (each a torch_malloc and a torch_free).
set -euo pipefail
base=$1 new=$2 work=$3 n=$4 reps=${5:-3}
mkdir -p "$work"
sim="$work/sim"
# demo --keep writes only new files: what an interrupted one left goes first.
[[ -x $sim/sim/bin/workload ]] || { rm -rf "$sim"; "$new" demo --keep "$sim" >/dev/null; }
S=$sim/sim
workload="torch_malloc 4096 keep; repeat $n { torch_malloc 4096 a; torch_free a }; sleep 300"
record() { # record BIN DIR
  PATH=$S/bin:$PATH LD_LIBRARY_PATH=$S/lib "$1" trace --db "$2" --rotate 1s --torch-allocator \
    --cuda-lib "$S/lib/libcudart.so.13" --cuda-lib "$S/lib/libcuda.so.1" \
    --cuda-lib "$S/lib/libc10_cuda.so" --precheck off -- workload "$workload" >/dev/null 2>&1
}
# Same base names: the answers name the directory read.
run=$work/carried/run_$n replay=$work/replayed/run_$n old=$work/base/run_$n
mkdir -p "$work/carried" "$work/replayed" "$work/base"
[[ -d $run ]] || record "$new" "$run"
[[ -d $old ]] || record "$base" "$old"
if [[ ! -d $replay ]]; then
  cp -r "$run" "$replay"
  for f in "$replay"/part-*.db; do
    sqlite3 "$f" "DELETE FROM meta WHERE key IN ('run_allocator', 'run_allocator_begin')"
  done
fi
completion() { # completion DIR: each file's completion CPU in ms
  for f in "$1"/part-*.db; do
    sqlite3 "$f" "SELECT value / 1000000 FROM stats WHERE name = 'tracer_cpu_ns_completion'"
  done | tr '\n' ' '
}
echo "files: $(ls "$run"/part-*.db | wc -l) carried, $(ls "$old"/part-*.db | wc -l) base"
echo "completion CPU ms per file, base: $(completion "$old")"
echo "completion CPU ms per file, new:  $(completion "$run")"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Once each, so that every file's checks are cached before the timings.
for d in "$run" "$replay"; do "$new" stats --db "$d" >/dev/null 2>&1 || true; done
cmds=("memory" "memory --at 1500ms" "memory --at 3500ms" "explain --json" "report --force -o OUT.html")
for ((r = 1; r <= reps; r++)); do
  for c in "${cmds[@]}"; do
    for way in carried replayed; do
      args=${c//OUT.html/$out/$way.html}
      # From the run's parent: the answers name the directory as given.
      # shellcheck disable=SC2086
      (cd "$work/$way" && /usr/bin/time -f "%e %M" -o "$out/time" "$new" $args --db "run_$n" >"$out/$way.stdout" 2>/dev/null) || echo "  $way failed"
      read -r wall kb <"$out/time"
      printf '%-26s %-9s rep %d: %6.2f s %6d MB\n' "$c" "$way" "$r" "$wall" $((kb / 1024))
    done
    if [[ $c == report* ]]; then
      cmp -s "$out/carried.html" "$out/replayed.html" && echo "  same report" || echo "  REPORTS DIFFER"
    else
      cmp -s "$out/carried.stdout" "$out/replayed.stdout" && echo "  same answer" || echo "  ANSWERS DIFFER"
    fi
  done
done
