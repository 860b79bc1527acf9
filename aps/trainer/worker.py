"""A compute worker process: reads its files, parses them, runs the model's kernel.

In geo mode it trains on the shared replica with local SGD (Hogwild with the other workers) and
never waits for the network. In the other modes each batch asks the trainer for fresh rows and
hands its gradients over through its shared mailbox; the trainer's communicator decides when the
worker may go on (see docs/modes.md).
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from ..errors import ApsError, DataError
from ..specs import SGD
from .ipc import Kind, Record
from .kernels import sgd_rows
from .model import Batch, Grads, Model, Params, WorkerContext
from .procs import child_signals
from .reader import feed_queue
from .shared import STAT, Attached, SharedLayout


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs; pickled once when the process is spawned."""

    worker_id: int
    trainer_id: int
    num_trainers: int
    num_workers: int
    mode: str
    files: list[str]
    layout: SharedLayout
    model: Model
    chunk_bytes: int = 1 << 20
    queue_chunks: int = 4
    pipe_command: str | None = None
    skip_bad_lines: bool = False
    seed: int = 0


class Worker:
    def __init__(self, spec: WorkerSpec, conn: Connection) -> None:
        self.spec = spec
        self.conn = conn
        self.model = spec.model
        self.shared = Attached(spec.layout)
        self.params = Params(
            sparse={t.name: self.shared.params[t.name] for t in self.model.sparse_tables()},
            dense={t.name: self.shared.params[t.name] for t in self.model.dense_tables()},
        )
        self.stats = self.shared.stats[spec.worker_id]
        self.ctx = WorkerContext(
            trainer_id=spec.trainer_id,
            worker_id=spec.worker_id,
            num_trainers=spec.num_trainers,
            num_workers=spec.num_workers,
            rng=np.random.default_rng([spec.seed, spec.trainer_id, spec.worker_id]),
            skip_bad_lines=spec.skip_bad_lines,
        )
        self.geo = spec.mode == "geo"
        if not self.geo:
            w = spec.worker_id
            self.box_ids = self.shared.all_mailbox_ids[w]
            self.box_sparse = self.shared.all_mailbox_sparse[w]
            self.box_dense = self.shared.all_mailbox_dense[w]
        else:
            self.local_sparse = {t.name: np.zeros((0, t.dim), np.float32) for t in self.model.sparse_tables()}
            self.local_dense = {t.name: np.zeros(t.shape, np.float32) for t in self.model.dense_tables()}
        self.step = 0
        self.fused_sgd = type(self.model).local_sgd is not Model.local_sgd
        self._lrs: dict[str, float] | None = None
        self._lrs_step = 0

    # ----------------------------------------------------------------- main loop

    def run(self) -> None:
        self.conn.send_bytes(Record(Kind.READY).encode())
        while True:
            rec = Record.decode(self.conn.recv_bytes())
            if rec.kind == Kind.STOP:
                return
            if rec.kind == Kind.EPOCH:
                steps_before = self.step
                asyncio.run(self._epoch(rec.a))
                self.conn.send_bytes(Record(Kind.EPOCH_DONE, rec.a, self.step - steps_before).encode())

    async def _epoch(self, epoch: int) -> None:
        self.stats[STAT["epoch"]] = epoch
        queue: asyncio.Queue = asyncio.Queue(maxsize=self.spec.queue_chunks)
        producer = asyncio.ensure_future(
            feed_queue(self.spec.files, queue, chunk_bytes=self.spec.chunk_bytes, pipe_command=self.spec.pipe_command)
        )
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                for batch in self.model.batches(item, self.ctx):
                    self._train(batch)
                    if self.step % 16 == 0:
                        await asyncio.sleep(0)  # let the reader refill the queue now and then
                self.stats[STAT["bad_lines"]] = self.ctx.bad_lines
                self.stats[STAT["heartbeat"]] = time.time()
            await producer
        finally:
            producer.cancel()

    # ----------------------------------------------------------------- one batch

    def _train(self, batch: Batch) -> None:
        t0 = time.perf_counter()
        if self.geo:
            loss = self._train_geo(batch)
        else:
            loss = self._train_remote(batch)
        self.step += 1
        s = self.stats
        s[STAT["loss_sum"]] += loss
        s[STAT["examples"]] += batch.examples
        s[STAT["steps"]] += 1
        s[STAT["compute_s"]] += time.perf_counter() - t0

    def _grads_geo(self, batch: Batch) -> Grads:
        grads = Grads()
        for name, ids in batch.sparse_ids.items():
            buf = self.local_sparse[name]
            if buf.shape[0] < len(ids):
                buf = self.local_sparse[name] = np.zeros((max(len(ids), 2 * buf.shape[0]), buf.shape[1]), np.float32)
            view = buf[: len(ids)]
            view.fill(0.0)
            grads.sparse[name] = view
        for name, buf in self.local_dense.items():
            buf.fill(0.0)
            grads.dense[name] = buf
        return grads

    def _geo_lrs(self) -> dict[str, float]:
        """Local SGD learning rate of every table for this step.

        Decay counts this trainer's steps (all its workers), times trainer_num: each trainer
        only sees its own steps, so geo divides decay_steps by trainer_num. The shared step
        count is re-read every 32 steps; between reads the schedule cannot move by more than
        that many steps, far below any sensible decay_steps."""
        if self._lrs is None or self.step - self._lrs_step >= 32:
            trainer_steps = int(self.shared.stats[:, STAT["steps"]].sum())
            lrs = {}
            for spec in self.model.tables():
                opt = spec.optimizer
                assert isinstance(opt, SGD)
                factor = 1.0 if opt.decay is None else opt.decay.factor(trainer_steps * self.spec.num_trainers)
                lrs[spec.name] = opt.lr * factor
            self._lrs, self._lrs_step = lrs, self.step
        return self._lrs

    def _train_geo(self, batch: Batch) -> float:
        lrs = self._geo_lrs()
        if self.fused_sgd:
            loss = self.model.local_sgd(batch, self.params, lrs, self.shared.dirty)
            if loss is None:
                raise ApsError(f"model {self.model.name!r}: local_sgd returned None; return the batch loss")
            return float(loss)
        grads = self._grads_geo(batch)
        loss = self.model.compute(batch, self.params, grads)
        for name, ids in batch.sparse_ids.items():
            sgd_rows(self.params.sparse[name], ids, grads.sparse[name], lrs[name], self.shared.dirty[name])
        for name, g in grads.dense.items():
            self.params.dense[name] -= lrs[name] * g
        return float(loss)

    def _train_remote(self, batch: Batch) -> float:
        counts = []
        for table in self.model.sparse_tables():
            ids = batch.sparse_ids.get(table.name, np.zeros(0, np.int64))
            box = self.box_ids[table.name]
            if len(ids) > len(box):
                raise ApsError(
                    f"batch touches {len(ids)} rows of {table.name!r}, more than the model's max_batch_ids {len(box)}"
                )
            box[: len(ids)] = ids
            counts.append(len(ids))
        self._ask(Record(Kind.PULL, self.step, 0, counts))
        grads = Grads()
        for table, n in zip(self.model.sparse_tables(), counts):
            view = self.box_sparse[table.name][:n]
            view.fill(0.0)
            grads.sparse[table.name] = view
        for name, buf in self.box_dense.items():
            buf.fill(0.0)
            grads.dense[name] = buf
        loss = self.model.compute(batch, self.params, grads)
        self._ask(Record(Kind.GRADS, self.step, batch.examples, counts))
        return float(loss)

    def _ask(self, rec: Record) -> None:
        """Send a request to the trainer and block until it says OK."""
        t0 = time.perf_counter()
        self.conn.send_bytes(rec.encode())
        reply = Record.decode(self.conn.recv_bytes())
        if reply.kind == Kind.STOP:
            raise SystemExit(0)
        if reply.kind != Kind.OK:
            raise ApsError(f"worker expected OK from the trainer, got {reply.kind.name}")
        self.stats[STAT["wait_s"]] += time.perf_counter() - t0


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of a worker process (spawn-safe: a module-level function)."""
    child_signals()
    try:
        Worker(spec, conn).run()
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        os._exit(1)  # the trainer is gone; nothing to report to
    except SystemExit:
        raise
    except BaseException as exc:  # report every failure to the trainer, then exit non-zero
        where = f"worker {spec.worker_id} of trainer {spec.trainer_id}"
        text = f"{where}: {exc}" if isinstance(exc, (DataError, ApsError)) else f"{where}: {traceback.format_exc()}"
        try:
            conn.send_bytes(Record(Kind.ERROR, text=text).encode())
        finally:
            os._exit(1)

