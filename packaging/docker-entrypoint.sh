#!/bin/sh
# Entrypoint of the locafs image: mounts $LOCAFS_SOURCE on $LOCAFS_MOUNTPOINT
# with the cache in $LOCAFS_CACHE_DIR, in the foreground. Arguments are
# passed on to `locafs mount` (e.g. --cache-size 200G --metrics :9100). If a
# config file is mounted at $LOCAFS_CONFIG (default /etc/locafs/locafs.toml)
# it is used.
#
# It execs locafs, which is then the container's first process:
#   SIGTERM (docker stop, pod deletion), SIGINT: unmount (detached lazily if
#     files are open), book the cache out, exit 0;
#   SIGKILL (docker kill, the OOM killer): exit 137; the mount is left dead
#     ("Transport endpoint is not connected") until locafs starts again and
#     replaces it;
#   other signals (SIGHUP, SIGQUIT, SIGUSR1, ...) are ignored: a first
#     process gets only the signals it handles.
# Exit status 2: what a restart will not mend: a configuration error (a bad
# option, a missing source) or a container that cannot mount (no /dev/fuse,
# no CAP_SYS_ADMIN: checked below first, naming the flag); 1: the mount
# failed otherwise.
set -eu

: "${LOCAFS_SOURCE:=/data}"
: "${LOCAFS_MOUNTPOINT:=/mnt/dataset}"
: "${LOCAFS_CACHE_DIR:=/cache}"
: "${LOCAFS_CONFIG:=/etc/locafs/locafs.toml}"

# What the mount needs, said plainly (the mount's own error would be "No
# such file or directory": the fusermount fallback is not in the image).
if [ ! -c /dev/fuse ]; then
    echo "locafs: /dev/fuse is missing in the container: run it with --device /dev/fuse (Kubernetes: privileged, or a device plugin)" >&2
    exit 2
fi
cap_eff=$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status 2>/dev/null || true)
if [ -n "$cap_eff" ] && [ $(( (0x$cap_eff >> 21) & 1 )) -eq 0 ] \
    && ! command -v fusermount3 >/dev/null 2>&1 && ! command -v fusermount >/dev/null 2>&1; then
    echo "locafs: mounting needs CAP_SYS_ADMIN: run the container with --cap-add SYS_ADMIN (and, where AppArmor runs, --security-opt apparmor=unconfined), or privileged" >&2
    exit 2
fi

mkdir -p "$LOCAFS_MOUNTPOINT"
# The cache holds copies of files others may not read: owner-only (locafs
# makes an existing one so at start, or refuses one others may write).
mkdir -p -m 0700 "$LOCAFS_CACHE_DIR"

# A previous container of this pod may have died and left a dead mount on the
# shared volume; locafs detaches a dead locafs mount by itself before mounting.

if [ -f "$LOCAFS_CONFIG" ]; then
    set -- --config "$LOCAFS_CONFIG" "$@"
fi

exec /usr/bin/locafs mount --cache-dir "$LOCAFS_CACHE_DIR" "$@" -- "$LOCAFS_SOURCE" "$LOCAFS_MOUNTPOINT"
