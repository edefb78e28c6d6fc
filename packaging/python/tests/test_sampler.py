"""The sampler's invariants and the shared test vector (unittest: runs with
nothing but Python; `cargo test --test locality_python` drives it).

The owners here come from a stand-in for a mount (``Owned``): the sampler's
decisions depend only on them. Real mounts are tested from Rust
(tests/locality_python.rs: a real 3-node run).
"""

import io
import json
import os
import sys
import tempfile
import unittest
import warnings
from contextlib import redirect_stderr

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import locafs  # noqa: E402
from locafs import sampler as S  # noqa: E402

REPO = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
VECTORS = os.path.join(REPO, "tests", "data", "locality_vectors.json")


class Owned(locafs.Mount):
    """A mount stand-in: node ``me`` of ``p``, file i owned by owners[i]."""

    def __init__(self, owners, p, me, plan_error=None):
        self.path = "/stand-in"
        self.owners, self._num_nodes, self._node_index = owners, p, me
        self.plan_error = plan_error
        self.plans = []

    def locate(self, files):
        return [self.owners[int(f[1:])] for f in files]

    def plan(self, files):
        if self.plan_error:
            raise self.plan_error
        self.plans.append(list(files))
        return len(files), 0


def files(n):
    return ["f%d" % i for i in range(n)]


def hashed_owners(n, p, seed=1):
    rng = S.SplitMix64(seed)
    return [rng.next() % p for _ in range(n)]


def all_ranks(owners, p, L, b, seed=0, epoch=0, **kw):
    """Every rank's output, each from its own sampler (no shared state)."""
    out = []
    for q in range(p):
        for r in range(L):
            s = locafs.LocalitySampler(
                files(len(owners)), Owned(owners, p, q, **kw), b,
                local_rank=r, local_world_size=L, seed=seed,
            )
            s.set_epoch(epoch)
            out.append((s, list(s)))
    return out


class Vectors(unittest.TestCase):
    def test_every_case_of_the_shared_vector(self):
        # The vector is written by the Rust side (src/peer/sampler.rs); it must
        # be there.
        with open(VECTORS) as f:
            cases = json.load(f)["cases"]
        self.assertGreater(len(cases), 0)
        for i, c in enumerate(cases):
            p, L, b = c["num_nodes"], c["local_world_size"], c["batch_size"]
            self.assertEqual(len(c["owners"]), c["n"])
            nodes, moved = S.locality_epoch(c["owners"], p, L, b, c["seed"], c["epoch"])
            got = [S.rank_indices(nodes[q], r, L, b) for q in range(p) for r in range(L)]
            self.assertEqual(got, c["ranks"], "case %d" % i)
            self.assertEqual(moved, c["moved"], "case %d" % i)
            if p > 1:
                # The sampler itself, rank by rank.
                for q in range(p):
                    for r in range(L):
                        s = locafs.LocalitySampler(
                            files(c["n"]), Owned(c["owners"], p, q), b,
                            local_rank=r, local_world_size=L, seed=c["seed"],
                        )
                        s.set_epoch(c["epoch"])
                        self.assertEqual(list(s), c["ranks"][q * L + r], "case %d" % i)

    def test_splitmix64_known_answer(self):
        # splitmix64 seeded with 0 (the reference values of the generator).
        g = S.SplitMix64(0)
        self.assertEqual(g.next(), 0xE220A8397B1DCDAF)
        self.assertEqual(g.next(), 0x6E789E6AA1B965F4)
        g = S.SplitMix64((1 << 64) - 1)
        g.next()  # wraps, no overflow
        self.assertLess(g.state, 1 << 64)


class Invariants(unittest.TestCase):
    def check(self, n, p, L, b, seed, epoch, owners=None):
        owners = owners if owners is not None else hashed_owners(n, p, seed + 7)
        outs = all_ranks(owners, p, L, b, seed, epoch)
        G = p * L * b
        batches = n // G
        seen = []
        for s, out in outs:
            self.assertEqual(len(out), batches * b, "equal shares")
            self.assertEqual(len(s), len(out), "__len__")
            seen.extend(out)
        self.assertEqual(len(seen), len(set(seen)), "a sample twice in an epoch")
        self.assertEqual(len(seen), batches * G)
        # Exactly the epoch's global batches: the permutation less its tail.
        perm = S.permutation(n, seed, epoch)
        self.assertEqual(sorted(seen), sorted(perm[: batches * G]))
        # Batch by batch: rank outputs at step k are batch k's samples.
        for k in range(batches):
            step = set()
            for _, out in outs:
                step.update(out[k * b : (k + 1) * b])
            self.assertEqual(step, set(perm[k * G : (k + 1) * G]))
        return outs, owners

    def test_exactly_once_equal_shares_many_layouts(self):
        for n, p, L, b, seed in [
            (1000, 3, 1, 8, 0), (1000, 3, 2, 5, 1), (997, 4, 2, 3, 2),
            (500, 2, 4, 4, 3), (64, 4, 1, 16, 4), (300, 5, 1, 7, 2**64 - 1),
        ]:
            for epoch in (0, 1):
                self.check(n, p, L, b, seed, epoch)

    def test_uneven_owners_are_balanced(self):
        # Node 0 owns almost everything: balancing moves the rest, shares
        # stay equal.
        n, p = 600, 3
        owners = [0 if i % 10 else 1 + (i // 10) % 2 for i in range(n)]
        outs, _ = self.check(n, p, 2, 5, 11, 0, owners)
        self.assertGreater(outs[0][0].moved, 0)

    def test_most_samples_stay_on_their_owner(self):
        n, p, L, b = 3000, 3, 1, 32
        outs, owners = self.check(n, p, L, b, 5, 0)
        local = sum(1 for q in range(p) for i in outs[q][1] if owners[i] == q)
        total = sum(len(o) for _, o in outs)
        self.assertGreater(local / total, 0.8)
        # moved is what left its owner.
        self.assertEqual(total - local, outs[0][0].moved)

    def test_identical_decisions_on_every_rank(self):
        # Each rank computes the whole epoch on its own; all agree on every
        # node's order.
        n, p, L, b = 800, 4, 2, 6
        owners = hashed_owners(n, p)
        orders = []
        for q in range(p):
            for r in range(L):
                s = locafs.LocalitySampler(
                    files(n), Owned(owners, p, q), b, local_rank=r, local_world_size=L, seed=3
                )
                s.set_epoch(2)
                list(s)
                orders.append((q, s.node_order(), s.moved))
        for q, order, moved in orders:
            ref = [o for qq, o, _ in orders if qq == q][0]
            self.assertEqual(order, ref)
            self.assertEqual(moved, orders[0][2])

    def test_set_epoch_changes_the_order(self):
        owners = hashed_owners(500, 3)
        s = locafs.LocalitySampler(files(500), Owned(owners, 3, 1), 4, seed=9)
        s.set_epoch(0)
        a = list(s)
        s.set_epoch(1)
        b = list(s)
        s.set_epoch(0)
        self.assertEqual(list(s), a)
        self.assertNotEqual(a, b)
        self.assertEqual(len(a), len(b))

    def test_rank_0_hands_its_nodes_order_as_a_plan_once_per_epoch(self):
        n, p, L, b = 240, 3, 2, 4
        owners = hashed_owners(n, p)
        m = Owned(owners, p, 2)
        s0 = locafs.LocalitySampler(files(n), m, b, local_rank=0, local_world_size=L)
        s1 = locafs.LocalitySampler(files(n), m, b, local_rank=1, local_world_size=L)
        for epoch in (0, 1):
            s0.set_epoch(epoch)
            s1.set_epoch(epoch)
            r0, r1 = list(s0), list(s1)
            list(s0)  # a second pass of the same epoch: no second plan
            list(s1)
            s0._plan_thread.join(10)
            self.assertEqual(len(m.plans), epoch + 1)
            plan = m.plans[-1]
            # The node's order: both local ranks' samples, batch by batch.
            want = []
            for k in range(len(r0) // b):
                want += r0[k * b : (k + 1) * b] + r1[k * b : (k + 1) * b]
            self.assertEqual(plan, ["f%d" % i for i in want])

    def test_a_plan_failure_is_a_warning(self):
        owners = hashed_owners(100, 2)
        m = Owned(owners, 2, 0, plan_error=locafs.LocafsError("control socket: gone"))
        s = locafs.LocalitySampler(files(100), m, 5)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = list(s)
            s._plan_thread.join(10)
        self.assertEqual(len(out), len(s))
        self.assertTrue(any("plan not handed" in str(x.message) for x in w), [str(x.message) for x in w])

    def test_bad_arguments_are_clear_errors(self):
        owners = hashed_owners(10, 2)
        with self.assertRaises(ValueError):
            locafs.LocalitySampler(files(10), Owned(owners, 2, 0), 0)
        with self.assertRaises(ValueError):
            locafs.LocalitySampler(files(10), Owned(owners, 2, 0), 2, local_rank=2, local_world_size=2)
        with self.assertRaises(ValueError):
            locafs.LocalitySampler(files(10), Owned(owners, 2, 0), 2, drop_last=False)

    def test_fewer_samples_than_a_global_batch_yields_nothing(self):
        owners = hashed_owners(10, 2)
        s = locafs.LocalitySampler(files(10), Owned(owners, 2, 1), 8)
        self.assertEqual(list(s), [])
        self.assertEqual(len(s), 0)


class Fallback(unittest.TestCase):
    def setUp(self):
        S._told.clear()
        self.env = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE") if k in os.environ}

    def tearDown(self):
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            os.environ.pop(k, None)
        os.environ.update(self.env)

    def test_not_a_mount_is_distributed_sampler_and_says_so_once(self):
        n, world = 103, 4
        with tempfile.TemporaryDirectory() as d:
            err = io.StringIO()
            with redirect_stderr(err):
                samplers = [locafs.LocalitySampler(files(n), d, 8, rank=r, world_size=world, seed=5) for r in range(world)]
            said = err.getvalue()
            self.assertEqual(said.count("sampling like DistributedSampler"), 1, said)
            self.assertIn("not the root of a locafs mount", said)
            for epoch in (0, 1):
                seen = []
                for r, s in enumerate(samplers):
                    self.assertFalse(s.locality)
                    s.set_epoch(epoch)
                    out = list(s)
                    self.assertEqual(len(out), n // world)
                    self.assertEqual(len(s), n // world)
                    self.assertEqual(out, S.permutation(n, 5, epoch)[: (n // world) * world][r::world])
                    seen += out
                self.assertEqual(len(set(seen)), (n // world) * world)
            self.assertNotEqual(list(samplers[0]), (samplers[0].set_epoch(0), list(samplers[0]))[1])

    def test_rank_and_world_size_from_the_environment(self):
        os.environ.update({"RANK": "3", "WORLD_SIZE": "6", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
        with tempfile.TemporaryDirectory() as d, redirect_stderr(io.StringIO()):
            s = locafs.LocalitySampler(files(60), d, 4)
        self.assertEqual((s.rank, s.world_size, s.local_rank, s.local_world_size), (3, 6, 1, 2))
        self.assertEqual(list(s), S.permutation(60, 0, 0)[3::6])

    def test_without_drop_last_pads_like_distributed_sampler(self):
        with tempfile.TemporaryDirectory() as d, redirect_stderr(io.StringIO()):
            ss = [locafs.LocalitySampler(files(10), d, 2, rank=r, world_size=4, drop_last=False) for r in range(4)]
        outs = [list(s) for s in ss]
        self.assertTrue(all(len(o) == 3 == len(s) for o, s in zip(outs, ss)))
        self.assertEqual(set(sum(outs, [])), set(range(10)))

    def test_a_mount_without_peers_falls_back(self):
        class Alone(Owned):
            pass

        with redirect_stderr(io.StringIO()) as err:
            s = locafs.LocalitySampler(files(20), Alone([0] * 20, 1, 0), 4, world_size=2, rank=1)
        self.assertFalse(s.locality)
        self.assertIn("has no peers", err.getvalue())
        self.assertEqual(len(list(s)), 10)


class TorchForm(unittest.TestCase):
    def test_sampler_type(self):
        try:
            import torch.utils.data as tud
        except Exception:
            self.assertIs(S._Base, object)
            self.skipTest("torch is not installed: the plain-iterable form was tested")
        owners = hashed_owners(40, 2)
        s = locafs.LocalitySampler(files(40), Owned(owners, 2, 0), 4)
        self.assertIsInstance(s, tud.Sampler)
        loader = tud.DataLoader(list(range(40)), sampler=s, batch_size=4)
        self.assertEqual(sum(len(x) for x in loader), len(s))


class PackedAnswer(unittest.TestCase):
    """The packed ``where`` form (src/mount/control.rs): owners as little-endian
    u32s in base64, 0xFFFFFFFF for a path that is not a file."""

    def test_unpack(self):
        import base64
        import struct

        from locafs import control as M

        raw = struct.pack("<4I", 0, 255, 0xFFFFFFFF, 70000)
        packed = {"owners_packed": base64.b64encode(raw).decode(), "unknown": 1}
        self.assertEqual(M._unpack_owners(packed), [0, 255, None, 70000])
        packed["unknown"] = 0
        packed["owners_packed"] = base64.b64encode(raw[:8]).decode()
        self.assertEqual(M._unpack_owners(packed), [0, 255])
        self.assertEqual(M._unpack_owners({"owners": [1, None]}), [1, None])

    def test_joined_paths_are_made_relative(self):
        m = Owned([0], 1, 0)
        m.path = "/mnt/x"
        self.assertEqual(m._joined(["a/b", "c"]), "a/b\0c")
        self.assertEqual(m._joined(["a/b", "/mnt/x/c/d"]), "a/b\0c/d")
        self.assertEqual(m._joined([b"a/b", "c"]), "a/b\0c")


if __name__ == "__main__":
    unittest.main()
