"""A model for online tests that counts how often each record is trained, and predicts.

A line is ``RECORD_ID LABEL FEATURE``. Table ``seen`` (one float per record id, SGD lr 1, zeros)
gets gradient -1 for every record a batch trains, so after a run row ``r`` holds how many times
record ``r`` was trained: the pservers count, and a test reads the counts back. Table ``w`` is a
logistic regression over one feature per line, so scoring a pass gives a real AUC."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

import aps
from aps.trainer import Batch, Chunk, Grads, Model, Params, WorkerContext


class CountingLR(Model):
    name = "counting_lr"

    def __init__(self, records: int = 10_000, features: int = 16, batch_size: int = 8, lr: float = 0.5, pause: float = 0.0) -> None:
        self.records, self.features = int(records), int(features)
        self.batch_size, self.lr, self.pause = int(batch_size), float(lr), float(pause)

    def tables(self) -> list:
        return [
            aps.SparseTable("seen", rows=self.records, dim=1, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0)),
            aps.SparseTable("w", rows=self.features, dim=1, init=aps.Constant(0.0), optimizer=aps.SGD(lr=self.lr)),
        ]

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        rows = np.array([line.split() for line in chunk.data.decode().splitlines() if line.strip()], np.int64).reshape(-1, 3)
        for start in range(0, len(rows), self.batch_size):
            part = rows[start : start + self.batch_size]
            if self.pause:
                time.sleep(self.pause)
            rids, rpos = np.unique(part[:, 0], return_inverse=True)
            feats, fpos = np.unique(part[:, 2], return_inverse=True)
            yield Batch({"seen": rids, "w": feats}, len(part), (rpos, fpos, part[:, 1].astype(np.float64)))

    def _probs(self, batch: Batch, params: Params) -> np.ndarray:
        _, fpos, _ = batch.data
        z = params.sparse["w"][batch.sparse_ids["w"], 0][fpos].astype(np.float64)
        return 1.0 / (1.0 + np.exp(-z))

    def compute(self, batch: Batch, params: Params, grads: Grads) -> float:
        rpos, fpos, labels = batch.data
        grads.sparse["seen"][:, 0] = -1.0
        probs = self._probs(batch, params)
        np.add.at(grads.sparse["w"][:, 0], fpos, (probs - labels).astype(np.float32))
        batch.data = (rpos, fpos, labels, probs)
        eps = 1e-7
        return float(-np.sum(labels * np.log(probs + eps) + (1 - labels) * np.log(1 - probs + eps)))

    def predictions(self, batch: Batch) -> tuple[np.ndarray, np.ndarray] | None:
        return batch.data[3], batch.data[2]


class HashCountingLR(CountingLR):
    """CountingLR whose feature weights ``w`` are a hash table keyed by the feature (any int64),
    pushing each feature's shows and clicks, so a day tick's shrink scores and evicts its keys.
    Every key goes into a base export (``base_threshold`` 0): what a base leaves out, only the
    shrink took away. ``ttl_days``: the table's (keys unseen for more days go at a day tick)."""

    name = "hash_counting_lr"

    def __init__(self, ttl_days: int | None = None, **kw) -> None:
        super().__init__(**kw)
        self.ttl_days = ttl_days

    def tables(self) -> list:
        seen, _ = super().tables()
        w = aps.HashTable("w", dim=1, init=aps.Constant(0.0), optimizer=aps.SGD(lr=self.lr), base_threshold=0.0,
                          ttl_days=self.ttl_days)
        return [seen, w]

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        for batch in super().batches(chunk, ctx):
            _, fpos, labels = batch.data
            stats = np.zeros((len(batch.sparse_ids["w"]), 2), np.float32)
            np.add.at(stats[:, 0], fpos, 1.0)
            np.add.at(stats[:, 1], fpos, labels.astype(np.float32))
            batch.stats["w"] = stats
            yield batch

    def _probs(self, batch: Batch, params: Params) -> np.ndarray:
        _, fpos, _ = batch.data[:3]
        z = params.sparse["w"][fpos, 0].astype(np.float64)  # a hash table's rows: the batch's keys, in order
        return 1.0 / (1.0 + np.exp(-z))

    def max_batch_ids(self, table: str) -> int:
        return self.batch_size if table == "w" else super().max_batch_ids(table)
