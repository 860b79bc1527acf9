"""Who owns what: the mapping from sparse ids and dense elements to pservers.

Both the client (to split requests) and the server (to size its shard, check ownership and
re-shard checkpoints) use these functions and the :class:`SparseSharding` value, so the two can
never disagree.

* Fixed sparse tables: row id ``r`` lives on server ``r % n`` at local row ``r // n``.
* Hash tables: key ``k`` is mixed (splitmix64, :mod:`aps.mixer`, the hash index's own mixer) and
  the top 10 bits of the mix are its logical shard ``l`` in ``[0, 1024)``; logical shard ``l``
  lives on server ``l % n``. Patterned keys (all even, all multiples of n) spread evenly, and a
  change from N to M pservers moves whole logical shards, never single keys.
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

from .mixer import mix64
from .specs import HashTable, TableSpec

#: smallest dense block, in elements (Paddle: 8192)
MIN_BLOCK = 8192
#: logical shards of every hash table: a power of two (a key's shard is the top bits of its mix,
#: so the hash index's probe start, the low bits, stays independent of the server it lands on);
#: 1024 spreads evenly over any pserver count up to a few hundred and keeps a checkpoint's
#: per-shard files few
LOGICAL_SHARDS = 1024
_LOGICAL_BITS = 10


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
    owner = SparseSharding(num_shards).owners(ids)
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=num_shards)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    local = ids[order] // num_shards
    return order, local, [slice(int(bounds[k]), int(bounds[k + 1])) for k in range(num_shards)]


@njit(cache=True, nogil=True)
def _logical_shards(keys: np.ndarray, shift: np.uint64, out: np.ndarray) -> None:
    for i in range(keys.shape[0]):
        out[i] = np.int64(mix64(np.uint64(keys[i])) >> shift)


@njit(cache=True, nogil=True)
def _group(ids: np.ndarray, hashed: bool, shift: np.uint64, num_servers: int, order: np.ndarray, bounds: np.ndarray) -> None:
    """A counting sort of ``ids`` by owner: ``order`` (positions, grouped by server, each group
    in the caller's order) and ``bounds[k]:bounds[k + 1]``, server k's part of it."""
    n = ids.shape[0]
    owner = np.empty(n, np.int32)
    for i in range(n):
        o = np.int64(mix64(np.uint64(ids[i])) >> shift) if hashed else ids[i]
        owner[i] = o % num_servers
        bounds[owner[i] + 1] += 1
    for k in range(num_servers):
        bounds[k + 1] += bounds[k]
    at = bounds[:-1].copy()
    for i in range(n):
        o = owner[i]
        order[at[o]] = i
        at[o] += 1


@njit(cache=True, nogil=True)
def _first_foreign_key(keys: np.ndarray, shift: np.uint64, num_servers: int, server: int) -> int:
    for i in range(keys.shape[0]):
        if np.int64(mix64(np.uint64(keys[i])) >> shift) % num_servers != server:
            return i
    return -1


@dataclass(frozen=True)
class SparseSharding:
    """Which pserver owns each id of one sparse table: the one value both ends hold.

    ``hashed`` False (fixed tables): id ``r`` on server ``r % num_servers``. ``hashed`` True (hash
    tables): the key's logical shard (:meth:`logical`) modulo ``num_servers``. Build it from a
    spec with :meth:`of`; the client splits requests with :meth:`owners`, the server refuses keys
    it does not own with :meth:`first_foreign`.
    """

    num_servers: int
    hashed: bool = False

    def __post_init__(self) -> None:
        if self.num_servers <= 0:
            raise ValueError("num_servers must be positive")

    @classmethod
    def of(cls, spec: TableSpec, num_servers: int) -> SparseSharding:
        """The sharding of table ``spec`` over ``num_servers`` pservers."""
        return cls(num_servers, isinstance(spec, HashTable))

    @staticmethod
    def logical(keys: np.ndarray) -> np.ndarray:
        """Each hash key's logical shard in ``[0, LOGICAL_SHARDS)`` (int64 keys, any value)."""
        out = np.empty(keys.shape[0], np.int64)
        _logical_shards(keys, np.uint64(64 - _LOGICAL_BITS), out)
        return out

    def owners(self, ids: np.ndarray) -> np.ndarray:
        """The server of each id (int64 array)."""
        if not self.hashed:
            return ids % self.num_servers  # type: ignore[no-any-return]
        return self.logical(ids) % self.num_servers  # type: ignore[no-any-return]

    def group(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(order, bounds)``: ``ids[order[bounds[k]:bounds[k + 1]]]`` are server k's ids, in the
        caller's order. One compiled counting pass (a stable argsort of the owners costs
        n log n and several temporaries on every sharded pull and push)."""
        order = np.empty(ids.shape[0], np.int64)
        bounds = np.zeros(self.num_servers + 1, np.int64)
        _group(np.ascontiguousarray(ids, dtype=np.int64), self.hashed, np.uint64(64 - _LOGICAL_BITS), self.num_servers, order, bounds)
        return order, bounds

    def first_foreign(self, ids: np.ndarray, server: int) -> int:
        """Index of the first hash key not owned by ``server``, or -1 (one compiled pass)."""
        if not self.hashed:
            raise ValueError("first_foreign is for hash tables; fixed tables check ids with scan_ids")
        if self.num_servers == 1:
            return -1
        return int(_first_foreign_key(ids, np.uint64(64 - _LOGICAL_BITS), self.num_servers, server))


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
