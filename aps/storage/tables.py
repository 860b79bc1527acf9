"""Table storage on one pserver: a shard of a sparse table, or some blocks of a dense one.

Pure data structures — no asyncio, no sockets — so the server's network layer stays a thin
dispatcher and everything here is testable with plain arrays.

Every request is validated before any byte of state changes (dtype, shape, id range), and a bad
request raises :class:`~aps.errors.ServerError` with the code the wire reply will carry and a
message naming the table and the offending id or shape. A half-applied push is therefore
impossible: either the whole push is applied or none of it.
"""

from __future__ import annotations

import math
import time
from typing import Any, ClassVar, Union

import numpy as np
import structlog

from ..errors import ErrorCode, ServerError
from ..sharding import UNSHARDED, DenseBlock, ModuloSharding, dense_blocks
from ..specs import DenseTable, SparseTable, TableSpec
from . import optim
from .init_kernels import init_dense, init_sparse_rows, table_seed
from .table_classes import BySpecClass
from .tracking import ChangeTracking

log = structlog.get_logger("aps.server")
#: seconds between two log lines about keys refused over a size budget (the first comes at once)
REFUSED_LOG_EVERY = 10.0


def _bad(code: ErrorCode, table: str, message: str) -> ServerError:
    return ServerError(code, f"table {table!r}: {message}")


def _check_ids(table: str, ids: object, limit: int, shard: int, sharding: ModuloSharding) -> np.ndarray:
    """Local row ids as a contiguous int64[n], all in ``[0, limit)`` (server ``shard``'s rows of
    a table sharded by ``sharding``, which the refusal names by global id)."""
    if not isinstance(ids, np.ndarray) or ids.dtype != np.int64:
        kind = ids.dtype if isinstance(ids, np.ndarray) else type(ids).__name__
        raise _bad(ErrorCode.BAD_REQUEST, table, f"ids must be an int64 array, got {kind}")
    if ids.ndim != 1:
        raise _bad(ErrorCode.SHAPE_MISMATCH, table, f"ids must be 1-D, got shape {ids.shape}")
    ids = np.ascontiguousarray(ids)
    at = UNSHARDED.first_bad_id(ids, limit, 0)  # one compiled pass, cheaper than min + max on small requests
    if at >= 0:
        bad = int(ids[at])
        raise _bad(
            ErrorCode.ID_OUT_OF_RANGE, table,
            f"local id {bad} (global id {sharding.global_ids(bad, shard)}) is outside [0, {limit}) "
            f"on shard {shard} of {sharding.num_servers}",
        )
    return ids


def _check_float32(table: str, values: object, what: str) -> np.ndarray:
    """``values`` as a contiguous float32 array (any shape)."""
    if not isinstance(values, np.ndarray) or values.dtype != np.float32:
        kind = values.dtype if isinstance(values, np.ndarray) else type(values).__name__
        raise _bad(ErrorCode.BAD_REQUEST, table, f"{what} must be a float32 array, got {kind}")
    return np.ascontiguousarray(values)


def _check_values(table: str, values: object, shape: tuple[int, ...], what: str) -> np.ndarray:
    """``values`` as a contiguous float32 array of exactly ``shape``."""
    arr = _check_float32(table, values, what)
    if arr.shape != shape:
        raise _bad(ErrorCode.SHAPE_MISMATCH, table, f"{what} shape {arr.shape} does not match expected {shape}")
    return arr


def _check_scale(table: str, scale: float) -> float:
    scale = float(scale)
    if not math.isfinite(scale):
        raise _bad(ErrorCode.BAD_REQUEST, table, f"scale must be finite, got {scale}")
    return scale


def _load_arrays(table: str, target: dict[str, np.ndarray], arrays: dict[str, np.ndarray]) -> None:
    """Copy ``arrays`` into ``target`` after checking names, shapes and dtypes all match."""
    if set(arrays) != set(target):
        raise _bad(ErrorCode.BAD_REQUEST, table, f"state arrays {sorted(arrays)} do not match {sorted(target)}")
    for name, dst in target.items():
        src = arrays[name]
        if src.shape != dst.shape or src.dtype != dst.dtype:
            raise _bad(
                ErrorCode.SHAPE_MISMATCH, table,
                f"state {name!r} is {src.dtype}{list(src.shape)}, expected {dst.dtype}{list(dst.shape)}",
            )
    for name, dst in target.items():
        dst[...] = arrays[name]


class SparseShard(ChangeTracking):
    """Server ``shard``'s rows of a sparse table (:class:`~aps.sharding.ModuloSharding`), plus
    optimizer state.

    ``step`` counts completed optimizer applications on this shard (it drives lr decay).
    Change tracking (GEO): each tracked client has a bitmap, one bit per local row, of rows
    changed by *other* clients since its last :meth:`changed` call (tracking.py bounds how many
    the server keeps).
    """

    #: the spec of the tables whose shards these are (:func:`make_shard` looks it up)
    spec_type: ClassVar[type[TableSpec]] = SparseTable

    @staticmethod
    def new_nbytes(spec: SparseTable, shard: int, num_shards: int) -> int:
        """Bytes a new shard ``shard`` of ``spec`` allocates (see :func:`shard_nbytes`)."""
        rows = ModuloSharding(num_shards).local_row_count(spec.rows, shard)
        steps = rows * 8 if optim.row_steps(spec.optimizer) else 0
        state_columns = optim.state_columns(spec.optimizer, spec.dim) * len(optim.state_names(spec.optimizer))
        return rows * 4 * (spec.dim + state_columns) + steps

    @classmethod
    def create(cls, spec: SparseTable, shard: int, num_shards: int, *, initialise: bool = True) -> SparseShard:
        """Server ``shard``'s part of ``spec`` among ``num_shards`` (see :func:`make_shard`)."""
        return cls(spec, shard, num_shards, initialise=initialise)

    def __init__(self, spec: SparseTable, shard: int, num_shards: int, *, initialise: bool = True) -> None:
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard {shard} is not in [0, {num_shards})")
        self.spec = spec
        self.shard = shard
        #: which rows are this shard's and where (aps/sharding.py)
        self.sharding = ModuloSharding(num_shards)
        self.local_rows = self.sharding.local_row_count(spec.rows, shard)
        if initialise:
            self.values = init_sparse_rows(
                spec.init, table_seed(spec.name, spec.seed), self.global_ids(), spec.dim
            )
        else:  # about to be overwritten by a checkpoint: skip the hashing work
            self.values = np.zeros((self.local_rows, spec.dim), dtype=np.float32)
        self.state = optim.new_sparse_state(spec.optimizer, self.local_rows, spec.dim)
        self.step = 0
        self._init_tracking(self.local_rows)

    @property
    def name(self) -> str:
        return self.spec.name

    def global_ids(self, local_ids: np.ndarray | None = None) -> np.ndarray:
        """Global row ids of ``local_ids`` (all local rows by default)."""
        if local_ids is None:
            local_ids = np.arange(self.local_rows, dtype=np.int64)
        return self.sharding.global_ids(np.asarray(local_ids, dtype=np.int64), self.shard)

    # ------------------------------------------------------------ data path

    def pull(self, local_ids: np.ndarray, *, checked: bool = False) -> np.ndarray:
        """A copy of the rows ``local_ids``, float32[n, dim].

        ``checked``: the ids were validated at the server edge (ServerCore, one compiled pass
        over the global ids) and are a contiguous int64[n] in range; they are not checked again."""
        ids = local_ids if checked else _check_ids(self.name, local_ids, self.local_rows, self.shard, self.sharding)
        return self.values.take(ids, axis=0)  # the method: np.take adds ~0.5 us of dispatch

    def push_grad(
        self,
        local_ids: np.ndarray,
        grads: np.ndarray,
        *,
        scale: float = 1.0,
        advance_step: bool = True,
        client: int | None = None,
        checked: bool = False,
        ordered: bool = False,
    ) -> None:
        """Apply the table's optimizer to ``grads * scale`` (duplicate ids summed first).

        ``advance_step=False`` lets a client split one logical push into chunks that all use the
        same learning rate; the last chunk advances the step. ``checked``: as for :meth:`pull`.
        ``ordered``: the server edge found the ids ascending (only with ``checked``); the
        optimizer kernel then neither checks their order nor sorts them.
        """
        ids = local_ids if checked else _check_ids(self.name, local_ids, self.local_rows, self.shard, self.sharding)
        g = _check_values(self.name, grads, (ids.shape[0], self.spec.dim), "grads")
        scale = _check_scale(self.name, scale)
        optim.apply_sparse(self.spec.optimizer, self.values, self.state, ids, g, scale, self.step, checked and ordered)
        if advance_step:
            self.step += 1
        self._mark(ids, client)

    def push_delta(
        self,
        local_ids: np.ndarray,
        deltas: np.ndarray,
        *,
        client: int | None = None,
        checked: bool = False,
        ordered: bool = False,
    ) -> None:
        """``param += delta`` per row, duplicates summed; no optimizer, no step (GEO mode);
        ``checked`` and ``ordered``: as for :meth:`push_grad`."""
        ids = local_ids if checked else _check_ids(self.name, local_ids, self.local_rows, self.shard, self.sharding)
        d = _check_values(self.name, deltas, (ids.shape[0], self.spec.dim), "deltas")
        optim.add_rows(self.values, ids, d, checked and ordered)
        self._mark(ids, client)

    def changed_rows(self, local_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(global ids, rows) of ``local_ids``: what a changed-row read sends."""
        return self.global_ids(local_ids), self.pull(local_ids, checked=True)

    def all_rows(self) -> np.ndarray:
        """Every local row: what a client whose tracking was dropped reads next."""
        return np.arange(self.local_rows, dtype=np.int64)

    # ------------------------------------------------------------ bookkeeping

    @property
    def nbytes(self) -> int:
        """Bytes held: values, optimizer state and change-tracking bitmaps."""
        return int(
            self.values.nbytes
            + sum(a.nbytes for a in self.state.values())
            + self.tracking_nbytes
        )

    def state_arrays(self) -> dict[str, np.ndarray]:
        """``{"values": ..., <optimizer state>...}``, row-indexed on axis 0 (live arrays, not copies)."""
        return {"values": self.values, **self.state}

    def load_state(self, arrays: dict[str, np.ndarray], step: int | None = None) -> None:
        """Overwrite values and optimizer state (same names and shapes as :meth:`state_arrays`)."""
        _load_arrays(self.name, self.state_arrays(), arrays)
        if step is not None:
            self.step = int(step)


class DenseShard:
    """The blocks of a dense table that one pserver owns, each with its own optimizer state.

    Blocks are independent: each has its own step counter (lr decay, Adam's ``t``), so a block's
    updates never depend on which other blocks share its server.
    """

    #: the spec of the tables whose shards these are (:func:`make_shard` looks it up)
    spec_type: ClassVar[type[TableSpec]] = DenseTable

    @staticmethod
    def own_blocks(spec: DenseTable, shard: int, num_shards: int) -> list[DenseBlock]:
        """The blocks of ``spec`` that server ``shard`` of ``num_shards`` holds."""
        return [b for b in dense_blocks(spec.name, spec.size, num_shards) if b.server == shard]

    @staticmethod
    def new_nbytes(spec: DenseTable, shard: int, num_shards: int) -> int:
        """Bytes a new shard ``shard`` of ``spec`` allocates (see :func:`shard_nbytes`)."""
        return sum(b.size for b in DenseShard.own_blocks(spec, shard, num_shards)) * 4 * _arrays(spec)

    @classmethod
    def create(cls, spec: DenseTable, shard: int, num_shards: int, *, initialise: bool = True) -> DenseShard:
        """Server ``shard``'s blocks of ``spec`` among ``num_shards`` (see :func:`make_shard`)."""
        return cls(spec, cls.own_blocks(spec, shard, num_shards), initialise=initialise)

    def __init__(self, spec: DenseTable, blocks: list[DenseBlock], *, initialise: bool = True) -> None:
        self.spec = spec
        self.blocks: dict[int, DenseBlock] = {}
        self.values: dict[int, np.ndarray] = {}
        self.state: dict[int, dict[str, np.ndarray]] = {}
        self.steps: dict[int, int] = {}
        seed = table_seed(spec.name, spec.seed)
        for block in blocks:
            if block.index in self.blocks:
                raise ValueError(f"table {spec.name!r}: block {block.index} given twice")
            if not 0 <= block.start < block.stop <= spec.size:
                raise ValueError(f"table {spec.name!r}: block {block} outside [0, {spec.size})")
            self.blocks[block.index] = block
            self.values[block.index] = (
                init_dense(spec.init, seed, block.start, block.stop)
                if initialise
                else np.zeros(block.size, dtype=np.float32)
            )
            self.state[block.index] = optim.new_dense_state(spec.optimizer, block.size)
            self.steps[block.index] = 0

    @property
    def name(self) -> str:
        return self.spec.name

    def _block(self, block_index: int, offset: int, count: int) -> DenseBlock:
        """The block, after checking ``[offset, offset + count)`` lies inside it."""
        block = self.blocks.get(int(block_index))
        if block is None:
            raise _bad(
                ErrorCode.ID_OUT_OF_RANGE, self.name,
                f"block {block_index} is not held here (held: {sorted(self.blocks)})",
            )
        if offset < 0 or count < 0 or offset + count > block.size:
            raise _bad(
                ErrorCode.ID_OUT_OF_RANGE, self.name,
                f"range [{offset}, {offset + count}) is outside block {block.index} of size {block.size}",
            )
        return block

    def _check_flat(self, values: object, what: str) -> np.ndarray:
        arr = _check_float32(self.name, values, what)
        if arr.ndim != 1:
            raise _bad(ErrorCode.SHAPE_MISMATCH, self.name, f"{what} must be 1-D, got shape {arr.shape}")
        return arr

    # ------------------------------------------------------------ data path

    def check_range(self, block_index: int, offset: int, count: int) -> None:
        """Refuse a range that is not inside a block this shard holds (what :meth:`pull` and
        the pushes refuse), without touching the values."""
        self._block(block_index, int(offset), int(count))

    def pull(self, block_index: int, offset: int, count: int) -> np.ndarray:
        """A copy of elements ``[offset, offset + count)`` of a block, float32[count]."""
        offset, count = int(offset), int(count)
        block = self._block(block_index, offset, count)
        return self.values[block.index][offset : offset + count].copy()

    def push_grad(
        self,
        block_index: int,
        offset: int,
        values: np.ndarray,
        *,
        scale: float = 1.0,
        advance_step: bool = True,
    ) -> None:
        """Apply the optimizer to a (sub-)range of a block; chunks pass ``advance_step=False``."""
        g = self._check_flat(values, "grads")
        block = self._block(block_index, int(offset), g.shape[0])
        scale = _check_scale(self.name, scale)
        i = block.index
        optim.apply_dense(self.spec.optimizer, self.values[i], self.state[i], int(offset), g, scale, self.steps[i])
        if advance_step:
            self.steps[i] += 1

    def push_delta(self, block_index: int, offset: int, values: np.ndarray) -> None:
        """``param += delta`` on a (sub-)range of a block (GEO mode)."""
        d = self._check_flat(values, "deltas")
        block = self._block(block_index, int(offset), d.shape[0])
        optim.add_dense(self.values[block.index], int(offset), d)

    # ------------------------------------------------------------ bookkeeping

    @property
    def nbytes(self) -> int:
        """Bytes held: values and optimizer state of every block."""
        return int(
            sum(v.nbytes for v in self.values.values())
            + sum(a.nbytes for s in self.state.values() for a in s.values())
        )

    def state_arrays(self) -> dict[str, np.ndarray]:
        """``{"b{index}.values": ..., "b{index}.<state>": ...}`` for every block (live arrays)."""
        out: dict[str, np.ndarray] = {}
        for i in sorted(self.blocks):
            out[f"b{i}.values"] = self.values[i]
            for name, arr in self.state[i].items():
                out[f"b{i}.{name}"] = arr
        return out

    def load_state(self, arrays: dict[str, np.ndarray], steps: dict[int, int] | None = None) -> None:
        """Overwrite every block's values and state (names as in :meth:`state_arrays`)."""
        _load_arrays(self.name, self.state_arrays(), arrays)
        if steps is not None:
            if set(steps) != set(self.blocks):
                raise _bad(ErrorCode.BAD_REQUEST, self.name, f"steps for blocks {sorted(steps)}, held {sorted(self.blocks)}")
            self.steps = {int(k): int(v) for k, v in steps.items()}


Shard = Union[SparseShard, DenseShard]
#: the shard class of each spec made here (a hash table's store is aps.storage.hash.store's)
_SHARDS: BySpecClass[Any] = BySpecClass([SparseShard, DenseShard])


def _arrays(spec: SparseTable | DenseTable) -> int:
    """Float32 arrays a shard of ``spec`` holds per value: the values and the optimizer's state."""
    return 1 + len(optim.state_names(spec.optimizer))


def _shard_class(spec: TableSpec) -> Any:
    found = _SHARDS.for_spec(spec)
    if found is None:
        raise TypeError(f"unknown table spec {spec!r}")
    return found


def shard_nbytes(spec: TableSpec, shard: int, num_shards: int) -> int:
    """Bytes that :func:`make_shard` would allocate for server ``shard``'s part of ``spec``:
    float32 values plus the optimizer's state arrays, plus per-row Adam's int64 step per sparse row.
    Computed from the spec alone, so a table can be refused before anything is allocated."""
    return int(_shard_class(spec).new_nbytes(spec, shard, num_shards))


def make_shard(spec: TableSpec, shard: int, num_shards: int, *, initialise: bool = True) -> Shard:
    """Server ``shard``'s part of table ``spec`` in a cluster of ``num_shards`` pservers."""
    return _shard_class(spec).create(spec, shard, num_shards, initialise=initialise)  # type: ignore[no-any-return]


class TablesBudget:
    """The bytes all of one pserver's table shards may take together (``--max-tables-bytes``;
    0: no limit), and what they take now.

    Why an object the shards share: a hash table grows as keys come, so a check when tables are
    created held nothing (20 M keys took 7x a 512 MiB budget). Fixed tables are counted once,
    as created; a hash shard claims, before its slab grows, the most its next slab and index
    may take (:func:`~aps.storage.hash.store.claim_nbytes`). Growth is rare (a doubling), so a
    push pays nothing for the budget until its new keys need a bigger slab, and then O(1)
    (:attr:`version` lets a shard refused once skip asking again until something changed).
    Not thread-safe, and needs not be: growth runs on the event loop or in the one upkeep
    thread the write gate lets run, never both at once."""

    def __init__(self, limit: int, *, log_every: float = REFUSED_LOG_EVERY) -> None:
        self.limit = int(limit)
        self.taken = 0
        #: changes at every take: a shard's refused growth stays refused until it moves
        self.version = 0
        self.log_every = log_every
        self._logged_at: float | None = None
        self._unlogged = 0

    @property
    def free(self) -> int:
        """Bytes not claimed yet (may be negative: a load brought more than the limit)."""
        return self.limit - self.taken if self.limit else 1 << 62

    def take(self, nbytes: int) -> None:
        """Count ``nbytes`` more as taken (negative: given back)."""
        self.taken += int(nbytes)
        self.version += 1

    def refused(self, table: str, occurrences: int, keys: int, key_limit: int) -> None:
        """Note pushed occurrences of new keys refused because a size budget is full: a
        warning at once the first time, then at most one per :attr:`log_every` seconds with the
        count since the last one (a push of new keys per request must not log per request)."""
        self._unlogged += occurrences
        now = time.monotonic()
        if self._logged_at is not None and now - self._logged_at < self.log_every:
            return
        log.warning("table size budget reached: new keys refused, held keys still train", table=table,
                    refused_since_last_line=self._unlogged, keys=keys, key_limit=key_limit,
                    max_tables_bytes=self.limit, tables_bytes=self.taken)
        self._logged_at, self._unlogged = now, 0
