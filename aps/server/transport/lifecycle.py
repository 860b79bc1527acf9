"""A server connection's life apart from its bytes: the one state it is in, what it counts for
on its server in each (:class:`Membership`), and how its close is told.

Why apart from the connection: what a state means (what is counted, what its loss gives back)
and which closes an operator must hear of are rules, not transport; the connection reports what
happened (accepted, through the handshake, a first request, lost) and closes what it is told to.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import structlog

from ...errors import CloseReason
from .context import ConnectionContext

log = structlog.get_logger("aps.server")


class ConnectionState(Enum):
    """Where a connection is in its life, which says what it holds and what its loss undoes.
    Closing is not a state of its own: once ``close_reason`` is set the connection reads and
    runs nothing more, whatever its state, until the transport is lost."""

    #: refused when accepted: nothing was counted or held, nothing to undo
    REFUSED = "refused"
    #: accepted and counted by admission; in its handshake, or through it with no request yet
    ACCEPTED = "accepted"
    #: a request came after the handshake: also counted as one of its client's connections
    SERVING = "serving"
    #: the transport is gone and everything it held is given back
    LOST = "lost"


#: closes an operator should hear of: a warning line each; the others are the normal end of a
#: connection, or are logged where they are decided (admission's rate-limited line, the failed
#: AUTH): a debug line
_WARNINGS = {
    CloseReason.BAD_FRAME: "closing connection: bad frame",
    CloseReason.FRAME_REFUSED: "closing connection: frame refused",
    CloseReason.HANDSHAKE_TIMEOUT: "closing connection: no handshake in time",
    CloseReason.FRAME_TIMEOUT: "closing connection: frame not completed in time",
}


def log_close(reason: CloseReason, detail: str, peer: str, client: int | None) -> None:
    """The log line of a connection that starts closing: a warning for what an operator must
    hear of (:data:`_WARNINGS`), else a debug line."""
    warning = _WARNINGS.get(reason)
    if warning is not None:
        log.warning(warning, peer=peer, client=client, reason=reason.value, detail=detail)
    else:
        log.debug("closing connection", peer=peer, client=client, reason=reason.value, detail=detail)


class Membership:
    """What one connection counts for on its server, by its :class:`ConnectionState`: the
    admission caps and the open connections and their stats from ACCEPTED, its client's
    connections from SERVING (the core counts its trainer's lease). Each is counted once, and :meth:`lost`
    gives back exactly what was counted, whichever way the connection ended.

    ``owner`` is the connection (what an eviction closes); admission counts this object."""

    __slots__ = ("server", "owner", "address", "state", "uncounted", "client_id", "trainer_id")

    def __init__(self, server: ConnectionContext, owner: Any) -> None:
        self.server = server
        self.owner = owner
        self.address = "?"  # the peer's host: what admission counts it under
        self.state = ConnectionState.ACCEPTED
        #: admission stopped counting it (evicted, or refused once through its handshake)
        self.uncounted = False
        self.client_id = 0
        self.trainer_id = -1

    def accept(self, address: str) -> tuple[bool, list[Any]]:
        """Count a connection just accepted from ``address``: (admitted, the connections evicted
        to make room for it, idle in their handshake, for the caller to close). A refused one
        is REFUSED: counted nowhere, nothing to give back."""
        self.address = address
        server = self.server
        admitted, evicted = server.admission.admit(address, self)
        for victim in evicted:
            victim.uncounted = True
        if not admitted:
            server.core.stats.refused()
            self.state = ConnectionState.REFUSED
        else:
            server.connections.add(self.owner)
            server.core.stats.opened()
        return admitted, [victim.owner for victim in evicted]

    def established(self) -> bool:
        """Through its handshake: counted as an established connection of its address, or
        False when that address has too many (refused: the caller closes it)."""
        if self.server.admission.established(self.address, self):
            return True
        self.uncounted = True
        self.server.core.stats.refused()
        return False

    def serving(self, client_id: int, trainer_id: int) -> None:
        """A request came after the handshake: one more connection of its client (and trainer)."""
        self.state = ConnectionState.SERVING
        self.client_id, self.trainer_id = client_id, trainer_id
        self.server.core.client_connected(client_id, trainer_id)

    def lost(self) -> bool:
        """The transport is gone: give back what was counted (a client's last connection
        withdraws what it waits for, core.py); False when there was nothing to give back."""
        state, self.state = self.state, ConnectionState.LOST
        if state is ConnectionState.REFUSED or state is ConnectionState.LOST:
            return False
        server = self.server
        if not self.uncounted:
            server.admission.release(self.address, self)
        server.connections.discard(self.owner)
        server.core.stats.closed()
        if state is ConnectionState.SERVING:
            server.core.client_disconnected(self.client_id, self.trainer_id)
        return True
