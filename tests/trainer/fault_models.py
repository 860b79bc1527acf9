"""Models that misbehave on purpose, for fault tests of the trainer runtime."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

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
