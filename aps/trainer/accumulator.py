"""Gradients merged as they arrive, in buffers sized once: what a push is sent from.

A worker's gradients sit in its shared mailbox until the trainer says OK. Instead of copying them
out, concatenating several batches and sorting to merge rows by id, the communicator adds each
batch straight from the mailbox into a :class:`GradAccumulator`: per sparse table a pre-sized
array of distinct ids and their summed rows (an id's slot is found through a table-sized index,
so a repeated id is one add, never a sort), per dense table a pre-sized sum. A push then sends
the accumulator's filled part as it is. Each pushed row is written once on its way from the
mailbox to the client (it was written three times before: copy out, concatenate, merge).

A push hands out its ids unique *and ascending* (:meth:`GradAccumulator.sparse` sorts the
distinct ids once, with their rows, by a numba kernel): the client's shard split keeps that order,
so each pserver receives ascending ids, finds them so in the one pass it makes over them at its
edge, and its optimizer kernel neither checks nor sorts them. Sorting here costs one radix sort
of the distinct ids and one more write of each row per push; keeping the ids sorted as they arrive
(a merge per batch) was measured slower (bench/push_sorted.py).

A hash table's keys (:class:`aps.HashTable`) are any int64, so no table-sized index can find
their slots: its buffer appends every batch's ids and rows and merges equal ids by one sort when
the push takes them (:class:`_KeyedSparseBuffer`). Its rows carry two more columns than the
gradient, each id's shows and clicks: summed like the gradient, never averaged.

An accumulator holds at most ``max_batches`` batches and its sized rows; :meth:`fits` says
whether one more batch does. The modes make a producer wait while nothing fits (a bounded
accumulator, the aiokafka idea), so memory never grows with a slow network.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..errors import ApsError
from ..specs import DenseTable, HashTable, SparseTable
from .kernels import accumulate_rows, count_new, release_slots
from .shared import HASH_STAT_COLUMNS


_RADIX_BITS = 11
#: below this many ids a comparison sort beats clearing 2,048 counters per radix pass
_RADIX_MIN = 512


@njit(cache=True, nogil=True)
def _radix_order(ids: np.ndarray, n: int) -> np.ndarray:
    """Positions of ``ids[:n]`` (non-negative) in ascending order: an LSD radix sort of 11-bit
    digits, as many passes as the largest id needs (2 for a million rows), O(n) each - several
    times faster than a comparison sort on the tens of thousands of ids of a CTR push."""
    top = 0
    for s in range(n):
        top = max(top, ids[s])
    order = np.arange(n)
    spare = np.empty(n, np.int64)
    counts = np.empty((1 << _RADIX_BITS) + 1, np.int64)
    mask = (1 << _RADIX_BITS) - 1
    shift = 0
    while shift == 0 or (top >> shift) > 0:
        counts[:] = 0
        for s in range(n):
            counts[((ids[order[s]] >> shift) & mask) + 1] += 1
        for d in range(1, counts.shape[0]):
            counts[d] += counts[d - 1]
        for s in range(n):
            d = (ids[order[s]] >> shift) & mask
            spare[counts[d]] = order[s]
            counts[d] += 1
        order, spare = spare, order
        shift += _RADIX_BITS
    return order


@njit(cache=True, nogil=True)
def sort_slots(
    slot_of: np.ndarray, ids: np.ndarray, rows: np.ndarray, used: int, out_ids: np.ndarray, out_rows: np.ndarray
) -> bool:
    """Write the first ``used`` slots to ``out_ids`` / ``out_rows`` in ascending id order and
    point ``slot_of`` at their new slots. Returns False, writing nothing, when the ids are
    ascending already (then the buffers stay as they are)."""
    for s in range(1, used):
        if ids[s] < ids[s - 1]:
            break
    else:
        return False
    order = _radix_order(ids, used) if used >= _RADIX_MIN else np.argsort(ids[:used])
    dim = rows.shape[1]
    for s in range(used):
        src = order[s]
        r = ids[src]
        out_ids[s] = r
        slot_of[r] = s
        for d in range(dim):
            out_rows[s, d] = rows[src, d]
    return True


class _SparseBuffer:
    """One sparse table's part of an accumulator: distinct ids, their summed rows, the index."""

    def __init__(self, table: SparseTable, capacity: int) -> None:
        self.table = table
        self.capacity = capacity
        self.ids = np.zeros(capacity, np.int64)
        self.rows = np.zeros((capacity, table.dim), np.float32)
        #: where :meth:`sort` writes the sorted slots; then the two pairs swap roles
        self._spare_ids = np.zeros(capacity, np.int64)
        self._spare_rows = np.zeros((capacity, table.dim), np.float32)
        #: slot of each table row in ``ids`` / ``rows``, -1 where the row has none
        self.slot_of = np.full(table.rows, -1, np.int32)
        self.used = 0

    def fits(self, ids: np.ndarray) -> bool:
        if self.used + len(ids) <= self.capacity:
            return True  # even if every id were new
        return self.used + int(count_new(self.slot_of, ids)) <= self.capacity

    def add(self, ids: np.ndarray, rows: np.ndarray) -> None:
        used = int(accumulate_rows(self.slot_of, self.ids, self.rows, self.used, ids, rows))
        if used < 0:
            bad = -1 - used
            raise ApsError(f"table {self.table.name!r}: gradient for id {int(ids[bad])} not in [0, {self.table.rows})")
        self.used = used

    def sort(self) -> None:
        """Put the slots in ascending id order (the index follows, so adding may go on)."""
        if sort_slots(self.slot_of, self.ids, self.rows, self.used, self._spare_ids, self._spare_rows):
            self.ids, self._spare_ids = self._spare_ids, self.ids
            self.rows, self._spare_rows = self._spare_rows, self.rows

    def clear(self) -> None:
        release_slots(self.slot_of, self.ids, self.used)
        self.used = 0


@njit(cache=True, nogil=True)
def merge_keys(ids: np.ndarray, rows: np.ndarray, used: int, out_ids: np.ndarray, out_rows: np.ndarray) -> int:
    """Sum the rows of equal ids among the first ``used`` into ``out_ids`` / ``out_rows``, ids
    ascending; returns how many distinct ids there are."""
    if used == 0:
        return 0
    order = np.argsort(ids[:used], kind="mergesort")
    width = rows.shape[1]
    u = -1
    for s in range(used):
        src = order[s]
        if u < 0 or ids[src] != out_ids[u]:
            u += 1
            out_ids[u] = ids[src]
            for d in range(width):
                out_rows[u, d] = rows[src, d]
        else:
            for d in range(width):
                out_rows[u, d] += rows[src, d]
    return u + 1


class _KeyedSparseBuffer:
    """A hash table's part of an accumulator: appended ids and rows (gradient, shows, clicks),
    merged by id once per push (see the module). ``capacity`` holds ``max_batches`` whole
    batches, so a batch the accumulator admits always fits."""

    def __init__(self, table: HashTable, capacity: int) -> None:
        self.table = table
        self.capacity = capacity
        width = table.dim + HASH_STAT_COLUMNS
        self.ids = np.zeros(capacity, np.int64)
        self.rows = np.zeros((capacity, width), np.float32)
        self._spare_ids = np.zeros(capacity, np.int64)
        self._spare_rows = np.zeros((capacity, width), np.float32)
        self.used = 0

    def fits(self, ids: np.ndarray) -> bool:
        return self.used + len(ids) <= self.capacity

    def add(self, ids: np.ndarray, rows: np.ndarray) -> None:
        n = len(ids)
        self.ids[self.used : self.used + n] = ids
        self.rows[self.used : self.used + n] = rows
        self.used += n

    def sort(self) -> None:
        """Merge equal ids, ascending (adding may go on after it)."""
        self.used = int(merge_keys(self.ids, self.rows, self.used, self._spare_ids, self._spare_rows))
        self.ids, self._spare_ids = self._spare_ids, self.ids
        self.rows, self._spare_rows = self._spare_rows, self.rows

    def clear(self) -> None:
        self.used = 0


class GradAccumulator:
    """Gradients of up to ``max_batches`` batches, merged by id on arrival (see the module)."""

    def __init__(
        self, sparse: list[SparseTable | HashTable], dense: list[DenseTable], max_batch_ids: dict[str, int], max_batches: int
    ) -> None:
        if max_batches < 1:
            raise ApsError(f"an accumulator holds at least one batch, got max_batches={max_batches}")
        self.max_batches = max_batches
        # distinct ids never exceed the table's rows; one batch always fits an empty accumulator
        self._sparse: list[_SparseBuffer | _KeyedSparseBuffer] = [
            _KeyedSparseBuffer(t, max(1, max_batches * max_batch_ids[t.name])) if t.keyed
            else _SparseBuffer(t, max(1, min(max_batches * max_batch_ids[t.name], max(t.rows, max_batch_ids[t.name]))))
            for t in sparse
        ]
        self._dense = {t.name: np.zeros(t.shape, np.float32) for t in dense}
        self.batches = 0
        self.examples = 0

    @property
    def has_sparse(self) -> bool:
        """Whether this accumulator carries sparse gradients (hybrid mode keeps them apart from
        the dense ones: its dense accumulator has none)."""
        return bool(self._sparse)

    @property
    def has_dense(self) -> bool:
        """Whether this accumulator carries dense gradients."""
        return bool(self._dense)

    def fits(self, ids: list[np.ndarray]) -> bool:
        """Whether one more batch with these ids (one array per sparse table) can be added."""
        return self.batches < self.max_batches and all(buf.fits(i) for buf, i in zip(self._sparse, ids))

    def add(self, ids: list[np.ndarray], rows: list[np.ndarray], dense: dict[str, np.ndarray], examples: int) -> None:
        """Merge one batch: ``ids[k]`` / ``rows[k]`` of the k-th sparse table (views into a
        mailbox are fine: they are read, never kept), ``dense`` by table name."""
        if not self.fits(ids):
            raise ApsError("GradAccumulator.add: the batch does not fit; wait until fits() says it does")
        for buf, i, r in zip(self._sparse, ids, rows):
            buf.add(i, r)
        for name, total in self._dense.items():
            if self.batches == 0:
                np.copyto(total, dense[name])
            else:
                np.add(total, dense[name], out=total)
        self.batches += 1
        self.examples += examples

    def scale(self, factor: float) -> None:
        """Multiply everything accumulated by ``factor`` in place (averaging before a push)."""
        f = np.float32(factor)
        for buf in self._sparse:
            buf.rows[: buf.used, : buf.table.dim] *= f  # a hash table's shows and clicks stay counts
        for total in self._dense.values():
            total *= f

    def sparse(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per sparse table, views of the distinct ids, unique and ascending, and their rows
        (sorted here, once per push: see the module); a hash table's rows end with the shows
        and clicks columns."""
        for buf in self._sparse:
            buf.sort()
        return {buf.table.name: (buf.ids[: buf.used], buf.rows[: buf.used]) for buf in self._sparse}

    def dense(self) -> dict[str, np.ndarray]:
        """Per dense table, the accumulated sum (zeros when no batch was added)."""
        if self.batches == 0:
            for total in self._dense.values():
                total.fill(0.0)
        return self._dense

    def clear(self) -> None:
        """Empty the accumulator for reuse (nothing is reallocated)."""
        for buf in self._sparse:
            buf.clear()
        self.batches = 0
        self.examples = 0
