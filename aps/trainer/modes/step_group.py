"""sync and half_async: the workers of a trainer step together (docs/modes.md, "sync" and
"half_async").

Each worker's gradients are merged into the step's accumulator the moment they arrive; when
every still-active worker has handed in its batch, the trainer averages them, pushes, pulls the
dense parameters and releases the workers. In sync mode the push carries the SYNC flag (each
pserver applies one averaged update once every trainer pushed) and the trainers vote each round
whether anyone still has data, so a trainer that ran out joins rounds with empty gradients
instead of hanging the others. half_async pushes without waiting for the other trainers.

With a lag of 1 (hybrid's dense rounds, :meth:`Mode.dense_lag`) the workers do not wait for
their step's round: once every one handed in step s, and round s-1 has written its parameters,
they are released at once to compute step s+1 with round s-1's parameters, while round s
(average, vote, push, pull) runs in the background. Two accumulators alternate (step s+1's
gradients never reach round s's) and so do two parameter buffers (round r pulls into the one the
workers do not read, and the reply names the one they do).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import ClassVar

from ..accumulator import GradAccumulator
from ..ipc import Kind, Record
from .base import Link, Mode


class StepGroup(Mode):
    """Workers of one trainer step together; trainers do not wait for each other."""

    #: trainers wait for each other each step (sync) or not (half_async)
    across_trainers: ClassVar[bool] = False
    averages_workers = True

    def __init__(
        self, link: Link, sparse: bool = True, lag: int = 0, after_round: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """``sparse=False``: the steps carry the dense gradients only (hybrid mode pushes the
        sparse ones as async does). ``lag`` 1: each step's round runs while the next computes
        (see the module; the shared arrays must have two dense buffers). ``after_round`` is
        awaited once a round's pull is done, before the workers hear of it (hybrid mode's sparse
        pushes wait for it)."""
        super().__init__(link)
        self._after_round = after_round
        assert link.strategy.workers is not None
        assert not lag or len(link.dense_buffers) == 2, "a dense lag needs two parameter buffers"
        self._lag = lag
        self._accs = [link.accumulator(max_batches=link.strategy.workers, sparse=sparse) for _ in range(1 + lag)]
        self._filling = 0  # the accumulator this step's gradients go to
        self._average = link.average(across_workers=True)
        self._active: set[int] = set()
        self._pending: dict[int, int] = {}  # worker -> the step its merged gradients belong to
        self._lock = asyncio.Lock()
        self._round = 0
        self._latest = 0  # the buffer the last complete round pulled into
        self._running: asyncio.Task[None] | None = None  # the round in the background (lag 1)

    def begin_epoch(self, epoch: int, workers: set[int]) -> None:
        super().begin_epoch(epoch, workers)
        assert self._running is None, "the previous epoch's last round is still running"
        self._round = 0
        self._active = set(workers)
        self._pending.clear()
        for acc in self._accs:
            acc.clear()

    async def on_grads(self, worker: int, rec: Record) -> None:
        async with self._lock:
            self.link.take(self._accs[self._filling], worker, rec.counts, rec.step, rec.examples)
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
            acc = self._accs[self._filling]
            if self._lag:
                await self._finish_round()  # the previous step's: its buffer is what they read next
                self._filling = 1 - self._filling
                self._running = asyncio.ensure_future(self._step_round(acc, 1 - self._latest))
                self._running.add_done_callback(self._round_done)
            else:
                await self._step_round(acc, 0)
            for w, step in released:
                self.link.reply(w, Record(Kind.OK, step=step, answers=Kind.GRADS, buffer=self._latest))

    async def _step_round(self, acc: GradAccumulator, buffer: int) -> None:
        """One step's round: average, vote (sync), push, pull the dense tables into ``buffer``."""
        try:
            if self._average:
                acc.scale(1.0 / acc.batches)
            if self._votes:
                await self._vote(has_data=True)
            await self.link.push(acc, sync=self.across_trainers)
        finally:
            acc.clear()
        await self.link.pull_dense(buffer)
        self._latest = buffer
        if self._after_round is not None:
            await self._after_round()

    def _round_done(self, task: asyncio.Task[None]) -> None:
        """A background round's failure is the mode's (the trainer sees it through check())."""
        if not task.cancelled() and task.exception() is not None:
            self.failure = task.exception()

    async def _finish_round(self) -> None:
        """Wait for the round in the background, if any, and raise its failure. A waiter that is
        cancelled leaves the round running (only :meth:`stop` cancels it)."""
        task = self._running
        if task is None:
            return
        await asyncio.wait({task})
        if self._running is task:  # another waiter may have started the next round meanwhile
            self._running = None
        task.result()

    async def flush(self) -> None:
        """The round in the background reaches the pservers (lag 1; else nothing is pending)."""
        await self._finish_round()

    async def end_epoch(self) -> None:
        await self._finish_round()
        if self._votes:
            await self._idle_rounds()
        if self._lag:  # no worker computes: both buffers get the newest values for the next epoch
            newest = self.link.dense_buffers[self._latest]
            for name, values in self.link.dense_buffers[1 - self._latest].items():
                values[...] = newest[name]

    async def stop(self) -> None:
        if self._running is not None:
            self._running.cancel()
            await asyncio.gather(self._running, return_exceptions=True)
            self._running = None

    @property
    def _votes(self) -> bool:
        """Whether the rounds need the trainers' vote: across several trainers only (one trainer
        has data for as long as it steps; its barrier was a round trip per step, ~4% of a round)."""
        return self.across_trainers and self.link.num_trainers > 1

    async def _vote(self, has_data: bool) -> int:
        """Every trainer says whether it still has data this round (a summed barrier)."""
        self._round += 1
        name = f"aps.sync.{self.epoch}.{self._round}"
        return await self.link.ps.barrier(name, value=int(has_data), timeout=self.link.strategy.rpc_timeout)

    async def _idle_rounds(self) -> None:
        """This trainer ran out: join rounds with empty gradients until every trainer has."""
        while await self._vote(has_data=False):
            async with self._lock:
                await self.link.push(self._accs[0], sync=True)  # nothing added: empty ids, zero dense
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
