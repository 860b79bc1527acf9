"""Who owns what: the mapping from sparse ids and dense elements to pservers.

Both the client (to split requests) and the server (to size its shard and re-shard checkpoints)
use these functions, so the two can never disagree.

* Sparse: row id ``r`` lives on server ``r % n`` at local row ``r // n``.
* Dense: the flattened tensor is cut into at most ``n`` contiguous blocks of at least
  :data:`MIN_BLOCK` elements (Paddle's slice_variable rule); block ``b`` goes to server
  ``(start + b) % n`` where ``start`` is a stable hash of the table name, so many small tables
  spread over the servers instead of piling onto server 0.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
from numba import njit

#: smallest dense block, in elements (Paddle: 8192)
MIN_BLOCK = 8192


def sparse_local_rows(rows: int, shard: int, num_shards: int) -> int:
    """How many rows of a ``rows``-row table server ``shard`` of ``num_shards`` stores."""
    if rows <= shard:
        return 0
    return (rows - shard + num_shards - 1) // num_shards


@dataclass(frozen=True)
class DenseBlock:
    """Elements ``[start, stop)`` of a flattened dense table, owned by ``server``."""

    index: int
    start: int
    stop: int
    server: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def dense_blocks(name: str, size: int, num_servers: int) -> list[DenseBlock]:
    """The block layout of a dense table with ``size`` elements over ``num_servers`` servers."""
    if num_servers <= 0:
        raise ValueError("num_servers must be positive")
    per_block = max(MIN_BLOCK, -(-size // num_servers))
    count = max(1, -(-size // per_block))
    first = zlib.crc32(name.encode()) % num_servers
    return [
        DenseBlock(b, b * per_block, min(size, (b + 1) * per_block), (first + b) % num_servers)
        for b in range(count)
    ]


def split_ids(ids: np.ndarray, num_shards: int) -> tuple[np.ndarray, np.ndarray, list[slice]]:
    """Group ids by owning shard.

    Returns ``(order, local_ids_sorted, slices)``: ``ids[order]`` is grouped by shard, the
    ``local_ids_sorted`` are those ids translated to each shard's local rows, and ``slices[k]``
    selects shard k's part of both. The caller scatters results back with ``out[order] = ...``.
    """
    if num_shards == 1:
        order = np.arange(len(ids), dtype=np.int64)
        return order, ids, [slice(0, len(ids))]
    owner = ids % num_shards
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=num_shards)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    local = ids[order] // num_shards
    return order, local, [slice(int(bounds[k]), int(bounds[k + 1])) for k in range(num_shards)]


@njit(cache=True, nogil=True)
def _first_bad_id(ids: np.ndarray, rows: int, num_shards: int, shard: int) -> int:
    for i in range(ids.shape[0]):
        r = ids[i]
        if r < 0 or r >= rows or r % num_shards != shard:
            return i
    return -1


def first_bad_id(ids: np.ndarray, rows: int, num_shards: int = 1, shard: int = 0) -> int:
    """Index of the first id outside ``[0, rows)`` or not owned by ``shard``, or -1.

    One compiled pass: on the small-request path this replaces several numpy reductions whose
    fixed overhead dominated a one-id pull."""
    return int(_first_bad_id(ids, rows, num_shards, shard))
