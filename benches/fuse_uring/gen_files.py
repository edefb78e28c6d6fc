#!/usr/bin/env python3
"""Figure-2 data set: 50,000 files of 4-256 KiB (uniform), 100 directories."""
import os, random, sys
root = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FUSE_URING_DIR", "/work/uring") + "/data/src"
rng = random.Random(2)
buf = os.urandom(256 * 1024)
os.makedirs(root, exist_ok=True)
total = 0
for d in range(100):
    dp = os.path.join(root, f"d{d:03d}")
    os.makedirs(dp, exist_ok=True)
    for i in range(500):
        size = rng.randint(4 * 1024, 256 * 1024)
        off = rng.randint(0, 1024)
        fd = os.open(os.path.join(dp, f"f{i:04d}.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, (buf[off:] + buf[:off])[:size])
        os.close(fd)
        total += size
print(f"{100*500} files, {total/2**30:.2f} GiB in {root}")
