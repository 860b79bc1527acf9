"""Things a pserver makes clients wait for: named barriers and sync-mode gradient rounds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import ErrorCode, ServerError


@dataclass
class _BarrierState:
    target: int
    arrived: dict[int, int] = field(default_factory=dict)
    done: asyncio.Future[int] | None = None


class Barriers:
    """Named barriers; arrivals are keyed by client so a retried call counts once."""

    def __init__(self) -> None:
        self._pending: dict[str, _BarrierState] = {}

    def arrive(self, name: str, client_id: int, target: int, value: int = 0) -> asyncio.Future[int]:
        """Join barrier ``name``; the future resolves to the sum of every participant's value."""
        state = self._pending.get(name)
        if state is None:
            state = self._pending[name] = _BarrierState(target, done=asyncio.get_running_loop().create_future())
        elif state.target != target:
            raise ServerError(ErrorCode.BAD_REQUEST, f"barrier {name!r} expects {state.target} participants, got {target}")
        assert state.done is not None
        state.arrived[client_id] = value
        if len(state.arrived) >= state.target:
            del self._pending[name]
            state.done.set_result(sum(state.arrived.values()))
        return state.done

    def fail_all(self, error: BaseException) -> None:
        for state in self._pending.values():
            if state.done is not None and not state.done.done():
                state.done.set_exception(error)
        self._pending.clear()


@dataclass
class _Round:
    ids: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)
    finals: set[int] = field(default_factory=set)
    done: asyncio.Future[None] | None = None


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
        apply: Callable[[np.ndarray | None, np.ndarray], None],
    ) -> asyncio.Future[None]:
        rnd = self._rounds.get(key)
        if rnd is None:
            rnd = self._rounds[key] = _Round(done=asyncio.get_running_loop().create_future())
        if client_id in rnd.finals:
            raise ServerError(ErrorCode.BAD_REQUEST, f"sync push for {key!r}: this trainer already finished the round")
        if ids is not None:
            rnd.ids.append(np.array(ids, copy=True))
        rnd.values.append(np.array(values, copy=True))
        if final:
            rnd.finals.add(client_id)
        assert rnd.done is not None
        if len(rnd.finals) >= self.num_trainers:
            del self._rounds[key]
            try:
                all_ids = np.concatenate(rnd.ids) if ids is not None else None
                apply(all_ids, np.concatenate(rnd.values) if ids is not None else _sum_dense(rnd.values))
            except BaseException as exc:  # the pushers must learn that the round failed
                rnd.done.set_exception(exc)
            else:
                rnd.done.set_result(None)
        return rnd.done

    def fail_all(self, error: BaseException) -> None:
        for rnd in self._rounds.values():
            if rnd.done is not None and not rnd.done.done():
                rnd.done.set_exception(error)
        self._rounds.clear()


def _sum_dense(values: list[np.ndarray]) -> np.ndarray:
    """Dense sync pushes cover the same range; their sum is the round's gradient."""
    total = np.array(values[0], dtype=np.float32, copy=True)
    for v in values[1:]:
        if v.shape != total.shape:
            raise ServerError(ErrorCode.SHAPE_MISMATCH, "dense sync pushes of one round must cover the same range")
        total += v
    return total
