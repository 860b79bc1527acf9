"""One client connection on a pserver: bytes in, frames decoded, handlers called, replies out.

The protocol object only moves bytes and keeps per-connection state (handshake, flow control);
the request logic lives in :class:`~aps.server.core.ServerCore`.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

import structlog

from .. import wire
from ..errors import RETRIABLE_CODES, ErrorCode, LocalProtocolError, RemoteProtocolError, ServerError
from ..wire.auth import check_mac

if TYPE_CHECKING:
    from .pserver import PServer

log = structlog.get_logger("aps.server")

_HANDSHAKE_MAX_FRAME = 4096


class ServerConnection(asyncio.Protocol):
    """asyncio protocol for one accepted connection."""

    def __init__(self, server: PServer) -> None:
        self.server = server
        self.core = server.core
        self.config = server.config
        # until the handshake is done only small frames are accepted, so an unauthenticated
        # peer cannot make us allocate a max-size body
        self.decoder = wire.FrameDecoder(min(self.config.max_frame, _HANDSHAKE_MAX_FRAME))
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.client_id: int | None = None
        self.authenticated = self.config.token is None
        self.nonce = os.urandom(16)
        self.tasks: set[asyncio.Task[Any]] = set()
        self._write_paused = False
        self._read_paused = False
        self.closed = False

    # ----------------------------------------------------------------- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.server.connections.add(self)
        self.core.stats.connections += 1
        self.core.stats.connections_total += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self.core.stats.connections -= 1

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        self.decoder.receive_data(data)
        while not self.closed:
            try:
                frame = self.decoder.next_frame()
            except RemoteProtocolError as exc:
                log.warning("closing connection: bad frame", peer=self.peer, error=str(exc))
                self.abort()
                return
            if frame is None:
                return
            self._frame_received(frame)

    # ----------------------------------------------------------------- requests

    def _frame_received(self, frame: wire.Frame) -> None:
        started = time.perf_counter_ns()
        size_in = len(frame.payload) + wire.HEADER_SIZE
        try:
            msg = wire.decode(frame)
        except RemoteProtocolError as exc:
            code = ErrorCode.UNKNOWN_OPCODE if "opcode" in str(exc) else ErrorCode.BAD_REQUEST
            self._send_error(frame.request_id, ServerError(code, str(exc)))
            return
        op_name = type(msg).__name__
        if not self._admitted(msg, frame.request_id):
            return
        if isinstance(msg, (wire.Hello, wire.Auth)):
            return
        assert self.client_id is not None
        replay = msg.MUTATES and self.core.replays.get(self.client_id, frame.request_id)
        if replay:
            self._finish_later(frame.request_id, op_name, replay, started, size_in)
            return
        try:
            reply = self.core.handle(self.client_id, msg, frame.flags)
        except ServerError as exc:
            self._send_error(frame.request_id, exc)
            self.core.stats.record(op_name, time.perf_counter_ns() - started, size_in, 0, True)
            return
        except Exception as exc:  # a bug must not take the server down; the client learns of it
            log.exception("request failed", op=op_name, peer=self.peer)
            self._send_error(frame.request_id, ServerError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"))
            self.core.stats.record(op_name, time.perf_counter_ns() - started, size_in, 0, True)
            return
        if isinstance(reply, wire.Message):
            if msg.MUTATES:
                self.core.replays.put(self.client_id, frame.request_id, reply)
            size_out = self._send(reply, frame.request_id)
            self.core.stats.record(op_name, time.perf_counter_ns() - started, size_in, size_out, False)
            return
        task = asyncio.ensure_future(reply)
        if msg.MUTATES:
            self.core.replays.put(self.client_id, frame.request_id, task)
        self._finish_later(frame.request_id, op_name, task, started, size_in)

    def _finish_later(self, request_id: int, op_name: str, reply: Any, started: int, size_in: int) -> None:
        """Send the reply of a request that waits (barrier, sync round, or a replay still running)."""

        async def finish() -> None:
            try:
                result = await reply if not isinstance(reply, wire.Message) else reply
            except ServerError as exc:
                self._send_error(request_id, exc)
                self.core.stats.record(op_name, time.perf_counter_ns() - started, size_in, 0, True)
                return
            except asyncio.CancelledError:
                self._send_error(request_id, ServerError(ErrorCode.SHUTTING_DOWN, "server is shutting down", True))
                raise
            except Exception as exc:
                log.exception("request failed", op=op_name, peer=self.peer)
                self._send_error(request_id, ServerError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"))
                return
            size_out = self._send(result, request_id)
            self.core.stats.record(op_name, time.perf_counter_ns() - started, size_in, size_out, False)

        task = asyncio.ensure_future(finish())
        self.tasks.add(task)
        self.server.inflight.add(task)
        task.add_done_callback(self._task_done)
        self._update_reading()

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        self.server.inflight.discard(task)
        self._update_reading()

    def _admitted(self, msg: wire.Message, request_id: int) -> bool:
        """The handshake: HELLO first, then AUTH when a token is set; nothing else before."""
        if isinstance(msg, wire.Hello):
            if self.client_id is not None:
                self._send_error(request_id, ServerError(ErrorCode.BAD_REQUEST, "duplicate hello"))
                return False
            self.client_id = msg.client_id
            if self.config.token is None:
                self.decoder.max_frame = self.config.max_frame
            self._send(
                wire.HelloReply(
                    server_index=self.config.server_index,
                    num_servers=self.config.num_servers,
                    max_frame=self.config.max_frame,
                    auth_required=int(self.config.token is not None),
                    nonce=self.nonce,
                ),
                request_id,
            )
            return True
        if self.client_id is None:
            self._refuse(request_id, ServerError(ErrorCode.AUTH_REQUIRED, "the first message must be hello"))
            return False
        if isinstance(msg, wire.Auth):
            if self.config.token is None:
                self._send(wire.Ok(op=wire.Op.AUTH), request_id)
                return True
            if not check_mac(self.config.token, self.nonce, self.client_id, msg.mac):
                log.warning("authentication failed", peer=self.peer)
                self._refuse(request_id, ServerError(ErrorCode.AUTH_FAILED, "bad token"))
                return False
            self.authenticated = True
            self.decoder.max_frame = self.config.max_frame
            self._send(wire.Ok(op=wire.Op.AUTH), request_id)
            return True
        if not self.authenticated:
            self._refuse(request_id, ServerError(ErrorCode.AUTH_REQUIRED, "this server needs a token"))
            return False
        if self.server.closing:
            self._send_error(request_id, ServerError(ErrorCode.SHUTTING_DOWN, "server is shutting down", True))
            return False
        return True

    # ----------------------------------------------------------------- output

    def _send(self, msg: wire.Message, request_id: int) -> int:
        if self.closed or self.transport is None:
            return 0
        try:
            parts = wire.encode(msg, request_id, max_frame=self.config.max_frame)
        except LocalProtocolError as exc:  # e.g. a pull whose reply does not fit in a frame
            if isinstance(msg, wire.Error):
                raise
            error = wire.Error(code=int(ErrorCode.TOO_LARGE), retriable=0, message=f"reply not sent: {exc}")
            parts = wire.encode(error, request_id, max_frame=self.config.max_frame)
        if len(parts) == 1:
            self.transport.write(parts[0])
            return len(parts[0])
        self.transport.writelines(parts)
        return sum(len(p) for p in parts)

    def _send_error(self, request_id: int, exc: ServerError) -> None:
        retriable = exc.retriable or exc.code in RETRIABLE_CODES
        self._send(wire.Error(code=int(exc.code), retriable=int(retriable), message=exc.message[:4000]), request_id)

    def _refuse(self, request_id: int, exc: ServerError) -> None:
        self._send_error(request_id, exc)
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    def _update_reading(self) -> None:
        """Stop reading while the peer does not read our replies or has too much in flight."""
        if self.transport is None or self.closed:
            return
        should_pause = self._write_paused or len(self.tasks) >= self.config.max_inflight_per_connection
        if should_pause and not self._read_paused:
            self.transport.pause_reading()
            self._read_paused = True
        elif not should_pause and self._read_paused:
            self.transport.resume_reading()
            self._read_paused = False

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True
