"""Models that misbehave on purpose, for fault tests of the trainer runtime, and slowed-down
models for tests that need a run to last a while."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

from aps.models.ctr_dnn.model import CtrDnn
from aps.trainer import Batch, Chunk, WorkerContext
from examples.linreg.model import LinReg


class SlowLinReg(LinReg):
    """Sleeps in every batch so a test can signal the trainer mid-epoch."""

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        for batch in super().batches(chunk, ctx):
            time.sleep(0.2)
            yield batch


class CrashingLinReg(LinReg):
    """Worker 0 of trainer 0 kills itself with SIGKILL on its first batch, 1.5 s into it: long
    enough for a test that polls the process tree to see both workers alive first (workers
    reach their first batch within a fraction of a second of starting)."""

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        if ctx.worker_id == 0:
            time.sleep(1.5)
            os.kill(os.getpid(), signal.SIGKILL)
        yield from super().batches(chunk, ctx)


class PacedCtrDnn(CtrDnn):
    """CTR-DNN that takes at least 0.1 s per batch, so a run on a few thousand lines lasts
    seconds on any machine: long enough for several progress records, which a curve needs."""

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        for batch in super().batches(chunk, ctx):
            time.sleep(0.1)
            yield batch


class BadIdsLinReg(LinReg):
    """Claims ids beyond its table: the communicator's first pull fails mid-epoch (a ConfigError
    from the pserver naming the table)."""

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        for batch in super().batches(chunk, ctx):
            batch.sparse_ids["lin.w"] = batch.sparse_ids["lin.w"] + self.features
            yield batch
