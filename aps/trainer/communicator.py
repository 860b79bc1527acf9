"""The communicator: the one coroutine family in a trainer that talks to the pservers.

Workers never open sockets. They ask for rows (PULL) and hand over gradients (GRADS) through
shared mailboxes, or, in geo mode, train locally and say when the next exchange is due (STEPS).
What happens next is the mode's business: the communicator builds the mode object once
(:mod:`aps.trainer.modes`, one class per mode) and routes every worker request and epoch event
to it; the metrics and records read the mode's counters through it (:meth:`Communicator.report`).
Exact semantics of each mode: docs/modes.md.
"""

from __future__ import annotations

from collections.abc import Callable

from ..client import PSClient
from .ipc import Kind, Record
from .model import Model
from .modes import Link, Mode, mode_class
from .shared import Attached
from .strategy import Strategy


class Communicator:
    """Owns all network traffic of one trainer, through its mode object."""

    def __init__(
        self,
        ps: PSClient,
        model: Model,
        strategy: Strategy,
        shared: Attached,
        reply: Callable[[int, Record], None],
        trainer_id: int,
        num_trainers: int,
    ) -> None:
        self.ps = ps
        self.strategy = strategy
        self.link = Link(ps, model, strategy, shared, reply, trainer_id, num_trainers)
        self.mode: Mode = mode_class(strategy.mode)(self.link)
        self.epoch = 0

    # ----------------------------------------------------------------- read by the metrics endpoint

    def report(self) -> dict[str, float]:
        """The mode's counters by name (:meth:`Mode.report`): the metrics endpoint and the
        records read them all from this one dict."""
        return self.mode.report()

    @property
    def failure(self) -> BaseException | None:
        """The failure of a background task of the mode, if any."""
        return self.mode.failure

    def check(self) -> None:
        self.mode.check_failure()

    # ----------------------------------------------------------------- start / stop

    async def start(self) -> None:
        """Fill the local replica from the pservers and start the mode's background work."""
        await self.mode.start()

    async def stop(self) -> None:
        await self.mode.stop()

    # ----------------------------------------------------------------- epochs

    def begin_epoch(self, epoch: int, workers: set[int]) -> None:
        self.epoch = epoch
        self.mode.begin_epoch(epoch, workers)

    async def flush(self) -> None:
        """Hand the pservers everything this trainer has computed so far without ending the
        epoch (async: the merged batches are pushed; geo: the deltas are sent now)."""
        await self.mode.flush()

    async def end_epoch(self) -> None:
        """Every worker finished the epoch: flush what is in flight so the servers have it all."""
        await self.mode.end_epoch()

    async def finish_epoch(self, epoch: int) -> None:
        """The end of an epoch as every trainer sees it: flush, meet the other trainers at the
        epoch barrier, and take in what they sent before it. Both the file-driven trainer and
        the step-wise one call this, so an epoch ends the same way in each."""
        await self.end_epoch()
        self.check()
        await self.ps.barrier(f"aps.epoch.{epoch}", timeout=self.strategy.rpc_timeout)
        await self.mode.after_barrier()

    # ----------------------------------------------------------------- worker requests

    async def handle(self, worker: int, rec: Record) -> None:
        if rec.kind == Kind.PULL:
            await self.mode.on_pull(worker, rec)
        elif rec.kind == Kind.GRADS:
            await self.mode.on_grads(worker, rec)
        elif rec.kind == Kind.STEPS:
            await self.mode.on_steps(worker, rec)
        elif rec.kind == Kind.EPOCH_DONE:
            await self.mode.on_worker_done(worker)
