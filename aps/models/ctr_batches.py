"""Criteo-format lines to CTR batches, shared by the CTR-DNN and wide&deep models.

A chunk is parsed by the numba Criteo reader (:mod:`aps.models.criteo`), cut into batches of
``batch_size`` lines, and each batch's slot ids are de-duplicated in one kernel call for the
whole chunk. Every batch owns its arrays (views of per-chunk arrays), so the runtime may build
the next batch (and prefetch its rows) while the current one computes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
from numba import njit

from ..trainer.model import Batch, WorkerContext
from ..trainer.reader import Chunk
from .criteo import CriteoFormat


class CtrBatch(NamedTuple):
    """``Batch.data`` of the CTR models.

    ``ids[i, s]`` is the global row of example ``i``'s slot ``s``; ``inverse[i * slots + s]``
    its position in ``batch.sparse_ids[...]`` (where its gradient row goes). ``probs`` is
    filled by ``compute`` with the predicted click probability of every example (for AUC).
    """

    ids: np.ndarray
    inverse: np.ndarray
    dense: np.ndarray
    labels: np.ndarray
    probs: np.ndarray


@njit(cache=True, nogil=True)
def _dedup_batches(ids: np.ndarray, per_batch: int, mark: np.ndarray, uniq: np.ndarray, offsets: np.ndarray, inverse: np.ndarray) -> None:
    """For each run of ``per_batch`` ids: its unique ids (first-seen order) appended to ``uniq``
    (batch b's are ``uniq[offsets[b]:offsets[b+1]]``) and each id's position among them."""
    total = ids.shape[0]
    nb = (total + per_batch - 1) // per_batch
    u = 0
    offsets[0] = 0
    for b in range(nb):
        lo = b * per_batch
        hi = min(total, lo + per_batch)
        start = u
        for j in range(lo, hi):
            r = ids[j]
            k = mark[r]
            if k < 0:
                k = u - start
                mark[r] = k
                uniq[u] = r
                u += 1
            inverse[j] = k
        for j in range(start, u):
            mark[uniq[j]] = -1
        offsets[b + 1] = u


class CtrBatcher:
    """Turns chunks into :class:`CtrBatch` batches for the given sparse tables (all of which are
    indexed by the same hashed slot ids). One per worker process (holds the dedup lookup)."""

    def __init__(self, fmt: CriteoFormat, batch_size: int, tables: tuple[str, ...]) -> None:
        self.fmt = fmt
        self.batch_size = batch_size
        self.tables = tables
        self._mark: np.ndarray | None = None

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        rec = self.fmt.parse(chunk, skip_bad_lines=ctx.skip_bad_lines)
        ctx.bad_lines += rec.bad_lines
        n = rec.n
        if n == 0:
            return
        if self._mark is None:
            self._mark = np.full(self.fmt.buckets, -1, np.int32)
        slots = self.fmt.slots
        flat = rec.ids.reshape(-1)
        per_batch = self.batch_size * slots
        nb = -(-n // self.batch_size)
        uniq = np.empty(flat.shape[0], np.int64)
        offsets = np.empty(nb + 1, np.int64)
        inverse = np.empty(flat.shape[0], np.int32)
        _dedup_batches(flat, per_batch, self._mark, uniq, offsets, inverse)
        probs = np.zeros(n, np.float32)
        off = offsets.tolist()
        for b in range(nb):
            lo = b * self.batch_size
            hi = min(n, lo + self.batch_size)
            ids = uniq[off[b] : off[b + 1]]
            data = CtrBatch(rec.ids[lo:hi], inverse[lo * slots : hi * slots], rec.dense[lo:hi], rec.labels[lo:hi], probs[lo:hi])
            yield Batch({t: ids for t in self.tables}, hi - lo, data)
