"""Coalescing of concurrent small pulls of one table into one request.

An online-serving application pulls a few ids at a time from many coroutines at once. Sent one
by one, each pull costs a frame, a server dispatch and a reply; a pserver spends more on that
fixed cost than on the rows. A :class:`PullCoalescer` sends a table's pulls at once while fewer
than two of its requests are in flight (no added latency when the client is not busy) and
queues the pulls that follow; when a request returns, what queued goes out together as one
request, and each caller gets its own rows. Under load this turns N requests into about two per
round trip; alone, it changes nothing.

A queued pull keeps its own deadline while it waits; a coalesced request carries the earliest
deadline of the pulls it serves, and its failure is each of their failures. One request holds at most the rows one frame holds; what does not fit
goes in the next one. The queue holds one entry per waiting caller (each caller waits for its
own entry), so it is bounded by the application's own concurrency.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

import numpy as np

from .retry import timed_out

#: sends one pull of ``ids`` by ``deadline`` (loop time or None) and returns the rows
SendPull = Callable[[np.ndarray, "float | None", float], Awaitable[np.ndarray]]


class _Waiting:
    __slots__ = ("ids", "future", "deadline", "limit")

    def __init__(self, ids: np.ndarray, future: asyncio.Future[np.ndarray], deadline: float | None, limit: float) -> None:
        self.ids = ids
        self.future = future
        self.deadline = deadline
        self.limit = limit


def _expire(future: asyncio.Future[np.ndarray], limit: float) -> None:
    if not future.done():
        future.set_exception(timed_out(limit))


class PullCoalescer:
    """Small pulls of one table: up to ``max_inflight`` requests in flight, the rest merged
    behind them."""

    def __init__(self, send: SendPull, max_rows: int, max_inflight: int = 2) -> None:
        self._send = send
        self.max_rows = max_rows
        #: requests in flight at once: one more than one keeps the server busy while a reply
        #: travels back and its callers run, instead of idling a round trip per batch
        self.max_inflight = max_inflight
        self._inflight = 0
        self._queue: deque[_Waiting] = deque()
        self._flushers: set[asyncio.Task[None]] = set()  # send what queued (held: not collected)
        #: requests sent and pulls they served (a pull alone counts as one request, one pull)
        self.requests = 0
        self.pulls = 0

    @property
    def idle(self) -> bool:
        """Nothing in flight and nothing queued."""
        return self._inflight == 0 and not self._queue

    async def pull(self, ids: np.ndarray, deadline: float | None, limit: float) -> np.ndarray:
        if self._inflight < self.max_inflight and not self._queue:
            self._inflight += 1
            try:
                self.requests += 1
                self.pulls += 1
                return await self._send(ids, deadline, limit)
            finally:
                self._done()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[np.ndarray] = loop.create_future()
        self._queue.append(_Waiting(ids, future, deadline, limit))
        # while queued its own deadline still holds (the requests ahead may take longer)
        timer = None if deadline is None else loop.call_at(deadline, _expire, future, limit)
        try:
            return await future
        finally:
            if timer is not None:
                timer.cancel()

    def _done(self) -> None:
        """A request is done: its slot sends what queued behind it, or goes idle."""
        self._inflight -= 1
        if self._queue:
            self._inflight += 1
            task = asyncio.ensure_future(self._flush())
            self._flushers.add(task)
            task.add_done_callback(self._flushers.discard)

    async def _flush(self) -> None:
        try:
            batch, rows = [], 0
            queue = self._queue
            while queue and (not batch or rows + len(queue[0].ids) <= self.max_rows):
                waiting = queue.popleft()
                if waiting.future.done():  # its caller was cancelled meanwhile
                    continue
                batch.append(waiting)
                rows += len(waiting.ids)
            if batch:
                await self._serve(batch)
        finally:
            self._done()

    async def _serve(self, batch: list[_Waiting]) -> None:
        timed = [w for w in batch if w.deadline is not None]
        soonest = min(timed, key=lambda w: w.deadline or 0.0) if timed else None
        deadline, limit = (soonest.deadline, soonest.limit) if soonest is not None else (None, 0.0)
        ids = batch[0].ids if len(batch) == 1 else np.concatenate([w.ids for w in batch])
        self.requests += 1
        self.pulls += len(batch)
        try:
            rows = await self._send(ids, deadline, limit)
        except asyncio.CancelledError:
            for w in batch:
                if not w.future.done():
                    w.future.cancel()
            raise
        except Exception as exc:  # each waiting caller gets the failure of the request it joined
            for w in batch:
                if not w.future.done():
                    w.future.set_exception(exc)
            return
        at = 0
        for w in batch:
            n = len(w.ids)
            if not w.future.done():
                w.future.set_result(rows[at : at + n])
            at += n
