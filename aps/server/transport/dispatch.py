"""What a pserver does with one request of a handshaken client, apart from moving its bytes:
a retried mutation's replay, the core's handling, and every failure mapped to the error reply the
client gets (a bug in a handler must not take the server down: the client learns of it).

Why apart from the connection: these are the rules of answering (which reply a retry gets, what
a failure is worth to the client), not of the transport; the connection sends what comes back
and records its stats.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import structlog

from ... import wire
from ...errors import RETRIABLE_CODES, ErrorCode, LocalProtocolError, ServerError

log = structlog.get_logger("aps.server")

#: a request refused or cut short because the server is stopping (the client retries elsewhere
#: or later)
SHUTTING_DOWN = "server is shutting down"


def shutting_down() -> ServerError:
    return ServerError(ErrorCode.SHUTTING_DOWN, SHUTTING_DOWN, True)


def internal(exc: BaseException, op: str, peer: str) -> ServerError:
    """A handler raised what it should not have: logged with its traceback, INTERNAL for the client."""
    log.exception("request failed", op=op, peer=peer)
    return ServerError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")


def run(core: Any, client_id: int, trainer_id: int, msg: wire.Message, flags: int, request_id: int, peer: str
        ) -> wire.Message | ServerError | Awaitable[wire.Message]:
    """Run one request: its reply, the error to answer, or what to await for the reply (a
    barrier, a sync round, a replay of a retried mutation, even one already answered)."""
    if msg.MUTATES:
        replay = core.replays.get(client_id, request_id)
        if replay:
            return _replayed(replay)
    try:
        reply = core.handle(client_id, msg, flags, trainer_id=trainer_id)
    except ServerError as exc:
        return exc
    except Exception as exc:
        return internal(exc, type(msg).__name__, peer)
    if isinstance(reply, wire.Message):
        if msg.MUTATES:
            core.replays.put(client_id, request_id, reply)
        return reply
    task = asyncio.ensure_future(reply)
    if msg.MUTATES:
        core.replays.put(client_id, request_id, task)
    return task


async def settle(reply: Awaitable[wire.Message], op: str, peer: str) -> wire.Message | ServerError:
    """The outcome of a request that waited (a barrier, a sync round, a save, a replay): its
    reply, or the error to answer. A cancel (the server stopping) is the caller's to answer."""
    try:
        return await reply
    except ServerError as exc:
        return exc
    except Exception as exc:  # not a cancel: a BaseException, the caller's to answer
        return internal(exc, op, peer)


def hello_reply(config: Any, nonce: bytes) -> wire.HelloReply:
    """What HELLO is answered with: this server's place in the cluster, its limits and lease,
    whether AUTH must follow, and the nonce its MAC signs."""
    return wire.HelloReply(
        server_index=config.server_index,
        num_servers=config.num_servers,
        max_frame=config.max_frame,
        auth_required=int(config.token is not None),
        lease_ms=min(0xFFFFFFFF, int(config.trainer_timeout * 1000)),
        nonce=nonce,
    )


async def _replayed(reply: wire.Message | Awaitable[wire.Message]) -> wire.Message:
    return reply if isinstance(reply, wire.Message) else await reply


def error_reply(exc: ServerError) -> wire.Error:
    """The ERROR frame's message for ``exc`` (retriable by its own word or by its code)."""
    retriable = exc.retriable or exc.code in RETRIABLE_CODES
    return wire.Error(code=int(exc.code), retriable=int(retriable), message=exc.message[:4000])


def too_large(msg: wire.Message, exc: LocalProtocolError, request_id: int, max_frame: int) -> list[bytes]:
    """What a reply that could not be encoded (``exc``: a pull too large for a frame) is
    answered with: a TOO_LARGE error. An error reply that does not fit is our bug: raised."""
    if isinstance(msg, wire.Error):
        raise exc
    error = wire.Error(code=int(ErrorCode.TOO_LARGE), retriable=0, message=f"reply not sent: {exc}")
    return wire.encode(error, request_id, max_frame=max_frame)


def encode_reply(msg: wire.Message, request_id: int, max_frame: int) -> list[bytes]:
    """The frames of a reply; one that does not fit in a frame is answered with :func:`too_large`."""
    try:
        return wire.encode(msg, request_id, max_frame=max_frame)
    except LocalProtocolError as exc:
        return too_large(msg, exc, request_id, max_frame)
