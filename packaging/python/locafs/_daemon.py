"""``locafs.mount()``: a mount made from Python, without a shell.

It runs ``locafs mount SOURCE MOUNTPOINT --option ...`` (the binary of
:func:`locafs.binary`) as a child in the foreground, in a session of its
own, and supervises it:

- ready: the child says ``READY=1`` on a datagram socket of ours, named
  by ``LOCAFS_READY_SOCKET`` (not ``NOTIFY_SOCKET``, which would make it
  act as a systemd unit: keep its descriptors for a store that is not
  there, leave the mount on SIGTERM; that variable is taken out of its
  environment), so the call returns once the mount is live; if the child
  exits first, its one-line reason (``locafs: <msg>``) becomes a
  :class:`MountError`;
- logs: the child's stderr is read by a thread and goes to the
  ``logging`` logger ``"locafs"`` at the level each line has (warnings and
  errors show without any logging set up), the last lines kept for errors;
- stop: ``Mount.close()``, the end of a ``with`` block, or the interpreter's
  exit (``atexit``) sends SIGTERM, upon which locafs unmounts (for a user
  through ``fusermount3 -u``, lazily if files are still open) and exits;
  then it is waited for, so that the same data set can be mounted again
  at once.

Why a supervised child rather than ``locafs mount --daemon``: the Python
object then holds the daemon's process (its pid, its exit status, its
logs), and stopping it is a signal to a known process, not an unmount by
path that has to guess who serves it. Its own session keeps a terminal's
Ctrl-C from killing the mount under a training script that catches
KeyboardInterrupt. What it must never do: unmount a mount it did not
make, or act in a forked child (DataLoader workers inherit the object).
"""

import atexit
import collections
import json
import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import warnings

from ._binary import binary
from .control import Mount, MountError, UsageError

__all__ = ["mount", "cli_args"]

_log = logging.getLogger("locafs")

# Options handled here, not by the child.
_RESERVED = {"daemon": "locafs.mount() supervises the daemon itself; drop daemon="}

_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
}
# tracing's text format: "2026-01-02T03:04:05.678901Z  WARN message"
_TEXT_LINE = re.compile(r"^\S+\s+(TRACE|DEBUG|INFO|WARN|ERROR)\s+(.*)$")

# Daemons started by this process and not yet stopped (atexit stops them).
_LIVE = []
_LIVE_LOCK = threading.Lock()


def cli_args(options):
    """``locafs mount`` flags for keyword options: ``cache_size="50G"`` ->
    ``--cache-size=50G``, ``True`` -> the bare flag, ``False``/``None`` ->
    nothing, a list or tuple -> its items joined by commas (the command's
    list syntax: ``peers=["a:7070", "b:7070"]`` -> ``--peers=a:7070,b:7070``,
    ``o=["immutable", "cache_size=5G"]`` -> ``-o immutable,cache_size=5G``)."""
    args = []
    for key, value in options.items():
        if key in _RESERVED:
            raise ValueError("%s: %s" % (key, _RESERVED[key]))
        if value is None or value is False:
            continue
        flag = ("-" if len(key) == 1 else "--") + key.replace("_", "-")
        if value is True:
            args.append(flag)
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        text = ",".join(os.fspath(v) if isinstance(v, os.PathLike) else str(v) for v in values)
        args.extend([flag, text] if len(key) == 1 else ["%s=%s" % (flag, text)])
    return args


def mount(source, mountpoint, ready_timeout=300.0, **options):
    """Mounts ``source`` (a directory, or an ``s3://``, ``gs://``, ``az://``
    URL) read-only on ``mountpoint`` (an existing empty directory) and
    returns the live :class:`locafs.Mount`.

    ``options`` are ``locafs mount`` options by their long names in
    snake_case (``cache_size="50G"``, ``prefetch_memory="2G"``,
    ``immutable=True``, ``peers=["10.0.0.1:7070", ...]``); see ``locafs
    mount --help``. As a user, the cache goes under
    ``$XDG_CACHE_HOME/locafs`` (else ``~/.cache/locafs``) unless
    ``cache_dir`` says otherwise.

    Unmounts on ``close()``, at the end of a ``with`` block, or when the
    interpreter exits. Raises :class:`UsageError` for options or input the
    command refuses, :class:`MountError` when the mount fails (the message
    is the command's one line, e.g. no access to /dev/fuse, no
    fusermount3), or after ``ready_timeout`` seconds without the mount
    becoming live.
    """
    if source is None or mountpoint is None:
        raise ValueError("mount() needs a source and a mountpoint")
    src = os.fspath(source)
    if "://" not in src:
        src = os.path.abspath(src)
    mnt = os.path.abspath(os.fspath(mountpoint))
    command = [binary(), "mount"] + cli_args(options) + ["--", src, mnt]
    daemon = _Daemon(command, mnt, ready_timeout)
    try:
        m = Mount(mnt)
    except BaseException:
        daemon.stop(10.0)
        raise
    m._daemon = daemon
    return m


class _Daemon:
    """One ``locafs mount`` child: started, waited for until ready, stopped."""

    def __init__(self, command, mountpoint, ready_timeout):
        self.command = command
        self.mountpoint = mountpoint
        self.owner = os.getpid()
        self.stopped = False
        self.tail = collections.deque(maxlen=50)
        self._lock = threading.Lock()
        notify_dir = tempfile.mkdtemp(prefix="locafs-")
        try:
            self._start(notify_dir, ready_timeout)
        finally:
            shutil.rmtree(notify_dir, ignore_errors=True)
        with _LIVE_LOCK:
            if not _LIVE:
                atexit.register(_stop_all)
            _LIVE.append(self)

    @property
    def pid(self):
        return self.proc.pid

    def _start(self, notify_dir, ready_timeout):
        path = os.path.join(notify_dir, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(path)
            env = dict(os.environ)
            env["LOCAFS_READY_SOCKET"] = path
            # (a Python program run by systemd: its unit is not the child's)
            for k in ("NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
                env.pop(k, None)
            env.pop("LOCAFS_DAEMON_CHILD", None)
            try:
                self.proc = subprocess.Popen(
                    self.command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as e:
                raise MountError(
                    "cannot run %s: %s" % (self.command[0], e.strerror or e),
                    command=self.command,
                ) from None
            self._reader = threading.Thread(
                target=self._read_stderr, name="locafs-log", daemon=True
            )
            self._reader.start()
            try:
                self._wait_ready(sock, ready_timeout)
            except BaseException:
                # Failed, timed out, or interrupted (Ctrl-C while waiting):
                # no child is left behind.
                self._terminate(10.0)
                raise
        finally:
            sock.close()

    def _wait_ready(self, sock, ready_timeout):
        deadline = time.monotonic() + ready_timeout
        while True:
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable:
                states = sock.recv(4096).split(b"\n")
                if b"READY=1" in states:
                    return
                continue
            if self.proc.poll() is not None:
                self._reader.join(5.0)
                raise self._failure()
            if time.monotonic() >= deadline:
                self._terminate(10.0)
                raise MountError(
                    "%s: not mounted within %gs (the daemon was stopped)"
                    % (self.mountpoint, ready_timeout),
                    log=self.tail,
                    command=self.command,
                )

    def _read_stderr(self):
        """Forwards the child's log lines to the "locafs" logger and keeps
        the last ones (the child may write a line that is not UTF-8)."""
        for raw in iter(self.proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if not line:
                continue
            self.tail.append(line)
            if line.startswith("locafs: "):
                continue  # the command's own last word: the exception says it
            level, text = _parse(line)
            _log.log(level, "%s", text)
        self.proc.stderr.close()

    def _failure(self):
        """The exception for a child that exited before it was ready."""
        code = self.proc.returncode
        said = [l[len("locafs: "):] for l in self.tail if l.startswith("locafs: ")]
        # clap's refusal of an unknown option or a bad value: "error: ..."
        # then a tip and the usage.
        clap = [l[len("error: "):] for l in self.tail if l.startswith("error: ")]
        if said:
            message = said[-1]
        elif clap:
            message = clap[0]
        elif code is not None and code < 0:
            message = "locafs was killed by signal %d" % -code
        else:
            last = self.tail[-1] if self.tail else "no message"
            message = "locafs exited with status %s: %s" % (code, last)
        # Exit 2 is also a mount the system refused for lack of rights (no
        # /dev/fuse access, no fusermount3, mount(2) refused): a MountError,
        # not a UsageError, though a restart will not help either.
        refused = message.startswith(("cannot open /dev/fuse", "mounting as a user needs", "mount on "))
        cls = UsageError if code == 2 and not refused else MountError
        return cls(message, returncode=code, log=self.tail, command=self.command)

    def _terminate(self, timeout):
        """SIGTERM (locafs unmounts and exits), then SIGKILL after
        ``timeout`` seconds."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stop(self, timeout=60.0):
        """Unmounts and waits for the daemon to exit; nothing in a forked
        child or the second time."""
        if os.getpid() != self.owner:
            return
        with self._lock:
            if self.stopped:
                return
            self.stopped = True
        died = self.proc.poll()
        self._terminate(timeout)
        self._reader.join(5.0)
        # A daemon that died (or was killed above) leaves a dead mount:
        # every access fails with ENOTCONN until it is detached.
        if _is_locafs_mount(self.mountpoint):
            _detach(self.mountpoint)
        with _LIVE_LOCK:
            if self in _LIVE:
                _LIVE.remove(self)
        if died is not None and died != 0:
            warnings.warn(
                "locafs: the daemon of %s had exited with status %s: %s"
                % (self.mountpoint, died, self.tail[-1] if self.tail else "no message"),
                RuntimeWarning,
                stacklevel=3,
            )


def _parse(line):
    """(logging level, message) of one line of the daemon's log."""
    m = _TEXT_LINE.match(line)
    if m:
        return _LEVELS[m.group(1)], m.group(2)
    if line.startswith("{"):
        try:
            record = json.loads(line)
            level = _LEVELS.get(str(record.get("level", "")).upper(), logging.INFO)
            fields = record.get("fields") or {}
            return level, str(fields.get("message", line))
        except ValueError:
            pass
    return logging.INFO, line


def _stop_all():
    """atexit: stops every daemon this process started, newest first."""
    with _LIVE_LOCK:
        live = list(reversed(_LIVE))
    for d in live:
        try:
            d.stop(30.0)
        except Exception as e:  # keep stopping the others
            _log.error("locafs: unmounting %s at exit: %s", d.mountpoint, e)


def _unescape(field):
    """A /proc/self/mountinfo path field (spaces and the like as \\ooo)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _is_locafs_mount(path):
    """Whether ``path`` is the root of a locafs mount (a dead one too)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split(" ")
                if len(fields) < 5 or _unescape(fields[4]) != path:
                    continue
                sep = fields.index("-") if "-" in fields else -1
                if sep > 0 and fields[sep + 1] == "fuse.locafs":
                    return True
    except OSError:
        pass
    return False


def _detach(path):
    """Detaches a mount whose daemon is gone: ``umount -l`` as root,
    ``fusermount3 -u -z`` as a user (the mount is the user's)."""
    if os.geteuid() == 0:
        command = ["umount", "-l", path]
    else:
        helper = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"
        command = [helper, "-u", "-z", path]
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True)
    except OSError as e:
        _log.error("locafs: cannot detach %s: %s: %s", path, command[0], e)
        return
    if done.returncode != 0:
        _log.error(
            "locafs: cannot detach %s: %s", path, done.stderr.decode("utf-8", "replace").strip()
        )
