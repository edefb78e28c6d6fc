"""One node of the real 3-node run (tests/locality_python.rs): several local
ranks, each with its own sampler, and DataLoader-style worker threads that
read each rank's files through this node's mount in the sampler's order,
checking every byte against the source.

    python3 node_run.py CONFIG.json OUT.json

CONFIG: mount, source, files (relative paths), batch_size,
local_world_size, epochs, workers, seed, mode ("locality": LocalitySampler;
"plain": DistributedSampler's order, rank = node * L + local rank),
node (this node's index, plain mode only), nodes.
OUT: {"node_index", "ranks": {global rank: [[indices of epoch 0], ...]},
"moved", "bad"}.
"""

import json
import os
import queue
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import locafs  # noqa: E402


def read_all(mount, source, files, order, batch_size, workers):
    """Reads ``order`` batch by batch with ``workers`` threads; returns the
    indices read (in batch order) and the files whose bytes were wrong."""
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    jobs = queue.Queue()
    for k, batch in enumerate(batches):
        jobs.put((k, batch))
    done = [None] * len(batches)
    bad = []

    def worker():
        while True:
            try:
                k, batch = jobs.get_nowait()
            except queue.Empty:
                return
            got = []
            for i in batch:
                with open(os.path.join(mount, files[i]), "rb") as f:
                    data = f.read()
                with open(os.path.join(source, files[i]), "rb") as f:
                    if f.read() != data:
                        bad.append(files[i])
                got.append(i)
            done[k] = got

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [i for b in done for i in b], bad


def main():
    cfg = json.load(open(sys.argv[1]))
    files, L, b = cfg["files"], cfg["local_world_size"], cfg["batch_size"]
    mount = locafs.Mount(cfg["mount"])
    if cfg["mode"] == "locality":
        samplers = [
            locafs.LocalitySampler(files, mount, b, local_rank=r, local_world_size=L, seed=cfg["seed"])
            for r in range(L)
        ]
        assert all(s.locality for s in samplers), "not in locality mode"
        node = mount.node_index
    else:
        node = cfg["node"]
        samplers = None
    out = {"node_index": node, "ranks": {}, "moved": [], "bad": []}
    for epoch in range(cfg["epochs"]):
        orders = []
        for r in range(L):
            if samplers:
                samplers[r].set_epoch(epoch)
                orders.append(list(samplers[r]))
            else:
                world = cfg["nodes"] * L
                orders.append(
                    locafs.distributed_indices(len(files), node * L + r, world, cfg["seed"], epoch)
                )
        if samplers:
            out["moved"].append(samplers[0].moved)
        # The local ranks train at once, each with its own workers.
        results = [None] * L
        threads = []
        for r in range(L):
            def run(r=r):
                results[r] = read_all(cfg["mount"], cfg["source"], files, orders[r], b, cfg["workers"])

            threads.append(threading.Thread(target=run))
            threads[-1].start()
        for t in threads:
            t.join()
        for r in range(L):
            read, bad = results[r]
            assert read == orders[r], "rank %d did not read its order" % r
            out["ranks"].setdefault(str(node * L + r), []).append(read)
            out["bad"] += bad
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
