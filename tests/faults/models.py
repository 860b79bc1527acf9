"""A linear-regression model paced to a known speed, so that a fault test can strike mid-training."""

from __future__ import annotations

import time
from collections.abc import Iterator

from aps.trainer import Batch, Chunk, WorkerContext
from examples.linreg.model import LinReg


class PacedLinReg(LinReg):
    """LinReg that sleeps ``pause`` seconds per batch (the job's length no longer depends on
    how busy the machine is, only on the data and the pause)."""

    def __init__(self, features: int = 200, batch_size: int = 32, lr: float = 0.2, pause: float = 0.005) -> None:
        super().__init__(features, batch_size, lr)
        self.pause = float(pause)

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        for batch in super().batches(chunk, ctx):
            time.sleep(self.pause)
            yield batch
