"""One client connection on a pserver: bytes in, frames decoded and dispatched, replies out.

The protocol object moves bytes and acts on what small objects decide: the handshake
(:class:`~aps.wire.handshake.ServerHandshake`: which message may come now), the limits
(:class:`~aps.wire.limits.ConnectionLimits`: bytes held, when to stop reading, deadlines), the
answer to a request (:mod:`aps.server.dispatch`: replays, error mapping; the request logic is
:class:`~aps.server.core.ServerCore`'s). Its life is one :class:`ConnectionState`, and why it
closes one :class:`~aps.errors.CloseReason`. A frame over a budget is answered with a retriable
TOO_LARGE and the connection is closed; while the peer does not read our replies, or has too
many requests waiting, frames already received are left unparsed until it catches up.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable
from enum import Enum
from typing import Any

import structlog

from .. import wire
from ..errors import CloseReason, ErrorCode, LocalProtocolError, RemoteProtocolError, ServerError
from ..wire.auth import check_mac
from ..wire.handshake import Action, HandshakeState, ServerHandshake, Step
from ..wire.limits import ConnectionLimits
from . import dispatch
from .context import ConnectionContext

log = structlog.get_logger("aps.server")

#: after refusing a frame, how long the rest of what the peer sends is read and dropped (so that
#: closing does not reset the connection before the peer has read our error reply)
_REFUSED_LINGER = 1.0


#: what the handshake machine answers itself, whatever the state (the rest of a registered
#: connection's requests it passes unchanged, so they skip it)
_HANDSHAKE_MESSAGES = frozenset((wire.Hello, wire.Auth))


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
        #: HELLO, AUTH, then requests (sans-IO, aps/wire/handshake.py)
        self.handshake = ServerHandshake(self.config.token is not None, self.config.max_frame)
        # until the handshake is done only small frames are accepted, so an unauthenticated
        # peer cannot make us allocate a max-size body
        self.decoder = wire.FrameDecoder(self.handshake.frame_limit)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.address = "?"  # the peer's host: what admission counts it under
        self.state = ConnectionState.ACCEPTED
        #: why it closes (None while open; the first reason stays), and the words that go with it
        self.close_reason: CloseReason | None = None
        self.close_detail = ""
        self.nonce = os.urandom(16)
        self.tasks: set[asyncio.Task[Any]] = set()
        # flow control, not state: the peer does not read our replies / we stopped reading
        self._write_paused = False
        self._read_paused = False
        #: bytes in flight (charged as they arrive, held while requests wait), deadlines
        self.limits = ConnectionLimits.from_config(server, self.config)
        self.decoder.on_header = self._on_header
        self._header_request = 0  # request id of the frame whose header came last
        #: admission stopped counting it (evicted, or refused once through its handshake)
        self.uncounted = False
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._frame_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._drain: bytearray | None = None  # where bytes go once closed (read and dropped)
        self._loop: asyncio.AbstractEventLoop | None = None  # set when connected

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

    @property
    def _held(self) -> bool:
        """An AUTH waits for its (throttled) verdict: read and run nothing else."""
        return self.handshake.state is _CHECKING

    # ----------------------------------------------------------------- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.address = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        admitted, evicted = self.server.admission.admit(self.address, self)
        for victim in evicted:  # idle in their handshake: they make room for this one
            victim.uncounted = True
            victim.abort(CloseReason.EVICTED, "the oldest connection still in its handshake, to make room for a new one")
        if not admitted:
            self.core.stats.connections_refused += 1
            self.state = ConnectionState.REFUSED
            self._closing(CloseReason.REFUSED, "too many connections")
            transport.abort()  # before it holds any buffer or timer
            return
        self.server.connections.add(self)
        self.core.stats.connections += 1
        self.core.stats.connections_total += 1
        loop = asyncio.get_running_loop()
        due = self.limits.handshake_deadline(loop.time())
        if due is not None:
            self._handshake_timer = loop.call_at(due, self._handshake_deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self._closing(CloseReason.RESET, str(exc))
        else:
            self._closing(CloseReason.PEER_CLOSED)
        state, self.state = self.state, ConnectionState.LOST
        if state is ConnectionState.REFUSED or state is ConnectionState.LOST:
            return  # nothing was counted or held, or it is all given back already
        if not self.uncounted:
            self.server.admission.release(self.address, self)
        self.server.connections.discard(self)
        self.core.stats.connections -= 1
        for timer in (self._handshake_timer, self._frame_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        self._handshake_timer = self._frame_timer = self._linger_timer = None
        # requests still waiting release their share when they finish (withdrawn just below if
        # this was the client's last connection)
        self.limits.lost()
        self.decoder = wire.FrameDecoder(0)
        if state is ConnectionState.SERVING:
            assert self.client_id is not None
            self.core.client_disconnected(self.client_id)
            if 0 <= self.trainer_id < self.config.num_trainers:
                self.core.leases.disconnected(self.trainer_id)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

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
        handshake = self.handshake
        while self.close_reason is None and not self._read_paused and handshake.state is not _CHECKING:
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
            self.limits.take_frame(wire.HEADER_SIZE + len(frame.payload))  # charged as it arrived
            self._frame_received(frame)
            self.limits.frame_done()  # unless a waiting request took its bytes over
        self._watch_frame(completed)

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

    def _through_handshake(self) -> None:
        """The handshake is done: what this connection holds moves to the main budget, and it
        counts as an established connection of its address (admission.py)."""
        if self.limits.in_handshake and self.handshake.ready:
            self.limits.through_handshake()
            if not self.server.admission.established(self.address, self):
                self.uncounted = True
                self.core.stats.connections_refused += 1
                self.close(CloseReason.REFUSED, "too many connections from this address (max_connections_per_address)")

    def _refuse_frame(self, request_id: int, exc: ServerError) -> None:
        """Answer a refused frame and close without reading its body into memory."""
        self._send_error(request_id, exc)
        self._closing(CloseReason.FRAME_REFUSED, exc.message)  # nothing more is parsed or run; data_received drops what arrives
        transport = self.transport
        if transport is None:
            return
        if self._read_paused:
            transport.resume_reading()  # drop what follows rather than leave it unread
        if transport.can_write_eof():
            transport.write_eof()  # the reply goes out; the peer's EOF (or the timer) ends it
            self._linger_timer = asyncio.get_running_loop().call_later(_REFUSED_LINGER, transport.abort)
        else:
            transport.close()

    def _handshake_deadline(self) -> None:
        self._handshake_timer = None
        if self.closed or self.handshake.ready:
            return
        self.abort(CloseReason.HANDSHAKE_TIMEOUT, f"no handshake within {self.config.handshake_timeout} s")

    def _watch_frame(self, completed: bool) -> None:
        """Arm the frame deadline while a frame is partly received (not while we stopped reading)."""
        if self.close_reason is not None:
            return
        reading = not (self._read_paused or self._held)
        due = self.limits.watch_frame(self._loop.time, self.decoder.buffered, reading, completed)
        if due is not None and self._frame_timer is None:
            self._frame_timer = self._loop.call_at(due, self._frame_deadline)

    def _frame_deadline(self) -> None:
        self._frame_timer = None
        due = self.limits.frame_deadline()
        if self.closed or due is None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < due:  # a later frame is in progress: its own deadline
            self._frame_timer = loop.call_at(due, self._frame_deadline)
            return
        self.abort(
            CloseReason.FRAME_TIMEOUT,
            f"frame not completed within {self.config.frame_timeout} s "
            f"({self.decoder.buffered} bytes received of {self.decoder.pending_length} declared)"
        )

    def _register(self) -> None:
        """The handshake is done and a request came: count this connection for its client."""
        assert self.client_id is not None
        self.state = ConnectionState.SERVING
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self.core.client_connected(self.client_id, self.trainer_id)
        if 0 <= self.trainer_id < self.config.num_trainers:
            self.core.leases.connected(self.trainer_id)

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
            self._handshake_error(self.handshake.receive_unparsable(frame.opcode, code, str(exc)), frame.request_id)
            return
        if self.state is not _SERVING or type(msg) in _HANDSHAKE_MESSAGES or self.server.closing:
            if not self._admitted(msg, frame.request_id):
                return
            if self.state is not _SERVING:
                self._register()
        # else: a request on a registered connection, which the handshake passes as it is
        assert self.client_id is not None
        op_name = type(msg).__name__
        reply = dispatch.run(self.core, self.client_id, self.trainer_id, msg, frame.flags, frame.request_id, self.peer)
        if isinstance(reply, wire.Message):
            size_out = self._send(reply, frame.request_id)
            self.core.stats.record(op_name, time.perf_counter_ns() - started, size_in, size_out, False)
        elif isinstance(reply, ServerError):
            self._send_error(frame.request_id, reply)
            self.core.stats.record(op_name, time.perf_counter_ns() - started, size_in, 0, True)
        else:
            self._finish_later(frame.request_id, op_name, reply, started, size_in)

    def _finish_later(self, request_id: int, op_name: str, reply: Awaitable[wire.Message], started: int, size_in: int) -> None:
        """Send the reply of a request that waits (barrier, sync round, or a replay)."""

        async def finish() -> None:
            try:
                result = await reply
            except ServerError as exc:
                self._send_error(request_id, exc)
                self.core.stats.record(op_name, time.perf_counter_ns() - started, size_in, 0, True)
                return
            except asyncio.CancelledError:
                self._send_error(request_id, dispatch.shutting_down())
                raise
            except Exception as exc:
                self._send_error(request_id, dispatch.internal(exc, op_name, self.peer))
                return
            size_out = self._send(result, request_id)
            self.core.stats.record(op_name, time.perf_counter_ns() - started, size_in, size_out, False)

        task = asyncio.ensure_future(finish())
        self.tasks.add(task)
        self.server.inflight.add(task)
        self.limits.hold_frame(task)  # the request's bytes stay charged while it waits
        task.add_done_callback(self._task_done)
        self._update_reading()

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        self.server.inflight.discard(task)
        self.limits.request_done(task)
        self._update_reading()

    def _admitted(self, msg: wire.Message, request_id: int) -> bool:
        """The handshake (aps/wire/handshake.py) says what this message is: HELLO and AUTH are
        answered here; a request passes only once the handshake is done."""
        step = self.handshake.receive(msg)
        action = step.action
        if action is Action.REQUEST:
            if self.server.closing:
                self._send_error(request_id, dispatch.shutting_down())
                return False
            return True
        if action is Action.HELLO:
            self.decoder.max_frame = self.handshake.frame_limit
            self._through_handshake()  # without a token HELLO is the whole handshake
            self._send(
                wire.HelloReply(
                    server_index=self.config.server_index,
                    num_servers=self.config.num_servers,
                    max_frame=self.config.max_frame,
                    auth_required=int(self.config.token is not None),
                    lease_ms=min(0xFFFFFFFF, int(self.config.trainer_timeout * 1000)),
                    nonce=self.nonce,
                ),
                request_id,
            )
        elif action is Action.AUTH_OK:
            self._send(wire.Ok(op=wire.Op.AUTH), request_id)
        elif action is Action.CHECK_AUTH:
            assert isinstance(msg, wire.Auth)
            self._update_reading()  # held (CHECKING): nothing else is read meanwhile
            mac = msg.mac
            self.server.auth_throttle.submit(
                self.peer.rpartition(":")[0],
                lambda: self._check_auth(mac),
                lambda ok, why: self._auth_verdict(ok, why, request_id),
                self._auth_shed,
            )
        else:
            self._handshake_error(step, request_id)
        return False

    def _handshake_error(self, step: Step, request_id: int) -> None:
        assert step.code is not None
        if step.action is Action.REFUSE:
            self._send_error(request_id, ServerError(step.code, step.message))
            self.close(CloseReason.HANDSHAKE_REFUSED, step.message)
        else:
            self._send_error(request_id, ServerError(step.code, step.message))

    def _check_auth(self, mac: bytes) -> bool | None:
        assert self.config.token is not None and self.client_id is not None
        return None if self.closed else check_mac(self.config.token, self.nonce, self.client_id, mac)

    def _auth_verdict(self, ok: bool, why: str, request_id: int) -> None:
        """The answer to AUTH: a success at once, a refusal when its address's slot time ends
        (see throttle.py), possibly after the connection has gone."""
        if self.closed:
            return
        step = self.handshake.auth_checked(ok, why)
        if step.action is not Action.AUTH_OK:
            log.warning("authentication failed", peer=self.peer, reason=why)
            self._handshake_error(step, request_id)
            return
        self.decoder.max_frame = self.handshake.frame_limit
        self._through_handshake()
        self._send(wire.Ok(op=wire.Op.AUTH), request_id)
        self._update_reading()
        asyncio.get_running_loop().call_soon(self.data_received, b"")  # requests queued behind the AUTH

    def _auth_shed(self) -> None:
        """A wrong AUTH while its address (or the server) already has as many refusals scheduled
        as the throttle keeps: nothing is kept for it; the connection reads nothing more and the
        handshake deadline closes it unanswered (an early answer would tell a guesser its guess
        was wrong sooner than the throttle allows). With ``handshake_timeout`` 0 it stays open
        until the peer closes it, as an idle unauthenticated connection does."""
        log.debug("wrong AUTH shed: the handshake deadline closes it", peer=self.peer)

    # ----------------------------------------------------------------- output

    def _send(self, msg: wire.Message, request_id: int) -> int:
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

    def _send_error(self, request_id: int, exc: ServerError) -> None:
        self._send(dispatch.error_reply(exc), request_id)

    def _update_reading(self) -> None:
        """Stop reading while the peer does not read our replies or has too much in flight."""
        if self.transport is None or self.closed:
            return
        should_pause = self.limits.should_pause(
            checking_auth=self._held, peer_reading=not self._write_paused, waiting=len(self.tasks)
        )
        if should_pause and not self._read_paused:
            self.transport.pause_reading()
            self._read_paused = True
            self.limits.reading_stopped()
        elif not should_pause and self._read_paused:
            self.transport.resume_reading()
            self._read_paused = False
            asyncio.get_running_loop().call_soon(self.data_received, b"")  # frames left unparsed

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
        if self.close_reason is not None:
            return
        self.close_reason, self.close_detail = reason, detail
        self.handshake.close(f"{reason.value}: {detail}" if detail else reason.value)
        warning = _WARNINGS.get(reason)
        if warning is not None:
            log.warning(warning, peer=self.peer, client=self.client_id, reason=reason.value, detail=detail)
        else:
            log.debug("closing connection", peer=self.peer, client=self.client_id, reason=reason.value, detail=detail)
