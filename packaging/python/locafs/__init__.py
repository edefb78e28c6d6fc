"""locafs from Python: mount a data set, and load it with locality
(README.md beside this package; docs/locality.md).

- :func:`mount`: mounts a data set through the ``locafs`` binary that came
  with this package (:func:`binary`) and returns a :class:`Mount` that
  unmounts on ``close()``, at the end of a ``with`` block, or at exit.
- :class:`Mount`: a mount's control socket (``locate``, ``plan``,
  ``node_index``, ``num_nodes``); ``Mount(path)`` attaches to a mount made
  elsewhere (an admin's, a systemd unit's) and never unmounts it.
- :class:`LocalitySampler`: a sampler under which each node trains on the
  samples it holds (a ``torch.utils.data.Sampler`` when torch is installed,
  a plain iterable otherwise).
- Errors: :class:`LocafsError`, and for ``mount`` :class:`MountError`
  (``str(e)`` is the command's one-line reason) and its
  :class:`UsageError` (options or input refused).
"""

from ._binary import binary
from ._daemon import cli_args, mount
from .control import (
    CONTROL_XATTR,
    LocafsError,
    Mount,
    MountError,
    NotALocafsMount,
    UsageError,
)
from .sampler import (
    LocalitySampler,
    SplitMix64,
    balance,
    distributed_indices,
    locality_epoch,
    permutation,
)

__all__ = [
    "CONTROL_XATTR",
    "LocafsError",
    "LocalitySampler",
    "Mount",
    "MountError",
    "NotALocafsMount",
    "SplitMix64",
    "UsageError",
    "balance",
    "binary",
    "cli_args",
    "distributed_indices",
    "locality_epoch",
    "mount",
    "permutation",
]
# The version of the binary the wheel carries too (Cargo.toml's).
__version__ = "0.1.0"
