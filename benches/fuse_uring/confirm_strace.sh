#!/bin/bash
# Confirms the transport: syscalls of the daemon during one warm pass (50,000 OPEN+RELEASE).
U=${FUSE_URING_DIR:-/work/uring}; mode=$1; shift
$U/mount_ro.sh $mode "$@" || exit 1
pid=$(cat $U/logs/daemon.pid)
$U/reader $U/mnt 8 1 > /dev/null            # warm the FUSE page cache
strace -f -c -p $pid -o $U/logs/strace-$mode.txt & st=$!
sleep 1
$U/reader $U/mnt 8 0 | head -1               # one more pass, traced (slowed by strace)
kill -INT $st; wait $st
umount $U/mnt; wait $pid 2>/dev/null
echo "fds of daemon /dev/fuse vs io_uring shown above; top syscalls:"; head -12 $U/logs/strace-$mode.txt
