"""Two tiny models for the hybrid-mode and staleness tests (a module of its own: worker
processes import it by name).

* :class:`DenseLinReg`: linear regression on binary features with *dense* tables only, so that
  every parameter is synchronous in hybrid mode and a run can be compared to numpy exactly.
* :class:`Counter`: one sparse row that every batch pushes a gradient of -1 into (SGD, lr 1): the
  row's value is the number of batches applied, so the value a compute reads is the step of the
  parameters it computed with. Each compute appends ``start_ns end_ns value`` to a file per
  process in ``log_dir``.
* :class:`DenseCounter`: the same count in a *dense* table (hybrid's dense rounds), each compute
  appending the value it read to a file per process: the round whose parameters it used.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import numpy as np

import aps
from aps.trainer import Batch, Chunk, Grads, Model, Params, WorkerContext
from examples.linreg.model import FORMAT


class DenseLinReg(Model):
    """``pred = b + sum(w[f])``, loss ``0.5 (pred - y)^2``, gradients of the batch mean."""

    name = "dense_linreg"

    def __init__(self, features: int = 20, batch_size: int = 8, optimizer: aps.Optimizer | None = None) -> None:
        self.features = features
        self.batch_size = batch_size
        self.optimizer = optimizer or aps.SGD(lr=0.2)

    def tables(self) -> list[aps.SparseTable | aps.DenseTable]:
        return [
            aps.DenseTable("w", shape=(self.features,), init=aps.Constant(0.0), optimizer=self.optimizer),
            aps.DenseTable("b", shape=(1,), init=aps.Constant(0.0), optimizer=self.optimizer),
        ]

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        parsed = FORMAT.parse(chunk)
        y_all, _ = parsed.slots["y"]
        f_all, f_off = parsed.slots["f"]
        for start in range(0, parsed.num_lines, self.batch_size):
            stop = min(parsed.num_lines, start + self.batch_size)
            feats = [f_all[f_off[i] : f_off[i + 1]].copy() for i in range(start, stop)]
            yield Batch({}, stop - start, (feats, y_all[start:stop].astype(np.float64)))

    def compute(self, batch: Batch, params: Params, grads: Grads) -> float:
        feats, y = batch.data
        return dense_linreg_grads(params.dense["w"], params.dense["b"], feats, y, grads.dense["w"], grads.dense["b"])


def dense_linreg_grads(w: np.ndarray, b: np.ndarray, feats: list[np.ndarray], y: np.ndarray,
                       gw: np.ndarray, gb: np.ndarray) -> float:
    """Add the batch-mean gradient into ``gw`` / ``gb``; return the summed loss (float64 math)."""
    loss = 0.0
    for f, target in zip(feats, y):
        err = float(b[0]) + float(np.asarray(w, np.float64)[f].sum()) - float(target)
        loss += 0.5 * err * err
        np.add.at(gw, f, err / len(y))
        gb[0] += err / len(y)
    return loss


class Counter(Model):
    """Every batch (one line) pushes -1 into row 0 of ``count`` (SGD, lr 1)."""

    name = "counter"

    def __init__(self, log_dir: str, compute_s: float = 0.005) -> None:
        self.log_dir = log_dir
        self.compute_s = compute_s

    def tables(self) -> list[aps.SparseTable | aps.DenseTable]:
        return [aps.SparseTable("count", rows=1, dim=1, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))]

    def max_batch_ids(self, table: str) -> int:
        return 1

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        for _ in range(chunk.lines):
            yield Batch({"count": np.zeros(1, np.int64)}, 1)

    def compute(self, batch: Batch, params: Params, grads: Grads) -> float:
        start = time.monotonic_ns()
        value = float(params.sparse["count"][0, 0])
        time.sleep(self.compute_s)  # long enough for a prefetched pull to return meanwhile
        grads.sparse["count"][0, 0] = -1.0
        with open(os.path.join(self.log_dir, f"{os.getpid()}.txt"), "a") as f:
            f.write(f"{start} {time.monotonic_ns()} {value}\n")
        return 0.0


class DenseCounter(Model):
    """Every batch (one line) has gradient -1 on the dense ``count`` (SGD, lr 1): after r dense
    rounds of equal data the value is r, whatever the workers' and trainers' averaging."""

    name = "dense_counter"

    def __init__(self, log_dir: str, compute_s: float = 0.0) -> None:
        self.log_dir = log_dir
        self.compute_s = compute_s

    def tables(self) -> list[aps.SparseTable | aps.DenseTable]:
        return [aps.DenseTable("count", shape=(1,), init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))]

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        for _ in range(chunk.lines):
            yield Batch({}, 1)

    def compute(self, batch: Batch, params: Params, grads: Grads) -> float:
        grads.dense["count"][0] = -1.0
        time.sleep(self.compute_s)
        with open(os.path.join(self.log_dir, f"{os.getpid()}.txt"), "a") as f:
            f.write(f"{float(params.dense['count'][0])}\n")
        return 0.0
