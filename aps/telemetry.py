"""Prometheus metrics over HTTP: the endpoint, its registry and its settings, served by
prometheus-client. What a pserver and a trainer report is read by their own collectors, each in
the room it reads (aps/server/collector.py, aps/trainer/collector.py); this module knows neither.

Why collectors and not Counter/Histogram objects: aps already counts everything it reports
(``ServerStats`` per op, the workers' shared stat rows, the shared AUC counts, the
communicator's counters). A custom collector reads those numbers when Prometheus scrapes, so the
request path and the workers' kernels do no second bookkeeping and the two views cannot disagree.

Every pserver and every trainer gets its own :class:`~prometheus_client.CollectorRegistry`
(never prometheus-client's global ``REGISTRY``): several servers or trainers may live in one
process (tests, an embedding application) and each must report only itself.

Threading: prometheus-client serves scrapes from its own thread, so collectors run outside the
event loop. They only *read*: plain ints, copies of dicts and lists (atomic under the GIL) and
numpy arrays in shared memory. A scrape may therefore see a request or a batch half-way counted;
the next scrape is consistent again. In exchange a scrape still answers when the event loop is
stuck, which is when one wants the numbers most.
"""

from __future__ import annotations

import asyncio
import os
import threading
from wsgiref.simple_server import WSGIServer

import structlog
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from .errors import ConfigError

log = structlog.get_logger("aps.telemetry")

#: prefix of every metric aps exports (process metrics included: aps_process_resident_memory_bytes)
NAMESPACE = "aps"


def check_metrics_options(port: int | None, port_file: str | None) -> None:
    """Refuse settings that could only be a mistake, at configuration time rather than at start."""
    if port is not None and not 0 <= port < 65536:
        raise ConfigError(f"metrics port {port} out of range")
    if port_file is not None and port is None:
        raise ConfigError("a metrics port file needs a metrics port (--metrics-port)")


def write_port_file(path: str, port: int) -> None:
    """Write ``port`` to ``path`` atomically, so a launcher polling for the file never reads half
    a number (the same protocol as aps-server's --port-file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)


class MetricsEndpoint:
    """``GET /metrics`` for one registry, served by prometheus-client from a daemon thread.

    :meth:`close` stops the thread and frees the port, so a server or trainer that stops leaves
    nothing listening behind it (prometheus-client's own default would live until exit).
    """

    def __init__(self, registry: CollectorRegistry, host: str, port: int, *, role: str, port_file: str | None = None) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self.role = role
        self.port_file = port_file
        self._httpd: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsEndpoint:
        """Bind and serve; with ``port`` 0 the bound port is in :attr:`port` afterwards.

        Binding is quick, so this is safe to call from the event loop."""
        try:
            self._httpd, self._thread = start_http_server(self.port, self.host, registry=self.registry)
        except OSError as exc:
            reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
            raise ConfigError(f"cannot serve metrics on {self.host}:{self.port}: {reason}") from exc
        self.port = int(self._httpd.server_port)
        log.info("metrics endpoint", role=self.role, host=self.host, port=self.port)
        if self.port_file:
            write_port_file(self.port_file, self.port)
        return self

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port (idempotent). Blocks up to half a second, the poll
        interval of the HTTP server's loop: from a coroutine use :meth:`aclose`."""
        httpd, thread = self._httpd, self._thread
        self._httpd = self._thread = None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5.0)

    async def aclose(self) -> None:
        """:meth:`close` in a worker thread, so the event loop keeps serving meanwhile."""
        if self._httpd is not None:
            await asyncio.to_thread(self.close)


def new_registry(collector: Collector) -> CollectorRegistry:
    """A fresh registry with ``collector`` and this process's metrics."""
    registry = CollectorRegistry()
    registry.register(collector)
    # RSS, CPU seconds, open fds of this process, read from /proc at scrape time (Linux)
    ProcessCollector(namespace=NAMESPACE, registry=registry)
    return registry
