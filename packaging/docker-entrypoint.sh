#!/bin/sh
# Entrypoint of the locafs sidecar image: mounts $LOCAFS_SOURCE on
# $LOCAFS_MOUNTPOINT with the cache in $LOCAFS_CACHE_DIR, in the foreground.
# locafs unmounts and exits 0 on SIGTERM. Arguments are passed on to
# `locafs mount` (e.g. --cache-size 200G --metrics :9100). If a config file
# is mounted at $LOCAFS_CONFIG (default /etc/locafs/locafs.toml) it is used.
set -eu

: "${LOCAFS_SOURCE:=/data}"
: "${LOCAFS_MOUNTPOINT:=/mnt/dataset}"
: "${LOCAFS_CACHE_DIR:=/cache}"
: "${LOCAFS_CONFIG:=/etc/locafs/locafs.toml}"

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
