"""What a connection may see of its server: a narrow view, so that connection.py does not need
(nor import) the PServer that accepts connections, and a test or another front end can give a
connection any object with these fields."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from ..config import ServerConfig
from .admission import Admission
from .service import RequestCore
from .throttle import AuthThrottle


class ConnectionContext(Protocol):
    """The server-wide state every connection shares (:class:`~aps.server.transport.listener.RequestServer` provides it)."""

    core: RequestCore
    config: ServerConfig
    #: open connections (each adds itself when made, removes itself when lost)
    connections: set[Any]
    #: requests that wait (barriers, sync rounds): a graceful shutdown drains them
    inflight: set[asyncio.Task[Any]]
    #: bytes in flight over every connection, charged against ``config.max_inflight_bytes``
    inflight_bytes: int
    #: bytes held by connections not through their handshake, against ``config.max_handshake_bytes``
    handshake_bytes: int
    #: shutting down: new requests are refused with SHUTTING_DOWN
    closing: bool
    #: the throttle that answers wrong AUTHs late
    auth_throttle: AuthThrottle
    #: the caps on open connections (all, and per client address)
    admission: Admission
