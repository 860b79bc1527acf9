"""A trainer's bounded local replica of one hash table, for geo mode (docs/modes.md, "geo").

Geo trains on a persistent local copy of every row and exchanges ``local - old`` every
``k_steps``. A fixed table's copy is the table itself, indexed by id; a hash table's keys are
any int64, so its copy is a cache of ``capacity`` rows: the key -> row index is an
open-addressing :class:`~aps.storage.hash.index.HashIndex` (numba kernels, no Python dict per
key), ``local`` is the shared array the workers train on (Hogwild), ``old`` the baseline of the
next delta, kept by the trainer alone.

Only the trainer's event loop calls this object, so it needs no lock; the workers only write
``local`` rows, add the shows and clicks their batches saw to ``counts`` and then set the rows'
``dirty`` flags (after writing, as on a fixed table), so an exchange that finds a flag finds the
counts of the steps behind it. A row a
worker may still write is *pinned* (a batch in flight maps to it) and is never evicted: the
cache evicts the unpinned rows least recently mapped, after taking their pending delta
(:attr:`Evicted.deltas`, what the next exchange would have sent), so no trained step is lost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from ..errors import ApsError, ConfigError
from ..specs import HashTable
from ..storage.hash.index import HashIndex
from .kernels import geo_apply, geo_delta

#: the default rows of a hash table's geo cache when its pservers set no ``max_keys`` bound
DEFAULT_ROWS = 1 << 20
#: a full cache evicts at least this share of its rows at once, so that finding the least
#: recently used rows (a pass over the cache) is paid once per that many new keys
EVICT_SHARE = 16


def min_rows(workers: int, max_ids: int) -> int:
    """The fewest rows a cache can have: every worker may have two batches pinned (the one it
    computes and the one whose rows it asked for meanwhile)."""
    return 2 * max(1, workers) * max_ids


def cache_rows(spec: HashTable, workers: int, max_ids: int, num_servers: int, rows: int | None) -> int:
    """Rows of ``spec``'s geo cache: ``rows`` if given (at least :func:`min_rows`), else the
    keys the pservers may hold (``max_keys`` per pserver times the pservers) up to
    :data:`DEFAULT_ROWS`, and never fewer than twice :func:`min_rows`."""
    floor = min_rows(workers, max_ids)
    if rows is not None:
        if rows < floor:
            raise ConfigError(
                f"geo_cache_rows {rows} is too small for hash table {spec.name!r}: {workers} workers "
                f"x 2 batches x {max_ids} keys may be in flight; use at least {floor}"
            )
        return rows
    held = DEFAULT_ROWS if spec.max_keys is None else min(DEFAULT_ROWS, spec.max_keys * max(1, num_servers))
    return max(held, 2 * floor)


@dataclass(frozen=True)
class CacheCounts:
    """How a trainer's geo caches fare, summed over its hash tables (progress and epoch records,
    Prometheus): a cache too small for the keys a run reads evicts rows and pulls them again,
    which shows in ``wait_share`` but only these numbers say why.

    ``evictions``: rows evicted because the cache was full; ``evicted_deltas``: those of them
    whose pending delta was pushed on eviction; ``held``: rows held now; ``capacity``: rows."""

    evictions: int = 0
    evicted_deltas: int = 0
    held: int = 0
    capacity: int = 0

    def __add__(self, other: CacheCounts) -> CacheCounts:
        return CacheCounts(
            self.evictions + other.evictions,
            self.evicted_deltas + other.evicted_deltas,
            self.held + other.held,
            self.capacity + other.capacity,
        )


@dataclass
class Evicted:
    """What leaving the cache took from rows that had trained steps not yet sent: their keys,
    ``(local - old) * scale`` and their shows and clicks (to push as deltas, like an exchange's)."""

    keys: np.ndarray
    deltas: np.ndarray
    counts: np.ndarray


@njit(cache=True, nogil=True)
def _pin(rows: np.ndarray, pins: np.ndarray, last_use: np.ndarray, stamp: int) -> None:
    for j in range(rows.shape[0]):
        r = rows[j]
        pins[r] += 1
        last_use[r] = stamp


@njit(cache=True, nogil=True)
def _unpin(rows: np.ndarray, pins: np.ndarray) -> None:
    for j in range(rows.shape[0]):
        pins[rows[j]] -= 1


class LocalCache:
    """Key -> row of a bounded replica of one hash table (see the module).

    ``local`` (float32 ``[capacity, dim]``), ``dirty`` (uint8 ``[capacity]``) and ``counts``
    (float32 ``[capacity, 2]``: shows and clicks since the row's last delta) are the shared
    arrays the workers write."""

    def __init__(self, name: str, local: np.ndarray, dirty: np.ndarray, counts: np.ndarray) -> None:
        self.name = name
        self.local = local
        self.dirty = dirty
        self.counts = counts
        capacity = local.shape[0]
        self.index = HashIndex(capacity)
        self.old = np.zeros_like(local)
        #: each row's key (meaningful where :attr:`held`)
        self.keys = np.zeros(capacity, np.int64)
        self.held = np.zeros(capacity, np.bool_)
        #: batches in flight that map to each row: a pinned row is never evicted
        self.pins = np.zeros(capacity, np.int32)
        #: the :meth:`admit` call that last mapped each row (least recently used goes first)
        self.last_use = np.zeros(capacity, np.int64)
        self._stamp = 0
        #: rows evicted so far, and those of them whose pending delta was pushed on eviction
        self.evictions = 0
        self.evicted_deltas = 0

    @property
    def capacity(self) -> int:
        return int(self.local.shape[0])

    def __len__(self) -> int:
        return len(self.index)

    def report(self) -> CacheCounts:
        """Evictions so far and rows held now (read by the records and the metrics endpoint)."""
        return CacheCounts(self.evictions, self.evicted_deltas, len(self), self.capacity)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The row of each key, -1 where the cache does not hold it."""
        return self.index.lookup(keys)

    def admit(self, keys: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray, Evicted]:
        """Map a batch's unique ``keys`` to rows and pin them; returns (rows, the positions of
        the keys that were not held, what was evicted to make room for them).

        The rows of new keys hold nothing yet: the caller pulls the pservers' rows and
        :meth:`fill`\\ s them before any worker reads them. When the cache is full, unpinned rows
        least recently admitted leave first, at least ``capacity / EVICT_SHARE`` at a time;
        ``scale`` (``1 / trainers``) scales their pending deltas."""
        keys = np.ascontiguousarray(keys, np.int64)
        rows = self.index.lookup(keys)
        missing = np.flatnonzero(rows < 0)
        self._stamp += 1
        _pin(rows[rows >= 0], self.pins, self.last_use, self._stamp)  # before any eviction
        evicted = Evicted(np.zeros(0, np.int64), np.zeros((0, self.local.shape[1]), np.float32), np.zeros((0, 2), np.float32))
        if missing.size:
            short = missing.size - self.index.free_rows
            if short > 0:
                evicted = self._evict(max(short, self.capacity // EVICT_SHARE), short, scale)
            new_rows = self.index.insert(keys[missing])
            rows[missing] = new_rows
            self.keys[new_rows] = keys[missing]
            self.held[new_rows] = True
            self.dirty[new_rows] = 0
            self.counts[new_rows] = 0
            _pin(new_rows, self.pins, self.last_use, self._stamp)
        return rows, missing, evicted

    def fill(self, rows: np.ndarray, values: np.ndarray) -> None:
        """The pservers' rows of newly admitted keys: ``local = old = values``."""
        self.local[rows] = values
        self.old[rows] = values

    def release(self, rows: np.ndarray) -> None:
        """A batch that mapped to ``rows`` is done: they may be evicted again."""
        _unpin(np.ascontiguousarray(rows, np.int64), self.pins)

    def _evict(self, want: int, need: int, scale: float) -> Evicted:
        """Remove up to ``want`` (at least ``need``) unpinned rows, least recently used first."""
        free = np.flatnonzero(self.held & (self.pins == 0))
        if free.size < need:
            raise ApsError(
                f"geo cache of hash table {self.name!r}: {need} more rows needed but only {free.size} of "
                f"its {self.capacity} rows are not in use by batches in flight; raise geo_cache_rows"
            )
        if free.size > want:
            free = free[np.argpartition(self.last_use[free], want - 1)[:want]]
        rows = free.astype(np.int64)
        written = rows[self.dirty[rows] != 0]
        out = Evicted(*self._deltas(written, scale))
        self.index.delete(self.keys[rows])
        self.held[rows] = False
        self.dirty[rows] = 0
        self.evictions += rows.size
        self.evicted_deltas += written.size
        return out

    def take_changes(self, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The exchange's send side: for every row written since the last call, its key,
        ``delta = (local - old) * scale`` (then ``old += delta``) and its shows and clicks since
        its last delta (keys unique, in row order).

        Workers keep setting flags meanwhile, so a snapshot is scanned (as on a fixed table: a
        row written after the snapshot keeps, or gets again, its flag)."""
        rows = np.flatnonzero(self.dirty.copy()).astype(np.int64)
        self.dirty[rows] = 0
        return self._deltas(rows, scale)

    def _deltas(self, rows: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys, deltas, counts) of ``rows``: ``old += delta``; the counts taken are subtracted
        (a worker may be adding to them meanwhile: what it adds now goes with the next delta)."""
        deltas = np.empty((rows.size, self.local.shape[1]), np.float32)
        geo_delta(self.local, self.old, rows, scale, deltas)
        counts = self.counts[rows]
        self.counts[rows] -= counts
        return self.keys[rows], deltas, counts

    def apply_server(self, keys: np.ndarray, values: np.ndarray) -> int:
        """The exchange's receive side: rows other trainers changed on the pservers, for the keys
        this cache holds (others are ignored): ``local += server - old; old = server``. Returns
        how many rows it applied."""
        rows = self.index.lookup(keys)
        held = np.flatnonzero(rows >= 0)
        geo_apply(self.local, self.old, rows[held], np.ascontiguousarray(values[held]))
        return int(held.size)
