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
from .criteo import CriteoFormat, CriteoRecords


class CtrBatch(NamedTuple):
    """``Batch.data`` of the CTR models.

    ``ids[i, s]`` is the row of example ``i``'s slot ``s`` in the sparse array the model is
    given: its global row for a fixed table; for a hash table its position among the batch's
    unique keys, as the runtime hands the model only those rows (:class:`~aps.trainer.model.Params`).
    ``inverse[i * slots + s]`` is its position in ``batch.sparse_ids[...]`` (where its gradient
    row goes). ``probs`` is
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

    def __init__(self, fmt: CriteoFormat, batch_size: int, tables: tuple[str, ...], hash_keys: bool = False) -> None:
        self.fmt = fmt
        self.batch_size = batch_size
        self.tables = tables
        #: the tables are hash tables: keys are the full 64-bit hashes (no modulo), a batch's
        #: ``ids`` are positions among its unique keys and it carries shows and clicks per key
        self.hash_keys = hash_keys
        self._mark: np.ndarray | None = None

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        rec = self.fmt.parse(chunk, skip_bad_lines=ctx.skip_bad_lines, full_keys=self.hash_keys)
        ctx.bad_lines += rec.bad_lines
        n = rec.n
        if n == 0:
            return
        if self.hash_keys:
            yield from self._keyed_batches(rec)
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

    def _keyed_batches(self, rec: CriteoRecords) -> Iterator[Batch]:
        """Batches over full 64-bit keys: each batch's unique keys (ascending), every slot's
        position among them, and per key its shows (occurrences) and clicks (the labels of the
        examples it occurs in), pushed with the gradients for the pservers' shrink."""
        n, slots = rec.n, self.fmt.slots
        probs = np.zeros(n, np.float32)
        for lo in range(0, n, self.batch_size):
            hi = min(n, lo + self.batch_size)
            keys, inverse = np.unique(rec.ids[lo:hi].reshape(-1), return_inverse=True)
            inverse = inverse.astype(np.int32).reshape(-1)
            stats = np.empty((len(keys), 2), np.float32)
            stats[:, 0] = np.bincount(inverse, minlength=len(keys))
            stats[:, 1] = np.bincount(inverse, weights=np.repeat(rec.labels[lo:hi], slots), minlength=len(keys))
            positions = inverse.astype(np.int64).reshape(hi - lo, slots)
            data = CtrBatch(positions, inverse, rec.dense[lo:hi], rec.labels[lo:hi], probs[lo:hi])
            yield Batch({t: keys for t in self.tables}, hi - lo, data, {t: stats for t in self.tables})
