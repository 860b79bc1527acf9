"""Settings of one pserver."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..telemetry import check_metrics_options
from ..wire import DEFAULT_MAX_FRAME, HEADER_SIZE


@dataclass(frozen=True)
class ServerConfig:
    """Everything a pserver needs to know about itself and its cluster.

    ``server_index`` / ``num_servers`` fix which shard of every table this server owns;
    ``num_trainers`` is what barriers, sync rounds and the stop-after-all-workers-done rule count.
    """

    host: str = "127.0.0.1"
    port: int = 0
    server_index: int = 0
    num_servers: int = 1
    num_trainers: int = 1
    token: str | None = None
    max_frame: int = DEFAULT_MAX_FRAME
    init_model: str | None = None
    #: exit once every trainer has sent worker_done (Paddle's stop_worker)
    exit_when_done: bool = True
    #: how many recent mutating request ids are remembered per client, to drop replays
    dedup_window: int = 4096
    #: requests a single connection may have executing at once before we stop reading from it
    max_inflight_per_connection: int = 256
    #: seconds that a graceful shutdown waits for in-flight requests
    drain_timeout: float = 10.0
    #: serve Prometheus metrics over HTTP on this port (0: a free one); None: no endpoint
    metrics_port: int | None = None
    #: address of the metrics endpoint; None: the same as ``host``, so it is reachable exactly
    #: where the pserver is
    metrics_host: str | None = None
    #: write the metrics endpoint's bound port here once it listens (for launchers, with port 0)
    metrics_port_file: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.server_index < self.num_servers:
            raise ConfigError(f"server_index {self.server_index} not in [0, {self.num_servers})")
        if self.num_trainers < 1:
            raise ConfigError(f"num_trainers must be >= 1, got {self.num_trainers}")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port {self.port} out of range")
        if self.max_frame < 4096 or self.max_frame > 0xFFFFFFFF - HEADER_SIZE:
            raise ConfigError(f"max_frame must be in [4096, 4 GiB), got {self.max_frame}")
        check_metrics_options(self.metrics_port, self.metrics_port_file)
