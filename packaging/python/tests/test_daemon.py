"""``locafs.mount``'s side of the command line, without FUSE: options to
flags, log lines to ``logging``, and the supervision of the child through
stand-in binaries that fail in each way a real one can (refused options,
clap's refusal, never ready, killed, ready on a path that is no mount).
The real binary and a real mount are tests/python_wheel.rs.
"""

import logging
import os
import pathlib
import shutil
import sys
import tempfile
import textwrap
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import locafs  # noqa: E402
from locafs import _daemon as D  # noqa: E402


class CliArgs(unittest.TestCase):
    def test_options_become_flags(self):
        self.assertEqual(
            locafs.cli_args(
                {
                    "cache_size": "5G",
                    "immutable": True,
                    "no_readahead": False,
                    "metrics": None,
                    "peers": ["a:7070", "b:7070"],
                    "o": ("immutable", "cache_size=5G"),
                    "log_file": pathlib.Path("/var/log/x"),
                    "fuse_threads": 4,
                }
            ),
            [
                "--cache-size=5G",
                "--immutable",
                "--peers=a:7070,b:7070",
                "-o",
                "immutable,cache_size=5G",
                "--log-file=/var/log/x",
                "--fuse-threads=4",
            ],
        )

    def test_a_value_that_looks_like_a_flag_stays_a_value(self):
        self.assertEqual(locafs.cli_args({"dataset_id": "-x"}), ["--dataset-id=-x"])

    def test_daemon_is_refused(self):
        with self.assertRaises(ValueError):
            locafs.cli_args({"daemon": True})


class LogLines(unittest.TestCase):
    def test_levels(self):
        self.assertEqual(
            D._parse("2026-12-06T04:52:05.706563Z  WARN unmount of /m failed"),
            (logging.WARNING, "unmount of /m failed"),
        )
        self.assertEqual(
            D._parse('{"timestamp":"t","level":"ERROR","fields":{"message":"bad"}}'),
            (logging.ERROR, "bad"),
        )
        self.assertEqual(D._parse("thread 'x' panicked"), (logging.INFO, "thread 'x' panicked"))

    def test_mountinfo_escapes(self):
        self.assertEqual(D._unescape("/mnt/a\\040b"), "/mnt/a b")


class Supervision(unittest.TestCase):
    """Stand-in binaries (shell scripts) in place of locafs."""

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.mnt = os.path.join(self.dir, "mnt")
        os.mkdir(self.mnt)
        self.real_binary = D.binary

    def tearDown(self):
        D.binary = self.real_binary
        shutil.rmtree(self.dir, ignore_errors=True)

    def stand_in(self, body):
        path = os.path.join(self.dir, "locafs")
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + textwrap.dedent(body))
        os.chmod(path, 0o755)
        D.binary = lambda: path
        return path

    def test_a_refused_option_is_a_usage_error_with_the_one_line(self):
        self.stand_in(
            """
            echo '2026-12-06T04:52:05.706563Z  WARN something odd' >&2
            echo 'locafs: --cache-size: bad size "5X": unknown unit "X"' >&2
            exit 2
            """
        )
        with self.assertLogs("locafs", logging.WARNING) as logs:
            with self.assertRaises(locafs.UsageError) as cm:
                locafs.mount(self.dir, self.mnt, cache_size="5X")
        e = cm.exception
        self.assertEqual(str(e), '--cache-size: bad size "5X": unknown unit "X"')
        self.assertEqual(e.returncode, 2)
        self.assertIn("--cache-size=5X", e.command)
        self.assertEqual(e.command[-2:], [os.path.abspath(self.dir), self.mnt])
        self.assertEqual(logs.records[0].getMessage(), "something odd")
        self.assertEqual(D._LIVE, [])

    def test_clap_refusal_gives_its_first_line(self):
        self.stand_in(
            """
            echo "error: unexpected argument '--bogus' found" >&2
            echo >&2
            echo "  tip: to pass '--bogus' as a value, use '-- --bogus'" >&2
            echo "Usage: locafs mount [OPTIONS] [SOURCE] [MOUNTPOINT]" >&2
            exit 2
            """
        )
        with self.assertRaises(locafs.UsageError) as cm:
            locafs.mount(self.dir, self.mnt, bogus=True)
        self.assertEqual(str(cm.exception), "unexpected argument '--bogus' found")

    def test_a_system_refusal_is_a_mount_error(self):
        self.stand_in("echo 'locafs: cannot open /dev/fuse (permission denied)' >&2; exit 1\n")
        with self.assertRaises(locafs.MountError) as cm:
            locafs.mount(self.dir, self.mnt)
        self.assertNotIsInstance(cm.exception, locafs.UsageError)
        self.assertEqual(cm.exception.returncode, 1)
        self.assertEqual(str(cm.exception), "cannot open /dev/fuse (permission denied)")

    def test_a_killed_daemon_says_so(self):
        self.stand_in("kill -9 $$\n")
        with self.assertRaises(locafs.MountError) as cm:
            locafs.mount(self.dir, self.mnt)
        self.assertEqual(str(cm.exception), "locafs was killed by signal 9")

    def test_never_ready_is_stopped_after_the_timeout(self):
        pidfile = os.path.join(self.dir, "pid")
        self.stand_in("echo $$ > %s\nexec sleep 60\n" % pidfile)
        start = time.monotonic()
        with self.assertRaises(locafs.MountError) as cm:
            locafs.mount(self.dir, self.mnt, ready_timeout=0.5)
        self.assertLess(time.monotonic() - start, 20)
        self.assertIn("not mounted within 0.5s", str(cm.exception))
        with open(pidfile) as f:
            pid = int(f.read())
        self.assertFalse(os.path.exists("/proc/%d" % pid), "the stand-in still runs")

    def test_an_interrupt_while_waiting_leaves_no_child(self):
        import signal

        pidfile = os.path.join(self.dir, "pid")
        self.stand_in("echo $$ > %s\nexec sleep 60\n" % pidfile)

        def interrupt(*_):
            raise KeyboardInterrupt

        old = signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        try:
            with self.assertRaises(KeyboardInterrupt):
                locafs.mount(self.dir, self.mnt)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        with open(pidfile) as f:
            pid = int(f.read())
        self.assertFalse(os.path.exists("/proc/%d" % pid), "the stand-in still runs")

    def test_ready_on_a_path_that_is_no_mount_stops_the_daemon(self):
        pidfile = os.path.join(self.dir, "pid")
        self.stand_in(
            """
            echo $$ > %s
            %s -c 'import os, socket; socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"STATUS=x\\nREADY=1", os.environ["LOCAFS_READY_SOCKET"])'
            exec sleep 60
            """
            % (pidfile, sys.executable)
        )
        with self.assertRaises(locafs.NotALocafsMount):
            locafs.mount(self.dir, self.mnt)
        with open(pidfile) as f:
            pid = int(f.read())
        self.assertFalse(os.path.exists("/proc/%d" % pid), "the stand-in still runs")
        self.assertEqual(D._LIVE, [])

    def test_the_child_hears_of_readiness_through_a_variable_of_ours_not_systemds(self):
        # (under systemd's NOTIFY_SOCKET locafs would act as a unit: keep
        # its descriptors for a store that is not there, and leave the
        # mount on SIGTERM)
        envfile = os.path.join(self.dir, "env")
        self.stand_in(
            """
            env > %s
            echo 'locafs: the stand-in stops here' >&2
            exit 1
            """
            % envfile
        )
        saved = os.environ.get("NOTIFY_SOCKET")
        os.environ["NOTIFY_SOCKET"] = "/run/systemd/notify"
        try:
            with self.assertRaises(locafs.MountError):
                locafs.mount(self.dir, self.mnt)
        finally:
            if saved is None:
                del os.environ["NOTIFY_SOCKET"]
            else:
                os.environ["NOTIFY_SOCKET"] = saved
        with open(envfile) as f:
            names = [line.split("=", 1)[0] for line in f]
        self.assertNotIn("NOTIFY_SOCKET", names)
        self.assertIn("LOCAFS_READY_SOCKET", names)

    def test_the_binary_is_the_installed_one_else_the_one_on_path(self):
        from locafs import _binary as B

        D.binary = self.real_binary
        installed = [c for c in B._candidates() if os.path.isfile(c) and os.access(c, os.X_OK)]
        saved = os.environ.get("PATH", "")
        os.environ["PATH"] = self.dir
        try:
            if installed:  # a wheel is installed for this interpreter
                self.assertEqual(locafs.binary(), installed[0])
                return
            with self.assertRaises(locafs.LocafsError) as cm:
                locafs.binary()
            self.assertIn("pip install locafs", str(cm.exception))
            path = self.stand_in("exit 0\n")
            self.assertEqual(B.binary(), path)
        finally:
            os.environ["PATH"] = saved

if __name__ == "__main__":
    unittest.main()
