"""New kinds of table, defined here, added to what real pservers, the checkpoints and aps-serve
are built with: each trains over TCP, saves, loads onto another number of pservers, and its
export is served by aps-serve, with no change to aps.

The toy kinds are bounded tables: fixed tables whose rows stay within ``[-bound, bound]`` after
every gradient push (the rows a push touches are clipped).

- A new *store* behind the existing spec: ordinary :class:`~aps.specs.SparseTable` specs whose
  shards clip to ``BOUND``; one class per side (the server's
  :class:`~aps.server.kinds.TableKind`, the checkpoint's :class:`~aps.checkpoints.kinds.TableFormat`),
  so the client and aps-serve need nothing new.
- A new kind of *spec*: :class:`BoundedTable`, whose ``bound`` is a field of the spec. Its class
  is handed to whatever reads specs back: the pserver by its kind, the checkpoints by their
  format, aps-serve by its served table, a client by the spec it creates (or ``specs=`` for a
  client that reads a table it did not create). A pserver not handed its kind refuses it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aps
from aps.checkpoints.kinds import DenseFormat, FixedFormat, HashFormat, TableFormats
from aps.errors import ConfigError, ServerError
from aps.server.config import ServerConfig
from aps.server.kinds import DEFAULT_KINDS, DenseKind, FixedKind, HashKind, TableKind
from aps.serving.model import SERVED_TABLES, ServedDense, ServedFixed, ServedHash
from aps.serving.server import serve_exports
from aps.specs import SGD, TABLE_SPECS, SparseTable, Uniform
from aps.storage.table_classes import BySpecClass
from aps.storage.tables import SparseShard

BOUND = 0.05
SPEC = SparseTable("emb", rows=101, dim=4, init=Uniform(-0.01, 0.01), optimizer=SGD(lr=1.0))


class BoundedShard(SparseShard):
    """A fixed table's shard whose pushed rows are clipped to ``[-bound, bound]``."""

    @property
    def bound(self) -> float:
        return BOUND

    def push_grad(self, local_ids: np.ndarray, grads: np.ndarray, **options: Any) -> None:
        super().push_grad(local_ids, grads, **options)
        rows = np.unique(local_ids)
        self.values[rows] = np.clip(self.values[rows], -self.bound, self.bound)


class BoundedKind(FixedKind):
    store_type = BoundedShard


class BoundedFormat(FixedFormat):
    store_type = BoundedShard


KINDS = (BoundedKind, HashKind, DenseKind)
FORMATS = TableFormats((BoundedFormat(), DenseFormat(), HashFormat()))


# ---------------------------------------------------------------- a new kind of spec


@dataclass(frozen=True)
class BoundedTable(SparseTable):
    """A fixed table whose rows stay within ``[-bound, bound]``: the one class of the new kind
    of spec (the rest of a fixed table's facts are inherited)."""

    bound: float = 0.05

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.bound, bool) or not isinstance(self.bound, (int, float)) or not self.bound > 0:
            raise ConfigError(f"table {self.name!r}: bound must be a positive number, got {self.bound!r}")


class BoundedTableShard(BoundedShard):
    """A bounded table's shard: clipped to its spec's bound."""

    spec_type = BoundedTable

    @property
    def bound(self) -> float:
        return float(self.spec.bound)  # type: ignore[attr-defined]


class BoundedTableKind(FixedKind):
    spec_type = BoundedTable
    store_type = BoundedTableShard

    def new_nbytes(self, spec: BoundedTable) -> int:
        """Sized by its store (the package's storage shards are looked up for its own specs)."""
        return BoundedTableShard.new_nbytes(spec, self.index, self.servers)


class BoundedTableFormat(FixedFormat):
    spec_type = BoundedTable
    store_type = BoundedTableShard


class ServedBounded(ServedFixed):
    """aps-serve reads and serves a bounded table as a fixed one."""

    spec_type = BoundedTable


#: the registration: the kind to the pservers, the format to the checkpoints, the served table
#: to aps-serve, the spec class to a client that reads a table it did not create
SPEC_KINDS: tuple[type[TableKind], ...] = (*DEFAULT_KINDS, BoundedTableKind)
SPEC_FORMATS = TableFormats((FixedFormat(), DenseFormat(), HashFormat(), BoundedTableFormat()))
SERVED = BySpecClass([ServedHash, ServedFixed, ServedDense, ServedBounded])
SPECS = (*TABLE_SPECS, BoundedTable)
BOUNDED = BoundedTable("emb", rows=101, dim=4, init=Uniform(-0.01, 0.01), optimizer=SGD(lr=0.5), bound=0.03)


@asynccontextmanager
async def cluster(
    n: int, root: Path, kinds: tuple[type[TableKind], ...] = KINDS, formats: TableFormats = FORMATS,
    specs: Sequence[type[Any]] = TABLE_SPECS,
) -> AsyncIterator[tuple[list[aps.PServer], aps.PSClient]]:
    servers = []
    try:
        for k in range(n):
            config = ServerConfig(port=0, server_index=k, num_servers=n, checkpoint_root=str(root))
            servers.append(await aps.PServer(config, kinds=kinds, formats=formats).start())
        async with aps.connect([s.address for s in servers], specs=specs) as ps:
            yield servers, ps
    finally:
        for s in servers:
            await s.aclose()


async def served_rows(
    root: Path, ids: np.ndarray, served: BySpecClass[Any] = SERVED_TABLES, specs: Sequence[type[Any]] = TABLE_SPECS
) -> Any:
    """The spec and rows of table "emb" as aps-serve serves the exports under ``root``."""
    serving = await serve_exports(root, served=served)
    try:
        async with aps.connect([serving.address], specs=specs) as ps:
            return await ps.table_spec("emb"), await ps.pull_sparse("emb", ids)
    finally:
        await serving.aclose()


def ids_and_grads(spec: SparseTable) -> tuple[np.ndarray, np.ndarray]:
    ids = np.arange(spec.rows, dtype=np.int64)
    return ids, np.random.default_rng(0).normal(0.0, 1.0, (spec.rows, spec.dim)).astype(np.float32)


async def test_a_kind_of_table_added_by_one_class_per_side_trains_saves_loads_n_to_m_and_is_served(tmp_path: Path) -> None:
    ids, grads = ids_and_grads(SPEC)
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

    _, served = await served_rows(tmp_path / "exports", ids)
    np.testing.assert_array_equal(served, trained)


async def test_a_kind_of_spec_defined_outside_aps_trains_saves_loads_n_to_m_and_is_served(tmp_path: Path) -> None:
    ids, grads = ids_and_grads(BOUNDED)
    bound, lr = BOUNDED.bound, BOUNDED.optimizer.lr
    async with cluster(2, tmp_path, SPEC_KINDS, SPEC_FORMATS) as (servers, ps):
        await ps.create_table(BOUNDED)  # CREATE_TABLE carries the spec's dict, read back by the kind's class
        assert all(s.core.tables["emb"].spec == BOUNDED and type(s.core.tables["emb"]) is BoundedTableShard for s in servers)
        before = await ps.pull_sparse("emb", ids)
        await ps.push_sparse_grad("emb", ids, grads)
        trained = await ps.pull_sparse("emb", ids)
        np.testing.assert_array_equal(trained, np.clip(before - np.float32(lr) * grads, -bound, bound))
        assert (np.abs(trained) == np.float32(bound)).mean() > 0.9  # the spec's bound, not the store kind's BOUND
        assert (await ps.table_info("emb")).spec == BOUNDED  # this client created it: read back as its class
        await ps.save("ckpt")
        await ps.export("exports", kind="base")

    async with cluster(3, tmp_path, SPEC_KINDS, SPEC_FORMATS, specs=SPECS) as (servers, ps):
        await ps.load("ckpt")
        assert all(s.core.tables["emb"].spec == BOUNDED and type(s.core.tables["emb"]) is BoundedTableShard for s in servers)
        assert await ps.table_spec("emb") == BOUNDED
        np.testing.assert_array_equal(await ps.pull_sparse("emb", ids), trained)
        await ps.push_sparse_grad("emb", ids, -grads)  # the loaded table still clips, to its own bound
        np.testing.assert_array_equal(await ps.pull_sparse("emb", ids), np.clip(trained + np.float32(lr) * grads, -bound, bound))

    assert aps.read_checkpoint(tmp_path / "ckpt", formats=SPEC_FORMATS).spec("emb") == BOUNDED
    spec, served = await served_rows(tmp_path / "exports", ids, SERVED, SPECS)
    assert spec == BOUNDED
    np.testing.assert_array_equal(served, trained)


async def test_a_pserver_not_given_a_kind_of_spec_refuses_its_tables_naming_the_spec_type(tmp_path: Path) -> None:
    async with cluster(1, tmp_path, DEFAULT_KINDS) as (servers, ps):
        with pytest.raises(ServerError, match="bad table spec: not a spec: unknown type 'BoundedTable'"):
            await ps.create_table(BOUNDED)
        assert "emb" not in servers[0].core.tables


async def test_a_checkpoint_of_a_kind_of_spec_is_no_table_to_a_reader_not_given_its_format(tmp_path: Path) -> None:
    async with cluster(2, tmp_path, SPEC_KINDS, SPEC_FORMATS) as (_, ps):
        await ps.create_table(BOUNDED)
        await ps.save("ckpt")
    with pytest.raises(ConfigError, match="not a spec: unknown type 'BoundedTable'"):
        aps.read_checkpoint(tmp_path / "ckpt")
