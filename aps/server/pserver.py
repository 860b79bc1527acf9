"""The pserver as an embeddable object: the listener (transport/listener.py: start, serve, stop
gracefully) over the training core (core.py), which stops it once every trainer is done.
"""

from __future__ import annotations

from typing import Any

from ..checkpoints.kinds import DEFAULT_FORMATS, TableFormats
from .autosave import AutoCheckpoints
from .collector import server_registry
from .config import ServerConfig
from .core import ServerCore
from .kinds import DEFAULT_KINDS, TableKind
from .transport.listener import RequestServer


class PServer(RequestServer):
    """One parameter server: owns a shard of every table and serves it over TCP (the listener
    over the training core)."""

    def __init__(
        self, config: ServerConfig, kinds: tuple[type[TableKind], ...] = DEFAULT_KINDS, formats: TableFormats = DEFAULT_FORMATS,
    ) -> None:
        """``kinds`` and ``formats``: the table kinds it serves and their checkpoints (server/kinds/,
        checkpoints/kinds.py); a new kind of table is one of each, added to the defaults."""
        core = ServerCore(config, kinds, formats)
        super().__init__(config, core, server_registry(core))
        self.core: ServerCore = core

    @property
    def checkpoints(self) -> AutoCheckpoints | None:
        """The periodic checkpoints (None without ``checkpoint_dir`` or ``resume``)."""
        return self.core.scheduled.checkpoints


async def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    num_trainers: int = 1,
    *,
    server_index: int = 0,
    num_servers: int = 1,
    token: str | None = None,
    init_model: str | None = None,
    exit_when_done: bool = ServerConfig.exit_when_done,
    **options: Any,
) -> PServer:
    """Start a pserver inside the running event loop and return it once it is listening.

    ``server.port`` is the bound port (useful with ``port=0``); ``await server.aclose()`` stops it.
    ``exit_when_done``: :attr:`ServerConfig.exit_when_done`, with the same default (off): stop
    by itself once every trainer has sent worker_done (or is gone), as aps-server does; off, a
    server embedded in an application outlives the trainers that fill it (``await
    server.wait_closed()`` then returns only after ``aclose``).
    ``metrics_port=`` (any :class:`ServerConfig` field may be passed) also serves Prometheus
    metrics over HTTP; ``server.metrics_port`` is then its bound port.

    The numba kernels the server runs load in a background thread once it listens (they are
    cached on disk; the first load in a fresh process takes ~0.5 s): the caller's event loop is
    not blocked by the load, but a request that needs a kernel still loading waits for it.
    """
    config = ServerConfig(
        host=host,
        port=port,
        server_index=server_index,
        num_servers=num_servers,
        num_trainers=num_trainers,
        token=token,
        init_model=init_model,
        exit_when_done=exit_when_done,
        **options,
    )
    return await PServer(config).start()
