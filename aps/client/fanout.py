"""Sharded fan-out: how one call's ids and tensors are split over the pservers and their frames,
and how the replies are put back together in the caller's order.

Sparse ids belong to the server their table's :class:`~aps.sharding.SparseSharding` names
(by id for fixed tables, by logical shard of the mixed key for hash tables); the client
sends global ids (each server validates and maps them to its rows once, at its edge). Dense tables are split in blocks
(aps/sharding.py), and anything larger than a frame goes in several chunks. The parts of one
call run concurrently; the first failure cancels the rest (:func:`gather`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import NamedTuple, TypeVar

import numpy as np

from .. import wire
from ..sharding import DenseBlock, SparseSharding, dense_blocks
from ..specs import DenseTable
from .lanes import PortPlan

T = TypeVar("T")


async def gather(calls: Sequence[Awaitable[T]]) -> list[T]:
    """Run calls concurrently; on the first failure cancel the rest and raise that failure."""
    if len(calls) == 1:
        return [await calls[0]]
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def row_bytes(dim: int) -> int:
    """Bytes one sparse row of width ``dim`` takes in a frame: float32 values and its int64 id."""
    return dim * 4 + 8


def chunks(n: int, per: int) -> list[slice]:
    """``n`` rows in pieces of at most ``per``; one empty piece when ``n`` is 0 (a push still
    reaches its server: a sync round counts every trainer's FINAL chunk)."""
    return [slice(i, min(n, i + per)) for i in range(0, n, per)] or [slice(0, 0)]


class Share(NamedTuple):
    """Server ``server``'s part of a call's ids: ``ids`` are the caller's ``ids[rows]``
    (``rows`` is ``slice(None)`` with one server: all of them, in order, not copied)."""

    server: int
    rows: np.ndarray | slice
    ids: np.ndarray


def shares(ids: np.ndarray, sharding: SparseSharding) -> list[Share]:
    """The part of ``ids`` each server owns, one :class:`Share` per server (empty ones too)."""
    num_servers = sharding.num_servers
    if num_servers == 1:
        return [Share(0, slice(None), ids)]
    order, bounds = sharding.group(ids)
    out = []
    for k in range(num_servers):
        rows = order[int(bounds[k]) : int(bounds[k + 1])]
        out.append(Share(k, rows, ids[rows]))
    return out


def caller_rows(rows: np.ndarray | slice, chunk: slice) -> np.ndarray | slice:
    """Which of the caller's rows chunk ``chunk`` of a share whose rows are ``rows`` holds."""
    return chunk if isinstance(rows, slice) else rows[chunk]


def sum_duplicates(ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One row per distinct id, the rows of repeated ids summed."""
    if len(ids) == 0:
        return ids, values
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
    if len(starts) == len(ids):
        return ids, values
    return sorted_ids[starts], np.add.reduceat(values[order], starts, axis=0)


class DensePart(NamedTuple):
    """``count`` values of dense block ``block`` from ``offset`` in it, sent on port ``lane``."""

    block: DenseBlock
    offset: int
    count: int
    lane: int

    @property
    def start(self) -> int:
        """Where the part starts in the whole (flattened) table."""
        return self.block.start + self.offset


def dense_parts(spec: DenseTable, num_servers: int, ports: PortPlan, per: int) -> list[DensePart]:
    """Pieces of at most ``per`` values, each fitting one frame; every piece of one block on
    the same port of its server (lanes.py), so its FINAL piece never overtakes the others."""
    parts = []
    for block in dense_blocks(spec.name, spec.size, num_servers):
        lane = ports.dense_lane(block.server)
        for offset in range(0, block.size, per):
            parts.append(DensePart(block, offset, min(per, block.size - offset), lane))
    return parts


class Versions:
    """The version each pull reply gave, per (server, table, dense block or -1 for sparse): the
    next gradient push to that server names it as what it was computed from, so a pserver can
    drop gradients computed from parameters too old."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[tuple[int, str, int], int] = {}

    def based_on(self, server: int, table: str, block: int = -1) -> int:
        """The version a push to ``server`` was computed from (-1: never pulled)."""
        return self._seen.get((server, table, block), -1)

    def read(self, server: int, table: str, version: int, block: int = -1) -> None:
        """One pull reply from ``server`` read ``version``."""
        self._seen[(server, table, block)] = version

    def note(self, table: str, keys: Sequence[tuple[int, int]], replies: Sequence[wire.Message]) -> None:
        """The versions several pull replies read, per (server, block) key; of several replies
        for one key the oldest, as values read at it are part of what was pulled."""
        seen: dict[tuple[int, str, int], int] = {}
        for (k, block), reply in zip(keys, replies):
            version = reply.version  # type: ignore[attr-defined]
            key = (k, table, block)
            seen[key] = min(version, seen.get(key, version))
        self._seen.update(seen)
