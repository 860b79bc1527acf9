"""A new kind of table, defined here by its store and one class per side (the server's
:class:`~aps.server.kinds.TableKind`, the checkpoint's :class:`~aps.checkpoints.kinds.TableFormat`),
added to the kinds real pservers are built with: it trains over TCP, saves, loads onto another
number of pservers, and its export is served by aps-serve.

The toy kind is a bounded table: a fixed table whose rows stay within ``[-BOUND, BOUND]`` after
every gradient push (the rows a push touches are clipped). Its tables are ordinary
:class:`~aps.specs.SparseTable` specs, so the client and aps-serve need nothing new.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np

import aps
from aps.checkpoints.kinds import DenseFormat, FixedFormat, HashFormat, TableFormats
from aps.server.config import ServerConfig
from aps.server.kinds import DenseKind, FixedKind, HashKind
from aps.serving.server import serve_exports
from aps.specs import SGD, SparseTable, Uniform
from aps.storage.tables import SparseShard

BOUND = 0.05
SPEC = SparseTable("emb", rows=101, dim=4, init=Uniform(-0.01, 0.01), optimizer=SGD(lr=1.0))


class BoundedShard(SparseShard):
    """A fixed table's shard whose pushed rows are clipped to ``[-BOUND, BOUND]``."""

    def push_grad(self, local_ids: np.ndarray, grads: np.ndarray, **options: Any) -> None:
        super().push_grad(local_ids, grads, **options)
        rows = np.unique(local_ids)
        self.values[rows] = np.clip(self.values[rows], -BOUND, BOUND)


class BoundedKind(FixedKind):
    store_type = BoundedShard


class BoundedFormat(FixedFormat):
    store_type = BoundedShard


KINDS = (BoundedKind, HashKind, DenseKind)
FORMATS = TableFormats((BoundedFormat(), DenseFormat(), HashFormat()))


@asynccontextmanager
async def cluster(n: int, root: Path) -> AsyncIterator[tuple[list[aps.PServer], aps.PSClient]]:
    servers = []
    try:
        for k in range(n):
            config = ServerConfig(port=0, server_index=k, num_servers=n, checkpoint_root=str(root))
            servers.append(await aps.PServer(config, kinds=KINDS, formats=FORMATS).start())
        async with aps.connect([s.address for s in servers]) as ps:
            yield servers, ps
    finally:
        for s in servers:
            await s.aclose()


async def test_a_kind_of_table_added_by_one_class_per_side_trains_saves_loads_n_to_m_and_is_served(tmp_path: Path) -> None:
    ids = np.arange(SPEC.rows, dtype=np.int64)
    grads = np.random.default_rng(0).normal(0.0, 1.0, (SPEC.rows, SPEC.dim)).astype(np.float32)
    async with cluster(2, tmp_path) as (servers, ps):
        await ps.create_table(SPEC)
        assert all(type(s.core.tables["emb"]) is BoundedShard for s in servers)
        before = await ps.pull_sparse("emb", ids)
        await ps.push_sparse_grad("emb", ids, grads)
        trained = await ps.pull_sparse("emb", ids)
        # SGD with lr 1 moves every row by its gradient; the kind clips it into the bound
        np.testing.assert_array_equal(trained, np.clip(before - grads, -BOUND, BOUND))
        assert (np.abs(trained) == np.float32(BOUND)).mean() > 0.9
        await ps.save("ckpt")
        await ps.export("exports", kind="base")

    async with cluster(3, tmp_path) as (servers, ps):
        await ps.load("ckpt")
        assert all(type(s.core.tables["emb"]) is BoundedShard for s in servers)  # the format loads its own store
        np.testing.assert_array_equal(await ps.pull_sparse("emb", ids), trained)
        await ps.push_sparse_grad("emb", ids, -grads)  # the loaded table still clips
        np.testing.assert_array_equal(await ps.pull_sparse("emb", ids), np.clip(trained + grads, -BOUND, BOUND))

    serving = await serve_exports(tmp_path / "exports")
    try:
        async with aps.connect([serving.address]) as ps:
            np.testing.assert_array_equal(await ps.pull_sparse("emb", ids), trained)
    finally:
        await serving.aclose()
