#!/bin/bash
# Second alternating series, reversed order (uring first).
U=${FUSE_URING_DIR:-/work/uring}; out=$U/logs/series2-$(date +%H%M).txt
wait_load() { for i in $(seq 30); do awk '{exit !($1 < 1.5)}' /proc/loadavg && return; sleep 5; done; echo "(load still high after 150 s)"; }
run() { wait_load; $U/bench.sh "$@" 2>&1; echo; }
{
run uring
run classic
run uring
run classic
run direct
} > $out
echo N > /sys/module/fuse/parameters/enable_uring
