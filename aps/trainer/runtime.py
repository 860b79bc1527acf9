"""One trainer's runtime, the same for both trainer kinds.

:class:`TrainerRuntime` owns what a trainer trains with between its start and its end: the
metrics endpoint, the shared arrays, the compute workers, the client and its tables, the
communicator (the mode) and the monitor. :class:`~aps.trainer.Trainer` drives it with worker
processes (:class:`~aps.trainer.pool.WorkerPool`), :class:`~aps.trainer.StepTrainer` with the
caller's thread as its one worker (:class:`~aps.trainer.inprocess.CallerWorker`). Built in one
order, torn down in one order, whether the run ends well or fails:

* start: metrics endpoint (it serves from the start, workers starting up included), shared arrays,
  workers launched (they start while this process connects), tables created, the save dir checked
  against the pservers' roots, ``prepare`` (an online trainer's resume), communicator (fills the
  replica), workers ready, monitor;
* clean end (:meth:`TrainerRuntime.finish`): flush what is pending, stop the communicator, stop
  the workers, tell the pservers this trainer is done;
* teardown (:meth:`TrainerRuntime.aclose`, always): stop the communicator, stop the workers (and
  make sure none is left), close the client, the monitor's files, the shared arrays, and last the
  metrics endpoint (the registry keeps the final numbers).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Protocol, TextIO, TypeVar

import structlog
from prometheus_client import CollectorRegistry

from ..client import PSClient
from ..client.probe import wait_listening
from ..client.roots import check_checkpoint_path
from ..cluster import ClusterSpec
from ..telemetry import MetricsEndpoint
from .collector import TrainerProbe
from .communicator import Communicator
from .files import FilePart
from .ipc import Record
from .model import Model
from .modes import mode_class
from .monitor import Monitor, RecordSink
from .options import TrainOptions
from .pool import WorkerPool
from .shared import STAT, Attached, SharedArrays
from .strategy import Strategy
from .tensorboard import TensorBoardSink
from .worker import WorkerSpec

log = structlog.get_logger("aps.trainer")

T = TypeVar("T")

#: what a worker's record is handed to (the communicator)
OnRecord = Callable[[int, Record], Awaitable[None]]
#: work run once the tables exist, before the replica is filled (an online trainer's resume)
Prepare = Callable[[PSClient], Awaitable[None]]


class Workers(Protocol):
    """Where a runtime's compute workers run: processes, or the caller's thread."""

    def launch(self) -> None:
        """Start the workers in the background (from the running event loop); return at once."""

    async def watch(self, work: Awaitable[T]) -> T:
        """Await ``work``, raising a worker's failure as soon as it happens."""

    async def ready(self) -> None:
        """Wait until every worker can train."""

    def send(self, worker: int, rec: Record) -> None:
        """Hand a record (a reply of the communicator) to ``worker``."""

    async def stop(self, grace: float = 5.0) -> None:
        """Stop every worker (``grace`` seconds to exit by itself) and close their pipes."""

    def kill(self) -> None:
        """Synchronous last resort: no worker may be left running after it."""


W = TypeVar("W", bound=Workers)


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


def make_monitor(
    options: TrainOptions, attached: Attached, trainer_id: int, line: TextIO | None, ps: PSClient, comm: Communicator
) -> Monitor:
    """The trainer's monitor with its records' destinations: the metrics file and TensorBoard;
    its records name the pservers ``ps`` cannot reach and carry ``comm``'s counters that records
    keep (Communicator.report: how geo's caches fare)."""
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
        comm.report,
    )


class TrainerRuntime(Generic[W]):
    """Everything one trainer trains with (see the module); use it as ``async with``.

    ``files``: each worker's files, those it trains every epoch (None: none; each epoch names
    its own). ``make_workers`` builds the workers from their specs and the callback their
    records go to. ``check_save_dir``: check ``options.save_dir`` against the pservers' roots at
    start, naming it so in the error (None: this trainer never saves it, nothing is checked).
    ``line``: where the monitor shows a live line (None: nowhere)."""

    def __init__(
        self,
        model: Model,
        strategy: Strategy,
        cluster: ClusterSpec,
        trainer_id: int,
        options: TrainOptions,
        probe: TrainerProbe,
        registry: CollectorRegistry,
        make_workers: Callable[[list[WorkerSpec], OnRecord], W],
        *,
        files: list[list[str | FilePart]] | None = None,
        check_save_dir: str | None = None,
        line: TextIO | None = None,
        prepare: Prepare | None = None,
    ) -> None:
        assert strategy.workers is not None, "a resolved strategy"
        self.model = model
        self.strategy = strategy
        self.cluster = cluster
        self.trainer_id = trainer_id
        self.options = options
        self.probe = probe
        self.registry = registry
        self.num_workers = strategy.workers
        self.files = files or [[] for _ in range(self.num_workers)]
        self._make_workers = make_workers
        self._check_save_dir = check_save_dir
        self._line = line
        self._prepare = prepare
        self.metrics: MetricsEndpoint | None = None
        self.shared: SharedArrays | None = None
        self.workers: W | None = None
        self.ps: PSClient | None = None
        #: the pservers' checkpoint roots, by address (learned at start with ``check_save_dir``)
        self.roots: dict[str, str | None] = {}
        self.comm: Communicator | None = None
        self.monitor: Monitor | None = None
        #: the trainer's views of the shared arrays (the workers' stats, AUC and scores)
        self.attached: Attached | None = None
        self._workers_stopped = False
        self._closed = False

    # ----------------------------------------------------------------- start

    async def __aenter__(self) -> TrainerRuntime[W]:
        await self.open()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Build everything, in the module's order; on a failure, tear down what was built."""
        try:
            await self._open()
        except BaseException:
            await self.aclose()
            raise

    async def _open(self) -> None:
        self.probe.comm = self.probe.monitor = None  # nothing of a previous run reported as this one's
        options = self.options
        if options.metrics_port is not None:
            self.metrics = MetricsEndpoint(
                self.registry,
                options.metrics_host,
                options.metrics_port,
                role="trainer",
                port_file=options.metrics_port_file,
            ).start()
        kind = mode_class(self.strategy.mode)
        self.model.share_batch(self._sharing_workers() if kind.averages_workers else 1)  # before anything is sized
        cache_rows = kind.cache_rows(self.model, self.strategy, self.cluster.num_servers)
        self.shared = SharedArrays(
            self.model,
            self.num_workers,
            with_mailboxes=kind.mailboxes,
            cache_rows=cache_rows,
            dense_buffers=1 + kind.dense_lag(self.strategy),
        )
        self.ps = ps = open_client(self.strategy, self.cluster, self.trainer_id, options)
        specs = [self._spec(w, kind.local_sgd, kind.prefetch) for w in range(self.num_workers)]
        # the workers start (and load their kernels) while this process connects, creates the
        # tables and fills the replica; they train only once told to, after all of that
        self.workers = workers = self._make_workers(specs, self._on_record)
        started = time.monotonic()
        workers.launch()
        await workers.watch(create_tables(ps, self.model, options.wait_pservers))
        if self._check_save_dir is not None:
            self.roots = await save_roots(ps, options.save_dir, self._check_save_dir)
        if self._prepare is not None:
            await workers.watch(self._prepare(ps))
        self.attached = attached = Attached(self.shared.layout)
        self.probe.stats, self.probe.auc = attached.stats, attached.auc
        self.comm = Communicator(
            ps, self.model, self.strategy, attached, workers.send, self.trainer_id, self.cluster.num_trainers
        )
        self.probe.comm = self.comm
        await workers.watch(self.comm.start())
        await workers.ready()
        log.info("workers ready", workers=self.num_workers, seconds=round(time.monotonic() - started, 2),
                 batch_lines=self.model.lines_per_batch())  # each worker's (Model.share_batch)
        # every process the arrays were made for has mapped them: nothing is left in /dev/shm
        # from here on, even if this process is killed
        self.shared.close()
        self.monitor = make_monitor(options, attached, self.trainer_id, self._line, ps, self.comm)
        self.probe.monitor = self.monitor

    def _sharing_workers(self) -> int:
        """The workers whose gradients make each update: those with files, when the files are
        dealt once for every epoch; else (each epoch or pass names its own) every worker."""
        with_files = sum(1 for files in self.files if files)
        return with_files or self.num_workers

    def _spec(self, w: int, local_sgd: bool, prefetch: bool) -> WorkerSpec:
        assert self.shared is not None
        o = self.options
        return WorkerSpec(
            worker_id=w,
            trainer_id=self.trainer_id,
            num_trainers=self.cluster.num_trainers,
            num_workers=self.num_workers,
            local_sgd=local_sgd,
            files=self.files[w],
            layout=self.shared.layout,
            model=self.model,
            chunk_bytes=o.chunk_bytes,
            queue_chunks=o.queue_chunks,
            pipe_command=o.pipe_command,
            skip_bad_lines=o.skip_bad_lines,
            seed=o.seed,
            prefetch=prefetch and self.strategy.prefetch,
            max_staleness=self.strategy.max_staleness,
        )

    async def _on_record(self, worker: int, rec: Record) -> None:
        assert self.comm is not None
        await self.comm.handle(worker, rec)

    # ----------------------------------------------------------------- epochs

    def mode_fields(self) -> dict[str, Any]:
        """What an epoch record says of how it trained: the mode, and the rounds its dense
        parameters lag behind (docs/modes.md, "Staleness")."""
        return {"mode": self.strategy.mode, "dense_lag": mode_class(self.strategy.mode).dense_lag(self.strategy)}

    def begin_epoch(self, epoch: int) -> None:
        """Every worker trains epoch ``epoch`` (or an online pass) from now on."""
        assert self.comm is not None and self.monitor is not None and self.attached is not None
        self.monitor.start_epoch()
        self.comm.begin_epoch(epoch, set(range(self.num_workers)))
        self.attached.stats[:, STAT["epoch"]] = epoch

    async def finish_epoch(self, epoch: int) -> None:
        """End the epoch as every trainer does: flush, the epoch barrier, take in what the
        other trainers sent before it (:meth:`Communicator.finish_epoch`)."""
        assert self.comm is not None
        await self.comm.finish_epoch(epoch)

    async def train_epoch(self, epoch: int, files: list[list[str]] | None = None) -> None:
        """Have the worker processes train one epoch (``files``: each worker's files of it, else
        those it started with) and end it (:meth:`finish_epoch`); progress records meanwhile."""
        assert self.comm is not None and self.monitor is not None
        assert isinstance(self.workers, WorkerPool), "worker processes train epochs; a caller's loop trains itself"
        self.begin_epoch(epoch)
        run = asyncio.ensure_future(self.workers.run_epoch(epoch, files))
        try:
            while not run.done():
                await asyncio.wait({run}, timeout=self.monitor.due_in())
                self.comm.check()
                if not run.done():
                    self.monitor.tick(epoch)
            run.result()
        finally:
            run.cancel()
        await self.finish_epoch(epoch)

    # ----------------------------------------------------------------- pushes and saves

    async def flush(self) -> None:
        """Hand the pservers what this trainer has not sent yet. Always a round through the
        mode, even with no step trained since the last flush: geo's dense tables send a share
        of ``local - old`` at every exchange (the rest stays local until the next), so a flush
        after the epoch's own still moves the pservers' values."""
        assert self.comm is not None
        await self.comm.flush()

    async def save(self, path: str) -> None:
        """Every pserver writes its shard of every table under ``path``, once this trainer's
        pending pushes reached them."""
        assert self.ps is not None
        await self.flush()
        await self.ps.save(path)

    # ----------------------------------------------------------------- end

    async def finish(self) -> None:
        """The clean end: flush what is pending, stop the communicator and the workers, tell
        the pservers this trainer is done (Paddle's ``stop_worker``). :meth:`aclose` follows."""
        assert self.comm is not None and self.ps is not None
        await self.flush()
        await self.comm.stop()
        await self._stop_workers(grace=5.0)
        await self.ps.worker_done()

    async def _stop_workers(self, grace: float) -> None:
        if self.workers is not None and not self._workers_stopped:
            self._workers_stopped = True
            try:
                await self.workers.stop(grace)
            finally:
                self.workers.kill()

    async def aclose(self) -> None:
        """Release everything in the one order (the module's), after a clean end or a failure;
        the pservers are not told this trainer finished (:meth:`finish` does). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.comm is not None:
                await self.comm.stop()
            # after a failure the workers need no grace: nothing of theirs is left to finish
            await self._stop_workers(grace=0.0)
        finally:
            if self.ps is not None:
                await self.ps.aclose()
            if self.monitor is not None:
                self.monitor.close()
            self.probe.freeze()  # the shared memory goes away; keep the final numbers readable
            if self.shared is not None:
                self.shared.close()
            if self.metrics is not None:
                await self.metrics.aclose()
