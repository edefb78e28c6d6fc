#!/bin/bash
# Alternating series of bench.sh runs; before each run wait (max 150 s) for
# the 1-min load to fall below 1.5. `series.sh 1`: the first series (with the
# option variants); `series.sh 2`: the second, reversed order (uring first).
U=${FUSE_URING_DIR:-/work/uring}; which=${1:-1}
out=$U/logs/series$([ "$which" = 1 ] || echo "$which")-$(date +%H%M).txt
wait_load() { for i in $(seq 30); do awk '{exit !($1 < 1.5)}' /proc/loadavg && return; sleep 5; done; echo "(load still high after 150 s)"; }
run() { wait_load; $U/bench.sh "$@" 2>&1; echo; }
{
if [ "$which" = 1 ]; then
    run direct; run classic; run uring; run classic; run uring; run direct
    run classic -o max_threads=2
    run uring -o io_uring_q_depth=32
    run uring -o io_uring_q_depth=2
else
    run uring; run classic; run uring; run classic; run direct
fi
} > $out
echo enable_uring=$(cat /sys/module/fuse/parameters/enable_uring) >> $out
echo N > /sys/module/fuse/parameters/enable_uring
