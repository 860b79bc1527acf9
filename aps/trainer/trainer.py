"""Trainer orchestration: tables, workers, epochs, monitor, saving, and a clean stop.

``aps.Trainer(model, strategy, cluster).train(files, epochs)`` is the whole program behind
``aps-trainer``; it can equally run inside an existing asyncio application (:meth:`atrain`).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Awaitable, Callable
from typing import Any, TextIO, TypeVar

import structlog

from ..client import PSClient
from ..client.probe import wait_listening
from ..client.roots import check_checkpoint_path
from ..cluster import ClusterSpec
from ..errors import ConfigError
from ..telemetry import MetricsEndpoint, check_metrics_options
from ..validate import seconds
from .collector import TrainerProbe, trainer_registry
from .communicator import Communicator
from .files import assign_to_workers, expand_inputs, split_files
from .ipc import Record
from .model import Model
from .modes import mode_class
from .monitor import Monitor, RecordSink, terminal
from .online import OnlineOptions, OnlineResult, train_passes
from .pool import WorkerPool, start_fork_server
from .shared import Attached, SharedArrays
from .sources.base import Source
from .strategy import Strategy
from .tensorboard import TensorBoardSink
from .worker import WorkerSpec

log = structlog.get_logger("aps.trainer")

T = TypeVar("T")


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
    #: serve Prometheus metrics over HTTP on this port while :meth:`Trainer.atrain` runs
    #: (0: a free one); None: no endpoint
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


@dataclass
class Session:
    """What a running trainer trains with: its worker pool, communicator, client and monitor."""

    pool: WorkerPool
    comm: Communicator
    ps: PSClient
    monitor: Monitor
    #: the trainer's views of the shared arrays (the workers' stats, AUC and scores)
    shared: Attached


@dataclass
class TrainResult:
    epochs: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def final_loss(self) -> float | None:
        return self.epochs[-1]["loss"] if self.epochs else None


def check_options(options: TrainOptions) -> None:
    """Options that could only be a mistake, refused when a trainer is made (both kinds)."""
    check_metrics_options(options.metrics_port, options.metrics_port_file)
    seconds("wait_pservers", options.wait_pservers, "do not wait")
    seconds("record_period", options.record_period, None, none="automatic")


def make_monitor(options: TrainOptions, attached: Attached, trainer_id: int, line: TextIO | None, ps: PSClient) -> Monitor:
    """The trainer's monitor with its records' destinations: the metrics file and TensorBoard;
    its records name the pservers ``ps`` cannot reach."""
    sinks: list[RecordSink] = [TensorBoardSink(options.tensorboard)] if options.tensorboard else []
    return Monitor(
        attached.stats,
        options.print_period,
        trainer_id,
        Path(options.metrics_path) if options.metrics_path else None,
        line,
        attached.auc,
        options.record_period,
        sinks,
        attached.staleness,
        ps.unreachable,
    )


def check_trainer(model: Model, strategy: Strategy, cluster: ClusterSpec, trainer_id: int) -> None:
    """What makes a trainer impossible, found before anything starts (both trainer kinds)."""
    if not cluster.pservers:
        raise ConfigError("no pservers given: a trainer never trains without its parameter servers")
    if not 0 <= trainer_id < cluster.num_trainers:
        raise ConfigError(f"trainer id {trainer_id} not in [0, {cluster.num_trainers})")
    model.check_mode(mode_class(strategy.mode))


def open_client(strategy: Strategy, cluster: ClusterSpec, trainer_id: int, options: TrainOptions) -> PSClient:
    """The trainer's one PSClient, with the strategy's timeout and retries (not yet opened)."""
    return PSClient(
        cluster.pservers,
        token=options.token,
        timeout=strategy.rpc_timeout,
        retries=strategy.rpc_retry_times,
        deadline=strategy.rpc_deadline,
        trainer_id=trainer_id,
        ssl=options.ssl,
        ports_num=cluster.ports_num,
        ports_num_for_sparse=cluster.ports_num_for_sparse,
    )


async def create_tables(ps: PSClient, model: Model, wait: float = 0.0) -> None:
    """Open the connections (waiting up to ``wait`` seconds for pservers that do not listen
    yet) and create every table of the model (idempotent on the pservers)."""
    if wait:
        await wait_listening(ps.addresses, wait)
    await ps.open()
    for spec in model.tables():
        await ps.create_table(spec)


async def save_roots(ps: PSClient, save_dir: str | None, what: str) -> dict[str, str | None]:
    """The pservers' checkpoint roots, learned once connected. A ``save_dir`` outside them is
    refused now (ConfigError, naming the root and ``what`` the path came from): the pservers
    would refuse it only at the first save, after a whole epoch of training."""
    roots = await ps.checkpoint_roots()
    if save_dir:
        check_checkpoint_path(save_dir, roots, what)
    return roots


class Trainer:
    """One trainer of a cluster: ``trainer_id`` of ``cluster.num_trainers``."""

    def __init__(
        self,
        model: Model,
        strategy: Strategy,
        cluster: ClusterSpec,
        trainer_id: int = 0,
        options: TrainOptions | None = None,
    ) -> None:
        strategy = strategy.for_model(model)
        check_trainer(model, strategy, cluster, trainer_id)
        self.model = model
        self.strategy = strategy.resolved()
        self.cluster = cluster
        self.trainer_id = trainer_id
        self.options = options or TrainOptions()
        check_options(self.options)
        #: what the metrics collector reads; filled in by :meth:`atrain`
        self.probe = TrainerProbe(trainer_id, workers=self.strategy.workers or 0)
        #: this trainer's Prometheus registry (its own, never the global one). It outlives
        #: :meth:`atrain` with the final numbers, and an application may expose it itself.
        self.registry = trainer_registry(self.probe)
        self.metrics: MetricsEndpoint | None = None

    def train(self, files: list[str], epochs: int = 1) -> TrainResult:
        """Blocking wrapper around :meth:`atrain` (runs its own event loop).

        Workers are forked by multiprocessing's fork server, which imports the main module:
        call this under ``if __name__ == "__main__":`` in a script."""
        return asyncio.run(self.atrain(files, epochs))

    async def atrain(self, files: list[str], epochs: int = 1) -> TrainResult:
        """Train ``epochs`` passes over this trainer's share of ``files``.

        With ``options.metrics_port`` the metrics endpoint serves from the start (workers
        starting up included) until this returns; :attr:`registry` keeps the final numbers."""
        if epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {epochs}")
        self.model.begin_run(epochs)  # before the model is sent to any worker
        start_fork_server(type(self.model).__module__)  # imports in the background from now on
        mine = split_files(expand_inputs(files), self.trainer_id, self.cluster.num_trainers)
        assert self.strategy.workers is not None
        per_worker = assign_to_workers(mine, self.strategy.workers)
        if len(mine) < self.strategy.workers:
            log.warning(
                "fewer files than workers: some workers will idle", files=len(mine), workers=self.strategy.workers
            )
        if not mine:
            log.warning("this trainer got no files", trainer=self.trainer_id)
        log.info(
            "trainer starting",
            trainer=self.trainer_id,
            trainers=self.cluster.num_trainers,
            pservers=",".join(self.cluster.pservers),
            mode=self.strategy.mode,
            workers=self.strategy.workers,
            files=len(mine),
            **self.model.describe(),
        )
        return await self.with_metrics(self._run(mine, per_worker, epochs))

    def train_passes(self, source: Source, online: OnlineOptions | None = None) -> OnlineResult:
        """Blocking wrapper around :meth:`atrain_passes` (call it under ``if __name__ == "__main__":``)."""
        return asyncio.run(self.atrain_passes(source, online))

    async def atrain_passes(self, source: Source, online: OnlineOptions | None = None) -> OnlineResult:
        """Online training: score, then train every pass ``source`` hands out, checkpointing
        its position as it goes, until the source has no more (:mod:`aps.trainer.online`)."""
        return await train_passes(self, source, online)

    async def with_metrics(self, work: Awaitable[T]) -> T:
        """Await ``work`` while the metrics endpoint serves (with ``options.metrics_port``)."""
        if self.options.metrics_port is not None:
            self.metrics = MetricsEndpoint(
                self.registry,
                self.options.metrics_host,
                self.options.metrics_port,
                role="trainer",
                port_file=self.options.metrics_port_file,
            ).start()
        try:
            return await work
        finally:
            if self.metrics is not None:
                await self.metrics.aclose()

    @property
    def metrics_port(self) -> int | None:
        """The bound port of the metrics endpoint (served while :meth:`atrain` runs), or None."""
        return self.metrics.port if self.metrics is not None else None

    async def _run(self, mine: list[str], per_worker: list[list[str]], epochs: int) -> TrainResult:
        result = TrainResult(files=mine)

        async def body(s: Session) -> None:
            for epoch in range(epochs):
                result.epochs.append(await self._epoch(epoch, s))

        await self.session(per_worker, body)
        log.info("trainer finished", trainer=self.trainer_id, epochs=epochs, final_loss=result.final_loss)
        return result

    async def session(
        self,
        per_worker: list[list[str]],
        body: Callable[[Session], Awaitable[None]],
        prepare: Callable[[PSClient], Awaitable[None]] | None = None,
    ) -> None:
        """Start the workers, connect, create the tables, run ``body`` (the epochs, or an online
        trainer's passes), then stop everything; ``per_worker``: the files each worker was
        started with. ``prepare`` runs once the tables exist, before the replica is filled (an
        online trainer's resume loads its checkpoint there)."""
        assert self.strategy.workers is not None
        self.probe.comm = self.probe.monitor = None  # nothing of a previous run reported as this one's
        kind = mode_class(self.strategy.mode)
        shared = SharedArrays(self.model, self.strategy.workers, with_mailboxes=kind.mailboxes)
        pool: WorkerPool | None = None
        monitor: Monitor | None = None
        ps = open_client(self.strategy, self.cluster, self.trainer_id, self.options)
        try:
            specs = [
                WorkerSpec(
                    worker_id=w,
                    trainer_id=self.trainer_id,
                    num_trainers=self.cluster.num_trainers,
                    num_workers=self.strategy.workers,
                    local_sgd=kind.local_sgd,
                    files=per_worker[w],
                    layout=shared.layout,
                    model=self.model,
                    chunk_bytes=self.options.chunk_bytes,
                    queue_chunks=self.options.queue_chunks,
                    pipe_command=self.options.pipe_command,
                    skip_bad_lines=self.options.skip_bad_lines,
                    seed=self.options.seed,
                    prefetch=kind.prefetch and self.strategy.prefetch,
                    max_staleness=self.strategy.max_staleness,
                )
                for w in range(self.strategy.workers)
            ]
            comm: Communicator | None = None

            async def on_record(w: int, rec: Record) -> None:
                assert comm is not None
                await comm.handle(w, rec)

            # the workers start (and load their kernels) while this process connects, creates the
            # tables and fills the replica; they train only once told to, after all of that
            pool = WorkerPool(specs, on_record)
            started = time.monotonic()
            pool.launch()
            await pool.watch(create_tables(ps, self.model, self.options.wait_pservers))
            if self.trainer_id == 0:  # the one that saves
                await save_roots(ps, self.options.save_dir, "save_dir (aps-trainer --save-dir)")
            if prepare is not None:
                await pool.watch(prepare(ps))
            attached = Attached(shared.layout)
            self.probe.stats, self.probe.auc = attached.stats, attached.auc
            comm = Communicator(
                ps, self.model, self.strategy, attached, pool.send, self.trainer_id, self.cluster.num_trainers
            )
            self.probe.comm = comm
            await pool.watch(comm.start())
            await pool.ready()
            log.info("workers ready", workers=len(pool), seconds=round(time.monotonic() - started, 2))
            monitor = make_monitor(self.options, attached, self.trainer_id, terminal() if self.options.live_line else None, ps)
            self.probe.monitor = monitor
            await body(Session(pool, comm, ps, monitor, attached))
            await pool.stop()
            await comm.stop()
            await ps.worker_done()
        finally:
            if pool is not None:
                pool.kill()
            if monitor is not None:
                monitor.close()
            await ps.aclose()
            self.probe.freeze()  # the shared memory goes away; keep the final numbers readable
            shared.close()

    async def train_epoch(self, epoch: int, s: Session, files: list[list[str]] | None = None) -> None:
        """Train one epoch (``files``: each worker's files of it, else those it started with)
        and end it as every trainer does (flush, epoch barrier); progress records meanwhile."""
        s.monitor.start_epoch()
        s.comm.begin_epoch(epoch, set(range(len(s.pool))))
        run = asyncio.ensure_future(s.pool.run_epoch(epoch, files))
        try:
            while not run.done():
                await asyncio.wait({run}, timeout=s.monitor.due_in())
                s.comm.check()
                if not run.done():
                    s.monitor.tick(epoch)
            run.result()
        finally:
            run.cancel()
        await s.comm.finish_epoch(epoch)

    async def _epoch(self, epoch: int, s: Session) -> dict[str, Any]:
        await self.train_epoch(epoch, s)
        extra: dict[str, Any] = {"mode": self.strategy.mode}
        if self.options.save_dir and self.trainer_id == 0:
            path = os.path.join(self.options.save_dir, f"epoch_{epoch}")  # relative: to the pservers' checkpoint root
            await s.ps.save(path)
            extra["saved"] = path
        return s.monitor.end_epoch(epoch, extra)
