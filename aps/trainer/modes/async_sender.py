"""async: workers push as they go (docs/modes.md, "async").

A worker's gradients are merged into the newest accumulator that has room (at most
``max_merge_var_num`` batches each) and the worker is released at once; a full set of waiting
batches (``send_queue_size``) holds it back until the sender has taken some. The sender takes the
oldest accumulator whenever the previous push is done, averages it when ``--merge`` says so,
pushes it and, every ``min_send_grad_num_before_recv`` pushes, pulls the dense parameters.
Workers prefetch their next batch's rows so they never idle on the pull round trip.
"""

from __future__ import annotations

import asyncio
from collections import deque

import numpy as np

from ...errors import ApsError
from ..accumulator import GradAccumulator
from ..ipc import Kind, Record
from .base import Link, Mode


class AsyncSender(Mode):
    """Merge on arrival into bounded accumulators; one sender task pushes them in order."""

    name = "async"
    prefetch = True

    def __init__(self, link: Link, dense: bool = True) -> None:
        """``dense=False``: push and pull the sparse tables only (hybrid mode steps the dense
        ones together)."""
        super().__init__(link)
        s = link.strategy
        assert s.max_merge_var_num is not None and s.send_queue_size is not None
        assert s.min_send_grad_num_before_recv is not None
        self._merge = s.max_merge_var_num
        self._queue_size = s.send_queue_size
        self._recv_every = s.min_send_grad_num_before_recv
        self._average = link.average(across_workers=False)
        # enough accumulators for send_queue_size waiting batches, plus the one being pushed
        count = -(-self._queue_size // self._merge) + 1
        self._free: list[GradAccumulator] = [link.accumulator(self._merge, dense=dense) for _ in range(count)]
        self._pull_dense = dense
        self._ready: deque[GradAccumulator] = deque()  # oldest first; the newest may still fill
        self._waiting = 0  # batches merged and not yet taken by the sender
        self._sending = False
        self._gated = False  # pushes start only when the gate opens (gate_sends)
        self._open = 0  # accumulators the gate let through that the sender has not taken yet
        self._changed = asyncio.Condition()
        self._sender: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await super().start()
        self.start_sending()

    def start_sending(self) -> None:
        """Start the task that pushes the merged batches."""
        self._sender = asyncio.ensure_future(self._send_loop())

    async def stop(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)

    @property
    def queue_depth(self) -> int:
        """Batches of gradients waiting to be sent: whether the network keeps up."""
        return self._waiting

    @property
    def queue_capacity(self) -> int:
        """How many batches may wait before workers are held back."""
        return self._queue_size

    def report(self) -> dict[str, float]:
        return {**super().report(), "send_queue_depth": self._waiting, "send_queue_capacity": self._queue_size}

    def _target(self, ids: list[np.ndarray]) -> GradAccumulator | None:
        """The accumulator a batch with these ids goes to now, or None if it must wait."""
        if self._waiting >= self._queue_size:
            return None
        if self._ready and self._ready[-1].fits(ids):
            return self._ready[-1]
        if self._free:
            acc = self._free.pop()
            self._ready.append(acc)
            return acc
        return None

    async def on_grads(self, worker: int, rec: Record) -> None:
        await self.merge(worker, rec)
        self.link.reply(worker, Record(Kind.OK, step=rec.step, answers=Kind.GRADS))

    async def merge(self, worker: int, rec: Record) -> None:
        """Take the worker's gradients of ``rec.step`` into an accumulator, waiting while none
        has room."""
        ids = self.link.mailbox_ids(worker, rec.counts, rec.step)
        async with self._changed:
            while True:
                self.check_failure()
                acc = self._target(ids)
                if acc is not None:
                    break
                self._let_through()  # a closed gate never holds a worker back
                await self._changed.wait()  # bounded: while nothing fits, the worker waits
            self.link.take(acc, worker, rec.counts, rec.step, rec.examples)
            self._waiting += 1
            self._changed.notify_all()

    def gate_sends(self) -> None:
        """From now on the sender waits for :meth:`open_gate` (or a worker that would wait for
        room, or a flush) before it pushes what was merged: batches merged meanwhile go in one
        push, and the pserver is left to the requests sent before."""
        self._gated = True

    async def open_gate(self) -> None:
        """Let the sender push every accumulator merged so far."""
        async with self._changed:
            self._let_through()

    def _let_through(self) -> None:
        """Open the gate for what is merged now (the caller holds the condition's lock)."""
        self._open = len(self._ready)
        self._changed.notify_all()

    async def flush(self) -> None:
        """Wait until every merged batch was pushed."""
        async with self._changed:
            self._let_through()
            await self._changed.wait_for(lambda: self.failure is not None or (not self._ready and not self._sending))
        self.check_failure()

    async def end_epoch(self) -> None:
        await self.flush()
        await self.link.pull_dense()

    async def _send_loop(self) -> None:
        try:
            while True:
                async with self._changed:
                    await self._changed.wait_for(lambda: bool(self._ready) and (not self._gated or self._open > 0))
                    acc = self._ready.popleft()
                    self._open = max(0, self._open - 1)
                    self._waiting -= acc.batches
                    self._sending = True
                    self._changed.notify_all()
                try:
                    await self._send(acc)
                finally:
                    acc.clear()
                    async with self._changed:
                        self._free.append(acc)
                        self._sending = False
                        self._changed.notify_all()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # surfaced by the trainer through check(), and to waiting workers
            self.failure = exc
            async with self._changed:
                self._changed.notify_all()

    async def _send(self, acc: GradAccumulator) -> None:
        if acc.batches == 0:
            raise ApsError("AsyncSender: an empty accumulator was queued")
        if self._average:
            acc.scale(1.0 / acc.batches)
        await self.link.push(acc, sync=False)
        if self._pull_dense and self.link.sends % self._recv_every == 0:
            await self.link.pull_dense()
