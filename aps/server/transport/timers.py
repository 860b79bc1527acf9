"""A server connection's timers on its event loop: the handshake's deadline, the deadline of the
frame in progress, and the linger after a refused frame.

Why apart from the connection: :class:`~aps.wire.limits.ConnectionLimits` says when each is due
(arithmetic on times it is given); arming, re-arming and cancelling the loop's timers is one
small job of its own, and the connection only says what an overdue one does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ...wire.limits import ConnectionLimits


class ConnectionTimers:
    """Arms the deadlines ``limits`` computes; ``on_handshake`` / ``on_frame`` run when one is
    overdue (the frame's only once no later frame has begun since it was armed)."""

    __slots__ = ("loop", "limits", "on_handshake", "on_frame", "_handshake", "_frame", "_linger")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, limits: ConnectionLimits, on_handshake: Callable[[], None],
        on_frame: Callable[[], None],
    ) -> None:
        self.loop = loop
        self.limits = limits
        self.on_handshake = on_handshake
        self.on_frame = on_frame
        self._handshake: asyncio.TimerHandle | None = None
        self._frame: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None

    def start_handshake(self) -> None:
        """The connection was accepted now: its handshake must be done by the deadline."""
        due = self.limits.handshake_deadline(self.loop.time())
        if due is not None:
            self._handshake = self.loop.call_at(due, self._handshake_due)

    def handshake_done(self) -> None:
        if self._handshake is not None:
            self._handshake.cancel()
            self._handshake = None

    def watch_frame(self, buffered: int, reading: bool, completed: bool) -> None:
        """After bytes were parsed: arm the deadline of a frame partly received (none while we
        do not read: the peer cannot finish it). See :meth:`ConnectionLimits.watch_frame`."""
        due = self.limits.watch_frame(self.loop.time, buffered, reading, completed)
        if due is not None and self._frame is None:
            self._frame = self.loop.call_at(due, self._frame_due)

    def linger(self, seconds: float, then: Callable[[], None]) -> None:
        """Run ``then`` after ``seconds`` (a refused frame's connection, once its reply is out)."""
        self._linger = self.loop.call_later(seconds, then)

    def cancel(self) -> None:
        """The connection is gone: nothing is due any more."""
        for timer in (self._handshake, self._frame, self._linger):
            if timer is not None:
                timer.cancel()
        self._handshake = self._frame = self._linger = None

    def _handshake_due(self) -> None:
        self._handshake = None
        self.on_handshake()

    def _frame_due(self) -> None:
        self._frame = None
        due = self.limits.frame_deadline()
        if due is None:
            return
        if self.loop.time() < due:  # a later frame is in progress: its own deadline
            self._frame = self.loop.call_at(due, self._frame_due)
            return
        self.on_frame()
