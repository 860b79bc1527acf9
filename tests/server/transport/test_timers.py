"""A connection's timers on a real event loop: the handshake deadline fires unless the
handshake is done, the frame deadline follows the frame in progress (a later frame re-arms it),
and a cancel stops everything."""

from __future__ import annotations

import asyncio

from aps.server.transport.timers import ConnectionTimers
from aps.wire.limits import ConnectionLimits
from tests.conftest import eventually
from tests.wire.test_connection_limits import Pools


def timers(fired: list[str], **limits: float) -> ConnectionTimers:
    """Timers whose deadlines append their name to ``fired``."""
    loop = asyncio.get_running_loop()
    return ConnectionTimers(
        loop, ConnectionLimits(Pools(), **limits), lambda: fired.append("handshake"), lambda: fired.append("frame")  # type: ignore[arg-type]
    )


async def test_the_handshake_deadline_fires_unless_the_handshake_is_done() -> None:
    fired: list[str] = []
    late, done = timers(fired, handshake_timeout=0.05), timers(fired, handshake_timeout=0.05)
    late.start_handshake()
    done.start_handshake()
    done.handshake_done()
    await eventually(lambda: fired == ["handshake"], timeout=5)
    await asyncio.sleep(0.1)  # the other one's deadline is long past too
    assert fired == ["handshake"]


async def test_the_frame_deadline_follows_the_frame_in_progress() -> None:
    fired: list[str] = []
    t = timers(fired, frame_timeout=0.2)
    loop = asyncio.get_running_loop()
    at: list[float] = []
    t.on_frame = lambda: at.append(loop.time())
    t.watch_frame(buffered=3, reading=True, completed=False)  # a frame began: due in 0.2 s
    await asyncio.sleep(0.1)
    next_began = loop.time()
    t.watch_frame(buffered=2, reading=True, completed=True)  # it was done, and the next began
    await eventually(lambda: len(at) == 1, timeout=5)
    assert at[0] >= next_began + 0.2  # the first frame's deadline only re-armed the timer


async def test_cancel_stops_every_timer() -> None:
    fired: list[str] = []
    t = timers(fired, handshake_timeout=0.05, frame_timeout=0.05)
    t.start_handshake()
    t.watch_frame(buffered=3, reading=True, completed=False)
    t.linger(0.05, lambda: fired.append("linger"))
    t.cancel()
    await asyncio.sleep(0.15)  # every deadline is past
    assert fired == []
