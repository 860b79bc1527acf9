"""Load (or compile) every storage kernel of a pserver in a background thread as it starts.

Without it the first push would stall the event loop while numba loads its kernels from the
cache: about half a second in a fresh process, most of it numba's one-off set-up on its first
dispatch (which imports scipy.linalg, when installed, to look for BLAS). It used to run before
the pserver listened, on the critical path of every launch: ``aps-local`` starts the trainers
only once the pservers listen. In a thread it overlaps with the trainers' own start-up (importing
aps, spawning workers), which takes longer; a request that needs a kernel before the thread has
loaded it waits on numba's compiler lock for that one kernel, as it would have without warm-up.
"""

from __future__ import annotations

import threading

import numpy as np

from ..sharding import dense_blocks
from ..specs import SGD, Adagrad, Adam, Constant, DenseTable, Ftrl, HashTable, Normal, SparseTable, Uniform
from ..storage.hash.store import HashSparseStore
from ..storage.tables import DenseShard, SparseShard


def load_kernels() -> None:
    """Run every storage kernel once on tiny throw-away shards (each optimizer and initialiser,
    fixed and hash tables)."""
    ids = np.array([0, 1, 1], dtype=np.int64)
    for opt in (SGD(lr=0.1), Adagrad(lr=0.1), Adam(lr=0.1), Ftrl()):
        for init in (Uniform(-1, 1), Normal(0, 1), Constant(0)):
            sparse = SparseShard(SparseTable("warmup", rows=4, dim=2, init=init, optimizer=opt), 0, 1)
            sparse.track(2)  # change tracking's kernels too (tracking.py)
            sparse.push_grad(ids, np.ones((3, 2), np.float32), client=1)
            sparse.push_delta(ids, np.ones((3, 2), np.float32), client=1)
            sparse.pull(ids)
            sparse.changed(2)
            hashed = HashSparseStore(HashTable("warmup", dim=2, init=init, optimizer=opt))
            hashed.push_grad(ids, np.ones((3, 2), np.float32))
            hashed.push_grad(ids[1:], np.ones((2, 2), np.float32), distinct=True)
            hashed.pull(np.array([1, 7], np.int64))
        spec = DenseTable("warmup", shape=(4,), init=Normal(0, 1), optimizer=opt)
        dense = DenseShard(spec, dense_blocks(spec.name, spec.size, 1))
        dense.push_grad(0, 0, np.ones(4, np.float32))
        dense.push_delta(0, 0, np.ones(4, np.float32))
    load_hash_kernels()


def load_hash_kernels() -> None:
    """The kernels of hash tables that no optimizer picks: the index's growth and resize
    (made ahead), admission, eviction under ``max_keys``, change tracking and shrink. Loading one
    mid-fill held the event loop for 16-190 ms."""
    keys = np.arange(3000, dtype=np.int64) * 7919
    grads = np.ones((keys.shape[0], 2), np.float32)
    store = HashSparseStore(HashTable("warmup", dim=2))
    store.track(1)
    for part in np.array_split(np.arange(keys.shape[0]), 6):
        store.push_grad(keys[part], grads[part], shows=grads[part, 0], clicks=grads[part, 1], client=1)
        if store.growth_due:
            store.reserve()
    store.push_delta(keys[:3], grads[:3], client=1)
    store.changed(1)
    store.shrink(threshold=10.0, days=1)
    capped = HashSparseStore(HashTable("warmup", dim=2, admit_probability=0.5, admit_count=2, max_keys=64, pending_keys=256))
    for _ in range(3):
        capped.push_grad(keys[:200], grads[:200])
    capped.delete_keys(capped.evict_plan(capped.eviction_due or 8))


def warm_up_kernels() -> threading.Thread:
    """Start :func:`load_kernels` in a daemon thread and return it (join it to wait)."""
    thread = threading.Thread(target=load_kernels, name="aps-kernel-warmup", daemon=True)
    thread.start()
    return thread
