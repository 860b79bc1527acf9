"""One client connection on a pserver: bytes in, frames decoded and dispatched, replies out.

The protocol object moves bytes and acts on what small objects decide: the handshake
(:class:`~aps.wire.handshake.ServerHandshake`, and :class:`~aps.server.transport.greeting.Greeter` for its
answers), the limits (:class:`~aps.wire.limits.ConnectionLimits`: bytes held, when to stop
reading, deadlines), what the connection counts for on its server
(:class:`~aps.server.transport.lifecycle.Membership`, by its :class:`ConnectionState`), the answer to a
request (:mod:`aps.server.transport.dispatch`: replays, error mapping; the request logic is
the core's, :class:`~aps.server.transport.service.RequestCore`) and the stats (:class:`~aps.server.stats.ServerStats`).
Why it closes is one :class:`~aps.errors.CloseReason`. A frame over a budget is answered with a
retriable TOO_LARGE and the connection is closed; while the peer does not read our replies, or
has too many requests waiting, frames already received are left unparsed until it catches up.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable
from typing import Any

from ... import wire
from ...errors import CloseReason, ErrorCode, LocalProtocolError, RemoteProtocolError, ServerError
from ...wire.handshake import HandshakeState, ServerHandshake
from ...wire.limits import ConnectionLimits
from . import dispatch
from .context import ConnectionContext
from .greeting import Greeter
from .lifecycle import ConnectionState, Membership, log_close
from .timers import ConnectionTimers

__all__ = ["ConnectionState", "ServerConnection"]

#: after refusing a frame, how long the rest of what the peer sends is read and dropped (so that
#: closing does not reset the connection before the peer has read our error reply)
_REFUSED_LINGER = 1.0

#: what the handshake machine answers itself, whatever the state (the rest of a registered
#: connection's requests it passes unchanged, so they skip it)
_HANDSHAKE_MESSAGES = frozenset((wire.Hello, wire.Auth))

_CHECKING = HandshakeState.CHECKING
_SERVING = ConnectionState.SERVING


class _FrameRefused(Exception):
    """Raised through the decoder by the header hook once a frame has been refused."""


class ServerConnection(asyncio.BufferedProtocol):
    """asyncio protocol for one accepted connection. Bytes are received straight into the
    decoder's buffers (``get_buffer``): a large frame's body into its own final buffer, small
    frames into a reused receive buffer, with no concatenation per read."""

    def __init__(self, server: ConnectionContext) -> None:
        self.server = server
        self.core = server.core
        self.config = server.config
        #: HELLO, AUTH, then requests (sans-IO, aps/wire/handshake.py), and their answers
        self.handshake = ServerHandshake(self.config.token is not None, self.config.max_frame)
        self.nonce = os.urandom(16)
        self.greeter = Greeter(self, self.handshake, self.config, server.auth_throttle, self.nonce)
        # until the handshake is done only small frames are accepted, so an unauthenticated
        # peer cannot make us allocate a max-size body
        self.decoder = wire.FrameDecoder(self.handshake.frame_limit)
        self.decoder.on_header = self._on_header
        self._header_request = 0  # request id of the frame whose header came last
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        #: its state and what it counts for on the server (admission, its client, its trainer)
        self.life = Membership(server, self)
        #: why it closes (None while open; the first reason stays), and the words that go with it
        self.close_reason: CloseReason | None = None
        self.close_detail = ""
        self.tasks: set[asyncio.Task[Any]] = set()
        #: bytes in flight (charged as they arrive, held while requests wait), deadlines, and
        #: whether we read (the peer reads our replies, not too many requests wait)
        self.limits = ConnectionLimits.from_config(server, self.config)
        self._drain: bytearray | None = None  # where bytes go once closed (read and dropped)
        self._loop: asyncio.AbstractEventLoop  # set when connected, as are the timers
        self.timers: ConnectionTimers

    @property
    def state(self) -> ConnectionState:
        return self.life.state

    @property
    def client_id(self) -> int | None:
        """The client id HELLO gave (None before HELLO)."""
        return self.handshake.client_id

    @property
    def trainer_id(self) -> int:
        """What HELLO said (-1: not a trainer); only that trainer's worker_done is taken."""
        return self.handshake.trainer_id

    @property
    def closed(self) -> bool:
        """Closing or closed: nothing more is parsed, run or sent."""
        return self.close_reason is not None

    # ----------------------------------------------------------------- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        admitted, evicted = self.life.accept(str(peer[0]) if isinstance(peer, tuple) else str(peer))
        for victim in evicted:  # idle in their handshake: they make room for this one
            victim.abort(CloseReason.EVICTED, "the oldest connection still in its handshake, to make room for a new one")
        if not admitted:
            self._closing(CloseReason.REFUSED, "too many connections")
            transport.abort()  # before it holds any buffer or timer
            return
        self.timers = ConnectionTimers(self._loop, self.limits, self._handshake_overdue, self._frame_overdue)
        self.timers.start_handshake()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self._closing(CloseReason.RESET, str(exc))
        else:
            self._closing(CloseReason.PEER_CLOSED)
        # a client's last connection withdraws its waiting requests (core.py); those still
        # waiting release their share of the budget when they finish
        if not self.life.lost():
            return  # nothing was counted or held, or it is all given back already
        self.timers.cancel()
        self.limits.lost()
        self.decoder = wire.FrameDecoder(0)

    def pause_writing(self) -> None:
        self.limits.peer_reading = False
        self.update_reading()

    def resume_writing(self) -> None:
        self.limits.peer_reading = True
        self.update_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.close_reason is not None:  # refused or closing: what arrives is dropped, not buffered
            if self._drain is None:
                self._drain = bytearray(64 * 1024)
            return memoryview(self._drain)
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        if self.close_reason is not None:
            return
        self.decoder.buffer_updated(nbytes)
        if self._charge_arrived():
            self._process()

    def data_received(self, data: bytes) -> None:
        """Bytes handed over whole (also called with b"" to parse frames left unparsed)."""
        if self.close_reason is not None:
            return
        self.decoder.receive_data(data)
        if self._charge_arrived():
            self._process()

    def _process(self) -> None:
        completed = False
        # while reading is paused (slow reader, too many waiting requests) frames stay unparsed
        handshake, limits = self.handshake, self.limits
        while self.close_reason is None and not limits.read_paused and handshake.state is not _CHECKING:
            try:
                frame = self.decoder.next_frame()
            except _FrameRefused:
                return
            except RemoteProtocolError as exc:
                self.abort(CloseReason.BAD_FRAME, str(exc))
                return
            if frame is None:
                break
            completed = True
            limits.take_frame(wire.HEADER_SIZE + len(frame.payload))  # charged as it arrived
            self._frame_received(frame)
            limits.frame_done()  # unless a waiting request took its bytes over
        if self.close_reason is None:  # a frame partly received must be done in time
            reading = not (limits.read_paused or handshake.state is _CHECKING)
            self.timers.watch_frame(self.decoder.buffered, reading, completed)

    # ----------------------------------------------------------------- limits

    def _on_header(self, opcode: int, request_id: int, length: int) -> None:
        """The decoder has a frame's header: refuse it when its declared size could never be
        held by this connection; nothing is charged for what is only declared."""
        self._header_request = request_id
        refusal = self.limits.declared(length)
        if refusal is not None:
            self._refuse_frame(request_id, refusal)
            raise _FrameRefused

    def _charge_arrived(self) -> bool:
        """Charge the bytes received since the last call (False: over the budget, the frame in
        progress is refused)."""
        refusal = self.limits.charge_arrived(self.decoder.buffered)
        if refusal is None:
            return True
        self._refuse_frame(self._header_request, refusal)
        return False

    def through_handshake(self) -> None:
        """The handshake is done: what this connection holds moves to the main budget, and it
        counts as an established connection of its address (admission.py)."""
        self.decoder.max_frame = self.handshake.frame_limit  # a max-size body is allowed from now
        if self.limits.in_handshake and self.handshake.ready:
            self.limits.through_handshake()
            if not self.life.established():
                self.close(CloseReason.REFUSED, "too many connections from this address (max_connections_per_address)")

    def _refuse_frame(self, request_id: int, exc: ServerError) -> None:
        """Answer a refused frame and close without reading its body into memory."""
        self.send_error(request_id, exc)
        self._closing(CloseReason.FRAME_REFUSED, exc.message)  # nothing more is parsed or run; data_received drops what arrives
        transport = self.transport
        if transport is None:
            return
        if self.limits.read_paused:
            transport.resume_reading()  # drop what follows rather than leave it unread
        if transport.can_write_eof():
            transport.write_eof()  # the reply goes out; the peer's EOF (or the timer) ends it
            self.timers.linger(_REFUSED_LINGER, transport.abort)
        else:
            transport.close()

    def _handshake_overdue(self) -> None:
        if not (self.closed or self.handshake.ready):
            self.abort(CloseReason.HANDSHAKE_TIMEOUT, f"no handshake within {self.config.handshake_timeout} s")

    def _frame_overdue(self) -> None:
        if not self.closed:
            self.abort(
                CloseReason.FRAME_TIMEOUT,
                f"frame not completed within {self.config.frame_timeout} s "
                f"({self.decoder.buffered} bytes received of {self.decoder.pending_length} declared)"
            )

    # ----------------------------------------------------------------- requests

    def _frame_received(self, frame: wire.Frame) -> None:
        started = time.perf_counter_ns()
        size_in = len(frame.payload) + wire.HEADER_SIZE
        try:
            msg = wire.decode(frame)
        except RemoteProtocolError as exc:
            # through the handshake machine even on a registered connection: before the
            # handshake it refuses the connection (answering and reading on would let a HELLO
            # that follows be served), after it this is one bad request
            code = ErrorCode.UNKNOWN_OPCODE if "opcode" in str(exc) else ErrorCode.BAD_REQUEST
            self.greeter.refuse(self.handshake.receive_unparsable(frame.opcode, code, str(exc)), frame.request_id)
            return
        life = self.life
        if life.state is not _SERVING or type(msg) in _HANDSHAKE_MESSAGES or self.server.closing:
            if not self.greeter.receive(msg, frame.request_id, self.server.closing):
                return
            if life.state is not _SERVING:  # the handshake is done and a request came
                self.timers.handshake_done()
                life.serving(self.handshake.client_id, self.handshake.trainer_id)  # type: ignore[arg-type]
        # else: a request on a registered connection, which the handshake passes as it is
        op_name = type(msg).__name__
        reply = dispatch.run(self.core, life.client_id, life.trainer_id, msg, frame.flags, frame.request_id, self.peer)
        if isinstance(reply, wire.Message):  # the common case, without a further call
            self.core.stats.finished(op_name, started, size_in, self.send(reply, frame.request_id), False)
        elif isinstance(reply, ServerError):
            self._answer(frame.request_id, reply, op_name, started, size_in)
        else:
            self._finish_later(frame.request_id, op_name, reply, started, size_in)

    def _answer(self, request_id: int, outcome: wire.Message | ServerError, op: str, started: int, size_in: int) -> None:
        """Send a request's reply or error and record it in the server's stats."""
        if isinstance(outcome, ServerError):
            self.send_error(request_id, outcome)
            self.core.stats.finished(op, started, size_in, 0, True)
        else:
            self.core.stats.finished(op, started, size_in, self.send(outcome, request_id), False)

    def _finish_later(self, request_id: int, op: str, reply: Awaitable[wire.Message], started: int, size_in: int) -> None:
        """Answer a request that waits (barrier, sync round, or a replay) once it is done."""

        async def finish() -> None:
            try:
                outcome = await dispatch.settle(reply, op, self.peer)
            except asyncio.CancelledError:  # the server stops: the client retries elsewhere or later
                self.send_error(request_id, dispatch.shutting_down())
                raise
            self._answer(request_id, outcome, op, started, size_in)

        task = asyncio.ensure_future(finish())
        self.tasks.add(task)
        self.server.inflight.add(task)
        self.limits.hold_frame(task)  # the request's bytes stay charged while it waits
        task.add_done_callback(self._task_done)
        self.update_reading()

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        self.server.inflight.discard(task)
        self.limits.request_done(task)
        self.update_reading()

    # ----------------------------------------------------------------- output

    def send(self, msg: wire.Message, request_id: int) -> int:
        """Write ``msg`` (nothing once closing); the bytes written."""
        if self.close_reason is not None or self.transport is None:
            return 0
        try:
            parts = wire.encode(msg, request_id, max_frame=self.config.max_frame)
        except LocalProtocolError as exc:  # e.g. a pull whose reply does not fit in a frame
            parts = dispatch.too_large(msg, exc, request_id, self.config.max_frame)
        if len(parts) == 1:
            self.transport.write(parts[0])
            return len(parts[0])
        self.transport.writelines(parts)
        return sum(len(p) for p in parts)

    def send_error(self, request_id: int, exc: ServerError) -> None:
        self.send(dispatch.error_reply(exc), request_id)

    def update_reading(self) -> None:
        """Stop reading while an AUTH is checked, the peer does not read our replies or has too
        many requests waiting; resume (and parse what is left) when none holds any more."""
        if self.transport is None or self.closed:
            return
        pause = self.limits.reading(checking_auth=self.handshake.state is _CHECKING, waiting=len(self.tasks))
        if pause:
            self.transport.pause_reading()
        elif pause is not None:
            self.transport.resume_reading()
            self.read_queued()

    def read_queued(self) -> None:
        """Parse, soon, the frames that arrived while nothing was read."""
        self._loop.call_soon(self.data_received, b"")

    def abort(self, reason: CloseReason | str, detail: str = "") -> None:
        """Drop the connection now (a protocol breach, a missed deadline): what is unsent is
        lost. A ``reason`` in words (a program dropping the connection) is CLOSED with that
        detail."""
        if not isinstance(reason, CloseReason):
            reason, detail = CloseReason.CLOSED, reason
        self._closing(reason, detail)
        if self.transport is not None:
            self.transport.abort()

    def close(self, reason: CloseReason, detail: str = "") -> None:
        """Close once the replies already written have gone out."""
        if self.transport is not None and not self.closed:
            self.transport.close()
        self._closing(reason, detail)

    def _closing(self, reason: CloseReason, detail: str = "") -> None:
        """Nothing more is parsed, run or sent; the first reason stays (``close_reason``)."""
        if self.close_reason is None:
            self.close_reason, self.close_detail = reason, detail
            self.handshake.close(f"{reason.value}: {detail}" if detail else reason.value)
            log_close(reason, detail, self.peer, self.client_id)
