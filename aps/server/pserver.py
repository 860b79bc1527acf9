"""The pserver as an embeddable object: start, serve, stop gracefully.

Shutdown runs in phases (stop accepting, drain in-flight requests, close connections), whether it
was asked for by :meth:`PServer.aclose`, by the last trainer's worker_done, or by a signal the
CLI turned into an ``aclose`` call.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import structlog

from ..errors import ConfigError, ErrorCode, ServerError
from ..telemetry import MetricsEndpoint, server_registry
from ..tls import server_context
from .config import ServerConfig
from .connection import ServerConnection, check_limits
from .autosave import AutoCheckpoints
from .core import ServerCore
from .throttle import AuthThrottle
from .warmup import warm_up_kernels

log = structlog.get_logger("aps.server")


class PServer:
    """One parameter server: owns a shard of every table and serves it over TCP."""

    def __init__(self, config: ServerConfig) -> None:
        check_limits(config)
        self.config = config
        self.core = ServerCore(config, on_all_done=self._all_trainers_done)
        self.connections: set[ServerConnection] = set()
        self.inflight: set[asyncio.Task[Any]] = set()
        #: bytes in flight over every connection (max_inflight_bytes bounds it; connection.py)
        self.inflight_bytes = 0
        self.closing = False
        self._server: asyncio.base_events.Server | None = None
        self._closed: asyncio.Event | None = None
        self._close_task: asyncio.Task[None] | None = None
        self.port = config.port
        self.host = config.host
        self.exit_reason = ""
        #: this server's Prometheus registry (its own, never the global one); always built, so an
        #: embedding application can expose it itself even without ``metrics_port``
        self.registry = server_registry(self.core)
        self.metrics: MetricsEndpoint | None = None
        directory = config.checkpoint_dir or config.resume
        self.checkpoints = (
            AutoCheckpoints(self.core, directory, config.checkpoint_every, config.keep_checkpoints) if directory else None
        )
        self._final_checkpoint = False
        try:
            self.auth_throttle = AuthThrottle(
                config.auth_fail_delay, config.auth_fail_max_delay, config.auth_fail_concurrent
            )
        except ValueError as exc:
            raise ConfigError(f"auth_fail_*: {exc}") from None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def metrics_port(self) -> int | None:
        """The bound port of the metrics endpoint (useful with ``metrics_port=0``), or None."""
        return self.metrics.port if self.metrics is not None else None

    async def start(self) -> PServer:
        loop = asyncio.get_running_loop()
        self._closed = asyncio.Event()
        warm_up_kernels()
        tls = server_context(self.config.tls_cert, self.config.tls_key)
        try:
            self._server = await loop.create_server(
                lambda: ServerConnection(self), self.config.host, self.config.port, reuse_address=True, ssl=tls
            )
        except socket.gaierror as exc:  # errno is a resolver code, not an OS errno
            raise ConfigError(f"cannot listen on {self.config.host}:{self.config.port}: "
                              f"host {self.config.host!r} does not resolve to an address here ({exc.strerror})") from exc
        except OSError as exc:
            reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
            raise ConfigError(f"cannot listen on {self.config.host}:{self.config.port}: {reason}") from exc
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        self.core.leases.start(heard_all=self.core.resumed is not None)
        if self.checkpoints is not None:
            self.checkpoints.start()
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
                self._server.close()  # do not leave the data port open behind a failed start
                raise
        log.info(
            "pserver listening",
            address=self.address,
            tls=tls is not None,
            index=self.config.server_index,
            servers=self.config.num_servers,
            trainers=self.config.num_trainers,
        )
        return self

    async def wait_closed(self) -> None:
        """Return once the server has shut down (trainers done, aclose, or signal)."""
        assert self._closed is not None, "start() first"
        await self._closed.wait()

    def _all_trainers_done(self) -> None:
        gone = sorted(self.core.leases.gone)
        self.exit_reason = f"every trainer sent worker_done or is gone (gone: {gone})" if gone else "all trainers sent worker_done"
        self.request_close()

    def request_close(self, checkpoint: bool = False) -> None:
        """Begin a graceful shutdown without waiting for it (safe from callbacks and signal handlers).

        ``checkpoint``: write one last checkpoint to ``checkpoint_dir`` once the requests in flight
        are done and before the connections close (what SIGTERM asks for)."""
        self._final_checkpoint = self._final_checkpoint or checkpoint
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._shutdown())

    async def aclose(self, checkpoint: bool = False) -> None:
        """Stop accepting, finish in-flight requests (bounded by drain_timeout), close;
        ``checkpoint``: write a last checkpoint to ``checkpoint_dir`` before closing."""
        self.request_close(checkpoint)
        assert self._close_task is not None
        await asyncio.shield(self._close_task)

    async def _shutdown(self) -> None:
        self.closing = True
        if self._server is not None:
            self._server.close()
        # requests that wait on other trainers (barriers, sync rounds) would never finish now
        self.core.fail_waiters(ServerError(ErrorCode.SHUTTING_DOWN, "server is shutting down", True))
        if self.inflight:
            _, pending = await asyncio.wait(set(self.inflight), timeout=self.config.drain_timeout)
            for task in pending:
                task.cancel()
        if self.checkpoints is not None:
            await self.checkpoints.stop()  # a periodic save being written finishes first
            if self._final_checkpoint:
                # new requests are refused (closing) and those in flight are done: the last
                # checkpoint holds every push this server acknowledged
                try:
                    await self.checkpoints.save_now("shutdown")
                except Exception as exc:  # still stop; the operator reads why there is no checkpoint
                    log.error("checkpoint at shutdown failed", error=str(exc))
        # let the replies already written reach the socket before closing it
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
        if self.metrics is not None:  # last, so the drain itself can still be watched
            await self.metrics.aclose()
        log.info("pserver stopped", address=self.address, reason=self.exit_reason or "closed")
        assert self._closed is not None
        self._closed.set()

    async def __aenter__(self) -> PServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    num_trainers: int = 1,
    *,
    server_index: int = 0,
    num_servers: int = 1,
    token: str | None = None,
    init_model: str | None = None,
    **options: Any,
) -> PServer:
    """Start a pserver inside the running event loop and return it once it is listening.

    ``server.port`` is the bound port (useful with ``port=0``); ``await server.aclose()`` stops it;
    ``await server.wait_closed()`` waits until it stops by itself (every trainer done).
    ``metrics_port=`` (any :class:`ServerConfig` field may be passed) also serves Prometheus
    metrics over HTTP; ``server.metrics_port`` is then its bound port.
    """
    config = ServerConfig(
        host=host,
        port=port,
        server_index=server_index,
        num_servers=num_servers,
        num_trainers=num_trainers,
        token=token,
        init_model=init_model,
        **options,
    )
    return await PServer(config).start()
