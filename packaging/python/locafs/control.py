"""A locafs mount from Python: :class:`Mount`, its control socket, and the
errors of the package.

The socket's name is the ``user.locafs.control`` extended attribute of the
mount root (nothing is added to the data set's tree): ``@NAME`` for a socket
in the abstract namespace (reachable from the daemon's network namespace
only), else a path. One JSON request per line, one JSON answer per line, as
``locafs plan`` and ``locafs where`` use it (src/mount/control.rs). A
:class:`Mount` made by :func:`locafs.mount` also owns the daemon behind it
(``_daemon.py``) and unmounts on :meth:`close`; one made from a path
attaches to a mount someone else made and never unmounts it.

Who may ask: the user running the daemon and root ask anything; when the
daemon runs as root, another user who may read the mount root may ask
``where`` and ``plan`` (about the files they could reach); others are
refused with an answer that says why (docs/security.md).
"""

import array
import base64
import errno
import json
import os
import socket
import sys
import time

CONTROL_XATTR = "user.locafs.control"

__all__ = [
    "Mount",
    "LocafsError",
    "MountError",
    "NotALocafsMount",
    "UsageError",
    "CONTROL_XATTR",
]


class LocafsError(RuntimeError):
    """Something locafs refused or could not do: the mount answered a
    request with an error, or the binary is missing."""


class NotALocafsMount(LocafsError):
    """The path is not the root of a locafs mount."""


class MountError(LocafsError):
    """``locafs mount`` failed. ``str(e)`` and ``e.message`` are the
    command's one-line reason (what it printed after ``locafs: ``);
    ``e.returncode`` its exit status (2: what a retry cannot
    fix: bad options or input, or no right to mount, e.g. no FUSE access;
    1: anything else); ``e.log`` the daemon's last log
    lines; ``e.command`` the command line."""

    def __init__(self, message, returncode=None, log=(), command=()):
        super().__init__(message)
        self.message = message
        self.returncode = returncode
        self.log = list(log)
        self.command = list(command)


class UsageError(MountError):
    """``locafs mount`` refused its options or input (exit status 2): an
    unknown option, a bad size, a missing source or mountpoint."""


def _relative(path, root):
    """``path`` relative to the mount root (absolute paths under it allowed)."""
    p = os.fspath(path)
    if os.path.isabs(p):
        rel = os.path.relpath(p, root)
        if rel == os.pardir or rel.startswith(os.pardir + os.sep):
            return p.lstrip("/")
        return rel
    return p


class Mount:
    """The root of a locafs mount and its control socket.

    ``node_index`` and ``num_nodes`` come from the mount's ``where`` query:
    nodes are numbered by member id (the resolved ``ip:port`` of each
    ``--peers`` entry, sorted as strings), the same numbering on every node;
    without peers the mount is node 0 of 1.
    """

    # The daemon this object started (locafs.mount), which close() stops;
    # None for a mount attached by path.
    _daemon = None

    def __init__(self, path, wait=30.0):
        self.path = os.path.abspath(os.fspath(path))
        try:
            raw = os.getxattr(self.path, CONTROL_XATTR)
        except OSError as e:
            if e.errno == errno.EACCES:
                raise LocafsError(
                    "%s: you may not read the mount root, so its control socket is not "
                    "yours to use" % self.path
                ) from None
            raise NotALocafsMount(
                "%s: not the root of a locafs mount (%s)" % (self.path, e.strerror or e)
            ) from None
        self.socket_path = raw.decode("utf-8", "surrogateescape")
        # A node finds itself in its --peers list a moment after it mounts.
        deadline = time.monotonic() + wait
        while True:
            answer = self._call({"op": "where", "paths": []}, check=False)
            if answer.get("node_index") is not None or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if not answer.get("ok"):
            raise LocafsError("%s: %s" % (self.path, answer.get("error", "where failed")))
        self._node_index = int(answer["node_index"])
        self._num_nodes = int(answer.get("num_nodes") or 1)
        self.members = list(answer.get("members") or [])

    @property
    def node_index(self):
        """This node's index, 0 <= node_index < num_nodes."""
        return self._node_index

    @property
    def num_nodes(self):
        """The number of nodes in the configured peer list (1 without peers)."""
        return self._num_nodes

    def _call(self, request, check=True, payload=b""):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        name = self.socket_path
        address = "\0" + name[1:] if name.startswith("@") else name
        try:
            s.connect(address)
            try:
                s.sendall(json.dumps(request).encode("utf-8") + b"\n")
                if payload:
                    s.sendall(payload)
            except (BrokenPipeError, ConnectionResetError):
                # The daemon answered without reading (a refusal, "busy"):
                # its answer is read below.
                pass
            with s.makefile("rb") as f:
                line = f.readline()
        except OSError as e:
            hint = ""
            if name.startswith("@") and isinstance(e, ConnectionRefusedError):
                hint = " (an abstract socket: reachable only from the daemon's network namespace)"
            raise LocafsError("control socket %s: %s%s" % (self.socket_path, e, hint)) from None
        finally:
            s.close()
        if not line:
            raise LocafsError("control socket %s: closed" % self.socket_path)
        answer = json.loads(line)
        if answer.get("refused"):
            raise LocafsError("%s: %s" % (self.path, answer.get("error", "refused")))
        if check and not answer.get("ok"):
            raise LocafsError("%s: %s" % (self.path, answer.get("error", "request failed")))
        return answer

    def where(self, files=None):
        """The raw ``where`` answer: for ``files`` (paths relative to the
        mount root), or for the whole data set in listing order (then the
        answer has ``paths``). Keys: ok, node_index, num_nodes, members,
        owners (null for a path not found), cached, files, unknown."""
        req = {"op": "where"}
        if files is not None:
            req["paths"] = [_relative(f, self.path) for f in files]
        return self._call(req)

    def locate(self, files):
        """The owner node index of each file (None: not a file of the mount).

        One call for the whole list, in the packed form: the paths as raw
        bytes after the request line, separated by NULs (no JSON escaping;
        names need not be UTF-8), the owners back as little-endian u32s in
        base64 (docs/locality.md)."""
        payload = self._joined(files).encode("utf-8", "surrogateescape")
        request = {"op": "where", "payload": len(payload), "packed": True}
        return _unpack_owners(self._call(request, payload=payload))

    def _joined(self, files):
        """``files`` relative to the mount root, joined by NUL characters."""
        try:
            joined = "\0".join(files)
        except TypeError:  # bytes or path objects among them
            joined = "\0".join(os.fsdecode(f) for f in files)
        if joined.startswith("/") or "\0/" in joined:
            joined = "\0".join(_relative(p, self.path) for p in joined.split("\0"))
        return joined

    def plan(self, files):
        """Hands the loader's order (paths relative to the mount root) to the
        mount's read-ahead. Returns (files found, paths not found)."""
        answer = self._call({"op": "plan", "paths": [_relative(f, self.path) for f in files]})
        return int(answer.get("files", 0)), int(answer.get("unknown", 0))

    @property
    def pid(self):
        """The process id of the daemon serving this mount if this object
        started it (:func:`locafs.mount`), else None."""
        return self._daemon.pid if self._daemon is not None else None

    @property
    def closed(self):
        """True once :meth:`close` has unmounted what this object mounted."""
        return self._daemon is not None and self._daemon.stopped

    def close(self, timeout=60.0):
        """Unmounts, if this object mounted (:func:`locafs.mount`), and
        waits up to ``timeout`` seconds for the daemon to finish: the
        daemon unmounts (detaching lazily while files are still open, as
        ``umount -l``; through ``fusermount3 -u`` for a user), saves its
        state and exits. A mount attached by path is left as it is. Safe
        to call twice; a forked child (a DataLoader worker) never unmounts
        its parent's mount."""
        if self._daemon is not None:
            self._daemon.stop(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        owner = ", pid %d" % self.pid if self.pid is not None else ""
        state = " (closed)" if self.closed else ""
        return "locafs.Mount(%r, node %d of %d%s)%s" % (
            self.path,
            self._node_index,
            self._num_nodes,
            owner,
            state,
        )


def _unpack_owners(answer):
    """The ``owners`` of a ``where`` answer, plain or packed."""
    if "owners" in answer:
        return answer["owners"]
    for code in ("I", "L"):
        if array.array(code).itemsize == 4:
            break
    owners = array.array(code)
    owners.frombytes(base64.b64decode(answer.get("owners_packed", "")))
    if sys.byteorder == "big":
        owners.byteswap()
    owners = owners.tolist()
    if answer.get("unknown"):
        owners = [None if o == 0xFFFFFFFF else o for o in owners]
    return owners
