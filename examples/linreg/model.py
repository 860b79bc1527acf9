"""A model defined outside aps: sparse linear regression on binary features.

It proves the plug-in contract: tables, batches from MultiSlot text, and a numba step kernel.
Each line: ``1 y  k f1 .. fk`` (slots ``y`` float32, ``f`` int64). Prediction
``b + sum(w[f])``; loss ``0.5 * (pred - y)^2``; gradients are of the batch *mean* loss.
Data made by :func:`make_data` has an exact optimum (w*, b*), so every mode can be checked
against it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
from numba import njit

import aps
from aps.trainer import Batch, Chunk, Grads, Model, Params, WorkerContext
from aps.trainer.multislot import MultiSlotFormat, Slot

FORMAT = MultiSlotFormat([Slot("y", "float32"), Slot("f", "int64")])


@njit(cache=True)
def _step(w, b, inverse, offsets, y, gw, gb) -> float:
    n = y.shape[0]
    loss = 0.0
    for i in range(n):
        pred = b[0]
        for j in range(offsets[i], offsets[i + 1]):
            pred += w[inverse[j], 0]
        err = pred - y[i]
        loss += 0.5 * err * err
        g = err / n
        gb[0] += g
        for j in range(offsets[i], offsets[i + 1]):
            gw[inverse[j], 0] += g
    return loss


@njit(cache=True)
def _gather(w_full, ids, out):
    for k in range(ids.shape[0]):
        out[k, 0] = w_full[ids[k], 0]


class LinReg(Model):
    name = "linreg"

    def __init__(self, features: int = 200, batch_size: int = 32, lr: float = 0.2) -> None:
        self.features = features
        self.batch_size = batch_size
        self.lr = lr

    def tables(self) -> list[aps.SparseTable | aps.DenseTable]:
        return [
            aps.SparseTable("lin.w", rows=self.features, dim=1, init=aps.Constant(0.0), optimizer=aps.SGD(lr=self.lr)),
            aps.DenseTable("lin.b", shape=(1,), init=aps.Constant(0.0), optimizer=aps.SGD(lr=self.lr)),
        ]

    def max_batch_ids(self, table: str) -> int:
        return self.features

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        parsed = FORMAT.parse(chunk, skip_bad_lines=ctx.skip_bad_lines)
        ctx.bad_lines += parsed.bad_lines
        y_all, _ = parsed.slots["y"]
        f_all, f_off = parsed.slots["f"]
        for start in range(0, parsed.num_lines, self.batch_size):
            stop = min(parsed.num_lines, start + self.batch_size)
            lo, hi = f_off[start], f_off[stop]
            ids, inverse = np.unique(f_all[lo:hi], return_inverse=True)
            offsets = (f_off[start : stop + 1] - lo).astype(np.int64)
            yield Batch({"lin.w": ids.astype(np.int64)}, stop - start, (inverse.astype(np.int64), offsets, y_all[start:stop]))

    def compute(self, batch: Batch, params: Params, grads: Grads) -> float:
        inverse, offsets, y = batch.data
        ids = batch.sparse_ids["lin.w"]
        w = np.empty((len(ids), 1), dtype=np.float32)
        _gather(params.sparse["lin.w"], ids, w)
        return _step(w, params.dense["lin.b"], inverse, offsets, y, grads.sparse["lin.w"], grads.dense["lin.b"])


def make_data(directory: Path, files: int, lines_per_file: int, features: int = 200, seed: int = 0) -> tuple[np.ndarray, float]:
    """Write MultiSlot files whose labels follow y = b* + sum(w*[f]) exactly; return (w*, b*)."""
    rng = np.random.default_rng(seed)
    w_true = rng.uniform(-1.0, 1.0, size=features).astype(np.float32)
    b_true = 0.5
    directory.mkdir(parents=True, exist_ok=True)
    for k in range(files):
        lines = []
        for _ in range(lines_per_file):
            f = rng.choice(features, size=int(rng.integers(1, 6)), replace=False)
            y = b_true + float(w_true[f].sum())
            lines.append(f"1 {y!r} {len(f)} " + " ".join(str(int(x)) for x in f))
        (directory / f"part-{k:03d}").write_text("\n".join(lines) + "\n")
    return w_true, b_true
