#!/bin/bash
# usage: bench.sh direct|classic|uring [extra libfuse args...]
# Figure 2: 8 threads, 50,000 files, 1 warm-up + 3 timed passes, median files/s.
U=${FUSE_URING_DIR:-/work/uring}; mode=$1; shift
echo "### $mode $* -- $(date +%T) load: $(cut -d' ' -f1-3 /proc/loadavg) drop_caches in dmesg so far: $(dmesg | grep -c drop_caches)"
if [ "$mode" = direct ]; then
  $U/reader $U/data/src 8 3
else
  $U/mount_ro.sh $mode "$@" || exit 1
  pid=$(cat $U/logs/daemon.pid)
  $U/reader $U/mnt 8 3 $pid
  echo "daemon threads: $(ls /proc/$pid/task | wc -l) ($(cat /proc/$pid/task/*/comm | sort | uniq -c | tr '\n' ' ')), io_uring fds: $(ls -l /proc/$pid/fd | grep -c io_uring)"
  echo "daemon log lines other than FUSE_INIT/io-uring start (errors): $(grep -v -e '^FUSE_INIT' -e 'starting io-uring' $U/logs/daemon-$mode.log | grep -c .)"
  umount $U/mnt; wait $pid 2>/dev/null; sleep 0.5
fi
echo "### end $(date +%T) load: $(cut -d' ' -f1-3 /proc/loadavg) drop_caches so far: $(dmesg | grep -c drop_caches)"
