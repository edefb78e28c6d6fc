"""The locality sampler (docs/locality.md): every rank of every node derives
the same global batches from ``seed + epoch``; each node trains on the
samples of a batch that it holds, and only the imbalance moves (the paper's
Algorithm 1: two heaps, surplus to deficit, at most p-1 moves per batch).

The algorithm is fixed bit for bit (the Rust version, src/peer/sampler.rs, must
agree: tests/data/locality_vectors.json):

1. PRNG: splitmix64 from ``(seed + epoch) mod 2**64``.
2. Permutation: Fisher-Yates from the top, ``j = next() % (i + 1)``.
3. Global batches of ``G = p * L * b`` samples; ``n // G`` of them (the tail
   is dropped).
4. ``own[q]``: the batch's samples that node q owns, in batch order.
5. Balance to ``T = L * b`` per node: the largest surplus (ties: smaller
   node) gives its LAST ``m`` samples to the END of the largest deficit's
   list (ties: smaller node), ``m`` the smaller of the two, until balanced.
6. Local rank r of node q gets ``own[q][r*b:(r+1)*b]`` of each batch.
"""

import heapq
import os
import sys
import threading
import warnings

from .control import LocafsError, Mount, NotALocafsMount

__all__ = [
    "LocalitySampler",
    "SplitMix64",
    "permutation",
    "balance",
    "locality_epoch",
    "distributed_indices",
]

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


class SplitMix64:
    """splitmix64 with 64-bit wrapping arithmetic."""

    __slots__ = ("state",)

    def __init__(self, seed):
        self.state = seed & _MASK

    def next(self):
        self.state = (self.state + _GOLDEN) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)


def permutation(n, seed, epoch):
    """The epoch's permutation of 0..n (step 2 of the spec)."""
    state = (seed + epoch) & _MASK
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        # splitmix64's next(), inlined (this loop is the sampler's cost).
        state = (state + _GOLDEN) & _MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        j = (z ^ (z >> 31)) % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def balance(own, target):
    """Moves samples from nodes over ``target`` to nodes under it (step 5),
    in place; returns the number of samples moved."""
    surplus = [(target - len(o), q) for q, o in enumerate(own) if len(o) > target]
    deficit = [(len(o) - target, q) for q, o in enumerate(own) if len(o) < target]
    heapq.heapify(surplus)
    heapq.heapify(deficit)
    moved = 0
    while surplus and deficit:
        ns, s = heapq.heappop(surplus)
        nd, d = heapq.heappop(deficit)
        sv, dv = -ns, -nd
        m = min(sv, dv)
        src = own[s]
        own[d].extend(src[len(src) - m :])
        del src[len(src) - m :]
        moved += m
        if sv > m:
            heapq.heappush(surplus, (m - sv, s))
        if dv > m:
            heapq.heappush(deficit, (m - dv, d))
    return moved


def locality_epoch(owners, num_nodes, local_world_size, batch_size, seed, epoch):
    """One epoch of the algorithm for every node.

    Returns ``(nodes, moved)``: ``nodes[q]`` is node q's order for the epoch,
    batch after batch, each batch's ``L * b`` samples in local rank order
    (local rank r's samples are ``nodes[q][k*L*b + r*b : k*L*b + (r+1)*b]``
    for batch k); ``moved`` counts the samples balancing moved.
    """
    p, L, b = num_nodes, local_world_size, batch_size
    if p < 1 or L < 1 or b < 1:
        raise ValueError("num_nodes, local_world_size and batch_size must be at least 1")
    n = len(owners)
    perm = permutation(n, seed, epoch)
    G = p * L * b
    T = L * b
    nodes = [[] for _ in range(p)]
    moved = 0
    for k in range(n // G):
        own = [[] for _ in range(p)]
        for s in perm[k * G : (k + 1) * G]:
            own[owners[s]].append(s)
        moved += balance(own, T)
        for q in range(p):
            nodes[q].extend(own[q])
    return nodes, moved


def rank_indices(node_order, local_rank, local_world_size, batch_size):
    """Local rank r's indices from its node's order (step 6)."""
    L, b = local_world_size, batch_size
    out = []
    for k in range(len(node_order) // (L * b)):
        start = k * L * b + local_rank * b
        out.extend(node_order[start : start + b])
    return out


def distributed_indices(n, rank, world_size, seed, epoch, drop_last=True):
    """DistributedSampler's split of this permutation (shuffle=True): the
    first ``n // world`` * world samples (drop_last) or the permutation
    padded from its start (not drop_last), every world-th from ``rank``."""
    perm = permutation(n, seed, epoch)
    if drop_last:
        total = (n // world_size) * world_size
        perm = perm[:total]
    else:
        total = -(-n // world_size) * world_size
        pad = total - n
        while pad > 0 and perm:
            perm = perm + perm[:pad]
            pad = total - len(perm)
    return perm[rank:total:world_size]


try:  # torch is optional
    from torch.utils.data import Sampler as _Base
except Exception:  # pragma: no cover - depends on the environment
    _Base = object

_told = set()


def _tell_once(what, msg):
    if what not in _told:
        _told.add(what)
        print("locafs: " + msg, file=sys.stderr, flush=True)


def _env_int(name):
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError("%s=%r is not an integer" % (name, v)) from None


def _dist_rank_world():
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return None, None


class LocalitySampler(_Base):
    """Yields indices into ``files`` so that each node reads what it holds.

    ``files``: the data set's relative paths, in the order the dataset object
    indexes them. ``mount``: the mount's path or a :class:`locafs.Mount`.
    ``local_rank``/``local_world_size`` default to $LOCAL_RANK and
    $LOCAL_WORLD_SIZE (else 0 and 1). Every rank on every node must be given
    the same ``files``, ``batch_size`` and ``seed``, and call
    :meth:`set_epoch` with the same epoch.

    When ``mount`` is not a locafs mount, its control socket refuses this
    user (a mount of another user, or a root mount whose root this user may
    not read) or cannot be reached, or the mount has no peers, it behaves
    like ``DistributedSampler(shuffle=True, drop_last=drop_last)``
    with ``rank``/``world_size`` from its arguments, else $RANK and
    $WORLD_SIZE, else torch.distributed when initialised, else the local
    rank and local world size; the permutation is this module's splitmix64
    one (not torch's generator), no plan is handed to the mount, and it says
    so once on stderr. With peers the last partial global batch is always
    dropped: ``drop_last=False`` raises ``ValueError``.
    """

    def __init__(
        self,
        files,
        mount,
        batch_size,
        local_rank=None,
        local_world_size=None,
        seed=0,
        drop_last=True,
        rank=None,
        world_size=None,
    ):
        if _Base is not object:
            super().__init__()
        self.files = list(files)
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1, not %r" % batch_size)
        lr = local_rank if local_rank is not None else _env_int("LOCAL_RANK")
        lw = local_world_size if local_world_size is not None else _env_int("LOCAL_WORLD_SIZE")
        self.local_rank = 0 if lr is None else int(lr)
        self.local_world_size = 1 if lw is None else int(lw)
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                "local_rank %d is not in 0..local_world_size (%d)"
                % (self.local_rank, self.local_world_size)
            )
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self.moved = 0
        self._cache = None
        self._planned = None
        self.mount = None
        self.owners = None
        why = None
        if isinstance(mount, Mount):
            self.mount = mount
        else:
            try:
                self.mount = Mount(mount)
            except NotALocafsMount as e:
                why = str(e)
            except LocafsError as e:
                # Refused (another user's mount, a root it may not read) or
                # unreachable (another network namespace): the message says
                # which.
                why = "the mount's control socket cannot be used: %s" % e
        if self.mount is not None and self.mount.num_nodes > 1:
            if not self.drop_last:
                raise ValueError("LocalitySampler drops the last partial global batch: drop_last must be True")
            p = self.mount.num_nodes
            owners = self.mount.locate(self.files)
            # A file the mount does not know gets a fixed node: every node
            # computes the same (docs/locality.md).
            self.owners = [o if o is not None else i % p for i, o in enumerate(owners)]
            self.unknown = sum(1 for o in owners if o is None)
            self.num_nodes = p
            self.node_index = self.mount.node_index
            self.rank = self.node_index * self.local_world_size + self.local_rank
            self.world_size = p * self.local_world_size
            self.locality = True
            return
        if why is None:
            why = "%s has no peers" % self.mount.path
        r0, w0 = _dist_rank_world()
        r = rank if rank is not None else _env_int("RANK")
        w = world_size if world_size is not None else _env_int("WORLD_SIZE")
        self.rank = int(r if r is not None else (r0 if r0 is not None else self.local_rank))
        self.world_size = int(
            w if w is not None else (w0 if w0 is not None else self.local_world_size)
        )
        if not 0 <= self.rank < self.world_size:
            raise ValueError("rank %d is not in 0..world_size (%d)" % (self.rank, self.world_size))
        self.num_nodes = 1
        self.node_index = 0
        self.unknown = 0
        self.locality = False
        _tell_once(
            "fallback",
            "LocalitySampler: %s; sampling like DistributedSampler "
            "(rank %d of %d, no locality)" % (why, self.rank, self.world_size)
        )

    def set_epoch(self, epoch):
        """Sets the epoch (the permutation is drawn from seed + epoch)."""
        self.epoch = int(epoch)

    def _epoch(self):
        if self._cache is None or self._cache[0] != self.epoch:
            nodes, moved = locality_epoch(
                self.owners,
                self.num_nodes,
                self.local_world_size,
                self.batch_size,
                self.seed,
                self.epoch,
            )
            self.moved = moved
            self._cache = (self.epoch, nodes[self.node_index])
        return self._cache[1]

    def node_order(self):
        """This node's order for the current epoch (all its local ranks'
        samples, batch by batch): what local rank 0 hands the mount."""
        if not self.locality:
            return distributed_indices(
                len(self.files), self.rank, self.world_size, self.seed, self.epoch, self.drop_last
            )
        return list(self._epoch())

    def _send_plan(self, order):
        paths = [self.files[i] for i in order]
        mount = self.mount

        def send():
            try:
                mount.plan(paths)
            except Exception as e:  # a plan is a hint: never fail training
                warnings.warn("locafs: plan not handed to %s: %s" % (mount.path, e))

        self._plan_thread = threading.Thread(target=send, name="locafs-plan", daemon=True)
        self._plan_thread.start()

    def __iter__(self):
        if not self.locality:
            return iter(
                distributed_indices(
                    len(self.files), self.rank, self.world_size, self.seed, self.epoch, self.drop_last
                )
            )
        order = self._epoch()
        if self.local_rank == 0 and self._planned != self.epoch:
            self._planned = self.epoch
            self._send_plan(order)
        return iter(rank_indices(order, self.local_rank, self.local_world_size, self.batch_size))

    def __len__(self):
        n = len(self.files)
        if not self.locality:
            if self.drop_last:
                return n // self.world_size
            return -(-n // self.world_size)
        return (n // (self.num_nodes * self.local_world_size * self.batch_size)) * self.batch_size
