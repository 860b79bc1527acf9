"""aps-serve as an embeddable object: a read-only pserver over an export root that follows it.

The server is the pserver's listener (aps/server/transport/listener.py: handshake, token, TLS,
limits, graceful shutdown, metrics) over a :class:`ServingCore`; a task looks at the root every
``poll`` seconds and, when a new export is done, builds the next model in a thread
(:class:`ExportFollower`) and swaps it in on the loop. The first model is built before the
server listens, so a server started over an export root that holds one answers from it at once.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import structlog

from ..errors import ConfigError
from ..server.config import ServerConfig
from ..server.transport.listener import RequestServer
from ..server.transport.metrics import RequestCollector
from ..storage.table_classes import BySpecClass
from ..telemetry import new_registry
from ..validate import seconds
from .core import ServingCore
from .follow import ExportFollower
from .model import warm_up
from .rows_option import DEFAULT_ROWS, HASH_TABLES, served_tables

log = structlog.get_logger("aps.serving")

#: seconds between two looks at the export root
DEFAULT_POLL = 0.2


class ServingServer:
    """aps-serve: serves the newest model of the exports under ``root`` (see :func:`serve_exports`)."""

    def __init__(
        self, root: str | os.PathLike[str], config: ServerConfig, poll: float = DEFAULT_POLL,
        served: BySpecClass[Any] | None = None, rows: str = DEFAULT_ROWS,
    ) -> None:
        """``served``: the class aps-serve serves each kind of spec with (default: aps's; a kind
        of spec defined outside aps is one more entry), and so the only specs an export it loads
        may hold. ``rows``: what hash tables hold their rows as, ``"exported"`` (float32) or
        ``"int8"`` (int8 codes and a float32 scale a row: aps/serving/rows_option.py); only
        ``"exported"`` with ``served``."""
        seconds("poll", poll, None)
        served = served_tables(rows, served)
        if config.num_servers != 1 or config.server_index != 0:
            raise ConfigError("aps-serve is a cluster of one server: every export holds the whole model")
        self.root = os.fspath(root)
        self.poll = poll
        self.rows = rows
        self.core = ServingCore(config, self.root)
        self.server = RequestServer(config, self.core, new_registry(RequestCollector(self.core.stats)))
        self.follower = ExportFollower(self.root, served)
        self._task: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def version(self) -> int | None:
        """The model version served (None: no export loaded yet)."""
        return None if self.core.model is None else self.core.model.version

    async def start(self) -> ServingServer:
        await asyncio.gather(asyncio.to_thread(warm_up, HASH_TABLES.get(self.rows)), self.advance())
        await self.server.start()
        self._task = asyncio.create_task(self._follow(), name="aps-serve follow")
        return self

    async def advance(self) -> bool:
        """Look at the root once; True when a new model is served now."""
        try:
            model = await asyncio.to_thread(self.follower.advance)
        except (OSError, ConfigError) as exc:  # an unreadable root: say so, look again next time
            log.error("cannot read the export root", root=self.root, error=str(exc))
            return False
        except Exception as exc:  # the follower refuses what an export holds, so this is a bug: say so, and
            # serve the version held (look again next time) rather than end the follow task
            log.error("following the export root failed", root=self.root, error=f"{type(exc).__name__}: {exc}", exc_info=exc)
            return False
        finally:
            self.core.refused = dict(self.follower.refused)
            self.core.waiting = dict(self.follower.waiting)
        if model is None:
            return False
        self.core.install(model)
        return True

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.poll)
            await self.advance()

    async def serve_until_signalled(self, port_file: str | None = None) -> None:
        """Serve as aps-serve does, until the server closes: start (unless started), then the
        pserver's own loop (:meth:`PServer.serve_until_signalled`: the port file written
        atomically, SIGTERM and SIGINT a graceful stop), so aps-serve and aps-server answer a
        signal alike; the export root is no longer followed once it returns."""
        if self._task is None:
            await self.start()
        try:
            await self.server.serve_until_signalled(port_file)
        finally:
            await self._stop_following()

    async def wait_closed(self) -> None:
        await self.server.wait_closed()

    def request_close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.server.request_close()

    async def aclose(self) -> None:
        await self._stop_following()
        await self.server.aclose()

    async def _stop_following(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def __aenter__(self) -> ServingServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def serve_exports(
    root: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 0, *, token: str | None = None,
    poll: float = DEFAULT_POLL, served: BySpecClass[Any] | None = None, rows: str = DEFAULT_ROWS, **options: Any,
) -> ServingServer:
    """Start aps-serve inside the running event loop over the export root ``root`` and return it
    once it listens (``server.port`` is the bound port). ``served`` and ``rows`` (``"int8"``:
    hash tables' rows held as int8 with a scale a row): as for :class:`ServingServer`.
    ``options``: any :class:`ServerConfig` field (limits, TLS, ``metrics_port``, ...)."""
    config = ServerConfig(host=host, port=port, token=token, exit_when_done=False, trainer_timeout=0.0, **options)
    return await ServingServer(root, config, poll, served, rows).start()
