#!/usr/bin/env bash
# Is the trace writer's extra CPU on this machine page-cache reclaim done in
# its own context? The footprint flood with /proc/vmstat's direct-reclaim and
# writeback counters before and after, the memory cgroup's limit, the
# filesystem and the dirty-page settings. Usage (device): bash scripts/gpu/writer_reclaim.sh GS
set -u
GS=${1:-target/release/gpusleuth}
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
echo "kernel $(uname -r); $(nproc) CPUs; /tmp on $(df -T /tmp | tail -1 | awk '{print $1, $2}')"
cg=$(awk -F: '$1=="0"{print $3}' /proc/self/cgroup)
echo "cgroup ${cg:-?}: memory.max $(cat /sys/fs/cgroup${cg}/memory.max 2>/dev/null || echo n/a)"
grep -E "MemTotal|MemFree|^Cached|Dirty" /proc/meminfo
for k in dirty_ratio dirty_background_ratio dirty_bytes dirty_background_bytes; do echo "vm.$k=$(cat /proc/sys/vm/$k)"; done
keys="pgscan_direct pgsteal_direct pgscan_kswapd allocstall_normal allocstall_movable nr_dirtied nr_written pgfault pgmajfault"
snap() { for k in $keys; do awk -v k=$k '$1==k{printf "%s=%s ", k, $2}' /proc/vmstat; done; echo; }
echo "before: $(snap)"
timeout 150 "$GS" bench --footprint-only --footprint-launches "${N:-200000}" --reps 1 2>&1 | grep -E "^ +[0-9]+ +o|per added"
echo "after:  $(snap)"
