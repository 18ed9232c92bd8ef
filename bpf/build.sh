#!/usr/bin/env bash
# Regenerates the committed eBPF object from its C source.
# Needs: clang (Debian: clang, libbpf-dev). vmlinux.h is committed; regenerate it with
#   bpftool btf dump file /sys/kernel/btf/vmlinux format c > bpf/vmlinux.h
# Usage: bpf/build.sh [--check]   (--check: fail if the committed object differs)
set -euo pipefail
cd "$(dirname "$0")"
out=gpusleuth.bpf.o
tmp=$(mktemp --suffix=.o)
trap 'rm -f "$tmp"' EXIT
# -g keeps BTF (needed for CO-RE and BTF-defined maps); paths are relative and
# debug prefix maps fixed so the object is byte-reproducible across checkouts.
clang -O2 -g -target bpf -D__TARGET_ARCH_x86 -I. \
	-fdebug-prefix-map="$PWD"=. -fno-ident \
	-Wall -Werror -Wno-unused-function \
	-c gpusleuth.bpf.c -o "$tmp"
llvm-strip -g "$tmp" 2>/dev/null || true
if [[ "${1:-}" == "--check" ]]; then
	if ! cmp -s "$tmp" "$out"; then
		echo "bpf/$out is stale: run bpf/build.sh and commit the result" >&2
		exit 1
	fi
	echo "bpf/$out matches its sources"
else
	cp "$tmp" "$out"
	echo "wrote bpf/$out ($(stat -c %s "$out") bytes)"
fi
