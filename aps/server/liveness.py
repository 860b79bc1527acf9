"""Trainer leases: which trainers this pserver still hears from.

A trainer's lease is renewed by every frame that arrives on one of its connections (its
requests, and the heartbeat pings its client sends while it is otherwise quiet; psclient.py).
A trainer is *gone* once it has been silent for ``timeout`` seconds: all its connections
closed (a killed process) or open but mute (a dead machine, a cut network). The clock of a
trainer without a connection starts when its last one closed.

Only trainers this server has heard from can be gone, with one exception: a server restarted
from a checkpoint (``resume``) counts every trainer as heard at its start, because a trainer
that finished while it was down will never come back to say so.

What being gone does is the core's business (core.py): sync rounds and barriers waiting for a
gone trainer fail naming it, and it counts as done for the exit rule. Hearing from a gone
trainer again does not make it live: the core decides, at its next request, whether it rejoins
(:meth:`TrainerLeases.back`) or is told it was dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class TrainerLeases:
    """Last time each trainer was heard from, and which have gone silent too long."""

    def __init__(self, num_trainers: int, timeout: float, on_gone: Callable[[list[int]], None]) -> None:
        self.num_trainers = num_trainers
        self.timeout = timeout
        self._on_gone = on_gone
        self.last_heard: dict[int, float] = {}
        self.connections: dict[int, int] = {}
        self.gone: set[int] = set()
        self._timer: asyncio.TimerHandle | None = None

    def start(self, heard_all: bool) -> None:
        """Begin watching (``heard_all``: count every trainer as heard now, for a resumed server)."""
        if not self.timeout:
            return
        loop = asyncio.get_running_loop()
        if heard_all:
            now = loop.time()
            for trainer in range(self.num_trainers):
                self.last_heard.setdefault(trainer, now)
        self._timer = loop.call_later(self._period, self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def _period(self) -> float:
        """How often leases are checked: a gone trainer is noticed within timeout + period."""
        return min(1.0, self.timeout / 4)

    def heard(self, trainer: int) -> None:
        """A frame came from ``trainer`` (cheap: called for every frame of a trainer)."""
        self.last_heard[trainer] = asyncio.get_running_loop().time()

    def back(self, trainer: int) -> None:
        """A gone trainer rejoins: it is live again, and may be declared gone again."""
        self.gone.discard(trainer)
        self.heard(trainer)

    def connected(self, trainer: int) -> None:
        self.connections[trainer] = self.connections.get(trainer, 0) + 1
        self.heard(trainer)

    def disconnected(self, trainer: int) -> None:
        left = self.connections.get(trainer, 0) - 1
        if left > 0:
            self.connections[trainer] = left
        else:
            self.connections.pop(trainer, None)
        self.heard(trainer)  # its silence is counted from now

    def silent_for(self, trainer: int) -> float:
        return asyncio.get_running_loop().time() - self.last_heard[trainer]

    def _check(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self._period, self._check)
        now = asyncio.get_running_loop().time()
        newly = sorted(t for t, at in self.last_heard.items() if t not in self.gone and now - at > self.timeout)
        if newly:
            self.gone.update(newly)
            self._on_gone(newly)
