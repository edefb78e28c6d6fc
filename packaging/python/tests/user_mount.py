"""What tests/python_wheel.rs runs as an unprivileged user, with the wheel
installed in a fresh virtual environment: a training script's life with
``locafs.mount`` (not a unittest module: it needs a real mount).

argv[1] is JSON: ``source``, ``mountpoint``, ``files`` (relative paths of
every file of the source), ``mode``:

- ``"mount"``: mount with the defaults, read every byte twice and check it
  against the source, sample with ``LocalitySampler`` against the mount,
  close; again as a context manager; a third mount left open for the
  interpreter's exit. Prints one JSON line of facts for the Rust side.
- ``"error"``: ``locafs.mount`` must fail; prints the exception's class,
  message and status as JSON.

Every check fails with an AssertionError (exit 1).
"""

import json
import logging
import os
import subprocess
import sys


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append((record.levelname, record.getMessage()))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def check_bytes(mnt, src, files):
    for rel in files:
        got, want = read(os.path.join(mnt, rel)), read(os.path.join(src, rel))
        assert got == want, "%s: %d bytes through the mount, %d at the source" % (
            rel,
            len(got),
            len(want),
        )


def tree(root):
    out = []
    for d, dirs, names in os.walk(root):
        for n in names:
            out.append(os.path.relpath(os.path.join(d, n), root))
    return sorted(out)


def main():
    cfg = json.loads(sys.argv[1])
    import locafs

    logger = logging.getLogger("locafs")
    logger.setLevel(logging.DEBUG)
    records = Records()
    logger.addHandler(records)
    src, mnt, files = cfg["source"], cfg["mountpoint"], cfg["files"]

    if cfg["mode"] == "error":
        try:
            m = locafs.mount(src, mnt)
        except locafs.MountError as e:
            print(json.dumps({"type": type(e).__name__, "message": str(e), "returncode": e.returncode}))
            return
        m.close()
        raise AssertionError("locafs.mount succeeded where it must fail")

    facts = {"uid": os.geteuid()}
    # The binary is the wheel's, in this environment's bin/, of the
    # package's version.
    exe = locafs.binary()
    facts["binary"] = exe
    assert exe == os.path.join(sys.prefix, "bin", "locafs"), exe
    version = subprocess.run([exe, "--version"], capture_output=True, check=True).stdout
    assert version.decode().split() == ["locafs", locafs.__version__], version

    # A refused option: a UsageError carrying the command's one line.
    try:
        locafs.mount(src, mnt, no_such_option=True)
        raise AssertionError("an unknown option was accepted")
    except locafs.UsageError as e:
        assert e.returncode == 2 and "--no-such-option" in str(e) and "\n" not in str(e), repr(e)
        facts["usage_error"] = str(e)

    # Defaults only: the cache goes under $XDG_CACHE_HOME/locafs.
    m = locafs.mount(src, mnt)
    assert isinstance(m, locafs.Mount) and m.pid and os.path.ismount(mnt), m
    cache = os.path.join(os.environ["XDG_CACHE_HOME"], "locafs")
    facts["cache_entries"] = sorted(os.listdir(cache))
    assert tree(mnt) == sorted(files), (tree(mnt), files)
    check_bytes(mnt, src, files)  # from the source
    check_bytes(mnt, src, files)  # from the cache
    # The control socket answers this user.
    assert (m.node_index, m.num_nodes) == (0, 1), m
    assert m.locate(files) == [0] * len(files)
    assert m.plan(files) == (len(files), 0)

    # The sampler against the mount (one node, no peers: it samples like
    # DistributedSampler over every file, and says so once).
    sampler = locafs.LocalitySampler(files, m, batch_size=2, local_rank=0, local_world_size=1)
    assert sampler.mount is m and not sampler.locality
    order = list(sampler)
    assert sorted(order) == list(range(len(files))), order
    check_bytes(mnt, src, [files[i] for i in order])
    by_path = locafs.LocalitySampler(files, mnt, batch_size=2, local_rank=0, local_world_size=1)
    assert by_path.mount is not None and by_path.mount.path == mnt
    assert list(by_path) == order
    facts["sampler_order"] = order

    pid = m.pid
    m.close()
    assert m.closed and not os.path.ismount(mnt), m
    assert not os.path.exists("/proc/%d" % pid), "the daemon %d outlived close()" % pid
    m.close()  # twice is fine

    with locafs.mount(src, mnt) as m2:
        check_bytes(mnt, src, files[:1])
        facts["with_pid"] = m2.pid
    assert not os.path.ismount(mnt)

    facts["log"] = records.lines
    levels = [lvl for lvl, _ in records.lines]
    assert "ERROR" not in levels, records.lines
    # Left mounted: the interpreter's exit unmounts it.
    m3 = locafs.mount(src, mnt)
    facts["atexit_pid"] = m3.pid
    print(json.dumps(facts))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
