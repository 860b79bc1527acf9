"""A compute worker process: reads its files, parses them, runs the model's kernel.

With ``local_sgd`` (geo mode) it trains on the shared replica with local SGD (Hogwild with the
other workers) and never waits for the network, except for the rows of a hash table: its replica
is a cache whose rows the trainer assigns, so the worker publishes a batch's keys and asks for
their rows (PULL), for the next batch while the current one computes
(:mod:`aps.trainer.modes.geo_hash`); the step that brings the trainer's step count to its
next exchange also tells the trainer so (a STEPS record, no reply awaited), which is what wakes
the exchange. Otherwise each batch asks the trainer for fresh
rows and hands its gradients over through its shared mailbox; the trainer's mode decides when the
worker may go on (see docs/modes.md). With ``prefetch`` (async mode) the worker does not idle on
that round trip: it publishes the *next* batch's ids (in the other half of its double-buffered id
mailbox) before computing the current one, so the rows arrive while it computes.

BLAS is pinned to one thread per worker (threadpoolctl, at process start): ``--workers N`` then
means N busy cores, and numpy's matrix products never oversubscribe them.
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from threadpoolctl import threadpool_limits

from ..errors import ApsError, DataError
from ..metrics import Auc
from ..specs import SGD
from .files import FilePart
from .ipc import Kind, Record
from .kernels import add_changes, add_counts, gather_rows, sgd_rows
from .model import Batch, Grads, Model, Params, WorkerContext
from .procs import child_signals
from .reader import feed_queue, iter_queue
from .shared import CLOCK_EXCHANGE_AT, CLOCK_MERGED, STALE_BUCKETS, STAT, Attached, SharedLayout, slot_base


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs; pickled once, when the process is started."""

    worker_id: int
    trainer_id: int
    num_trainers: int
    num_workers: int
    #: train with SGD on the replica and keep the gradients (geo), instead of handing them over
    local_sgd: bool
    files: list[str | FilePart]
    layout: SharedLayout
    model: Model
    chunk_bytes: int = 1 << 20
    queue_chunks: int = 4
    pipe_command: str | None = None
    skip_bad_lines: bool = False
    seed: int = 0
    #: ask for the next batch's rows while this one computes (async mode)
    prefetch: bool = False
    #: compute only with sparse rows at most this many of the trainer's batches old (None: any)
    max_staleness: int | None = None


class Worker:
    """One compute worker: a worker process's whole life (:meth:`run`), or the caller's thread
    of a step-wise trainer, which drives :meth:`step` and :meth:`score` itself."""

    def __init__(self, spec: WorkerSpec, conn: Connection) -> None:
        self.spec = spec
        self.conn = conn
        self.model = spec.model
        self.shared = Attached(spec.layout)
        #: the dense tables' parameter buffers (two where the mode lags its dense rounds); each
        #: step computes with the one the trainer's reply to the previous step named
        self.dense_buffers = self.shared.dense_buffers([t.name for t in self.model.dense_tables()])
        self.params = Params(
            sparse={t.name: self.shared.params[t.name] for t in self.model.sparse_tables()},
            dense=dict(self.dense_buffers[0]),
        )
        #: hash tables by name, with their max_batch_ids: their replica is a slot area per worker
        #: and mailbox half, and the model sees the area of the batch it computes (slot_base)
        self.hashed = {t.name: self.model.max_batch_ids(t.name) for t in self.model.sparse_tables() if t.keyed}
        self.stats = self.shared.stats[spec.worker_id]
        self.stale_steps = self.shared.staleness[spec.worker_id]
        self.ctx = WorkerContext(
            trainer_id=spec.trainer_id,
            worker_id=spec.worker_id,
            num_trainers=spec.num_trainers,
            num_workers=spec.num_workers,
            rng=np.random.default_rng([spec.seed, spec.trainer_id, spec.worker_id]),
            skip_bad_lines=spec.skip_bad_lines,
            local_sgd=spec.local_sgd,
        )
        self.local_sgd = spec.local_sgd
        self.prefetch = spec.prefetch and not spec.local_sgd
        self._prefetched = -1  # step whose rows were requested ahead of time
        self._replies: dict[tuple[int, int], Record] = {}  # (kind, step) -> replies received early
        self.auc = Auc(state=self.shared.auc[spec.worker_id])
        w = spec.worker_id
        #: geo's hash tables, whose replica is a cache: the trainer maps each batch's keys to
        #: its rows, written to this worker's row mailbox (empty in other modes)
        self.cached = set(spec.layout.mailbox_rows[w]) if spec.layout.mailbox_rows else set()
        if not self.local_sgd:
            self.box_ids = self.shared.all_mailbox_ids[w]
            self.box_sparse = self.shared.all_mailbox_sparse[w]
            self.box_dense = self.shared.all_mailbox_dense[w]
        else:
            self.local_sparse = {t.name: np.zeros((0, t.dim), np.float32) for t in self.model.sparse_tables()}
            self.local_dense = {t.name: np.zeros(t.shape, np.float32) for t in self.model.dense_tables()}
            if self.cached:
                self.box_ids = self.shared.all_mailbox_ids[w]
                self.box_rows = self.shared.all_mailbox_rows[w]
                #: the rows of a batch's keys, gathered from the cache for the model
                self.gathered = {name: np.zeros((0, self.local_sparse[name].shape[1]), np.float32) for name in self.cached}
        self.steps = 0
        #: geo: the trainer's steps of every worker (a column of the shared stats), and the
        #: exchange step count this worker last told the trainer it reached
        self._trainer_steps = self.shared.stats[:, STAT["steps"]]
        self._told = 0
        self.fused_sgd = type(self.model).local_sgd is not Model.local_sgd
        self._lrs: dict[str, float] | None = None
        #: lines of a file before each part this worker reads, counted in its first epoch
        self._lines_known: dict[FilePart, int] = {}
        self._lrs_step = 0

    # ----------------------------------------------------------------- main loop

    def run(self) -> None:
        self.model.warm_up(self.ctx, self.local_sgd)  # kernels loaded while the trainer connects
        self.conn.send_bytes(Record(Kind.READY).encode())
        while True:
            rec = Record.decode(self.conn.recv_bytes())
            if rec.kind == Kind.STOP:
                return
            if rec.kind in (Kind.EPOCH, Kind.PASS):
                steps_before = self.steps
                self.stats[STAT["epoch"]] = rec.epoch
                files = self.spec.files if rec.kind == Kind.EPOCH else _listed(rec.text)
                asyncio.run(self._read(files, self.step))
                self.conn.send_bytes(Record(Kind.EPOCH_DONE, epoch=rec.epoch, steps=self.steps - steps_before).encode())
            elif rec.kind == Kind.SCORE:
                self.conn.send_bytes(self._score_pass(rec.epoch, _listed(rec.text)).encode())

    async def _read(self, files: Sequence[str | FilePart], step: Callable[[Batch, Batch | None], object]) -> None:
        """Run ``step(batch, next_batch)`` over every batch of ``files`` (one batch of look-ahead,
        so async mode can prefetch the next batch's rows)."""
        queue: asyncio.Queue = asyncio.Queue(maxsize=self.spec.queue_chunks)
        producer = asyncio.ensure_future(
            feed_queue(files, queue, chunk_bytes=self.spec.chunk_bytes, pipe_command=self.spec.pipe_command,
                       batch_lines=self.model.lines_per_batch(), lines_known=self._lines_known)
        )
        try:
            current: Batch | None = None
            done = 0
            async for batch in self._batches(queue):
                if current is not None:
                    step(current, batch)
                    done += 1
                    if done % 16 == 0:
                        await asyncio.sleep(0)  # let the reader refill the queue now and then
                current = batch
            if current is not None:
                step(current, None)
            await producer
        finally:
            producer.cancel()

    async def _batches(self, queue: asyncio.Queue) -> AsyncIterator[Batch]:
        async for chunk in iter_queue(queue):
            for batch in self.model.batches(chunk, self.ctx):
                yield batch
            self.stats[STAT["bad_lines"]] = self.ctx.bad_lines
            self.stats[STAT["heartbeat"]] = time.time()

    # ----------------------------------------------------------------- one batch

    def step(self, batch: Batch, upcoming: Batch | None) -> float:
        """One training step on ``batch``; returns its summed loss (a step-wise trainer hands it
        back to the user's loop, a worker process only counts it). ``upcoming``: the batch that
        comes next, if known, whose rows are asked for while this one computes (async mode's
        prefetch); None when there is none or nobody can know it (a caller's own loop)."""
        t0 = time.perf_counter()
        if self.local_sgd:
            loss = self._train_local(batch, upcoming)
        else:
            loss = self._train_remote(batch, upcoming)
        predicted = self.model.predictions(batch)
        if predicted is not None:
            self.auc.update(*predicted)
        self.steps += 1
        s = self.stats
        s[STAT["loss_sum"]] += loss
        s[STAT["examples"]] += batch.examples
        s[STAT["steps"]] += 1
        s[STAT["compute_s"]] += time.perf_counter() - t0
        if self.local_sgd:
            self._tell_exchange_due()
        return loss

    def _score_pass(self, seq: int, files: list[str]) -> Record:
        """Predict every example of ``files`` with the current parameters and update nothing
        (online training's "predict, then train"). The AUC counts of this pass alone go to this
        worker's row of the shared ``scores`` (too big for a record on the pipe), and the
        training numbers (loss, AUC, examples) stay as they were."""
        auc = Auc()
        scored = [0, 0]  # examples, batches

        def score_one(batch: Batch, upcoming: Batch | None) -> None:
            self.score(batch)
            predicted = self.model.predictions(batch)
            if predicted is not None:
                auc.update(*predicted)
            scored[0] += batch.examples
            scored[1] += 1

        asyncio.run(self._read(files, score_one))
        assert self.shared.scores is not None
        self.shared.scores[self.spec.worker_id] = auc.state[0]
        return Record(Kind.SCORE_DONE, epoch=seq, examples=scored[0], steps=scored[1])

    def score(self, batch: Batch) -> None:
        """The model's forward pass on ``batch`` with fresh rows (its predictions are then in
        the batch, for :meth:`Model.predictions`); its gradients are dropped, nothing is counted."""
        if self.local_sgd:
            params = self._cached_params(batch, self._cache_rows(batch, self.steps, None))
            grads = self._local_grads(batch)
        else:
            params = self.params
            counts = self._publish(batch, self.steps)
            self._send(Record(Kind.PULL, step=self.steps, counts=counts))
            self._await(Kind.PULL, self.steps)
            grads = self._remote_grads(batch, counts, self.steps)  # never sent: nothing is updated
        self.model.compute(batch, params, grads)

    def _local_grads(self, batch: Batch) -> Grads:
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

    def _local_lrs(self) -> dict[str, float]:
        """Local SGD learning rate of every table for this step.

        Decay counts this trainer's steps (all its workers), times trainer_num: each trainer
        only sees its own steps, so geo divides decay_steps by trainer_num. The shared step
        count is re-read every 32 steps; between reads the schedule cannot move by more than
        that many steps, far below any sensible decay_steps."""
        if self._lrs is None or self.steps - self._lrs_step >= 32:
            trainer_steps = int(self.shared.stats[:, STAT["steps"]].sum())
            lrs = {}
            for spec in self.model.tables():
                opt = spec.optimizer
                assert isinstance(opt, SGD)
                factor = 1.0 if opt.decay is None else opt.decay.factor(trainer_steps * self.spec.num_trainers)
                lrs[spec.name] = opt.lr * factor
            self._lrs, self._lrs_step = lrs, self.steps
        return self._lrs

    def _train_local(self, batch: Batch, upcoming: Batch | None) -> float:
        lrs = self._local_lrs()
        rows = self._cache_rows(batch, self.steps, upcoming)
        if self.fused_sgd:
            return self._fused_local(batch, rows, lrs)
        grads = self._local_grads(batch)
        loss = self.model.compute(batch, self._cached_params(batch, rows), grads)
        self._count_keys(batch, rows)
        for name, ids in batch.sparse_ids.items():
            sgd_rows(self.shared.params[name], rows.get(name, ids), grads.sparse[name], lrs[name], self.shared.dirty[name])
        for name, g in grads.dense.items():
            self.params.dense[name] -= lrs[name] * g
        return float(loss)

    def _fused_local(self, batch: Batch, rows: dict[str, np.ndarray], lrs: dict[str, float]) -> float:
        """The model's own local step; on a hash table's gathered rows, whose change is then
        added to the cache rows (other workers may have written them meanwhile: Hogwild)."""
        params, marks, before = self.params, self.shared.dirty, {}
        if rows:  # never on fixed tables alone: their step stays as cheap as it was
            params = self._cached_params(batch, rows)
            before = {name: params.sparse[name].copy() for name in rows}
            marks = {**marks, **{name: np.zeros(len(r), np.uint8) for name, r in rows.items()}}
        loss = self.model.local_sgd(batch, params, lrs, marks)
        if loss is None:
            raise ApsError(f"model {self.model.name!r}: local_sgd returned None; return the batch loss")
        self._count_keys(batch, rows)
        for name, r in rows.items():
            add_changes(self.shared.params[name], r, params.sparse[name], before[name], marks[name], self.shared.dirty[name])
        return float(loss)

    def _cache_rows(self, batch: Batch, step: int, upcoming: Batch | None) -> dict[str, np.ndarray]:
        """Geo on hash tables: the cache rows of ``batch``'s keys, per hash table, asked of the
        trainer (unless asked for while the previous batch computed), and the next batch's
        asked for now (empty without hash tables)."""
        if not self.cached:
            return {}
        if self._prefetched != step:
            self._send(Record(Kind.PULL, step=step, counts=self._publish(batch, step)))
        self._await(Kind.PULL, step)
        if upcoming is not None:
            self._send(Record(Kind.PULL, step=step + 1, counts=self._publish(upcoming, step + 1)))
            self._prefetched = step + 1
        return {name: self.box_rows[name][step % 2][: len(batch.sparse_ids.get(name, ()))] for name in self.cached}

    def _count_keys(self, batch: Batch, rows: dict[str, np.ndarray]) -> None:
        """Add the batch's shows and clicks of each key (one show each where the model gives
        none, as a push without them counts) to its cache row's, before the step marks the row
        dirty: the exchange sends them with the row's delta."""
        for name, r in rows.items():
            add_counts(self.shared.key_counts[name], r, batch.stats.get(name, _NO_COUNTS))

    def _cached_params(self, batch: Batch, rows: dict[str, np.ndarray]) -> Params:
        """The parameters a model computes ``batch`` with: a hash table's cache rows gathered in
        the order of the batch's keys (:class:`Params`), the rest as they are."""
        if not rows:
            return self.params
        sparse = dict(self.params.sparse)
        for name, r in rows.items():
            buf = self.gathered[name]
            if buf.shape[0] < len(r):
                buf = self.gathered[name] = np.zeros((max(len(r), 2 * buf.shape[0]), buf.shape[1]), np.float32)
            sparse[name] = buf[: len(r)]
            gather_rows(self.shared.params[name], r, sparse[name])
        return Params(sparse=sparse, dense=self.params.dense)

    def _publish(self, batch: Batch, step: int) -> list[int]:
        """Write the batch's ids into the id mailbox half of ``step``; return the counts."""
        counts = []
        for table in self.model.sparse_tables():
            if table.name not in self.box_ids:  # geo: a fixed table is indexed by id
                counts.append(0)
                continue
            ids = batch.sparse_ids.get(table.name, np.zeros(0, np.int64))
            box = self.box_ids[table.name][step % 2]
            if len(ids) > len(box):
                raise ApsError(
                    f"batch touches {len(ids)} rows of {table.name!r}, more than the model's max_batch_ids {len(box)}"
                )
            box[: len(ids)] = ids
            counts.append(len(ids))
        return counts

    def _train_remote(self, batch: Batch, upcoming: Batch | None) -> float:
        step = self.steps
        if self._prefetched == step:
            counts = [len(batch.sparse_ids.get(t.name, ())) for t in self.model.sparse_tables()]
        else:
            counts = self._publish(batch, step)
            self._send(Record(Kind.PULL, step=step, counts=counts))
        self._count_staleness(self._fresh_rows(self._await(Kind.PULL, step).clock, step, counts))
        if self.prefetch and upcoming is not None:
            # the next batch's rows travel while this one computes
            self._send(Record(Kind.PULL, step=step + 1, counts=self._publish(upcoming, step + 1)))
            self._prefetched = step + 1
        grads = self._remote_grads(batch, counts, step)
        loss = self.model.compute(batch, self.params, grads)
        self._send(Record(Kind.GRADS, step=step, examples=batch.examples, counts=counts))
        self.params.dense.update(self.dense_buffers[self._await(Kind.GRADS, step).buffer])
        return float(loss)

    def _remote_grads(self, batch: Batch, counts: list[int], step: int) -> Grads:
        """Zeroed gradient views into the mailbox for ``batch``; a hash table's mailbox also gets
        the batch's shows and clicks (its last columns) and the model its rows' slot area."""
        grads = Grads()
        for table, n in zip(self.model.sparse_tables(), counts):
            view = self.box_sparse[table.name][:n]
            view.fill(0.0)
            if table.name in self.hashed:
                cap = self.hashed[table.name]
                base = slot_base(self.spec.worker_id, step, cap)
                self.params.sparse[table.name] = self.shared.params[table.name][base : base + cap]
                stats = batch.stats.get(table.name)
                if stats is not None:
                    view[:, table.dim :] = stats
                view = view[:, : table.dim]
            grads.sparse[table.name] = view
        for name, buf in self.box_dense.items():
            buf.fill(0.0)
            grads.dense[name] = buf
        return grads

    def _fresh_rows(self, clock: int, step: int, counts: list[int]) -> int:
        """The staleness of the rows about to be computed with, pulled when ``clock`` of the
        trainer's batches were pushed: how many batches it has merged (the ones computed by now,
        this worker's previous one included) whose gradients those rows lack. Over
        ``max_staleness`` the worker asks again and waits: the trainer pulls once enough pushes
        are done (a prefetched pull was made before the batch computing meanwhile was merged)."""
        bound = self.spec.max_staleness
        while True:
            stale = int(self.shared.clock[CLOCK_MERGED]) - clock
            if bound is None or stale <= bound:
                return max(stale, 0)
            self._send(Record(Kind.PULL, step=step, counts=counts))
            clock = self._await(Kind.PULL, step).clock

    def _tell_exchange_due(self) -> None:
        """geo: tell the trainer once its step count (every worker's) reached the one its next
        exchange is due at (``CLOCK_EXCHANGE_AT``; 0: none published), so that the exchange
        starts on that step rather than when a timer next looks. At most one notice per worker
        and published count, so the pipe never fills with them; no reply is awaited."""
        due = int(self.shared.clock[CLOCK_EXCHANGE_AT])
        if due and due != self._told:
            steps = int(self._trainer_steps.sum())
            if steps >= due:
                self._told = due
                self._send(Record(Kind.STEPS, steps=steps))

    def _count_staleness(self, stale: int) -> None:
        self.stats[STAT["stale_sum"]] += stale
        self.stale_steps[min(stale, STALE_BUCKETS - 1)] += 1

    def _send(self, rec: Record) -> None:
        self.conn.send_bytes(rec.encode())

    def _await(self, kind: Kind, step: int) -> Record:
        """Block until the trainer says the ``kind`` request of ``step`` is done (replies to
        other outstanding requests that arrive meanwhile are remembered); returns the reply."""
        key = (int(kind), step)
        if key in self._replies:
            return self._replies.pop(key)
        t0 = time.perf_counter()
        while True:
            reply = Record.decode(self.conn.recv_bytes())
            if reply.kind == Kind.STOP:
                raise SystemExit(0)
            if reply.kind == Kind.ERROR:  # the communicator failed this request: say why
                raise ApsError(reply.text or "the trainer's communicator failed")
            if reply.kind != Kind.OK:
                raise ApsError(f"worker expected OK from the trainer, got {reply.kind.name}")
            got = (reply.answers, reply.step)
            if got == key:
                break
            self._replies[got] = reply
        self.stats[STAT["wait_s"]] += time.perf_counter() - t0
        return reply


#: a batch without shows and clicks of a table: one show per key (:func:`add_counts`)
_NO_COUNTS = np.zeros((0, 2), np.float32)


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of a worker process (a module-level function, as any start method needs)."""
    child_signals()
    try:
        threadpool_limits(limits=1)  # one BLAS thread per worker process: no oversubscription
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


def _listed(text: str) -> list[str]:
    """The files of a PASS or SCORE record (one per line; none for an empty text)."""
    return text.split("\n") if text else []
