"""Batches of a tabular file (several labels, list columns) for :class:`~aps.torch.TorchModel`.

One label and no list columns is the Criteo layout, batched by the CTR models' own
:class:`~aps.models.ctr_batches.CtrBatcher`; anything wider comes here. A batch's keys are the
unique values of its slots *and* lists (one key set for every Embedding table, as the CTR
models'), and each value becomes its position among them; a list is padded to its ``max_len``
with the position one past the last key, which :class:`~aps.torch.TorchModel` maps to a zero row:
padding embeds as zeros and trains nothing, whether or not the network masks it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
from numba import njit

from ..models.tabular import TabularFormat, TabularRecords
from ..trainer.model import Batch, WorkerContext
from ..trainer.reader import Chunk


class TabularBatch(NamedTuple):
    """``Batch.data`` of a tabular batch: ``slots`` int64 [B, S] positions among the batch's keys;
    ``lists[j]`` int64 [B, max_len_j] positions, padded with ``len(keys)``; ``lengths`` int64
    [B, lists]; ``dense``; ``labels`` float32 [B, labels]; ``probs`` float32 [B] (the first
    task's predicted probability, for AUC), filled by the model."""

    slots: np.ndarray
    lists: tuple[np.ndarray, ...]
    lengths: np.ndarray
    dense: np.ndarray
    labels: np.ndarray
    probs: np.ndarray


@njit(cache=True, nogil=True)
def _pad(positions, counts, out):
    """Line ``i``'s list ``j`` (its ``counts[i, j]`` positions, lines and their lists in order in
    ``positions``) into ``out[j, i, :counts[i, j]]``."""
    p = 0
    for i in range(counts.shape[0]):
        for j in range(counts.shape[1]):
            for k in range(counts[i, j]):
                out[j, i, k] = positions[p]
                p += 1


class TabularBatcher:
    """Chunks to :class:`TabularBatch` batches for the given Embedding tables. One per worker process."""

    def __init__(self, fmt: TabularFormat, batch_size: int, tables: tuple[str, ...], hash_keys: bool) -> None:
        self.fmt = fmt
        self.batch_size = batch_size
        self.tables = tables
        self.hash_keys = hash_keys
        self.widths = [c.max_len for c in fmt.lists]

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        rec = self.fmt.parse(chunk, skip_bad_lines=ctx.skip_bad_lines, full_keys=self.hash_keys)
        ctx.bad_lines += rec.bad_lines
        if rec.n == 0:
            return
        ends = np.cumsum(rec.counts.sum(1))  # where each line's list values end in rec.values
        probs = np.zeros(rec.n, np.float32)
        for lo in range(0, rec.n, self.batch_size):
            hi = min(rec.n, lo + self.batch_size)
            yield self._batch(rec, lo, hi, int(ends[lo - 1]) if lo else 0, int(ends[hi - 1]), probs[lo:hi])

    def _batch(self, rec: TabularRecords, lo: int, hi: int, vlo: int, vhi: int, probs: np.ndarray) -> Batch:
        n, slots = hi - lo, self.fmt.slots
        keys, inverse = np.unique(np.concatenate([rec.ids[lo:hi].reshape(-1), rec.values[vlo:vhi]]), return_inverse=True)
        inverse = inverse.astype(np.int64).reshape(-1)
        counts = rec.counts[lo:hi]
        padded = np.full((len(self.widths), n, max(self.widths, default=0)), len(keys), np.int64)
        _pad(inverse[n * slots :], counts, padded)
        lists = tuple(padded[j, :, :w] for j, w in enumerate(self.widths))
        labels = rec.labels[lo:hi]
        data = TabularBatch(inverse[: n * slots].reshape(n, slots), lists, counts, rec.dense[lo:hi], labels, probs)
        stats = {}
        if self.hash_keys:  # shows and clicks (the first label) per key, for the pservers' shrink
            line_of = np.concatenate([np.repeat(np.arange(n), slots), np.repeat(np.arange(n), counts.sum(1))])
            s = np.empty((len(keys), 2), np.float32)
            s[:, 0] = np.bincount(inverse, minlength=len(keys))
            s[:, 1] = np.bincount(inverse, weights=labels[line_of, 0], minlength=len(keys))
            stats = {t: s for t in self.tables}
        return Batch({t: keys for t in self.tables}, n, data, stats)
