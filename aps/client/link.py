"""One client connection to one pserver: request ids, in-flight futures, handshake.

A link is a single TCP connection. Many requests may be in flight; replies are matched by
request id, so a reply that arrives after its caller gave up (timeout, cancel) is simply dropped
and the connection stays in sync. When the connection dies every waiter fails with
:class:`ConnectionLost` whose ``reason`` says why (a :class:`CloseReason`: the pserver closed
it, the transport failed, the pserver sent a bad frame, or our own close) and whose ``__cause__``
is the underlying exception.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import socket
import ssl as _ssl
import time
from typing import Any

from .. import wire
from ..errors import CloseReason, ConnectionLost, RemoteProtocolError, ServerError
from ..wire.handshake import ClientHandshake
from .retry import timed_out


#: a client that gets every reply by spinning never yields to its event loop (awaiting a done
#: future does not); after this many seconds of that, one request waits in the loop instead
_MAX_SPIN_STREAK = 0.002


class _LinkProtocol(asyncio.BufferedProtocol):
    """Receives straight into the link's decoder buffers (a large reply's body into its own
    final buffer), instead of a bytes object per read appended to a buffer."""

    def __init__(self, link: Link) -> None:
        self.link = link

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.link.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.link.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.link.decoder.buffer_updated(nbytes)
        self.link._frames_in()

    def connection_lost(self, exc: Exception | None) -> None:
        self.link._lost(exc)

    def pause_writing(self) -> None:
        self.link._writable.clear()

    def resume_writing(self) -> None:
        self.link._writable.set()


class Link:
    """A connected, handshaken connection to one pserver."""

    def __init__(self, address: str, max_frame: int) -> None:
        self.address = address
        self.max_frame = max_frame
        self.transport: asyncio.Transport | None = None
        self.decoder = wire.FrameDecoder(max_frame)
        self.waiters: dict[int, asyncio.Future[wire.Message]] = {}
        self._writable = asyncio.Event()
        self._writable.set()
        self.closed = False
        #: why it closed (None while open), and the exception behind it
        self.close_reason: CloseReason | None = None
        self.close_cause: BaseException | None = None
        self.server_index = -1
        self.num_servers = 0
        #: seconds of silence after which the server takes this trainer for gone (0: never)
        self.lease = 0.0
        # deadlines of requests that have one: a heap of (when, seq, future, limit) and one timer
        # at its earliest, instead of a timer (and a timeout context) per request
        self._deadlines: list[tuple[float, int, asyncio.Future[wire.Message], float]] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        #: busy polling (see :meth:`busy_poll`): seconds to spin, and our own handle on the socket
        self._spin = 0.0
        self._spin_sock: socket.socket | None = None
        # a callback queued on the loop at the first spin since the loop last ran (see
        # _spin_or_yield): while it has not run, the loop has not had a turn
        self._turn_pending = False
        self._turn_asked = 0.0

    @classmethod
    async def open(
        cls,
        address: str,
        client_id: int,
        trainer_id: int,
        token: str | None,
        max_frame: int,
        first_request_id: int,
        ssl: _ssl.SSLContext | None = None,
    ) -> Link:
        """Connect (over TLS when ``ssl`` is a context) and handshake (hello, then auth when the
        server asks for a token; the steps are :class:`ClientHandshake`'s)."""
        host, _, port = address.rpartition(":")
        link = cls(address, max_frame)
        loop = asyncio.get_running_loop()
        try:
            await loop.create_connection(lambda: _LinkProtocol(link), host.strip("[]"), int(port), ssl=ssl)
        except _ssl.SSLError as exc:
            raise ConnectionLost(f"cannot connect to pserver {address}: TLS failed: {exc}", CloseReason.CONNECT_FAILED) from exc
        except OSError as exc:
            raise ConnectionLost(f"cannot connect to pserver {address}: {exc.strerror or exc}", CloseReason.CONNECT_FAILED) from exc
        handshake = ClientHandshake(client_id, trainer_id, token, max_frame, address)
        try:
            step: wire.Message | None = handshake.hello()
            request_id = first_request_id
            while step is not None:  # HELLO, then AUTH when the server asks for a token
                step = handshake.receive(await link.request(step, request_id))
                request_id += 1
        except BaseException:
            link.close()
            raise
        link.server_index, link.num_servers = handshake.server_index, handshake.num_servers
        link.max_frame, link.lease = handshake.max_frame, handshake.lease
        return link

    def busy_poll(self, seconds: float) -> bool:
        """After sending a request while no other is in flight, spin on the socket for up to
        ``seconds`` for the reply instead of sleeping in the event loop until it comes.

        Why: a round trip on loopback or a fast LAN is a few tens of microseconds, but a process
        that sleeps in ``epoll_wait`` for it is woken by the kernel (and, in a virtual machine,
        its idle CPU by the hypervisor), which can cost more than the round trip itself. Spinning
        trades one CPU for that latency; it blocks this event loop while it spins, so it is off
        by default and meant for a client that does one request at a time (online serving).
        Over TLS there is nothing to spin on (the bytes need decrypting): returns False."""
        self._stop_spinning()
        if seconds <= 0 or self.transport is None or self.transport.get_extra_info("sslcontext") is not None:
            return False
        raw = self.transport.get_extra_info("socket")
        if raw is None:
            return False
        # our own descriptor of the same socket: reads through it and the transport's come from
        # one queue, in order, and both are non-blocking
        self._spin_sock = socket.socket(fileno=os.dup(raw.fileno()))
        self._spin_sock.setblocking(False)
        self._spin = seconds
        return True

    def _stop_spinning(self) -> None:
        if self._spin_sock is not None:
            self._spin_sock.close()
            self._spin_sock = None
        self._spin = 0.0

    def _spin_or_yield(self, future: asyncio.Future[wire.Message]) -> None:
        """Spin for the reply, unless this link's spun replies have kept the event loop from
        running for ``_MAX_SPIN_STREAK``: then wait in the loop once, so other tasks run."""
        now = time.perf_counter()
        if not self._turn_pending:
            self._turn_pending, self._turn_asked = True, now
            asyncio.get_running_loop().call_soon(self._loop_turned)
        elif now - self._turn_asked > _MAX_SPIN_STREAK:
            return
        self._poll_reply(future)

    def _loop_turned(self) -> None:
        self._turn_pending = False

    def _poll_reply(self, future: asyncio.Future[wire.Message]) -> None:
        """Read the socket directly until ``future`` has its reply, the time is up, or the
        socket has nothing more to say (EOF or an error: the transport sees those too)."""
        sock, decoder = self._spin_sock, self.decoder
        assert sock is not None
        until = time.perf_counter() + self._spin
        while not future.done() and not self.closed:
            view = decoder.get_buffer(-1)
            try:
                n = sock.recv_into(view)
            except (BlockingIOError, InterruptedError):
                if time.perf_counter() > until:
                    return
                continue
            except OSError:
                return
            finally:
                view.release()
            if n == 0:
                return
            decoder.buffer_updated(n)
            self._frames_in()

    async def request(
        self, msg: wire.Message, request_id: int, flags: int = 0, deadline: float | None = None, limit: float = 0.0
    ) -> wire.Message:
        """Send one request and wait for its reply.

        ``deadline`` (loop time), when given, fails the wait with :class:`RequestTimeout` (naming
        ``limit`` seconds) once passed; a reply arriving later is dropped, as for a cancelled
        request. Without it the caller owns the time budget."""
        if self.closed or self.transport is None:
            raise ConnectionLost(f"connection to {self.address} is closed", self.close_reason) from self.close_cause
        if not self._writable.is_set():
            await self._writable.wait()
            if self.closed:
                raise ConnectionLost(f"connection to {self.address} is closed", self.close_reason) from self.close_cause
        parts = wire.encode(msg, request_id, flags, self.max_frame)  # may raise LocalProtocolError: register after
        future: asyncio.Future[wire.Message] = asyncio.get_running_loop().create_future()
        self.waiters[request_id] = future
        if deadline is not None:
            self._watch(future, deadline, limit)
        try:
            if len(parts) == 1:
                self.transport.write(parts[0])
            else:
                self.transport.writelines(parts)
            if self._spin and len(self.waiters) == 1 and not self.transport.get_write_buffer_size():
                self._spin_or_yield(future)
            return await future
        finally:
            self.waiters.pop(request_id, None)

    def _frames_in(self) -> None:
        """Decode every complete frame received and hand each reply to its waiter."""
        while True:
            try:
                frame = self.decoder.next_frame()
                if frame is None:
                    return
                msg = wire.decode(frame)
            except RemoteProtocolError as exc:
                self._fail(CloseReason.BAD_FRAME, exc)
                if self.transport is not None:
                    self.transport.abort()
                return
            future = self.waiters.get(frame.request_id)
            if future is None or future.done():
                continue  # its caller gave up (timeout / cancel); nothing to resynchronise
            if isinstance(msg, wire.Error):
                future.set_exception(
                    ServerError(msg.code, msg.message, retriable=bool(msg.retriable), server=self.address)
                )
            else:
                future.set_result(msg)

    def _watch(self, future: asyncio.Future[wire.Message], deadline: float, limit: float) -> None:
        heap = self._deadlines
        while heap and heap[0][2].done():  # the earliest are usually answered already
            heapq.heappop(heap)
        if len(heap) > 64 + 4 * len(self.waiters):  # answered ones behind a long deadline
            heap[:] = [entry for entry in heap if not entry[2].done()]
            heapq.heapify(heap)
        heapq.heappush(heap, (deadline, next(self._seq), future, limit))
        if self._timer is None or deadline < self._timer_at:
            self._arm(deadline)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(when, self._expire)
        self._timer_at = when

    def _expire(self) -> None:
        """Fail every request whose deadline has passed; re-arm for the next one."""
        self._timer = None
        heap = self._deadlines
        now = asyncio.get_running_loop().time()
        while heap:
            when, _, future, limit = heap[0]
            if not future.done():
                if when > now:
                    self._arm(when)
                    return
                future.set_exception(timed_out(limit))
            heapq.heappop(heap)

    def _lost(self, exc: Exception | None) -> None:
        """The transport is gone: the pserver closed it (EOF), or it failed (``exc``)."""
        if exc is None:
            self._fail(CloseReason.PEER_CLOSED, ConnectionResetError("closed by the pserver"))
        else:
            self._fail(CloseReason.RESET, exc)

    def _fail(self, reason: CloseReason, cause: BaseException) -> None:
        if not self.closed:  # the first reason stays (our close, then the transport's loss)
            self.close_reason, self.close_cause = reason, cause
        self.closed = True
        self._writable.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._deadlines.clear()
        self._stop_spinning()
        for future in self.waiters.values():
            if not future.done():
                err = ConnectionLost(f"connection to pserver {self.address} lost: {cause}", reason)
                err.__cause__ = cause
                future.set_exception(err)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self._fail(CloseReason.CLOSED, ConnectionResetError("closed by the client"))

    def info(self) -> dict[str, Any]:
        return {"address": self.address, "inflight": len(self.waiters), "closed": self.closed}
