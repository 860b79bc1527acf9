"""Who owns what: the mapping from sparse ids and dense elements to pservers.

This module is the one place that states the rules; everything else asks its objects. Both the
client (to split requests) and the server (to size its shard, check ownership and re-shard
checkpoints) hold a :class:`SparseSharding` value per sparse table, so the two can never
disagree.

* Fixed sparse tables (:class:`ModuloSharding`): row id ``r`` lives on server ``r % n`` at local
  row ``r // n``.
* Hash tables (:class:`LogicalSharding`): key ``k`` is mixed (splitmix64, :mod:`aps.mixer`, the
  hash index's own mixer) and the top 10 bits of the mix are its logical shard ``l`` in
  ``[0, 1024)``; logical shard ``l`` lives on server ``l % n``. Patterned keys (all even, all
  multiples of n) spread evenly, and a change from N to M pservers moves whole logical shards,
  never single keys.
* Dense: the flattened tensor is cut into at most ``n`` contiguous blocks of at least
  :data:`MIN_BLOCK` elements (Paddle's slice_variable rule); block ``b`` goes to server
  ``(start + b) % n`` where ``start`` is a stable hash of the table name, so many small tables
  spread over the servers instead of piling onto server 0.

Compiled kernels elsewhere that scan fixed-table ids (aps/storage/optim.py) take the rule for
one id from here too (:func:`row_owner`, :func:`row_local`).
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import numpy as np
from numba import njit

from .mixer import mix64
from .specs import TableSpec

#: smallest dense block, in elements (Paddle: 8192)
MIN_BLOCK = 8192
#: logical shards of every hash table: a power of two (a key's shard is the top bits of its mix,
#: so the hash index's probe start, the low bits, stays independent of the server it lands on);
#: 1024 spreads evenly over any pserver count up to a few hundred and keeps a checkpoint's
#: per-shard files few
LOGICAL_SHARDS = 1024
_LOGICAL_BITS = 10
#: a key's logical shard is its mix shifted right by this much
_LOGICAL_SHIFT = np.uint64(64 - _LOGICAL_BITS)
#: one id or an array of them
_Ids = TypeVar("_Ids", np.ndarray, int)


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


@njit(cache=True, nogil=True, inline="always")
def row_owner(r: int, num_servers: int) -> int:
    """The server of fixed-table row ``r``: :class:`ModuloSharding`'s rule for one id, for
    compiled scans of ids elsewhere (a kernel cannot call a method; aps/storage/optim.py)."""
    return r % num_servers


@njit(cache=True, nogil=True, inline="always")
def row_local(r: int, num_servers: int) -> int:
    """Fixed-table row ``r``'s local row on its server, as :func:`row_owner` (one id, compiled)."""
    return r // num_servers


@njit(cache=True, nogil=True)
def _first_bad_id(ids: np.ndarray, rows: int, num_servers: int, server: int) -> int:
    for i in range(ids.shape[0]):
        r = ids[i]
        if r < 0 or r >= rows or row_owner(r, num_servers) != server:
            return i
    return -1


@dataclass(frozen=True)
class SparseSharding(ABC):
    """Which pserver owns each id of one sparse table: the one value both ends hold (ps-lite's
    slicer: one object decides ownership for the client's split, the server's checks and the
    checkpoints' re-sharding, so none of them restates the rule).

    Build it from a spec with :meth:`of`: a :class:`ModuloSharding` for fixed tables, a
    :class:`LogicalSharding` for hash tables. The client splits requests with :meth:`group`.
    """

    num_servers: int
    #: whether :meth:`group`'s kernel takes a key's logical shard before the modulo
    _HASHED: ClassVar[bool]

    def __post_init__(self) -> None:
        if self.num_servers <= 0:
            raise ValueError("num_servers must be positive")

    @staticmethod
    def of(spec: TableSpec, num_servers: int) -> SparseSharding:
        """The sharding of table ``spec`` over ``num_servers`` pservers."""
        if spec.keyed:
            return LogicalSharding(num_servers)
        return ModuloSharding(num_servers)

    @abstractmethod
    def owners(self, ids: np.ndarray) -> np.ndarray:
        """The server of each id (int64 array)."""

    def group(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(order, bounds)``: ``ids[order[bounds[k]:bounds[k + 1]]]`` are server k's ids, in the
        caller's order. One compiled counting pass (a stable argsort of the owners costs
        n log n and several temporaries on every sharded pull and push)."""
        order = np.empty(ids.shape[0], np.int64)
        bounds = np.zeros(self.num_servers + 1, np.int64)
        _group(np.ascontiguousarray(ids, dtype=np.int64), self._HASHED, _LOGICAL_SHIFT, self.num_servers, order, bounds)
        return order, bounds


@dataclass(frozen=True)
class ModuloSharding(SparseSharding):
    """Fixed sparse tables: row id ``r`` lives on server ``r % num_servers`` as its local row
    ``r // num_servers``, so server k holds rows ``k, k + n, k + 2n, ...`` in that order."""

    _HASHED = False

    def owners(self, ids: np.ndarray) -> np.ndarray:
        return ids % self.num_servers  # type: ignore[no-any-return]

    def local_rows(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row on the server that owns it."""
        return ids // self.num_servers  # type: ignore[no-any-return]

    def global_ids(self, local_rows: _Ids, server: int) -> _Ids:
        """The ids of ``server``'s ``local_rows`` (the inverse of :meth:`local_rows`)."""
        return server + self.num_servers * local_rows

    def rows_of(self, server: int) -> slice:
        """``server``'s rows as a slice of the whole table, in local row order (a strided copy
        puts a server's part in place, no index array)."""
        return slice(server, None, self.num_servers)

    def local_row_count(self, rows: int, server: int) -> int:
        """How many rows of a ``rows``-row table ``server`` stores."""
        if rows <= server:
            return 0
        return (rows - server + self.num_servers - 1) // self.num_servers

    def first_bad_id(self, ids: np.ndarray, rows: int, server: int) -> int:
        """Index of the first id outside ``[0, rows)`` or not owned by ``server``, or -1.

        One compiled pass: on the small-request path this replaces several numpy reductions
        whose fixed overhead dominated a one-id pull."""
        return int(_first_bad_id(ids, rows, self.num_servers, server))


#: a table on one server: its ownership check is the range check alone (built once, for checks
#: on the small-request path)
UNSHARDED = ModuloSharding(1)


@dataclass(frozen=True)
class LogicalSharding(SparseSharding):
    """Hash tables: key ``k``'s logical shard is the top bits of its mix (:meth:`logical`), and
    logical shard ``l`` lives on server ``l % num_servers`` (:meth:`server_of`)."""

    _HASHED = True

    @staticmethod
    def logical(keys: np.ndarray) -> np.ndarray:
        """Each hash key's logical shard in ``[0, LOGICAL_SHARDS)`` (int64 keys, any value)."""
        out = np.empty(keys.shape[0], np.int64)
        _logical_shards(keys, _LOGICAL_SHIFT, out)
        return out

    def owners(self, ids: np.ndarray) -> np.ndarray:
        return self.logical(ids) % self.num_servers  # type: ignore[no-any-return]

    def server_of(self, logical_shard: int) -> int:
        """The server that holds logical shard ``logical_shard``."""
        return logical_shard % self.num_servers

    def logical_shards_of(self, server: int) -> range:
        """The logical shards ``server`` holds, ascending."""
        return range(server, LOGICAL_SHARDS, self.num_servers)

    def first_foreign(self, keys: np.ndarray, server: int) -> int:
        """Index of the first key not owned by ``server``, or -1 (one compiled pass)."""
        if self.num_servers == 1:
            return -1
        return int(_first_foreign_key(keys, _LOGICAL_SHIFT, self.num_servers, server))
