#!/usr/bin/env bash
# Packs this machine's perf with its dynamic loader and every library ldd
# lists into one directory (default target/perfkit, ~33 MiB), so it runs on a
# machine without perf: `KIT/ld-linux-x86-64.so.2 --library-path KIT KIT/perf`.
# The device machine has no perf and no network (scripts/gpu/writer_profile.sh).
set -eu
KIT=${1:-target/perfkit}
P=$(readlink -f "$(command -v perf)")
rm -rf "$KIT"; mkdir -p "$KIT"
cp "$P" "$KIT/perf"
for l in $(ldd "$P" | awk '/=>/ {print $3} /ld-linux/ {print $1}'); do cp -L "$l" "$KIT/"; done
"$KIT/ld-linux-x86-64.so.2" --library-path "$KIT" "$KIT/perf" --version
du -sh "$KIT"
