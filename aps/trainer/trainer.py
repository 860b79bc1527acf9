"""The file-driven trainer: this trainer's share of the files, its epochs and their saves.

``aps.Trainer(model, strategy, cluster).train(files, epochs)`` is the whole program behind
``aps-trainer``; it can equally run inside an existing asyncio application (:meth:`atrain`).
What it trains with (worker processes, client and tables, communicator, monitor, metrics) is a
:class:`~aps.trainer.runtime.TrainerRuntime`, the one :class:`~aps.trainer.StepTrainer` drives too.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from ..cluster import ClusterSpec
from ..errors import ConfigError
from ..telemetry import MetricsEndpoint
from .collector import TrainerProbe, trainer_registry
from .files import FilePart, cut_parts, expand_inputs, share_files, split_files
from .model import Model
from .monitor import terminal
from .online import ONLINE_WORKERS, OnlineOptions, OnlineResult, train_passes
from .options import TrainOptions, check_options, check_trainer
from .pool import WorkerPool, start_fork_server
from .runtime import Prepare, TrainerRuntime
from .sources.base import Source
from .strategy import Strategy

log = structlog.get_logger("aps.trainer")


@dataclass
class TrainResult:
    epochs: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def final_loss(self) -> float | None:
        return self.epochs[-1]["loss"] if self.epochs else None


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
        #: the strategy as given (its ``None`` knobs resolve differently online)
        self._given = strategy.for_model(model)
        strategy = self._given.resolved()
        check_trainer(model, strategy, cluster, trainer_id)
        self.model = model
        self.strategy = strategy
        self.cluster = cluster
        self.trainer_id = trainer_id
        self.options = options or TrainOptions()
        check_options(self.options)
        #: what the metrics collector reads; filled in by :meth:`atrain`
        self.probe = TrainerProbe(trainer_id, workers=self.strategy.workers or 0)
        #: this trainer's Prometheus registry (its own, never the global one). It outlives
        #: :meth:`atrain` with the final numbers, and an application may expose it itself.
        self.registry = trainer_registry(self.probe)
        self._runtime: TrainerRuntime[WorkerPool] | None = None

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
        assert self.strategy.workers is not None
        mine, per_worker = self._share(expand_inputs(files))
        idle = sum(1 for share in per_worker if not share)  # fewer lines, or whole files for a pipe command
        if idle:
            log.warning("some workers have nothing to read and will idle", idle=idle, files=len(mine), workers=self.strategy.workers)
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
        return await self._run(mine, per_worker, epochs)

    def _share(self, found: list[str]) -> tuple[list[str], list[list[str | FilePart]]]:
        """This trainer's files and each worker's inputs. With at least as many files as
        trainers, whole files as Paddle splits them (:func:`split_files`); with fewer, each
        trainer a span of their bytes. A trainer with fewer files than workers gives each worker
        a span of its own (:func:`share_files`); a pipe command reads whole files only."""
        whole = self.options.pipe_command is not None
        trainers, workers = self.cluster.num_trainers, self.strategy.workers
        assert workers is not None
        if whole or len(found) >= trainers:
            mine: list[str | FilePart] = list(split_files(found, self.trainer_id, trainers))
        else:
            mine = list(cut_parts(split_files(found, 0, 1), trainers)[self.trainer_id])
        per_worker = share_files(mine, workers, whole=whole)
        names = list(dict.fromkeys(item.path if isinstance(item, FilePart) else item for item in mine))
        return names, per_worker

    def train_passes(self, source: Source, online: OnlineOptions | None = None) -> OnlineResult:
        """Blocking wrapper around :meth:`atrain_passes` (call it under ``if __name__ == "__main__":``)."""
        return asyncio.run(self.atrain_passes(source, online))

    async def atrain_passes(self, source: Source, online: OnlineOptions | None = None) -> OnlineResult:
        """Online training: score, then train every pass ``source`` hands out, checkpointing
        its position as it goes, until the source has no more (:mod:`aps.trainer.online`)."""
        self.use_online_defaults()
        return await train_passes(lambda prepare: self.runtime(None, prepare), source, online)

    def use_online_defaults(self) -> None:
        """Resolve the strategy for online passes: a strategy that names no worker count gets
        :data:`~aps.trainer.online.ONLINE_WORKERS` instead of the CPU count. :meth:`atrain_passes`
        calls it; call it first where something is sized by the workers before that (a stream
        source's spool files, one a worker)."""
        if self._given.workers is not None or self.strategy.workers == ONLINE_WORKERS:
            return
        strategy = replace(self._given, workers=ONLINE_WORKERS).resolved()
        check_trainer(self.model, strategy, self.cluster, self.trainer_id)
        self.strategy = strategy
        self.probe.workers = ONLINE_WORKERS

    def runtime(
        self, files: list[list[str | FilePart]] | None = None, prepare: Prepare | None = None
    ) -> TrainerRuntime[WorkerPool]:
        """This trainer's runtime with worker processes (not started: ``async with`` it);
        ``files``: each worker's files of every epoch (None: each epoch names its own).
        ``prepare`` runs once the tables exist, before the replica is filled (an online
        trainer's resume loads its checkpoint there). With ``options.metrics_port`` the metrics
        endpoint serves while it runs; :attr:`registry` keeps the final numbers."""
        self._runtime = TrainerRuntime(
            self.model,
            self.strategy,
            self.cluster,
            self.trainer_id,
            self.options,
            self.probe,
            self.registry,
            WorkerPool,
            files=files,
            check_save_dir="save_dir (aps-trainer --save-dir)" if self.trainer_id == 0 else None,  # the one that saves
            line=terminal() if self.options.live_line else None,
            prepare=prepare,
        )
        return self._runtime

    @property
    def metrics(self) -> MetricsEndpoint | None:
        """The metrics endpoint of the last run (served while it runs), or None."""
        return self._runtime.metrics if self._runtime is not None else None

    @property
    def metrics_port(self) -> int | None:
        """The bound port of the metrics endpoint (served while :meth:`atrain` runs), or None."""
        return self.metrics.port if self.metrics is not None else None

    async def _run(self, mine: list[str], per_worker: list[list[str | FilePart]], epochs: int) -> TrainResult:
        result = TrainResult(files=mine)
        async with self.runtime(per_worker) as rt:
            for epoch in range(epochs):
                result.epochs.append(await self._epoch(epoch, rt))
            await rt.finish()
        log.info("trainer finished", trainer=self.trainer_id, epochs=epochs, final_loss=result.final_loss)
        return result

    async def _epoch(self, epoch: int, rt: TrainerRuntime[WorkerPool]) -> dict[str, Any]:
        await rt.train_epoch(epoch)
        extra: dict[str, Any] = rt.mode_fields()
        if self.options.save_dir and self.trainer_id == 0:
            path = os.path.join(self.options.save_dir, f"epoch_{epoch}")  # relative: to the pservers' checkpoint root
            await rt.save(path)
            extra["saved"] = path
        assert rt.monitor is not None
        return rt.monitor.end_epoch(epoch, extra)
