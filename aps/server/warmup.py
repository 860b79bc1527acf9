"""Compile (or load from numba's cache) every storage kernel before a pserver accepts clients,
so the first real push does not stall the event loop for seconds while numba compiles."""

from __future__ import annotations

import numpy as np

from ..sharding import dense_blocks
from ..specs import SGD, Adagrad, Adam, Constant, DenseTable, Normal, SparseTable, Uniform
from .tables import DenseShard, SparseShard


def warm_up_kernels() -> None:
    ids = np.array([0, 1, 1], dtype=np.int64)
    for opt in (SGD(lr=0.1), Adagrad(lr=0.1), Adam(lr=0.1)):
        for init in (Uniform(-1, 1), Normal(0, 1), Constant(0)):
            sparse = SparseShard(SparseTable("warmup", rows=4, dim=2, init=init, optimizer=opt), 0, 1)
            sparse.track(2)  # change tracking's kernels too
            sparse.push_grad(ids, np.ones((3, 2), np.float32), client=1)
            sparse.push_delta(ids, np.ones((3, 2), np.float32), client=1)
            sparse.pull(ids)
            sparse.changed(2)
        spec = DenseTable("warmup", shape=(4,), init=Normal(0, 1), optimizer=opt)
        dense = DenseShard(spec, dense_blocks(spec.name, spec.size, 1))
        dense.push_grad(0, 0, np.ones(4, np.float32))
        dense.push_delta(0, 0, np.ones(4, np.float32))
