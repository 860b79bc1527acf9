"""What every mode shares: the link to the pservers and the replica, and the mode interface.

A mode is one object built once per trainer (:func:`aps.trainer.modes.mode_class` is the one
place that reads the mode's name). The communicator hands it the workers' requests; the class
says what the workers must do differently (train locally, use mailboxes, prefetch rows).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ...client import PSClient
from ...errors import ApsError, ConfigError
from ...specs import SGD, DenseTable, HashTable, SparseTable, TableSpec
from ..accumulator import GradAccumulator
from ..ipc import Kind, Record
from ..kernels import scatter_rows
from ..model import Model
from ..shared import CLOCK_MERGED, Attached, slot_base
from ..strategy import Strategy

#: rows per request when a whole sparse table is pulled (initial replica fill)
_PULL_ALL_ROWS = 1 << 16


@dataclass
class Link:
    """The trainer's side of every mode: the client, the replica, the replies to workers, and
    the counters the metrics endpoint reads."""

    ps: PSClient
    model: Model
    strategy: Strategy  # resolved: no None knobs
    shared: Attached
    reply: Callable[[int, Record], None]
    trainer_id: int
    num_trainers: int
    sparse_tables: list[SparseTable | HashTable] = field(init=False)
    dense_tables: list[DenseTable] = field(init=False)
    #: the dense tables' parameter buffers: the replica's arrays, and a second set where the
    #: mode lags its dense rounds (:meth:`Mode.dense_lag`)
    dense_buffers: list[dict[str, np.ndarray]] = field(init=False)
    push_slots: asyncio.Semaphore = field(init=False)
    #: notified whenever ``pushed_batches`` grows (pulls waiting for fresh enough rows)
    pushed_changed: asyncio.Condition = field(init=False)
    #: merged gradient pushes sent
    sends: int = 0
    #: worker batches whose sparse gradients were pushed (all gradients, for a model without
    #: sparse tables): the "applied" end of a worker's staleness
    pushed_batches: int = 0
    #: worker batches whose sparse gradients were taken from the mailboxes (the "merged" end)
    merged_batches: int = 0

    def __post_init__(self) -> None:
        self.sparse_tables = self.model.sparse_tables()
        self.dense_tables = self.model.dense_tables()
        self.dense_buffers = self.shared.dense_buffers([t.name for t in self.dense_tables])
        assert self.strategy.thread_pool_size is not None
        self.push_slots = asyncio.Semaphore(self.strategy.thread_pool_size)
        self.pushed_changed = asyncio.Condition()

    def accumulator(self, max_batches: int, sparse: bool = True, dense: bool = True) -> GradAccumulator:
        """A pre-sized accumulator for ``max_batches`` worker batches of this model (of its
        sparse tables, its dense ones, or both)."""
        sizes = {t.name: self.model.max_batch_ids(t.name) for t in self.sparse_tables}
        return GradAccumulator(self.sparse_tables if sparse else [], self.dense_tables if dense else [], sizes, max_batches)

    def _counts(self, acc: GradAccumulator) -> bool:
        """Whether ``acc``'s batches count in the staleness clock: the one carrying sparse
        gradients (the dense one, for a model without sparse tables)."""
        return acc.has_sparse if self.sparse_tables else acc.has_dense

    def average(self, across_workers: bool) -> bool:
        """Whether merged gradients are averaged (else summed), per ``--merge``."""
        if self.strategy.merge != "auto":
            return self.strategy.merge == "average"
        if across_workers:
            return True  # one step of sync / half_async = the mean over the combined batch
        # async merges successive batches: adding SGD gradients = applying them in turn
        return not all(isinstance(t.optimizer, SGD) for t in self.model.tables())

    def take(self, acc: GradAccumulator, worker: int, counts: list[int], step: int, examples: int) -> None:
        """Merge the gradients ``worker`` left in its mailbox for ``step`` into ``acc``."""
        grads = self.shared.all_mailbox_sparse[worker]
        rows = [grads[t.name][:n] for t, n in zip(self.sparse_tables, counts)]
        acc.add(self.mailbox_ids(worker, counts, step), rows, self.shared.all_mailbox_dense[worker], examples)
        if self._counts(acc):
            self.merged_batches += 1
            self.shared.clock[CLOCK_MERGED] = self.merged_batches

    def mailbox_ids(self, worker: int, counts: list[int], step: int) -> list[np.ndarray]:
        """Views of the ids ``worker`` wrote for ``step``, one array per sparse table."""
        boxes = self.shared.all_mailbox_ids[worker]
        return [boxes[t.name][step % 2][:n] for t, n in zip(self.sparse_tables, counts)]

    async def push(self, acc: GradAccumulator, sync: bool) -> None:
        """Push an accumulator's gradients: every table concurrently, at most
        ``thread_pool_size`` at once, straight from its buffers."""
        timeout = self.strategy.rpc_timeout

        dims = {t.name: t.dim for t in self.sparse_tables if t.keyed}

        async def sparse(name: str, ids: np.ndarray, rows: np.ndarray) -> None:
            stats: dict[str, np.ndarray] = {}
            if name in dims:  # a hash table's rows: gradient, then shows and clicks
                d = dims[name]
                stats = {"shows": np.ascontiguousarray(rows[:, d]), "clicks": np.ascontiguousarray(rows[:, d + 1])}
                rows = np.ascontiguousarray(rows[:, :d])
            async with self.push_slots:
                await self.ps.push_sparse_grad(name, ids, rows, sync=sync, sorted_unique=True, timeout=timeout, **stats)

        async def dense(name: str, grad: np.ndarray) -> None:
            async with self.push_slots:
                await self.ps.push_dense_grad(name, grad, sync=sync, timeout=timeout)

        await asyncio.gather(
            *(sparse(name, ids, rows) for name, (ids, rows) in acc.sparse().items()),
            *(dense(name, grad) for name, grad in acc.dense().items()),
        )
        self.sends += 1
        if self._counts(acc) and acc.batches:
            async with self.pushed_changed:
                self.pushed_batches += acc.batches
                self.pushed_changed.notify_all()

    async def fresh_enough(self) -> int:
        """Wait until at most ``max_staleness`` of the batches merged so far are not yet pushed
        (at once without a bound); returns how many are pushed: rows pulled from now on have
        those batches' gradients."""
        bound = self.strategy.max_staleness
        if bound is not None:
            async with self.pushed_changed:
                await self.pushed_changed.wait_for(lambda: self.merged_batches - self.pushed_batches <= bound)
        return self.pushed_batches

    async def pull_rows(self, worker: int, counts: list[int], step: int) -> None:
        """Pull the rows whose ids the worker wrote in the id mailbox half of ``step``: a fixed
        table's at their ids, a hash table's into the slot area of that worker and half, in the
        ids' order (aps.trainer.shared.slot_base)."""

        async def one(t: SparseTable | HashTable, ids: np.ndarray) -> None:
            if len(ids):
                ids = ids.copy()  # the worker may publish its next ids in the other half only
                rows = await self.ps.pull_sparse(t.name, ids, timeout=self.strategy.rpc_timeout)
                if t.keyed:
                    base = slot_base(worker, step, self.model.max_batch_ids(t.name))
                    self.shared.params[t.name][base : base + len(ids)] = rows
                else:
                    scatter_rows(self.shared.params[t.name], ids, rows)

        await asyncio.gather(*(one(t, ids) for t, ids in zip(self.sparse_tables, self.mailbox_ids(worker, counts, step))))

    async def pull_all_sparse(self) -> None:
        """Every fixed sparse table whole (geo's replica; a hash table's, a cache, fills as
        workers ask for keys: :mod:`.geo_hash`)."""
        for t in self.sparse_tables:
            if t.keyed:
                continue
            params = self.shared.params[t.name]
            for start in range(0, t.rows, _PULL_ALL_ROWS):
                ids = np.arange(start, min(t.rows, start + _PULL_ALL_ROWS), dtype=np.int64)
                params[start : start + len(ids)] = await self.ps.pull_sparse(t.name, ids, timeout=self.strategy.rpc_timeout)

    async def pull_dense(self, buffer: int | None = None) -> None:
        """Every dense table at once (one round trip, not one per table), into parameter buffer
        ``buffer``, or into every buffer (None: no worker computes with any of them meanwhile)."""
        into = self.dense_buffers if buffer is None else [self.dense_buffers[buffer]]

        async def one(t: DenseTable) -> None:
            value = await self.ps.pull_dense(t.name, timeout=self.strategy.rpc_timeout, out=into[0][t.name])
            for params in into[1:]:
                params[t.name][...] = value

        await asyncio.gather(*(one(t) for t in self.dense_tables))


class Mode:
    """One training mode of a trainer (docs/modes.md has a section per subclass).

    The communicator calls :meth:`start` once, then per epoch :meth:`begin_epoch`, the
    workers' requests (:meth:`on_pull`, :meth:`on_grads`, :meth:`on_steps`,
    :meth:`on_worker_done`), :meth:`end_epoch` and, after the trainers' epoch barrier,
    :meth:`after_barrier`; finally :meth:`stop`. A failure of a background task is kept in
    :attr:`failure`. The trainer's metrics and records read the mode's counters as one dict,
    :meth:`report`.
    """

    #: the mode's name, as ``Strategy.mode`` spells it
    name: ClassVar[str] = ""
    #: workers hand gradients over through shared mailboxes (else they keep them)
    mailboxes: ClassVar[bool] = True
    #: workers apply SGD to the shared replica themselves (a model's fused ``local_sgd``)
    local_sgd: ClassVar[bool] = False
    #: workers ask for their next batch's rows while the current one computes
    prefetch: ClassVar[bool] = False
    #: one pserver restarted from its own checkpoint can rejoin the job (no round of pushes
    #: that every pserver must apply together)
    resumes_one_shard: ClassVar[bool] = True
    #: the dense lag a strategy naming none gets (:meth:`dense_lag`); None: the mode has none
    default_dense_lag: ClassVar[int | None] = None
    #: the trainer's workers step together and their gradients are averaged into one update
    #: (a model may then split each step's batch among them: Model.share_batch)
    averages_workers: ClassVar[bool] = False

    @classmethod
    def table_problem(cls, spec: TableSpec) -> str | None:
        """Why a table like ``spec`` cannot train in this mode (one line saying what to change),
        or None. A model's :meth:`~aps.trainer.model.Model.check_mode` asks it of every table."""
        return None

    @classmethod
    def dense_lag(cls, strategy: Strategy) -> int:
        """The rounds the workers' dense parameters lag behind in this mode (the strategy's
        ``dense_lag``, else the mode's default); ConfigError where the mode has no such choice."""
        if cls.default_dense_lag is None:
            if strategy.dense_lag:
                raise ConfigError(f"dense_lag applies to hybrid mode only; {cls.name} has no dense lag (use 0 or leave it unset)")
            return 0
        return cls.default_dense_lag if strategy.dense_lag is None else strategy.dense_lag

    @classmethod
    def cache_rows(cls, model: Model, strategy: Strategy, num_servers: int) -> dict[str, int] | None:
        """Where the mode keeps a bounded local cache of each hash table (geo), its rows per
        table (the shared arrays are laid out so); None: hash tables get slot areas."""
        return None

    def __init__(self, link: Link) -> None:
        self.link = link
        self.epoch = 0
        self.failure: BaseException | None = None

    async def start(self) -> None:
        """Fill the local replica from the pservers and start any background task."""
        await self.link.pull_dense()

    def begin_epoch(self, epoch: int, workers: set[int]) -> None:
        self.epoch = epoch

    async def on_pull(self, worker: int, rec: Record) -> None:
        """A worker asks for fresh rows of its batch: pull them into the replica (once they can
        be fresh enough for ``max_staleness``), say OK with how many batches they have."""
        applied = await self.link.fresh_enough()
        await self.link.pull_rows(worker, rec.counts, rec.step)
        self.link.reply(worker, Record(Kind.OK, step=rec.step, answers=Kind.PULL, clock=applied))

    async def on_grads(self, worker: int, rec: Record) -> None:
        """A worker's gradients of ``rec.step`` are in its mailbox; reply OK once they are taken."""
        raise ApsError(f"{type(self).__name__}: workers of this mode keep their gradients (got GRADS from worker {worker})")

    async def on_steps(self, worker: int, rec: Record) -> None:
        """A worker's step brought the trainer's step count to the one the mode published in
        the shared clock (geo: its next exchange is due); no reply."""
        raise ApsError(f"{type(self).__name__}: workers of this mode report no step counts (got STEPS from worker {worker})")

    async def on_worker_done(self, worker: int) -> None:
        """``worker`` finished the epoch: it sends nothing more in it."""

    async def flush(self) -> None:
        """Hand the pservers everything computed so far, without ending the epoch."""

    async def end_epoch(self) -> None:
        """Every worker finished the epoch: flush what is in flight so the servers have it all."""
        await self.flush()

    async def after_barrier(self) -> None:
        """The trainers met at the epoch barrier: take in what the others sent before it."""

    async def stop(self) -> None:
        """Cancel background tasks."""

    def report(self) -> dict[str, float]:
        """The mode's counters by name, in one dict: what the trainer's metrics endpoint
        (aps/trainer/collector.py) and its records (aps/trainer/monitor.py) read of the mode.
        Every mode has ``pushes`` (merged gradient pushes sent); a mode adds its own (async's
        send queue, geo's exchanges and local caches). The metrics endpoint calls it from its
        own thread: it only reads."""
        return {"pushes": self.link.sends}

    def check_failure(self) -> None:
        if self.failure is not None:
            raise self.failure
