"""The listener: one server over a request core, started, served and stopped gracefully.

:class:`RequestServer` binds the ports, accepts connections (admission, handshake, token, TLS,
limits), serves Prometheus metrics and stops in phases (stop accepting, fail what waits, drain
in-flight requests, let the core finish its own work, close connections), whether asked by
:meth:`RequestServer.aclose`, by its core (a pserver's trainers are all done) or by a signal
the CLI turned into an ``aclose`` call. What a request means is the core's
(:class:`~aps.server.transport.service.RequestCore`): the pserver (aps/server/pserver.py) and
aps-serve (aps/serving/server.py) are each this server over their own core.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import threading
from typing import Any, Self

import structlog
from prometheus_client import CollectorRegistry

from ... import wire
from ...errors import CloseReason, ConfigError, ErrorCode, ServerError
from ...telemetry import MetricsEndpoint, write_port_file
from ...tls import server_context
from ...wire.limits import check_limits
from ..config import ServerConfig
from ..stats import PortStats
from .admission import Admission
from .connection import ServerConnection
from .context import ConnectionContext
from .service import RequestCore
from .throttle import AuthThrottle

log = structlog.get_logger("aps.server")

#: opcode -> name for the per-port stats (an enum lookup per frame cost a microsecond)
_OP_NAMES = {int(op): op.name for op in wire.Op}
#: attempts at finding ``num_ports`` consecutive free ports when the first one is 0 (any)
_FREE_RUN_TRIES = 64


class _PortConnection(ServerConnection):
    """A connection accepted on one of the server's ports: it counts its connections and frames
    in that port's stats, so an operator sees how the clients spread their traffic."""

    def __init__(self, server: ConnectionContext, port: PortStats) -> None:
        super().__init__(server)
        self.port_stats = port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.port_stats.connections += 1
        self.port_stats.connections_total += 1
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.port_stats.connections -= 1
        super().connection_lost(exc)

    def _frame_received(self, frame: wire.Frame) -> None:
        op = _OP_NAMES.get(frame.opcode) or f"opcode_{frame.opcode}"
        self.port_stats.frame(op, wire.HEADER_SIZE + len(frame.payload))
        super()._frame_received(frame)


class RequestServer:
    """A TCP server over ``core``: ``config.num_ports`` consecutive ports, one request core."""

    def __init__(self, config: ServerConfig, core: RequestCore, registry: CollectorRegistry) -> None:
        """``registry``: the Prometheus registry served on ``config.metrics_port`` (the core's
        numbers). The log lines say "pserver" for aps-serve too, as they always have."""
        check_limits(config)
        self.config = config
        self.core = core
        self.connections: set[ServerConnection] = set()
        self.inflight: set[asyncio.Task[Any]] = set()
        #: bytes in flight over every connection (max_inflight_bytes bounds it; connection.py)
        self.inflight_bytes = 0
        #: bytes held by connections not through their handshake (max_handshake_bytes bounds it)
        self.handshake_bytes = 0
        self.closing = False
        #: one listening socket per port (``config.num_ports`` consecutive ones)
        self._servers: list[asyncio.base_events.Server] = []
        self._closed: asyncio.Event | None = None
        self._close_task: asyncio.Task[None] | None = None
        self.port = config.port
        self.host = config.host
        self.exit_reason = ""
        #: this server's Prometheus registry (its own, never the global one); always built, so an
        #: embedding application can expose it itself even without ``metrics_port``
        self.registry = registry
        self.metrics: MetricsEndpoint | None = None
        self._final_checkpoint = False
        self.admission = Admission(config.max_connections, config.max_connections_per_address)
        self.auth_throttle = AuthThrottle(config.auth_fail_delay, config.auth_fail_max_delay, config.auth_fail_concurrent)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ports(self) -> list[int]:
        """Every bound port: ``port`` and the ones after it (dense first, then sparse)."""
        return [self.port + i for i in range(len(self._servers) or self.config.num_ports)]

    @property
    def metrics_port(self) -> int | None:
        """The bound port of the metrics endpoint (useful with ``metrics_port=0``), or None."""
        return self.metrics.port if self.metrics is not None else None

    async def start(self) -> Self:
        loop = asyncio.get_running_loop()
        self._closed = asyncio.Event()
        tls = server_context(self.config.tls_cert, self.config.tls_key)
        self._servers = await self._listen(loop, tls)
        self.port = self._servers[0].sockets[0].getsockname()[1]
        self.core.start(self._close_for)
        if self.config.metrics_port is not None:
            endpoint = MetricsEndpoint(
                self.registry,
                self.config.metrics_host or self.config.host,
                self.config.metrics_port,
                role="pserver",
                port_file=self.config.metrics_port_file,
            )
            try:
                self.metrics = endpoint.start()
            except BaseException:
                for listening in self._servers:  # do not leave the data ports open behind a failed start
                    listening.close()
                raise
        log.info(
            "pserver listening",
            address=self.address,
            ports=f"{self.port}-{self.ports[-1]}" if len(self.ports) > 1 else str(self.port),
            sparse_ports=self.config.ports_num_for_sparse,
            tls=tls is not None,
            index=self.config.server_index,
            servers=self.config.num_servers,
            trainers=self.config.num_trainers,
        )
        return self

    async def _listen(self, loop: asyncio.AbstractEventLoop, tls: Any) -> list[asyncio.base_events.Server]:
        """Listen on ``num_ports`` consecutive ports from ``config.port``; with port 0 (any), on
        the first run of that many consecutive free ports found."""
        count, first = self.config.num_ports, self.config.port
        for _ in range(_FREE_RUN_TRIES if first == 0 and count > 1 else 1):
            servers: list[asyncio.base_events.Server] = []
            try:
                base = first
                for i in range(count):
                    servers.append(await self._listen_one(loop, tls, base + i, i))
                    base = servers[0].sockets[0].getsockname()[1]  # port 0: the one the system chose
                return servers
            except OSError as exc:
                for listening in servers:
                    listening.close()
                if first == 0 and exc.errno == errno.EADDRINUSE and servers:
                    continue  # the port after a free one was taken: try another run
                self._listen_failed(exc, servers)
        raise ConfigError(f"cannot find {count} consecutive free ports on {self.config.host} "
                          f"after {_FREE_RUN_TRIES} tries: pass --port")

    async def _listen_one(self, loop: asyncio.AbstractEventLoop, tls: Any, port: int, slot: int) -> asyncio.base_events.Server:
        if port > 65535:
            raise OSError(errno.EADDRINUSE, f"port {port} is past 65535")
        stats = PortStats(port, "dense" if slot < self.config.ports_num else "sparse")
        server = await loop.create_server(
            lambda: _PortConnection(self, stats), self.config.host, port, reuse_address=True, ssl=tls
        )
        stats.port = server.sockets[0].getsockname()[1]
        if slot == 0:
            self.core.stats.ports.clear()
        self.core.stats.ports.append(stats)
        return server

    def _listen_failed(self, exc: OSError, opened: list[asyncio.base_events.Server]) -> None:
        """A port could not be bound: raise a ConfigError naming it and why."""
        host = self.config.host
        port = self.config.port + len(opened) if self.config.port else 0
        if isinstance(exc, socket.gaierror):  # errno is a resolver code, not an OS errno
            raise ConfigError(f"cannot listen on {host}:{port}: "
                              f"host {host!r} does not resolve to an address here ({exc.strerror})") from exc
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise ConfigError(f"cannot listen on {host}:{port}: {reason}") from exc

    async def serve_until_signalled(
        self, port_file: str | None = None, signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)
    ) -> None:
        """Serve as a program does, until the server closes: start (unless started), write the
        bound port to ``port_file`` (atomically, for a launcher polling for it), and stop
        gracefully on any of ``signals`` with a last checkpoint when ``checkpoint_dir`` is set,
        as on :meth:`aclose` ``(checkpoint=True)``. One loop for aps-server and a fleet script's
        ``run_server``, so both answer SIGTERM alike. The handlers are installed only on the
        main thread (asyncio allows no other) and removed on return."""
        if self._closed is None:
            await self.start()
        if port_file:
            write_port_file(port_file, self.port)
        loop = asyncio.get_running_loop()
        handled = signals if threading.current_thread() is threading.main_thread() else ()

        def stop(sig: signal.Signals) -> None:
            log.info("signal received, stopping", signal=sig.name)
            self.exit_reason = f"signal {sig.name}"
            self.request_close(checkpoint=True)

        for sig in handled:
            loop.add_signal_handler(sig, stop, sig)
        try:
            await self.wait_closed()
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    async def wait_closed(self) -> None:
        """Return once the server has shut down (trainers done, aclose, or signal)."""
        assert self._closed is not None, "start() first"
        await self._closed.wait()

    def _close_for(self, reason: str) -> None:
        """The core asks the server to stop (a pserver's trainers are all done): ``reason`` is logged."""
        self.exit_reason = reason
        self.request_close()

    def request_close(self, checkpoint: bool = False) -> None:
        """Begin a graceful shutdown without waiting for it (safe from callbacks and signal handlers).

        ``checkpoint``: have the core keep what a graceful stop must (a pserver: one last
        checkpoint to ``checkpoint_dir``) once the requests in flight are done and before the
        connections close (what SIGTERM asks for)."""
        self._final_checkpoint = self._final_checkpoint or checkpoint
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._shutdown())

    async def aclose(self, checkpoint: bool = False) -> None:
        """Stop accepting, finish in-flight requests (bounded by drain_timeout), close;
        ``checkpoint``: as for :meth:`request_close`."""
        self.request_close(checkpoint)
        assert self._close_task is not None
        await asyncio.shield(self._close_task)

    async def _shutdown(self) -> None:
        self.closing = True
        for listening in self._servers:
            listening.close()
        # requests that wait on other trainers (barriers, sync rounds) would never finish now
        self.core.fail_waiters(ServerError(ErrorCode.SHUTTING_DOWN, "server is shutting down", True))
        if self.inflight:
            _, pending = await asyncio.wait(set(self.inflight), timeout=self.config.drain_timeout)
            for task in pending:
                task.cancel()
        # the core's own work (a pserver's scheduled shrink, a periodic save) finishes first; new
        # requests are refused (closing) and those in flight are done, so a last checkpoint
        # holds every push this server acknowledged
        await self.core.stop(self._final_checkpoint)
        # let the replies already written reach the socket before closing it
        for conn in list(self.connections):
            conn.close(CloseReason.SHUTDOWN)
        if self._servers:
            try:
                await asyncio.wait_for(asyncio.gather(*(s.wait_closed() for s in self._servers)), timeout=1.0)
            except asyncio.TimeoutError:
                pass
        if self.metrics is not None:  # last, so the drain itself can still be watched
            await self.metrics.aclose()
        log.info("pserver stopped", address=self.address, reason=self.exit_reason or "closed")
        assert self._closed is not None
        self._closed.set()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

