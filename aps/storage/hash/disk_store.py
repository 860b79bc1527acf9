"""One pserver's shard of a disk table (``HashTable(disk=Disk(ram_bytes))``): the hot rows in RAM
in a :class:`~.store.HashSparseStore`, the cold rows on local disk in :class:`~.cold.ColdRows`.

How a request goes: the keys the hot store lacks are looked up on disk in one batched read; the
rows found come into the hot store with their optimizer state and statistics, bitwise as they
went out; then the hot store answers the pull or applies the push exactly as an all-RAM table
does (admission, optimizer, statistics), so a disk table's rows equal an all-RAM table's after
the same pushes. Room for what comes in is made first: the rows least recently pulled or pushed
(a clock per hot row) go out to disk, never a row of the request being served.

Why least recently used rather than the accessor's score: a row comes back whenever it is asked
for, so the cost of a wrong choice is one read, and recency is what predicts the next read; the
score decides which keys a table keeps at all (shrink, ``max_keys``), not where they live.

What goes out is written only when needed: a row read from disk and not pushed since is still
on disk as it is (``in_cold`` and not ``dirty``), so it just leaves RAM. The victims are picked a
sixteenth of the hot rows at a time (one partial sort) and taken from that list as rooms are
needed, skipping rows touched since it was made.

Every method blocks on disk: the pserver runs them in a thread, one request of a table at a time
(aps/server/kinds/disk.py). A cap by ``max_keys``, TTL days and change tracking (GEO) are not
supported yet: the spec refuses the first two, and a GEO read of changed rows is refused.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from ...errors import ErrorCode, ServerError
from ...sharding import LogicalSharding
from ...specs import HashTable
from .cold import ColdRows
from .slab import most_that_fit
from .store import HashSparseStore, planned_nbytes

#: a hot row's bookkeeping besides its row and index entry: its clock (int64) and two flags
_ROW_EXTRA = 10
#: the share of the RAM budget the disk store's block cache and write buffers take, and its cap
_COLD_SHARE = 8
_COLD_CAP = 64 << 20
_NO_PENDING = (np.empty(0, np.int64), np.empty(0, np.int64))


def hot_keys(spec: HashTable) -> int:
    """Rows a shard of disk table ``spec`` keeps in RAM: what its budget has room for after the
    disk store's caches (its planned bytes, :func:`~.store.planned_nbytes`, plus the clock and
    flags of each row)."""
    assert spec.disk is not None
    room = spec.disk.ram_bytes - cold_cache_nbytes(spec)
    return most_that_fit(0, 1 << 31, lambda keys: planned_nbytes(spec, keys) + keys * _ROW_EXTRA <= room)


def cold_cache_nbytes(spec: HashTable) -> int:
    """RAM the disk store takes of the budget for its block cache and write buffers."""
    assert spec.disk is not None
    return min(spec.disk.ram_bytes // _COLD_SHARE, _COLD_CAP)


class DiskHashStore:
    """The keys one pserver holds of a disk table: hot rows in RAM, the rest in ``directory``."""

    def __init__(self, spec: HashTable, directory: Path) -> None:
        if spec.disk is None:
            raise ValueError(f"table {spec.name!r} is not a disk table")
        self.spec = spec
        capacity = hot_keys(spec)
        if capacity < 1024:
            raise ServerError(ErrorCode.TOO_LARGE, f"table {spec.name!r}: disk.ram_bytes={spec.disk.ram_bytes} holds "
                              f"{capacity} hot rows; give it room for at least 1024")
        #: the hot rows: an all-RAM hash store of the same table, held to ``capacity`` keys
        self.hot = HashSparseStore(replace(spec, disk=None), rows=capacity, key_limit=capacity)
        self.cold = ColdRows(directory, self.hot.row_nbytes, cold_cache_nbytes(spec))
        self.capacity = capacity
        self.touched = np.zeros(capacity, np.int64)  # the clock at each hot row's last request
        self.in_cold = np.zeros(capacity, np.bool_)  # its row is on disk too (as read, unless dirty)
        self.dirty = np.zeros(capacity, np.bool_)  # pushed since it came from disk
        self.clock = 0
        self.cold_keys = 0  # keys on disk
        self.hot_in_cold = 0  # hot keys that are on disk too
        self.paged_in = self.paged_out = self.written_out = 0
        self._queue_keys = self._queue_rows = np.empty(0, np.int64)  # victims planned, coldest first
        self._queue_clock = 0  # the clock when they were planned

    @property
    def name(self) -> str:
        return self.spec.name

    def __len__(self) -> int:
        """Keys held, in RAM or on disk."""
        return len(self.hot) + self.cold_keys - self.hot_in_cold

    # ------------------------------------------------------------ requests

    def pull(self, keys: np.ndarray) -> np.ndarray:
        """Rows of ``keys`` as :meth:`HashSparseStore.pull`; those on disk come into RAM (a pull
        of more keys than half the hot rows, a step of that many at a time)."""
        step = max(1, self.capacity // 2)
        if keys.shape[0] <= step:
            self._bring_in(keys, admitting=False)
            return self.hot.pull(keys)
        return np.concatenate([self.pull(keys[at : at + step]) for at in range(0, keys.shape[0], step)])

    def push_grad(self, keys: np.ndarray, grads: np.ndarray, **kwargs: object) -> int:
        """:meth:`HashSparseStore.push_grad` after the keys on disk come into RAM."""
        self._bring_in(keys, admitting=True)
        admitted = self.hot.push_grad(keys, grads, **kwargs)  # type: ignore[arg-type]
        self._mark_dirty(keys)
        return admitted

    def push_delta(self, keys: np.ndarray, deltas: np.ndarray, **kwargs: object) -> int:
        """:meth:`HashSparseStore.push_delta` after the keys on disk come into RAM."""
        self._bring_in(keys, admitting=True)
        admitted = self.hot.push_delta(keys, deltas, **kwargs)  # type: ignore[arg-type]
        self._mark_dirty(keys)
        return admitted

    def _mark_dirty(self, keys: np.ndarray) -> None:
        rows = self.hot.index.lookup(np.asarray(keys, np.int64))
        self.dirty[rows[rows >= 0]] = True

    def _bring_in(self, keys: np.ndarray, admitting: bool) -> None:
        """Read the rows of ``keys`` on disk into RAM (one batched read), making room for them
        and, for a push (``admitting``), for every key it may admit."""
        keys = np.asarray(keys, np.int64)
        self.clock += 1
        rows = self.hot.index.lookup(keys)
        held = rows[rows >= 0]
        self.touched[held] = self.clock
        absent = np.unique(keys[rows < 0])
        if not absent.size:
            return
        if self.cold_keys:
            found, records = self.cold.fetch(absent)
        else:
            found, records = np.zeros(absent.shape[0], np.bool_), np.empty((0, self.hot.row_nbytes), np.uint8)
        incoming = absent.size if admitting else int(found.sum())
        self._make_room(incoming, held)
        if records.shape[0]:
            came = absent[found]
            self.hot.restore(came, self._unpacked(records), _NO_PENDING)
            new_rows = self.hot.index.lookup(came)
            self.touched[new_rows] = self.clock
            self.in_cold[new_rows] = True
            self.dirty[new_rows] = False
            self.hot_in_cold += came.shape[0]
            self.paged_in += came.shape[0]

    # ------------------------------------------------------------ rows going out

    def _make_room(self, incoming: int, protected: np.ndarray) -> None:
        """Send the least recently used hot rows to disk until ``incoming`` more keys fit, never a
        row in ``protected`` (the request's own)."""
        short = incoming - (self.capacity - len(self.hot))
        if short <= 0:
            return
        if short > self.capacity - protected.size:
            raise ServerError(ErrorCode.TOO_LARGE, f"table {self.name!r}: one request needs {incoming + protected.size} "
                              f"rows in RAM, more than the {self.capacity} its disk.ram_bytes holds")
        guard = np.zeros(self.capacity, np.bool_)
        guard[protected] = True
        keys, rows = self._victims(short, guard)
        self._send_out(keys, rows)

    def _victims(self, count: int, guard: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``count`` hot rows to send out, coldest first, none in ``guard`` (keys, rows): from the
        planned list while it lasts (skipping rows gone or touched since), else from a new plan."""
        got_keys: list[np.ndarray] = []
        got_rows: list[np.ndarray] = []
        need = count
        for fresh in (False, True):
            if fresh or not self._queue_rows.size:
                self._plan(max(need, self.capacity // 16), guard)
            keys, rows = self._queue_keys, self._queue_rows
            usable = (~guard[rows]) & (self.touched[rows] <= self._queue_clock) & (self.hot.index.lookup(keys) == rows)
            take = np.flatnonzero(usable)[:need]
            got_keys.append(keys[take])
            got_rows.append(rows[take])
            guard[rows[take]] = True  # a new plan must not list them again
            used = int(take[-1]) + 1 if take.size == need else rows.size
            self._queue_keys, self._queue_rows = keys[used:], rows[used:]
            need -= take.size
            if not need:
                break
        keys, rows = np.concatenate(got_keys), np.concatenate(got_rows)
        if keys.size < count:
            raise ServerError(ErrorCode.INTERNAL, f"table {self.name!r}: found {keys.size} of {count} rows to send to disk")
        return keys, rows

    def _plan(self, count: int, guard: np.ndarray) -> None:
        """List the ``count`` least recently used hot rows outside ``guard``, coldest first."""
        keys, rows = self.hot.index.items()
        free = ~guard[rows]
        keys, rows = keys[free], rows[free]
        if count < rows.size:
            pick = np.argpartition(self.touched[rows], count)[:count]
            keys, rows = keys[pick], rows[pick]
        order = np.argsort(self.touched[rows], kind="stable")
        self._queue_keys, self._queue_rows = keys[order], rows[order]
        self._queue_clock = self.clock

    def _send_out(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Write the rows that disk lacks or holds stale, then drop all of them from RAM."""
        write = ~self.in_cold[rows] | self.dirty[rows]
        if write.any():
            self.cold.write(keys[write], self._packed(rows[write]))
            self.written_out += int(write.sum())
        already = int(self.in_cold[rows].sum())
        self.cold_keys += rows.size - already
        self.hot_in_cold -= already
        self.hot.index.delete(keys)
        self.in_cold[rows] = False
        self.dirty[rows] = False
        self.paged_out += rows.size

    # ------------------------------------------------------------ records

    def _byte_views(self) -> list[np.ndarray]:
        """Each slab array as uint8[capacity, its row's bytes] (views of the live arrays)."""
        return [arr.view(np.uint8).reshape(arr.shape[0], -1) for arr in self.hot.slab.arrays()]

    def _packed(self, rows: np.ndarray) -> np.ndarray:
        """The records of hot ``rows``: every slab array's row bytes, one after the other."""
        return np.concatenate([view[rows] for view in self._byte_views()], axis=1)

    def _unpacked(self, records: np.ndarray) -> dict[str, np.ndarray]:
        """Records as the hot store's arrays by name (:meth:`HashSparseStore.slab_arrays`)."""
        n, at = records.shape[0], 0

        def take(arr: np.ndarray) -> np.ndarray:
            nonlocal at
            width = arr.itemsize * int(np.prod(arr.shape[1:]))
            out = records[:, at : at + width].copy().view(arr.dtype).reshape(n, *arr.shape[1:])
            at += width
            return out

        slab = self.hot.slab
        arrays = {"values": take(slab.values), **{name: take(arr) for name, arr in slab.state.items()}}
        stats = take(self.hot.stats)
        return {**arrays, **{field: stats[field] for field in stats.dtype.names or ()}}

    # ------------------------------------------------------------ the whole table

    def logical_rows(self, logical: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Every key of logical shard ``logical`` with its row by name (as
        :meth:`HashSparseStore.slab_arrays`), those in RAM over their copies on disk."""
        keys, _ = self.hot.index.items()
        hot = keys[LogicalSharding.logical(keys) == logical]
        all_keys, parts = [hot], [self.hot.rows_of(hot)]
        for cold_keys, records in self.cold.walk(logical):
            keep = ~np.isin(cold_keys, hot, assume_unique=True)
            all_keys.append(cold_keys[keep])
            parts.append(self._unpacked(records[keep]))
        return np.concatenate(all_keys), {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    # ------------------------------------------------------------ reports

    @property
    def nbytes(self) -> int:
        """Bytes in RAM: the hot store, each hot row's clock and flags, and the disk store's
        caches, write buffers, bloom filters and block indexes."""
        return int(self.hot.nbytes + self.touched.nbytes + self.in_cold.nbytes + self.dirty.nbytes + self.cold.ram_nbytes)

    @property
    def disk_nbytes(self) -> int:
        """Bytes of the cold rows' files on disk."""
        return self.cold.disk_nbytes

    def counts(self) -> dict[str, int]:
        """TABLE_INFO's and STATS' numbers (as :meth:`HashSparseStore.counts`), with the keys
        ``hot_keys`` in RAM, ``disk_bytes`` and the rows brought in and sent out."""
        hot = self.hot.counts()
        return {**hot, "keys": len(self), "bytes": self.nbytes, "disk_bytes": self.disk_nbytes, "hot_keys": len(self.hot),
                "paged_in": self.paged_in, "paged_out": self.paged_out}

    def close(self) -> None:
        """Close the disk store (a table dropped or replaced by a load)."""
        self.cold.destroy()
