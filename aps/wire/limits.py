"""A server connection's limits as a sans-IO object: bytes it may hold, when to stop reading,
and when its handshake and each frame must be done (docs/operations.md, "Limits").

Why apart from the connection: the rules (what a header may declare, how arriving bytes are
charged to a server-wide budget, when a held request gives them back, when a frame is overdue)
are arithmetic on counters and times; the connection only reports what happened (a header, bytes
in, a frame out, a request waiting or done) and acts on the answer (refuse, pause, arm a timer).
Nothing here touches a socket or a clock: times are passed in, so every rule is tested alone
(tests/wire/test_limits.py).

Bytes are charged as they arrive, not when a header declares them (the decoder maps a large body
lazily, so what a peer only declares costs nothing), to the budget of connections still in their
handshake (``max_handshake_bytes``) until the handshake is done, then to ``max_inflight_bytes``;
a frame's bytes stay charged while its request waits (a barrier, a sync push).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Protocol

from ..errors import ConfigError, ErrorCode, ServerError
from .frame import HEADER_SIZE


def check_limits(config: Any) -> None:
    """Refuse limits that contradict each other or the max frame (ConfigError names the option).
    Each limit alone (a number of seconds or bytes >= 0) is checked by ServerConfig itself."""
    frame = config.max_frame + HEADER_SIZE
    own, total = config.max_connection_bytes, config.max_inflight_bytes
    if own and own < frame:
        raise ConfigError(
            f"max_connection_bytes ({own}) must hold at least one frame of max_frame ({config.max_frame}) "
            f"plus its {HEADER_SIZE}-byte header"
        )
    if total and total < (own or frame):
        raise ConfigError(f"max_inflight_bytes ({total}) must be at least max_connection_bytes ({own or frame})")


class BytePools(Protocol):
    """The server-wide counters every connection of one server charges (the server holds them)."""

    #: bytes in flight over every connection through its handshake
    inflight_bytes: int
    #: bytes held by connections not through their handshake
    handshake_bytes: int


def _too_large(problem: str) -> ServerError:
    return ServerError(ErrorCode.TOO_LARGE, f"frame refused: {problem}; retry later", True)


class ConnectionLimits:
    """The limits of one connection, and the bytes it holds against them.

    ``held`` is everything charged for this connection: ``arrived`` (received, not yet a whole
    frame), ``frame`` (the frame being handled now) and the bytes of requests that wait."""

    __slots__ = ("pools", "max_connection_bytes", "max_inflight_bytes", "max_handshake_bytes", "max_requests",
                 "handshake_timeout", "frame_timeout", "held", "arrived", "frame", "in_handshake",
                 "partial_since", "peer_reading", "read_paused", "_waiting")

    def __init__(
        self,
        pools: BytePools,
        *,
        max_connection_bytes: int = 0,
        max_inflight_bytes: int = 0,
        max_handshake_bytes: int = 0,
        max_requests: int = 256,
        handshake_timeout: float = 0.0,
        frame_timeout: float = 0.0,
    ) -> None:
        """Each limit 0 means none (``max_requests``: requests waiting before reading stops)."""
        self.pools = pools
        self.max_connection_bytes = max_connection_bytes
        self.max_inflight_bytes = max_inflight_bytes
        self.max_handshake_bytes = max_handshake_bytes
        self.max_requests = max_requests
        self.handshake_timeout = handshake_timeout
        self.frame_timeout = frame_timeout
        self.held = 0
        self.arrived = 0
        self.frame = 0
        #: charged to ``pools.handshake_bytes`` (True) or ``pools.inflight_bytes``
        self.in_handshake = True
        #: the time the frame in progress began (None: none in progress, or not being read)
        self.partial_since: float | None = None
        #: the peer reads our replies (the transport has not asked us to stop writing)
        self.peer_reading = True
        #: we stopped reading from the peer (:meth:`reading`)
        self.read_paused = False
        self._waiting: dict[Hashable, int] = {}

    @classmethod
    def from_config(cls, pools: BytePools, config: Any) -> ConnectionLimits:
        """The limits a :class:`~aps.server.config.ServerConfig` sets."""
        return cls(
            pools,
            max_connection_bytes=config.max_connection_bytes,
            max_inflight_bytes=config.max_inflight_bytes,
            max_handshake_bytes=config.max_handshake_bytes,
            max_requests=config.max_inflight_per_connection,
            handshake_timeout=config.handshake_timeout,
            frame_timeout=config.frame_timeout,
        )

    # ----------------------------------------------------------------- bytes

    def declared(self, length: int) -> ServerError | None:
        """A header declares a payload of ``length``: the refusal when this connection could
        never hold the frame beside what its waiting requests hold (nothing is charged)."""
        size = HEADER_SIZE + length
        own = self.max_connection_bytes
        held = self.held - self.arrived  # by requests that wait
        if own and held + size > own:
            return _too_large(
                f"this connection has {held} bytes in flight and this frame's {size} would pass its "
                f"limit of {own} (aps-server --max-connection-bytes)"
            )
        return None

    def charge_arrived(self, buffered: int) -> ServerError | None:
        """The decoder now buffers ``buffered`` bytes: charge what arrived since the last call, or
        (over the budget this connection draws on) the refusal of the frame in progress."""
        grow = buffered - self.arrived
        if grow <= 0:
            return None
        if self.in_handshake:
            total, pool = self.max_handshake_bytes, self.pools.handshake_bytes
            who, option = "connections not through the handshake hold", "aps-server --max-handshake-bytes"
        else:
            total, pool = self.max_inflight_bytes, self.pools.inflight_bytes
            who, option = "the server has", "aps-server --max-inflight-bytes"
        if total and pool + grow > total:
            return _too_large(f"{who} {pool} bytes in flight and {grow} more arrived, over the limit of {total} ({option})")
        self.arrived += grow
        self.held += grow
        if self.in_handshake:
            self.pools.handshake_bytes += grow
        else:
            self.pools.inflight_bytes += grow
        return None

    def take_frame(self, size: int) -> None:
        """A whole frame of ``size`` bytes (header included) left the decoder: it is the one
        being handled now."""
        self.arrived -= size
        self.frame = size

    def frame_done(self) -> None:
        """The frame being handled is done with: its bytes go, unless a waiting request took them."""
        size = self.frame
        if size:
            self.frame = 0
            self.held -= size
            if self.in_handshake:
                self.pools.handshake_bytes -= size
            else:
                self.pools.inflight_bytes -= size

    def hold_frame(self, request: Hashable) -> None:
        """The frame's request waits: its bytes stay charged until :meth:`request_done`."""
        if self.frame:
            self._waiting[request] = self.frame
            self.frame = 0

    def request_done(self, request: Hashable) -> None:
        self.release(self._waiting.pop(request, 0))

    def through_handshake(self) -> None:
        """The handshake is done: what this connection holds moves to the main budget."""
        if self.in_handshake:
            self.in_handshake = False
            self.pools.handshake_bytes -= self.held
            self.pools.inflight_bytes += self.held

    def lost(self) -> None:
        """The connection is gone: a half-received frame's bytes go now; waiting requests give
        theirs back when they finish."""
        self.release(self.frame + self.arrived)
        self.frame = self.arrived = 0

    def release(self, size: int) -> None:
        if size:
            self.held -= size
            if self.in_handshake:
                self.pools.handshake_bytes -= size
            else:
                self.pools.inflight_bytes -= size

    # ----------------------------------------------------------------- reading and deadlines

    def should_pause(self, *, checking_auth: bool, peer_reading: bool, waiting: int) -> bool:
        """Stop reading while an AUTH is being checked, the peer does not read our replies, or
        it has ``max_requests`` requests waiting."""
        return checking_auth or not peer_reading or waiting >= self.max_requests

    def reading(self, *, checking_auth: bool, waiting: int) -> bool | None:
        """Whether the connection must stop reading now (True), resume (False) or leave it as it
        is (None), by :meth:`should_pause` with what it knows of the peer's reading."""
        pause = self.should_pause(checking_auth=checking_auth, peer_reading=self.peer_reading, waiting=waiting)
        if pause is self.read_paused:
            return None
        self.read_paused = pause
        if pause:
            self.reading_stopped()
        return pause

    def reading_stopped(self) -> None:
        """We stopped reading: the peer cannot finish a frame meanwhile, so none is overdue."""
        self.partial_since = None

    def handshake_deadline(self, now: float) -> float | None:
        """When a connection accepted at ``now`` must be through its handshake (None: never)."""
        return now + self.handshake_timeout if self.handshake_timeout else None

    def watch_frame(self, now: Callable[[], float], buffered: int, reading: bool, completed: bool) -> float | None:
        """After bytes were parsed (``completed``: a whole frame came out of them; ``now``: the
        clock, read only when a frame is in progress): when the frame in progress must be
        complete, or None when there is none in progress or the peer cannot finish one (we do
        not read)."""
        if not self.frame_timeout:
            return None
        if buffered == 0 or not reading:
            self.partial_since = None
            return None
        if completed or self.partial_since is None:  # the frame in progress began in this data
            self.partial_since = now()
        return self.partial_since + self.frame_timeout

    def frame_deadline(self) -> float | None:
        """When the frame in progress must be complete (None: no frame in progress)."""
        if self.partial_since is None or not self.frame_timeout:
            return None
        return self.partial_since + self.frame_timeout
