"""What the transport asks of the service behind it: the one interface a request core implements.

The listener, the connections, the handshake and the dispatch (this package) move frames and
count them; what a request means is the core's. Two cores implement this today: the pserver's
training core (aps/server/core.py: tables, optimizers, barriers, leases, saves) and aps-serve's
read-only core over an export (aps/serving/core.py). The transport is typed against this
protocol and never against either, as an ASGI server is typed against the application.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from ... import wire
from ..config import ServerConfig
from ..stats import ServerStats
from .replay import ReplayCache

#: a handler's answer: the reply now, or an awaitable of it when the request has to wait
Reply = wire.Message | Awaitable[wire.Message]
#: what a core calls to have its server stop, with the reason the server logs
AllDone = Callable[[str], None]


class RequestCore(Protocol):
    """A service the transport serves (:class:`~aps.server.transport.listener.RequestServer`)."""

    config: ServerConfig
    #: request, connection and port counters (the transport adds to them; STATS and metrics read them)
    stats: ServerStats
    #: replies of the mutating requests, kept for a retry of the same request id (dispatch.py)
    replays: ReplayCache

    def handle(self, client_id: int, msg: wire.Message, flags: int, trainer_id: int = -1) -> Reply:
        """Run one request after the handshake; raise ServerError to refuse it. ``trainer_id``:
        what the connection's HELLO said (-1: not a trainer)."""

    def client_connected(self, client_id: int, trainer_id: int) -> None:
        """A connection of ``client_id`` made its first request after the handshake."""

    def client_disconnected(self, client_id: int, trainer_id: int) -> None:
        """A connection that had made a request is gone."""

    def start(self, on_all_done: AllDone) -> None:
        """The server listens: start the core's own background work. ``on_all_done(reason)``
        asks the server to stop (a pserver's trainers are all done)."""

    def fail_waiters(self, error: BaseException) -> None:
        """The server is stopping: fail every request that waits on others, keep nothing for later."""

    async def stop(self, checkpoint: bool) -> None:
        """After the requests in flight are drained, before the connections close: end the
        core's background work; ``checkpoint``: write what a graceful stop must keep."""

