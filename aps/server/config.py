"""Settings of one pserver."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..telemetry import check_metrics_options
from ..validate import count, seconds
from ..wire import DEFAULT_MAX_FRAME, HEADER_SIZE

#: the share of this machine's memory that all tables of one pserver may take by default
TABLES_SHARE_OF_MEMORY = 0.75


def physical_memory() -> int:
    """Bytes of memory this machine has (0 when it cannot be told)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def default_tables_bytes() -> int:
    """``max_tables_bytes`` by default: a share of the machine's memory (0, no limit, when the
    machine does not say how much it has)."""
    return int(physical_memory() * TABLES_SHARE_OF_MEMORY)


#: the duration settings and what 0 means for each (checked by ServerConfig)
SECONDS = {
    "handshake_timeout": "no limit",
    "frame_timeout": "no limit",
    "client_linger": "no limit",
    "trainer_timeout": "no limit",
    "drain_timeout": "do not wait",
    "auth_fail_delay": "no delay",
    "auth_fail_max_delay": "no delay",
    "shrink_every": "never",
}
#: the count settings: what they count, and what 0 means (None: 0 is refused, the least is 1)
COUNTS = {
    "max_connection_bytes": ("bytes", "no limit"),
    "max_inflight_bytes": ("bytes", "no limit"),
    "max_table_bytes": ("bytes", "no limit"),
    "max_tables_bytes": ("bytes", "no limit"),
    "max_handshake_bytes": ("bytes", "no limit"),
    "max_tracking_bytes": ("bytes", "no limit"),
    "max_connections": ("connections", "no limit"),
    "max_connections_per_address": ("connections", "no limit"),
    "max_inflight_per_connection": ("requests", None),
    "auth_fail_concurrent": ("slots", None),
}


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
    #: stop by itself once every trainer has sent worker_done (Paddle's stop_worker) or is gone
    #: (``trainer_timeout``). Off by default, as in :func:`aps.serve`: a server embedded in an
    #: application outlives the trainers that fill it. aps-server (unless
    #: ``--no-exit-when-done``) and fleet's ``run_server`` turn it on: a job's pservers end with it.
    exit_when_done: bool = False
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
    #: SAVE and LOAD paths a client names must resolve (symlinks and ``..`` included) inside this
    #: directory; relative ones are taken from it. None: the working directory at start.
    #: ``init_model`` is the operator's own and is not confined.
    checkpoint_root: str | None = None
    #: where disk tables keep their cold rows (a directory per table, emptied when the table is
    #: made: a checkpoint is the durable copy). None: ``aps-disk/server-<index>`` inside
    #: ``checkpoint_root`` (the working directory without one)
    data_dir: str | None = None
    #: TLS: a PEM certificate (chain) and its private key; both or neither (None: plain TCP)
    tls_cert: str | None = None
    tls_key: str | None = None
    #: every AUTH is checked at once and a right one answered at once; a wrong one is answered
    #: when its slot time ends: each address has auth_fail_concurrent slots, the n-th recent
    #: failure takes auth_fail_delay * 2**(n-1) seconds of one, at most auth_fail_max_delay
    #: (throttle.py; wrong AUTHs beyond its bounds are left to the handshake deadline)
    auth_fail_delay: float = 0.05
    auth_fail_max_delay: float = 1.0
    auth_fail_concurrent: int = 2
    #: limits (docs/operations.md "Limits"; each checked here, against each other and max_frame
    #: by wire/limits.check_limits); 0 turns one off.
    #: seconds a new connection has to finish HELLO (and AUTH) before it is closed
    handshake_timeout: float = 10.0
    #: seconds a frame may take from its first byte to its last before the connection is closed
    frame_timeout: float = 30.0
    #: bytes one connection may have in flight: declared bodies not yet read plus requests still
    #: being served (waiting barriers and sync pushes); a frame over it is refused (TOO_LARGE)
    max_connection_bytes: int = 256 << 20
    #: the same, summed over every connection of this server
    max_inflight_bytes: int = 1 << 30
    #: largest table shard (values + optimizer state) this server creates (BAD_REQUEST beyond)
    max_table_bytes: int = 16 << 30
    #: all table shards of this server together (BAD_REQUEST for the table that would pass it),
    #: hash tables' growth included (new keys past it are rejected, counted in over_budget); by
    #: default a share of the machine's memory (TABLES_SHARE_OF_MEMORY)
    max_tables_bytes: int = field(default_factory=default_tables_bytes)
    #: bytes held by all connections not through their handshake (a budget of their own, so
    #: that they cannot starve the others' max_inflight_bytes); over it a frame is refused
    max_handshake_bytes: int = 16 << 20
    #: seconds after a client's last connection closes before its change tracking and replay
    #: entries are dropped (its barrier arrivals and sync chunks are withdrawn at once)
    client_linger: float = 60.0
    #: bytes of GEO change tracking (one bit per row of a sparse shard for each client that reads
    #: its changes, plus a fixed overhead per client and table) over all clients and tables; over
    #: it, gone clients' tracking is dropped first (the one gone longest first), then the least
    #: recently read; a client whose tracking was dropped gets every row at its next read. 0: none
    max_tracking_bytes: int = 256 << 20
    #: open connections this server accepts (admission.py); one over it is closed at once. 0: no
    #: limit (the CLI also keeps it below the process's file-descriptor limit)
    max_connections: int = 4096
    #: the same, from one client address
    max_connections_per_address: int = 512
    #: this server's own checkpoints (autosave.py): written here every ``checkpoint_every``
    #: seconds (0: not periodically) and once on SIGTERM; the newest ``keep_checkpoints`` kept.
    #: None: none (the default is ``resume`` when that is set). The operator's own directory,
    #: not confined to ``checkpoint_root``.
    checkpoint_dir: str | None = None
    checkpoint_every: float = 0.0
    keep_checkpoints: int = 3
    #: shrink every hash table every this many seconds (PServer.shrinks, periodic.py; the reference's
    #: decay 0.98 and threshold 0.8). 0: only when a client asks
    shrink_every: float = 0.0
    #: start from the newest complete checkpoint of this shard in this directory (a restart);
    #: refuses to start when there is none. Exclusive with ``init_model``.
    resume: str | None = None
    #: a trainer that has had no connection open to this server, or sent nothing (requests or
    #: its client's heartbeats), for this many seconds is gone: barriers and sync rounds waiting
    #: for it fail naming it, and it counts as done for the exit rule. 0: never.
    trainer_timeout: float = 60.0
    #: the v2 launch parameters (aps-server --ports-num / --ports-num-for-sparse): this server
    #: listens on ``ports_num + ports_num_for_sparse`` consecutive ports from ``port``, the first
    #: ``ports_num`` for dense tables and control requests, the rest for sparse tables. Any port
    #: serves any request; the split is how aps clients spread their traffic (docs/protocol.md).
    ports_num: int = 1
    ports_num_for_sparse: int = 0
    #: async mode: a gradient push computed from a version of its table (shard or dense block)
    #: more than ``ratio * num_trainers`` updates old is dropped and counted (the reference's
    #: async_lagged_grad_discard_ratio; its num_gradient_servers is the number of trainers).
    #: 0: never dropped. Sync pushes are never dropped.
    async_lagged_grad_discard_ratio: float = 0.0

    @property
    def num_ports(self) -> int:
        """Every port this server listens on."""
        return self.ports_num + self.ports_num_for_sparse

    @property
    def lag_limit(self) -> float:
        """Updates a gradient's parameters may be behind before it is dropped (inf: never)."""
        ratio = self.async_lagged_grad_discard_ratio
        return ratio * self.num_trainers if ratio > 0 else float("inf")

    @property
    def disk_dir(self) -> Path:
        """Where this server's disk tables keep their cold rows (:attr:`data_dir`, or its default)."""
        if self.data_dir is not None:
            return Path(self.data_dir)
        return Path(self.checkpoint_root or os.getcwd()) / "aps-disk" / f"server-{self.server_index}"

    def __post_init__(self) -> None:
        if not 0 <= self.server_index < self.num_servers:
            raise ConfigError(f"server_index {self.server_index} not in [0, {self.num_servers})")
        if self.num_trainers < 1:
            raise ConfigError(f"num_trainers must be >= 1, got {self.num_trainers}")
        for name, zero in SECONDS.items():
            seconds(name, getattr(self, name), zero)
        for name, (unit, zero) in COUNTS.items():
            count(name, getattr(self, name), unit, zero, least=0 if zero else 1)
        if self.auth_fail_max_delay < self.auth_fail_delay:
            raise ConfigError(
                f"auth_fail_max_delay ({self.auth_fail_max_delay}) must be at least auth_fail_delay ({self.auth_fail_delay})"
            )
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port {self.port} out of range")
        if self.max_frame < 4096 or self.max_frame > 0xFFFFFFFF - HEADER_SIZE:
            raise ConfigError(f"max_frame must be in [4096, 4 GiB), got {self.max_frame}")
        check_metrics_options(self.metrics_port, self.metrics_port_file)
        if self.ports_num < 1 or self.ports_num_for_sparse < 0:
            raise ConfigError(f"ports_num must be >= 1 and ports_num_for_sparse >= 0, got {self.ports_num} and "
                              f"{self.ports_num_for_sparse}")
        if self.port and self.port + self.num_ports > 65536:
            raise ConfigError(f"ports {self.port}..{self.port + self.num_ports - 1} run past 65535")
        ratio = self.async_lagged_grad_discard_ratio
        if not (ratio >= 0 and ratio < float("inf")):
            raise ConfigError(f"async_lagged_grad_discard_ratio must be a number >= 0 (0: off), got {ratio}")
        if self.resume is not None and self.init_model is not None:
            raise ConfigError("resume and init_model exclude each other: resume restarts a shard, init_model starts a new job")
