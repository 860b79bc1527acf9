"""Gradients merged as they arrive, in buffers sized once: what a push is sent from.

A worker's gradients sit in its shared mailbox until the trainer says OK. Instead of copying them
out, concatenating several batches and sorting to merge rows by id, the communicator adds each
batch straight from the mailbox into a :class:`GradAccumulator`: per sparse table a pre-sized
array of distinct ids and their summed rows (an id's slot is found through a table-sized index,
so a repeated id is one add, never a sort), per dense table a pre-sized sum. A push then sends
the accumulator's filled part as it is. Each pushed row is written once on its way from the
mailbox to the client (it was written three times before: copy out, concatenate, merge).

An accumulator holds at most ``max_batches`` batches and its sized rows; :meth:`fits` says
whether one more batch does. The modes make a producer wait while nothing fits (a bounded
accumulator, the aiokafka idea), so memory never grows with a slow network.
"""

from __future__ import annotations

import numpy as np

from ..errors import ApsError
from ..specs import DenseTable, SparseTable
from .kernels import accumulate_rows, count_new, release_slots


class _SparseBuffer:
    """One sparse table's part of an accumulator: distinct ids, their summed rows, the index."""

    def __init__(self, table: SparseTable, capacity: int) -> None:
        self.table = table
        self.capacity = capacity
        self.ids = np.zeros(capacity, np.int64)
        self.rows = np.zeros((capacity, table.dim), np.float32)
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

    def clear(self) -> None:
        release_slots(self.slot_of, self.ids, self.used)
        self.used = 0


class GradAccumulator:
    """Gradients of up to ``max_batches`` batches, merged by id on arrival (see the module)."""

    def __init__(
        self, sparse: list[SparseTable], dense: list[DenseTable], max_batch_ids: dict[str, int], max_batches: int
    ) -> None:
        if max_batches < 1:
            raise ApsError(f"an accumulator holds at least one batch, got max_batches={max_batches}")
        self.max_batches = max_batches
        # distinct ids never exceed the table's rows; one batch always fits an empty accumulator
        self._sparse = [
            _SparseBuffer(t, max(1, min(max_batches * max_batch_ids[t.name], max(t.rows, max_batch_ids[t.name]))))
            for t in sparse
        ]
        self._dense = {t.name: np.zeros(t.shape, np.float32) for t in dense}
        self.batches = 0
        self.examples = 0

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
            buf.rows[: buf.used] *= f
        for total in self._dense.values():
            total *= f

    def sparse(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per sparse table, views of the distinct ids (in order of first arrival) and their rows."""
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
