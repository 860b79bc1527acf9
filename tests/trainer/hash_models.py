"""The linear regression of examples/linreg on a hash table, for geo's hash-table tests (a module
of its own: worker processes import it by name).

Feature ``f`` is key :func:`key_of` (far apart 64-bit values, negative ones included), so the
model trains the same problem as :class:`~examples.linreg.model.LinReg` and its rows can be read
back by feature. As the hash-table contract says, the model gets a batch's rows by position among
its unique keys.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

import aps
from aps.trainer import Batch, Chunk, Grads, Params, WorkerContext
from examples.linreg.model import LinReg, _step

#: feature f's key: a multiple of 2^40, shifted so that half are negative (ascending with f)
KEY_STEP = 1 << 40
KEY_BASE = -(1 << 49) + 12345


def key_of(features: np.ndarray) -> np.ndarray:
    return np.asarray(features, np.int64) * KEY_STEP + KEY_BASE


class HashLinReg(LinReg):
    """LinReg's ``lin.w`` as a :class:`aps.HashTable` (initial rows 0, as LinReg's)."""

    name = "hash_linreg"

    def __init__(self, features: int = 200, batch_size: int = 32, lr: float = 0.2, max_keys: int | None = None) -> None:
        super().__init__(features, batch_size, lr)
        self.max_keys = max_keys

    def tables(self) -> list[aps.HashTable | aps.DenseTable]:
        return [
            aps.HashTable("lin.w", dim=1, init=aps.Constant(0.0), optimizer=aps.SGD(lr=self.lr), max_keys=self.max_keys),
            aps.DenseTable("lin.b", shape=(1,), init=aps.Constant(0.0), optimizer=aps.SGD(lr=self.lr)),
        ]

    def max_batch_ids(self, table: str) -> int:
        return min(self.features, 5 * self.batch_size)  # make_data writes 1 to 5 features a line

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        for batch in super().batches(chunk, ctx):
            batch.sparse_ids["lin.w"] = key_of(batch.sparse_ids["lin.w"])
            yield batch

    def compute(self, batch: Batch, params: Params, grads: Grads) -> float:
        inverse, offsets, y = batch.data
        w = params.sparse["lin.w"][: len(batch.sparse_ids["lin.w"])]  # by position among the keys
        return _step(w, params.dense["lin.b"], inverse, offsets, y, grads.sparse["lin.w"], grads.dense["lin.b"])


class FusedHashLinReg(HashLinReg):
    """HashLinReg with its own fused geo step (:meth:`aps.trainer.Model.local_sgd`): it writes
    the rows it is given, by position, and marks them there."""

    name = "fused_hash_linreg"

    def local_sgd(self, batch: Batch, params: Params, lrs: dict[str, float], dirty: dict[str, np.ndarray]) -> float:
        n = len(batch.sparse_ids["lin.w"])
        grads = Grads({"lin.w": np.zeros((n, 1), np.float32)}, {"lin.b": np.zeros(1, np.float32)})
        loss = self.compute(batch, params, grads)
        params.sparse["lin.w"][:n] -= lrs["lin.w"] * grads.sparse["lin.w"]
        dirty["lin.w"][:n] = 1
        params.dense["lin.b"] -= lrs["lin.b"] * grads.dense["lin.b"]
        return loss
