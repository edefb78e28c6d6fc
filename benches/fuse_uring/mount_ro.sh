#!/bin/bash
# usage: mount_ro.sh classic|uring [extra libfuse args, e.g. -o io_uring_q_depth=16]
# Mounts /work/uring/data/src on /work/uring/mnt with mini_ro (libfuse 3.19-rc0
# low-level API): keep_cache, FOPEN_NOFLUSH, no writeback cache, no passthrough.
set -e
U=${FUSE_URING_DIR:-/work/uring}; mode=$1; shift
case $mode in
  classic) echo N > /sys/module/fuse/parameters/enable_uring; opt=() ;;
  uring)   echo Y > /sys/module/fuse/parameters/enable_uring; opt=(-o io_uring) ;;
  *) echo "bad mode"; exit 2 ;;
esac
mkdir -p $U/mnt $U/logs
FUSE_INIT_STATUS=1 $U/mini_ro $U/data/src $U/mnt -f -o max_threads=${MAXT:-8} "${opt[@]}" "$@" \
   > $U/logs/daemon-$mode.log 2>&1 &
echo $! > $U/logs/daemon.pid
for i in $(seq 50); do findmnt $U/mnt >/dev/null && break; sleep 0.1; done
findmnt $U/mnt >/dev/null || { echo "mount failed"; cat $U/logs/daemon-$mode.log; exit 1; }
for i in $(seq 50); do grep -q 'FUSE_INIT: io_uring' $U/logs/daemon-$mode.log && break; sleep 0.1; done
grep -E 'io-uring|FUSE_INIT: (io_uring|FUSE_CAP_PASSTHROUGH|FUSE_CAP_WRITEBACK)' $U/logs/daemon-$mode.log || true
echo "enable_uring=$(cat /sys/module/fuse/parameters/enable_uring) pid=$(cat $U/logs/daemon.pid)"
