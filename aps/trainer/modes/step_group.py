"""sync and half_async: the workers of a trainer step together (docs/modes.md, "sync" and
"half_async").

Each worker's gradients are merged into the step's accumulator the moment they arrive; when
every still-active worker has handed in its batch, the trainer averages them, pushes, pulls the
dense parameters and releases the workers. In sync mode the push carries the SYNC flag (each
pserver applies one averaged update once every trainer pushed) and the trainers vote each round
whether anyone still has data, so a trainer that ran out joins rounds with empty gradients
instead of hanging the others. half_async pushes without waiting for the other trainers.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from ..ipc import Kind, Record
from .base import Link, Mode


class StepGroup(Mode):
    """Workers of one trainer step together; trainers do not wait for each other."""

    #: trainers wait for each other each step (sync) or not (half_async)
    across_trainers: ClassVar[bool] = False

    def __init__(self, link: Link, sparse: bool = True) -> None:
        """``sparse=False``: the steps carry the dense gradients only (hybrid mode pushes the
        sparse ones as async does)."""
        super().__init__(link)
        assert link.strategy.workers is not None
        self._acc = link.accumulator(max_batches=link.strategy.workers, sparse=sparse)
        self._average = link.average(across_workers=True)
        self._active: set[int] = set()
        self._pending: dict[int, int] = {}  # worker -> the step its merged gradients belong to
        self._lock = asyncio.Lock()
        self._round = 0

    def begin_epoch(self, epoch: int, workers: set[int]) -> None:
        super().begin_epoch(epoch, workers)
        self._round = 0
        self._active = set(workers)
        self._pending.clear()
        self._acc.clear()

    async def on_grads(self, worker: int, rec: Record) -> None:
        async with self._lock:
            self.link.take(self._acc, worker, rec.counts, rec.step, rec.examples)
            self._pending[worker] = rec.step
        await self._maybe_step()

    async def on_worker_done(self, worker: int) -> None:
        self._active.discard(worker)
        await self._maybe_step()

    async def _maybe_step(self) -> None:
        """When every still-active worker has handed in its gradients, run one trainer step."""
        async with self._lock:
            if not self._pending or any(w not in self._pending for w in self._active):
                return
            released = sorted(self._pending.items())
            self._pending.clear()
            try:
                if self._average:
                    self._acc.scale(1.0 / self._acc.batches)
                if self.across_trainers:
                    await self._vote(has_data=True)
                await self.link.push(self._acc, sync=self.across_trainers)
            finally:
                self._acc.clear()
            await self.link.pull_dense()
            for w, step in released:
                self.link.reply(w, Record(Kind.OK, step=step, answers=Kind.GRADS))

    async def end_epoch(self) -> None:
        if self.across_trainers:
            await self._idle_rounds()

    async def _vote(self, has_data: bool) -> int:
        """Every trainer says whether it still has data this round (a summed barrier)."""
        self._round += 1
        name = f"aps.sync.{self.epoch}.{self._round}"
        return await self.link.ps.barrier(name, value=int(has_data), timeout=self.link.strategy.rpc_timeout)

    async def _idle_rounds(self) -> None:
        """This trainer ran out: join rounds with empty gradients until every trainer has."""
        while await self._vote(has_data=False):
            async with self._lock:
                await self.link.push(self._acc, sync=True)  # nothing added: empty ids, zero dense
            await self.link.pull_dense()


class SyncStepGroup(StepGroup):
    """sync: one averaged update per round on the pservers, after every trainer pushed."""

    name = "sync"
    across_trainers = True
    #: a restarted shard would miss the round the others applied, and desynchronise them
    resumes_one_shard = False


class HalfAsyncStepGroup(StepGroup):
    """half_async: as sync inside the trainer; each push is applied as it arrives."""

    name = "half_async"
    across_trainers = False
