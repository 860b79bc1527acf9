"""What a trainer is made with besides its model, strategy and cluster, and the checks made when
either kind of trainer (:class:`~aps.trainer.Trainer`, :class:`~aps.trainer.StepTrainer`) is made,
so that a setting that could only be a mistake fails before anything starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..cluster import ClusterSpec
from ..errors import ConfigError
from ..telemetry import check_metrics_options
from ..validate import seconds
from .model import Model
from .modes import mode_class
from .strategy import Strategy


@dataclass
class TrainOptions:
    """Settings of a training run that are not about the network."""

    save_dir: str | None = "model"
    #: seconds between progress lines (a live line on a terminal, else the log); <= 0: none
    print_period: float = 10.0
    metrics_path: str | None = None
    #: seconds between progress records (metrics file, TensorBoard); None: automatic, 1% of the
    #: time trained so far, at least 0.25 s and at most ``print_period`` (see monitor.py)
    record_period: float | None = None
    #: write the progress records as TensorBoard scalars into this directory (tensorboardX)
    tensorboard: str | None = None
    chunk_bytes: int = 1 << 20
    queue_chunks: int = 4
    pipe_command: str | None = None
    skip_bad_lines: bool = False
    seed: int = 0
    token: str | None = None
    live_line: bool = True
    #: serve Prometheus metrics over HTTP on this port while the trainer runs (0: a free one);
    #: None: no endpoint
    metrics_port: int | None = None
    #: address of the metrics endpoint: loopback by default, because a trainer usually runs
    #: next to its scraper agent and has no other reason to listen on the network
    metrics_host: str = "127.0.0.1"
    #: write the metrics endpoint's bound port here once it listens (for launchers, with port 0)
    metrics_port_file: str | None = None
    #: TLS to the pservers: None (plain TCP), True (the system's CAs) or an ssl.SSLContext
    ssl: Any = None
    #: seconds to wait at start for every pserver to accept connections (0: they must already)
    wait_pservers: float = 0.0


def check_options(options: TrainOptions) -> None:
    """Options that could only be a mistake, refused when a trainer is made (both kinds)."""
    check_metrics_options(options.metrics_port, options.metrics_port_file)
    seconds("wait_pservers", options.wait_pservers, "do not wait")
    seconds("record_period", options.record_period, None, none="automatic")


def check_trainer(model: Model, strategy: Strategy, cluster: ClusterSpec, trainer_id: int) -> None:
    """What makes a trainer impossible, found before anything starts (both trainer kinds);
    ``strategy`` is best the trainer's resolved one (its workers decide the smallest geo cache;
    an unresolved one is resolved here, for this machine's CPU count)."""
    if not cluster.pservers:
        raise ConfigError("no pservers given: a trainer never trains without its parameter servers")
    if not 0 <= trainer_id < cluster.num_trainers:
        raise ConfigError(f"trainer id {trainer_id} not in [0, {cluster.num_trainers})")
    mode = mode_class(strategy.mode)
    model.check_mode(mode)
    resolved = strategy if strategy.workers is not None else strategy.resolved()
    mode.cache_rows(model, resolved, cluster.num_servers)  # a geo cache too small for the batches in flight
