"""Things a pserver makes clients wait for: named barriers and sync-mode gradient rounds.

Both are keyed by client id (a retried request counts once) and give every request its own
future, so one waiter can be withdrawn without touching the others: when a client's last
connection closes, :meth:`Barriers.withdraw` and :meth:`SyncRounds.withdraw` take back what it
had put in (its arrivals, its gradient chunks) and fail its futures. A client that reconnects
retries those requests, which then count again, once.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ErrorCode, ServerError


def _fail(waiters: list[asyncio.Future[Any]], error: BaseException) -> list[asyncio.Future[Any]]:
    failed = []
    for waiter in waiters:
        if not waiter.done():
            waiter.set_exception(error)
            failed.append(waiter)
    return failed


@dataclass
class _BarrierState:
    target: int
    default: bool = False  # the count was the cluster's (live) trainers, not the caller's own
    arrived: dict[int, int] = field(default_factory=dict)  # client id -> value
    trainer_of: dict[int, int] = field(default_factory=dict)  # client id -> its trainer (-1: none)
    waiters: dict[int, list[asyncio.Future[int]]] = field(default_factory=dict)  # client id -> its requests


#: barriers passed without a counted-out trainer that are remembered for its late arrival; the
#: oldest is forgotten first (a trainer that late then waits at it like at a new barrier)
PASSED_KEPT = 4096


class Barriers:
    """Named barriers; arrivals are keyed by client so a retried call counts once.

    A barrier counted in live trainers (``default``) waits for the trainers that are not counted
    out (``counted_out()``: the gone ones); an arrival of a counted-out trainer does not count
    toward it. Such a barrier that completes without a counted-out trainer is remembered: that
    trainer's own arrival later (it was paused, came back and caught up) completes at once with
    the barrier's total, so a trainer that rejoins never waits at a barrier the others passed.
    """

    def __init__(self, counted_out: Callable[[], AbstractSet[int]] = frozenset) -> None:
        self._pending: dict[str, _BarrierState] = {}
        self._counted_out = counted_out
        #: name -> (total, trainers that did not arrive before it completed)
        self._passed: OrderedDict[str, tuple[int, set[int]]] = OrderedDict()

    def arrive(
        self, name: str, client_id: int, target: int, value: int = 0, default: bool = False, trainer: int = -1
    ) -> asyncio.Future[int]:
        """Join barrier ``name``; the future resolves to the sum of every participant's value.
        ``default``: ``target`` is the cluster's live trainers, which :meth:`retarget` may change;
        ``trainer``: the caller's trainer id (-1: not a trainer)."""
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        passed = self._passed.get(name) if default and trainer >= 0 else None
        if passed is not None and trainer in passed[1] and name not in self._pending:
            passed[1].discard(trainer)  # a late trainer: the others are past this barrier
            if not passed[1]:
                del self._passed[name]
            waiter.set_result(passed[0])
            return waiter
        state = self._pending.get(name)
        if state is None:
            state = self._pending[name] = _BarrierState(target, default)
        elif default and state.default:
            state.target = target  # the live trainers as of this arrival
        elif state.target != target:
            raise ServerError(ErrorCode.BAD_REQUEST, f"barrier {name!r} expects {state.target} participants, got {target}")
        state.arrived[client_id] = value
        state.trainer_of[client_id] = trainer
        state.waiters.setdefault(client_id, []).append(waiter)
        self._complete(name, state)
        return waiter

    def _complete(self, name: str, state: _BarrierState) -> None:
        out = self._counted_out() if state.default else frozenset()
        counted = sum(1 for c in state.arrived if state.trainer_of.get(c, -1) not in out)
        if counted < state.target:
            return
        del self._pending[name]
        total = sum(state.arrived.values())
        for waiters in state.waiters.values():
            for w in waiters:
                if not w.done():
                    w.set_result(total)
        missing = set(out) - set(state.trainer_of.values())
        if missing:
            self._passed[name] = (total, missing)
            while len(self._passed) > PASSED_KEPT:
                self._passed.popitem(last=False)

    def retarget(self, target: int) -> None:
        """Trainers went or came back: barriers counted in live trainers now wait for ``target``
        of them (the arrivals of counted-out trainers do not count)."""
        for name, state in list(self._pending.items()):
            if state.default:
                state.target = target
                self._complete(name, state)

    def withdraw(self, client_id: int, error: BaseException) -> list[asyncio.Future[Any]]:
        """Take back ``client_id``'s arrivals at every pending barrier; fail its waiters."""
        failed: list[asyncio.Future[Any]] = []
        for name, state in list(self._pending.items()):
            if client_id not in state.arrived:
                continue
            del state.arrived[client_id]
            state.trainer_of.pop(client_id, None)
            failed += _fail(state.waiters.pop(client_id, []), error)
            if not state.arrived:
                del self._pending[name]  # nobody waits: a later barrier may pick another count
        return failed

    def pending(self) -> dict[str, int]:
        """Arrivals so far of every barrier that is not complete (for stats and tests)."""
        return {name: len(state.arrived) for name, state in self._pending.items()}

    def fail_all(self, error: BaseException) -> None:
        for state in self._pending.values():
            for waiters in state.waiters.values():
                _fail(waiters, error)
        self._pending.clear()


@dataclass
class _Part:
    """One client's share of a sync round: its chunks so far and a future per chunk request."""

    ids: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)
    waiters: list[asyncio.Future[Any]] = field(default_factory=list)
    final: bool = False
    nbytes: int = 0


@dataclass
class _Round:
    parts: dict[int, _Part] = field(default_factory=dict)  # client id -> its share, in arrival order
    finals: int = 0


class SyncRounds:
    """Sync mode: gradients of one step from every trainer are summed, then applied once.

    A trainer's push (all its chunks) joins the current round of a key (a sparse table, or one
    block of a dense table); the round closes when ``num_trainers`` distinct clients have sent
    their FINAL chunk. ``apply`` then gets the concatenated gradients and every pusher is released.
    """

    def __init__(self, num_trainers: int) -> None:
        self.num_trainers = num_trainers
        self._rounds: dict[tuple[object, ...], _Round] = {}

    def add(
        self,
        key: tuple[object, ...],
        client_id: int,
        ids: np.ndarray | None,
        values: np.ndarray,
        final: bool,
        apply: Callable[[np.ndarray | None, np.ndarray], Awaitable[None] | None],
        result: Any = None,
    ) -> asyncio.Future[Any]:
        """Add one chunk; the returned future resolves to ``result`` once the round is applied."""
        rnd = self._rounds.get(key)
        part = rnd.parts.get(client_id) if rnd is not None else None
        if part is not None and part.final:
            raise ServerError(ErrorCode.BAD_REQUEST, f"sync push for {key!r}: this trainer already finished the round")
        if rnd is None:
            rnd = self._rounds[key] = _Round()
        if part is None:
            part = rnd.parts[client_id] = _Part()
        # kept as they are: they are views of the request's own payload (never of a reused
        # receive buffer, aps.wire.frame), and nothing else writes them; a copy of each was a
        # dense round's largest cost after the optimizer (fresh pages for megabytes each round)
        if ids is not None:
            part.ids.append(ids)
        part.values.append(values)
        part.nbytes += values.nbytes + (ids.nbytes if ids is not None else 0)
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        part.waiters.append(waiter)
        if final:
            part.final = True
            rnd.finals += 1
        if rnd.finals >= self.num_trainers:
            del self._rounds[key]
            parts = list(rnd.parts.values())
            waiters = [w for p in parts for w in p.waiters]
            try:
                all_values = [v for p in parts for v in p.values]
                if ids is not None:
                    outcome = apply(np.concatenate([i for p in parts for i in p.ids]), np.concatenate(all_values))
                else:
                    outcome = apply(None, _sum_dense(all_values))
            except BaseException as exc:  # the pushers must learn that the round failed
                _fail(waiters, exc)
            else:
                if isinstance(outcome, Awaitable):  # a kind applying off the loop: release them when it is done
                    asyncio.ensure_future(outcome).add_done_callback(lambda task: _release(waiters, task, result))
                else:
                    _release(waiters, None, result)
        return waiter

    def withdraw(self, client_id: int, error: BaseException) -> list[asyncio.Future[Any]]:
        """Drop ``client_id``'s share of every open round (partial or complete); fail its waiters."""
        failed: list[asyncio.Future[Any]] = []
        for key, rnd in list(self._rounds.items()):
            part = rnd.parts.pop(client_id, None)
            if part is None:
                continue
            if part.final:
                rnd.finals -= 1
            failed += _fail(part.waiters, error)
            if not rnd.parts:
                del self._rounds[key]
        return failed

    def pending_bytes(self) -> int:
        """Gradient bytes held by open rounds."""
        return sum(p.nbytes for rnd in self._rounds.values() for p in rnd.parts.values())

    def fail_all(self, error: BaseException) -> None:
        for rnd in self._rounds.values():
            for part in rnd.parts.values():
                _fail(part.waiters, error)
        self._rounds.clear()


def _release(waiters: list[asyncio.Future[Any]], applied: asyncio.Future[Any] | None, result: Any) -> None:
    """Answer a round's pushers: ``result``, or the error its application (``applied``) ended with."""
    if applied is not None:
        error = asyncio.CancelledError() if applied.cancelled() else applied.exception()
        if error is not None:
            _fail(waiters, error)
            return
    for w in waiters:
        if not w.done():
            w.set_result(result)


def _sum_dense(values: list[np.ndarray]) -> np.ndarray:
    """Dense sync pushes cover the same range; their sum is the round's gradient (one trainer's
    push as it is, float32 as every dense push is checked to be)."""
    if len(values) == 1:
        return values[0]
    total = np.array(values[0], dtype=np.float32, copy=True)
    for v in values[1:]:
        if v.shape != total.shape:
            raise ServerError(ErrorCode.SHAPE_MISMATCH, "dense sync pushes of one round must cover the same range")
        total += v
    return total
