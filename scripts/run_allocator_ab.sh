#!/usr/bin/env bash
# The allocator views of a `trace --rotate --torch-allocator` run, two builds
# interleaved: wall time and peak RSS of `memory`, `memory --at`, `explain`
# and `report` over the run's directory (and of the same workload recorded
# in one file, for reference), and whether the builds' outputs are
# byte-identical (docs/benchmarks.md "A run's allocator views without its
# events (round 31)"). Records the traces first (as root, with the simulated
# CUDA libraries of `gpusleuth demo --keep`) unless WORK already holds them.
# Usage:
#   scripts/run_allocator_ab.sh BASE_BIN NEW_BIN WORK N [REPS]
# N: the workload's iterations (each a torch_malloc and a torch_free: 2N
# allocator events); WORK/run_N (1-s files) and WORK/one_N.db are written.
set -euo pipefail
base=$1 new=$2 work=$3 n=$4 reps=${5:-3}
mkdir -p "$work"
sim="$work/sim"
# demo --keep writes only new files: what an interrupted one left goes first.
[[ -x $sim/sim/bin/workload ]] || { rm -rf "$sim"; "$new" demo --keep "$sim" >/dev/null; }
S=$sim/sim
workload="torch_malloc 4096 keep; repeat $n { torch_malloc 4096 a; torch_free a }; sleep 300"
record() { # record OUT_ARGS...
  PATH=$S/bin:$PATH LD_LIBRARY_PATH=$S/lib "$new" trace "$@" --torch-allocator \
    --cuda-lib "$S/lib/libcudart.so.13" --cuda-lib "$S/lib/libcuda.so.1" \
    --cuda-lib "$S/lib/libc10_cuda.so" --precheck off -- workload "$workload" >/dev/null 2>&1
}
run=$work/run_$n one=$work/one_$n.db
[[ -d $run ]] || record --db "$run" --rotate 1s
[[ -f $one ]] || record --db "$one"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Once each, so that every file's checks are cached before the timings.
for b in "$base" "$new"; do "$b" stats --db "$run" >/dev/null 2>&1 || true; done
cmds=("memory" "memory --at 1500ms" "explain --json" "report --force -o OUT.html")
for ((r = 1; r <= reps; r++)); do
  for c in "${cmds[@]}"; do
    for db in "$run" "$one"; do
      for b in base new; do
        bin=${!b}
        file="$out/$b.html"
        args=${c//OUT.html/$file}
        # shellcheck disable=SC2086
        /usr/bin/time -f "%e %M" -o "$out/time" "$bin" $args --db "$db" >"$out/$b.stdout" 2>/dev/null || echo "  $b failed"
        read -r wall kb <"$out/time"
        printf '%-28s %-14s %-4s rep %d: %6.2f s %6d MB\n' "$c" "$(basename "$db")" "$b" "$r" "$wall" $((kb / 1024))
      done
      if [[ $c == report* ]]; then
        cmp -s "$out/base.html" "$out/new.html" && echo "  same report" || echo "  REPORTS DIFFER"
      else
        cmp -s "$out/base.stdout" "$out/new.stdout" && echo "  same answer" || echo "  ANSWERS DIFFER"
      fi
    done
  done
done
