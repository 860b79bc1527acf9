"""Step-wise training: the batches come from the caller's own Python loop, one step at a time.

``aps-trainer`` reads files in worker processes; a user who ports a Paddle script has a loop of
their own (``for batch in reader(): loss = exe.run(...)``) and wants the loss of every step back.
:class:`StepTrainer` serves that loop with the same runtime ``aps-trainer`` uses
(:class:`~aps.trainer.runtime.TrainerRuntime`: built, ended and torn down in the same order),
arranged so:

* **the caller's thread** is this trainer's one compute worker
  (:class:`~aps.trainer.inprocess.CallerWorker`): :meth:`StepTrainer.step` runs the same
  :meth:`Worker.step <aps.trainer.worker.Worker.step>` a worker process runs (the model's
  ``compute`` on the shared replica; local SGD in geo mode) and returns the batch's loss;
* **a background thread of the same process** runs an asyncio loop with the runtime: the same
  :class:`~aps.trainer.communicator.Communicator` (the mode, the merging, pulls and pushes, the
  geo exchange every ``k_steps``) and the same :class:`~aps.trainer.monitor.Monitor` (metrics
  records, AUC). The two talk over a pipe with the worker protocol, bulk data through the shared
  arrays, exactly as a trainer and its worker processes do;
* **no worker processes** are started: a step-wise trainer computes one batch at a time, in the
  caller's thread. To train from files in many processes, use :class:`~aps.trainer.Trainer`.

A failure in the communicator (a pserver gone, a timeout) ends the step that waits on it with that
error; the pservers are told this trainer is done only by :meth:`StepTrainer.stop`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import structlog

from ..client.roots import check_checkpoint_path
from ..cluster import ClusterSpec
from ..errors import ApsError, ConfigError
from ..metrics import merged_auc
from .collector import TrainerProbe, trainer_registry
from .inprocess import CallerWorker
from .ipc import Kind, Record
from .model import Batch, Model
from .modes import mode_class
from .online import check_checkpointing, resume_position, save_pass
from .options import TrainOptions, check_options, check_trainer
from .reader import Chunk
from .runtime import TrainerRuntime
from .sources.base import Pass, Source
from .strategy import Strategy
from .worker import Worker

log = structlog.get_logger("aps.trainer")

T = TypeVar("T")

#: how often the background loop looks for a communicator failure the caller is waiting on
_WATCH_PERIOD = 0.1


class StepTrainer:
    """One trainer of a cluster whose batches come from the caller (``fleet.init_worker``).

    ``start()`` connects, creates the tables and fills the replica; then call :meth:`step` per
    batch, :meth:`end_epoch` at the end of each pass (every trainer the same number of times),
    :meth:`save` on one trainer, and :meth:`stop` once at the end. Use it from one thread.
    """

    def __init__(
        self,
        model: Model,
        strategy: Strategy,
        cluster: ClusterSpec,
        trainer_id: int = 0,
        options: TrainOptions | None = None,
    ) -> None:
        if strategy.workers not in (None, 1):
            raise ConfigError(
                f"step-wise training computes in the calling thread, as one worker; got workers={strategy.workers} "
                "(to train from files with several worker processes use aps.Trainer / aps-trainer)"
            )
        strategy = replace(strategy.for_model(model), workers=1).resolved()
        check_trainer(model, strategy, cluster, trainer_id)
        self.model = model
        self.strategy = strategy
        self.cluster = cluster
        self.trainer_id = trainer_id
        self.options = options or TrainOptions(save_dir=None)
        check_options(self.options)
        self.probe = TrainerProbe(trainer_id, workers=1)
        self.registry = trainer_registry(self.probe)
        self.epoch = 0
        self.records: list[dict[str, Any]] = []  #: one "epoch" record per finished epoch
        #: the pass checkpoint the last :meth:`passes` resumed from, if any
        self.resumed_from: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runtime: TrainerRuntime[CallerWorker] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._barriers = 0
        self._epoch_first_step = 0
        self._stopped = False

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> StepTrainer:
        """Connect to the pservers, create the tables, fill the local replica (blocking)."""
        if self._loop is not None:
            raise ApsError("StepTrainer.start() called twice")
        log.info(
            "step-wise trainer starting",
            trainer=self.trainer_id,
            trainers=self.cluster.num_trainers,
            pservers=",".join(self.cluster.pservers),
            mode=self.strategy.mode,
            **self.model.describe(),
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="aps-communicator", daemon=True)
        self._thread.start()
        self._runtime = TrainerRuntime(
            self.model, self.strategy, self.cluster, self.trainer_id, self.options, self.probe, self.registry,
            CallerWorker, check_save_dir="save_dir",  # the user's loop owns the terminal: no live line
        )
        try:
            self._call(self._open())
        except BaseException:
            self.close()
            raise
        return self

    async def _open(self) -> None:
        assert self._runtime is not None
        await self._runtime.open()
        self._watch = asyncio.ensure_future(self._watchdog())
        self._begin_epoch()

    def _begin_epoch(self) -> None:
        assert self._runtime is not None
        self._runtime.begin_epoch(self.epoch)
        self._epoch_first_step = self.steps

    def stop(self) -> dict[str, Any]:
        """End the last epoch (as :meth:`end_epoch`, unless it just ended), tell the pservers this trainer is done
        (Paddle's ``stop_worker``) and release everything; returns the last epoch's record."""
        if self._stopped:
            raise ApsError("StepTrainer.stop() called twice")
        self._check()
        try:
            # after end_epoch and no step since, the last epoch is already finished (on every
            # trainer, since each calls end_epoch as often): no empty epoch is added
            if self.epoch == 0 or self.steps > self._epoch_first_step:
                self._call(self._finish_epoch(begin_next=False))
            assert self._runtime is not None
            self._call(self._runtime.finish())
            record = self.records[-1]
            log.info("trainer finished", trainer=self.trainer_id, epochs=len(self.records), final_loss=record["loss"])
            return record
        finally:
            self.close()

    def close(self) -> None:
        """Release the connections, the background thread and the shared memory without telling
        the pservers this trainer finished (after a failure; :meth:`stop` calls it too)."""
        self._stopped = True
        loop = self._loop
        if loop is not None and self._thread is not None and self._thread.is_alive():
            try:
                self._call(self._release(), timeout=30.0)
            finally:
                loop.call_soon_threadsafe(loop.stop)
                self._thread.join(10.0)
        if loop is not None and not loop.is_running():
            loop.close()

    async def _release(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._runtime is not None:
            await self._runtime.aclose()
    def __enter__(self) -> StepTrainer:
        return self if self._loop is not None else self.start()

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if self._stopped:
            return
        if kind is None:
            self.stop()
        else:
            self.close()

    # ----------------------------------------------------------------- the user's loop

    def batches(self, lines: Iterable[str | bytes], source: str = "<lines>") -> Iterator[Batch]:
        """The model's batches of ``lines`` (the user's reader), parsed by the model's own
        ``batches`` in chunks of about ``options.chunk_bytes``; a bad line raises DataError
        naming ``source`` and its 1-based number."""
        worker = self._running()
        pending: list[bytes] = []
        size, first = 0, 1
        for line in lines:
            raw = line.encode("utf-8") if isinstance(line, str) else bytes(line)
            if not raw.endswith(b"\n"):
                raw += b"\n"
            pending.append(raw)
            size += len(raw)
            if size >= self.options.chunk_bytes:
                yield from self.model.batches(Chunk(source, first, b"".join(pending), len(pending)), worker.ctx)
                first += len(pending)
                pending, size = [], 0
        if pending:
            yield from self.model.batches(Chunk(source, first, b"".join(pending), len(pending)), worker.ctx)

    def step(self, batch: Batch) -> float:
        """Train on one batch in the strategy's mode; returns its mean loss per example (the
        summed loss the model's ``compute`` returns, divided by ``batch.examples``)."""
        worker = self._running()
        loss = self._in_worker(lambda: worker.step(batch, None))
        return loss / batch.examples if batch.examples else loss

    def predict(self, batch: Batch) -> tuple[np.ndarray, np.ndarray] | None:
        """The model's predictions of ``batch`` (probabilities, labels) with the current
        parameters, pulled fresh as a step pulls them; nothing is pushed or counted. None for a
        model that does not predict. Predicting a pass before training on it gives the online
        AUC (an :class:`~aps.metrics.Auc` over the pass), as aps-trainer's passes report it. The
        model's ``compute`` may change the batch: train on batches parsed anew."""
        worker = self._running()
        self._in_worker(lambda: worker.score(batch))
        return self.model.predictions(batch)

    def end_epoch(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """End this pass over the data: flush, meet every other trainer at the epoch barrier (sync
        mode: keep joining rounds until all have run out), write the epoch's metrics record (with
        ``extra`` added) and begin the next epoch. Every trainer must call it the same number of times."""
        self._running()
        self._check()
        return self._call(self._finish_epoch(begin_next=True, extra=extra))

    async def _finish_epoch(self, begin_next: bool, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        rt = self._started()
        assert rt.comm is not None and rt.monitor is not None
        await rt.comm.handle(0, Record(Kind.EPOCH_DONE, epoch=self.epoch))  # the caller's worker is done with it
        await rt.finish_epoch(self.epoch)
        record = rt.monitor.end_epoch(self.epoch, {**rt.mode_fields(), **(extra or {})})
        self.records.append(record)
        if begin_next:
            self.epoch += 1
            self._begin_epoch()
        return record

    def save(self, path: str) -> None:
        """Every pserver writes its shard of every table under ``path`` (relative paths: to the
        pservers' checkpoint root), after this trainer's pending pushes reached them. Call it on
        one trainer (``fleet.is_first_worker()``). A path outside the root is a ConfigError here,
        before anything is sent; ``TrainOptions.save_dir`` has it checked at :meth:`start`."""
        self._running()
        self._check()
        rt = self._started()
        check_checkpoint_path(path, rt.roots, "save path")
        self._call(rt.save(path))

    def passes(
        self, source: Source, *, save_dir: str | None = None, save_every: int = 1, resume: bool = False, keep_passes: int = 3
    ) -> Iterator[Pass]:
        """Online training in the caller's loop: the passes of ``source`` (a
        :class:`~aps.trainer.sources.PassDir` or :class:`~aps.trainer.sources.RedisStream` made
        for this trainer), in order, each once::

            for p in worker.passes(source, resume=True):
                for batch in my_batches(worker, p.files):  # this trainer's share of the pass
                    worker.step(batch)

        A pass is finished when the loop asks for the next one: the epoch ends (its record
        names the pass), and every ``save_every`` passes trainer 0 saves
        ``SAVE_DIR/pass-<seq>`` (``save_dir``, else ``options.save_dir``; none: no checkpoints)
        with the source's position, as ``aps-trainer --data-passes`` does; the trainers meet at a
        barrier and only then is the source told (a stream acknowledges the entries the
        checkpoint covers). Leaving the loop early (break, an
        error) finishes nothing: that pass is trained again after a restart. ``resume`` first
        loads the newest complete pass checkpoint in ``save_dir`` and continues after its
        position. Every trainer runs the same loop. For the online AUC, :meth:`predict` a pass's
        batches before training on them."""
        save_dir = save_dir or self.options.save_dir
        check_checkpointing(save_every, keep_passes, resume, save_dir)
        if resume and mode_class(self.strategy.mode).local_sgd:
            # geo filled its replica (and the baseline of its deltas) at start(), before the load
            raise ConfigError("resuming passes in geo mode is not supported by the step-wise trainer; use aps-trainer --resume")
        self._running()
        if save_dir:
            check_checkpoint_path(save_dir, self._started().roots, "pass save dir")
        return self._passes(source, save_dir, save_every, resume, keep_passes)

    def _passes(self, source: Source, save_dir: str | None, save_every: int, resume: bool, keep: int) -> Iterator[Pass]:
        ps, timeout = self._started().ps, self.strategy.rpc_timeout
        assert ps is not None
        position = None
        if resume:
            assert save_dir is not None
            self.resumed_from, position = self._call(resume_position(ps, save_dir, self.trainer_id, timeout))
        self._call(source.open(position))
        try:
            done = 0
            while (p := self._call(source.next_pass())) is not None:
                yield p  # the caller trains the pass; coming back for the next one finishes it
                self.end_epoch({"pass": p.name, "seq": p.seq, "files": len(p.files)})
                done += 1
                if not (save_every and save_dir and done % save_every == 0):
                    continue
                if self.trainer_id == 0:
                    self.records[-1]["saved"] = self._call(save_pass(ps, save_dir, source, p, keep))
                # every trainer waits for the save: none pushes the next pass into it
                self._call(ps.barrier(f"aps.online.saved.{p.seq}", timeout=timeout))
                self._call(source.committed(p))
            log.info("online passes stopped", trainer=self.trainer_id, reason=source.stop_reason, passes=done)
        finally:
            if self._loop is not None and self._loop.is_running():
                self._call(source.aclose())

    def barrier(self) -> None:
        """Wait until every trainer reached the same barrier (Paddle's ``barrier_worker``)."""
        self._running()
        self._check()
        self._barriers += 1
        name = f"aps.fleet.barrier.{self._barriers}"
        ps = self._started().ps
        assert ps is not None
        self._call(ps.barrier(name, timeout=self.strategy.rpc_timeout))

    def auc(self) -> float | None:
        """AUC of every prediction this trainer made so far (None for a model that does not
        predict, or before its first step): the reference's ``auc_var``."""
        states = self.probe.auc
        if states is None or not states[:, 0].any():
            return None
        return merged_auc(states)[0]

    @property
    def steps(self) -> int:
        """Steps this trainer has trained since it started."""
        host = self._runtime.workers if self._runtime is not None else None
        return host.worker.steps if host is not None and host.worker is not None else 0

    @property
    def failure(self) -> BaseException | None:
        """The communicator's failure that ends every step from now on, if any."""
        host = self._runtime.workers if self._runtime is not None else None
        return host.failure if host is not None else None

    # ----------------------------------------------------------------- plumbing

    def _started(self) -> TrainerRuntime[CallerWorker]:
        if self._runtime is None or self._runtime.comm is None:
            raise ApsError("the step-wise trainer is not started: call start() (fleet.init_worker) first")
        return self._runtime

    def _running(self) -> Worker:
        rt = self._started()
        if self._stopped:
            raise ApsError("the step-wise trainer is stopped")
        assert rt.workers is not None and rt.workers.worker is not None
        return rt.workers.worker

    def _call(self, work: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``work`` on the communicator's loop and wait for its result in this thread."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout)

    def _in_worker(self, work: Callable[[], T]) -> T:
        """Run ``work`` (the worker's code, which waits on the communicator) in this thread; a
        communicator failure it ran into is raised as itself."""
        self._check()
        try:
            result = work()
        except ApsError as exc:
            if self.failure is not None:
                raise self.failure from exc
            raise
        self._check()
        return result

    def _check(self) -> None:
        rt = self._runtime
        if rt is not None and rt.workers is not None and rt.comm is not None and rt.comm.failure is not None:
            rt.workers.fail(rt.comm.failure)  # kept only if it is the first
        if self.failure is not None:
            raise self.failure

    async def _watchdog(self) -> None:
        """Fail the waiting step when a background task of the communicator failed, and write
        progress records and lines when due (as aps-trainer does)."""
        rt = self._started()
        assert rt.comm is not None and rt.monitor is not None and rt.workers is not None
        while True:
            await asyncio.sleep(_WATCH_PERIOD)
            if rt.comm.failure is not None:
                rt.workers.fail(rt.comm.failure)
                return
            rt.monitor.tick(self.epoch)  # writes or shows only what is due
