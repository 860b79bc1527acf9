"""One exception tree for everything aps raises.

Callers catch :class:`ApsError` for "anything from aps", or a narrower class when they can act on
it: retry on :class:`ConnectionLost` / :class:`RequestTimeout`, fix their input on
:class:`ConfigError` / :class:`DataError`, read ``code`` on :class:`ServerError`.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class ApsError(Exception):
    """Base of every error aps raises on purpose."""


class ProtocolError(ApsError):
    """The byte stream broke the wire protocol."""


class LocalProtocolError(ProtocolError):
    """We were asked to send something the protocol cannot express (our caller's bug)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that are not a valid frame or message (the peer's bug, or garbage)."""


class CloseReason(StrEnum):
    """Why a connection closed, on either end: a server connection's ``close_reason``, a client
    link's and the :class:`ConnectionLost` it raises, and the ``reason`` of their log lines. A
    value to match on and count, where free text could only be read; the words that go with it
    are the ``detail``. Never sent on the wire: the peer learns of a close only by its EOF
    (and, when the server refuses something, by the error reply written before it)."""

    #: too many connections (server-wide or from its address): refused when accepted or once
    #: through its handshake
    REFUSED = "refused"
    #: still in its handshake, the oldest: closed to make room for a new connection
    EVICTED = "evicted"
    #: the handshake went wrong: a message out of order, a wrong token
    HANDSHAKE_REFUSED = "handshake_refused"
    #: not through the handshake within ``handshake_timeout``
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    #: a frame not complete within ``frame_timeout`` of its first byte
    FRAME_TIMEOUT = "frame_timeout"
    #: a frame over a byte budget (answered with TOO_LARGE first)
    FRAME_REFUSED = "frame_refused"
    #: bytes that are not a valid frame (either end)
    BAD_FRAME = "bad_frame"
    #: the server is shutting down
    SHUTDOWN = "shutdown"
    #: the other end closed it
    PEER_CLOSED = "peer_closed"
    #: the transport failed (a reset, a socket error)
    RESET = "reset"
    #: this end's owner closed it (a client's close, a program dropping a server connection)
    CLOSED = "closed"
    #: the connection could not be opened (refused, unreachable, TLS failed)
    CONNECT_FAILED = "connect_failed"


class ConnectionLost(ApsError):
    """The connection to a pserver closed or could not be opened; ``reason`` says why as a
    :class:`CloseReason`, so a caller tells a pserver that closed it (``PEER_CLOSED``: it shut
    down, or dropped this client) from a reset, a timed-out handshake, a pserver that never
    listened (``CONNECT_FAILED``) and its own close; ``__cause__`` has the underlying exception.
    Every raiser names one: it is not optional."""

    def __init__(self, message: str, reason: CloseReason) -> None:
        super().__init__(message)
        self.reason = reason


class RequestTimeout(ApsError):
    """A call did not finish within its timeout budget (all retries included)."""


class SourceUnavailable(ApsError):
    """An online trainer's data source (a Redis stream's server) stayed unreachable for longer
    than it is retried (``--stream-retry``); nothing read since the last checkpoint was
    acknowledged, so ``--resume`` continues exactly."""


class ConfigError(ApsError):
    """A setting, table spec or argument is invalid; raised before anything is sent."""


class TokenMissing(ConfigError):
    """A pserver asks for a token and none was given here: a setting to fix on this side
    (``token=``, ``APS_TOKEN``, ``--token-file``), not a refusal by the server to retry."""


class WorkerFailed(ApsError):
    """A trainer's compute worker process reported an error or died; the message says which
    worker and why. The trainer stops its other workers before this reaches the caller."""


class DataError(ApsError):
    """An input record could not be parsed; says which file and line."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None) -> None:
        where = f"{file}:{line}: " if file is not None and line is not None else (f"{file}: " if file else "")
        super().__init__(where + message)
        self.file = file
        self.line = line


class ErrorCode(IntEnum):
    """Codes a pserver puts in an error reply (stable: they are part of the wire protocol)."""

    INTERNAL = 1
    BAD_REQUEST = 2
    UNKNOWN_TABLE = 3
    TABLE_EXISTS = 4
    SHAPE_MISMATCH = 5
    ID_OUT_OF_RANGE = 6
    UNKNOWN_OPCODE = 7
    AUTH_REQUIRED = 8
    AUTH_FAILED = 9
    SHUTTING_DOWN = 10
    IO_ERROR = 11
    TOO_LARGE = 12
    TRAINER_GONE = 13
    #: a write (push, create, load, save, shrink, ...) sent to aps-serve, a read-only store
    READ_ONLY = 14


#: codes for which repeating the same request may succeed (the client retries these)
RETRIABLE_CODES = frozenset({ErrorCode.SHUTTING_DOWN})


class ServerError(ApsError):
    """A pserver refused or failed a request; ``code`` is an :class:`ErrorCode`."""

    def __init__(self, code: int, message: str, retriable: bool = False, server: str | None = None) -> None:
        try:
            name = ErrorCode(code).name
        except ValueError:
            name = f"CODE_{code}"
        prefix = f"[{server}] " if server else ""
        super().__init__(f"{prefix}{name}: {message}")
        self.code = code
        self.message = message
        self.retriable = retriable
        self.server = server
