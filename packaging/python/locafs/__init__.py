"""locafs: locality-aware loading over locafs mounts (docs/locality.md).

- :class:`Mount`: a mount's control socket (``locate``, ``plan``,
  ``node_index``, ``num_nodes``).
- :class:`LocalitySampler`: a sampler under which each node trains on the
  samples it holds (a ``torch.utils.data.Sampler`` when torch is installed,
  a plain iterable otherwise).
"""

from .mount import CONTROL_XATTR, LocafsError, Mount, NotALocafsMount
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
    "NotALocafsMount",
    "SplitMix64",
    "balance",
    "distributed_indices",
    "locality_epoch",
    "permutation",
]
__version__ = "0.1.0"
