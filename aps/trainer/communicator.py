"""The communicator: the one coroutine family in a trainer that talks to the pservers.

Workers never open sockets. They ask for rows (PULL) and hand over gradients (GRADS) through
shared mailboxes; in geo mode they only train locally and the communicator exchanges deltas
every ``k_steps`` trainer steps. Exact semantics of each mode: docs/modes.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
import structlog

from ..client import PSClient
from ..specs import SGD, DenseTable, SparseTable
from .ipc import Kind, Record
from .kernels import geo_apply, geo_delta, merge_rows, scatter_rows
from .model import Model
from .shared import STAT, Attached
from .strategy import Strategy

log = structlog.get_logger("aps.trainer")

#: rows per request when a whole sparse table is pulled (initial replica fill)
_PULL_ALL_ROWS = 1 << 16


@dataclass
class GradItem:
    """One worker's gradients for one batch, copied out of its mailbox."""

    sparse: dict[str, tuple[np.ndarray, np.ndarray]]
    dense: dict[str, np.ndarray]
    examples: int
    step: int = 0  # the worker's step these gradients belong to (its reply names it)


def merge_items(items: list[GradItem], average: bool) -> GradItem:
    """Merge several batches' gradients: rows with the same id are summed (or averaged over
    the number of batches when ``average``), dense tensors likewise. Consumes ``items``: the
    dense sum is accumulated in the first item's arrays (each item owns copies of its worker's
    mailbox), which saves a copy of every dense gradient per push."""
    scale = 1.0 / len(items) if average else 1.0
    sparse = {}
    for name in items[0].sparse:
        ids = np.concatenate([it.sparse[name][0] for it in items])
        rows = np.concatenate([it.sparse[name][1] for it in items])
        uids, urows = merge_rows(ids, rows)
        if scale != 1.0:
            urows *= np.float32(scale)
        sparse[name] = (uids, urows)
    dense = {}
    for name in items[0].dense:
        total = items[0].dense[name]
        for it in items[1:]:
            total += it.dense[name]
        if scale != 1.0:
            total *= np.float32(scale)
        dense[name] = total
    return GradItem(sparse, dense, sum(it.examples for it in items))


class Communicator:
    """Owns all network traffic of one trainer for the chosen mode."""

    def __init__(
        self,
        ps: PSClient,
        model: Model,
        strategy: Strategy,
        shared: Attached,
        reply: Callable[[int, Record], None],
        trainer_id: int,
        num_trainers: int,
    ) -> None:
        self.ps = ps
        self.model = model
        self.strategy = strategy
        self.mode = strategy.mode
        self.shared = shared
        self.reply = reply
        self.trainer_id = trainer_id
        self.num_trainers = num_trainers
        self.sparse_tables: list[SparseTable] = model.sparse_tables()
        self.dense_tables: list[DenseTable] = model.dense_tables()
        assert strategy.thread_pool_size is not None
        self._push_slots = asyncio.Semaphore(strategy.thread_pool_size)
        self.epoch = 0
        self.round = 0
        self.active: set[int] = set()
        self.pending: dict[int, GradItem] = {}
        self.sends = 0
        self.pushed_batches = 0
        self._step_lock = asyncio.Lock()
        self._queue: asyncio.Queue[GradItem] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._geo_task: asyncio.Task[None] | None = None
        self._geo_old_sparse: dict[str, np.ndarray] = {}
        self._geo_old_dense: dict[str, np.ndarray] = {}
        self._geo_last_steps = 0
        self.geo_syncs = 0
        self.failure: BaseException | None = None

    def _average(self, across_workers: bool) -> bool:
        if self.strategy.merge != "auto":
            return self.strategy.merge == "average"
        if across_workers:
            return True  # one step of sync / half_async = the mean over the combined batch
        # async merges successive batches: adding SGD gradients = applying them in turn
        return not all(isinstance(t.optimizer, SGD) for t in self.model.tables())

    @property
    def queue_depth(self) -> int | None:
        """Async mode: workers' gradient batches waiting to be merged and sent (None in other
        modes); read by the metrics endpoint to show whether the network keeps up."""
        return self._queue.qsize() if self._queue is not None else None

    @property
    def queue_capacity(self) -> int | None:
        """Async mode: how many batches the send queue holds before workers wait."""
        return self._queue.maxsize if self._queue is not None else None

    # ----------------------------------------------------------------- start / stop

    async def start(self) -> None:
        """Fill the local replica from the pservers and start the mode's background task."""
        if self.mode == "geo":
            for t in self.sparse_tables:
                await self.ps.pull_sparse_changed(t.name)  # registers us for change tracking
            await self._pull_all_sparse()
            self._geo_old_sparse = {t.name: self.shared.params[t.name].copy() for t in self.sparse_tables}
        await self._pull_dense()
        if self.mode == "geo":
            self._geo_old_dense = {t.name: self.shared.params[t.name].copy() for t in self.dense_tables}
            self._geo_task = asyncio.ensure_future(self._guard(self._geo_loop()))
        elif self.mode == "async":
            assert self.strategy.send_queue_size is not None
            self._queue = asyncio.Queue(maxsize=self.strategy.send_queue_size)
            self._sender = asyncio.ensure_future(self._guard(self._send_loop()))

    async def _guard(self, work: Awaitable[None]) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # surfaced by the trainer through check()
            self.failure = exc

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    async def stop(self) -> None:
        for task in (self._geo_task, self._sender):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _pull_all_sparse(self) -> None:
        for t in self.sparse_tables:
            params = self.shared.params[t.name]
            for start in range(0, t.rows, _PULL_ALL_ROWS):
                ids = np.arange(start, min(t.rows, start + _PULL_ALL_ROWS), dtype=np.int64)
                params[start : start + len(ids)] = await self.ps.pull_sparse(t.name, ids, timeout=self.strategy.rpc_timeout)

    async def _pull_dense(self) -> None:
        """Every dense table at once (one round trip, not one per table)."""

        async def one(t: DenseTable) -> None:
            self.shared.params[t.name][...] = await self.ps.pull_dense(t.name, timeout=self.strategy.rpc_timeout)

        await asyncio.gather(*(one(t) for t in self.dense_tables))

    # ----------------------------------------------------------------- epochs

    def begin_epoch(self, epoch: int, workers: set[int]) -> None:
        self.epoch = epoch
        self.round = 0
        self.active = set(workers)
        self.pending.clear()

    async def flush(self) -> None:
        """Hand the pservers everything this trainer has computed so far without ending the
        epoch: async waits for its send queue to drain, geo sends its deltas now; sync and
        half_async have nothing pending between steps."""
        if self.mode == "async":
            assert self._queue is not None
            await self._queue.join()
            self.check()
        elif self.mode == "geo":
            await self.geo_sync()

    async def end_epoch(self) -> None:
        """Every worker finished the epoch: flush what is in flight so the servers have it all."""
        await self.flush()
        if self.mode == "async":
            await self._pull_dense()
        elif self.mode == "sync":
            await self._sync_idle_rounds()

    async def finish_epoch(self, epoch: int) -> None:
        """The end of an epoch as every trainer sees it: flush, meet the other trainers at the
        epoch barrier, and (geo) take in what they sent before it. Both the file-driven trainer
        and the step-wise one call this, so an epoch ends the same way in each."""
        await self.end_epoch()
        self.check()
        await self.ps.barrier(f"aps.epoch.{epoch}", timeout=self.strategy.rpc_timeout)
        if self.mode == "geo":
            await self.geo_sync()  # take in what the other trainers sent before the barrier

    # ----------------------------------------------------------------- worker requests

    async def handle(self, worker: int, rec: Record) -> None:
        if rec.kind == Kind.PULL:
            await self._pull_rows(worker, rec.counts, rec.a % 2)
            self.reply(worker, Record(Kind.OK, rec.a, Kind.PULL))
        elif rec.kind == Kind.GRADS:
            item = self._take_grads(worker, rec.counts, rec.b, rec.a)
            if self.mode == "async":
                assert self._queue is not None
                await self._queue.put(item)  # bounded: a full queue holds the worker back
                self.reply(worker, Record(Kind.OK, rec.a, Kind.GRADS))
            else:
                self.pending[worker] = item
                await self._maybe_step()
        elif rec.kind == Kind.EPOCH_DONE:
            self.active.discard(worker)
            if self.mode in ("sync", "half_async"):
                await self._maybe_step()

    async def _pull_rows(self, worker: int, counts: list[int], half: int) -> None:
        """Pull the rows whose ids the worker wrote in ``half`` of its id mailbox."""
        boxes = self.shared.all_mailbox_ids[worker]

        async def one(t: SparseTable, n: int) -> None:
            if n:
                ids = boxes[t.name][half][:n].copy()
                rows = await self.ps.pull_sparse(t.name, ids, timeout=self.strategy.rpc_timeout)
                scatter_rows(self.shared.params[t.name], ids, rows)

        await asyncio.gather(*(one(t, n) for t, n in zip(self.sparse_tables, counts)))

    def _take_grads(self, worker: int, counts: list[int], examples: int, step: int) -> GradItem:
        ids = self.shared.all_mailbox_ids[worker]
        grads = self.shared.all_mailbox_sparse[worker]
        half = step % 2
        sparse = {
            t.name: (ids[t.name][half][:n].copy(), grads[t.name][:n].copy()) for t, n in zip(self.sparse_tables, counts)
        }
        dense = {t.name: self.shared.all_mailbox_dense[worker][t.name].copy() for t in self.dense_tables}
        return GradItem(sparse, dense, examples, step)

    async def _push(self, item: GradItem, sync: bool) -> None:
        """Push one merged gradient: each table concurrently, at most thread_pool_size at once."""

        async def sparse(t: SparseTable) -> None:
            ids, rows = item.sparse.get(t.name, (np.zeros(0, np.int64), np.zeros((0, t.dim), np.float32)))
            async with self._push_slots:
                await self.ps.push_sparse_grad(t.name, ids, rows, sync=sync, timeout=self.strategy.rpc_timeout)

        async def dense(t: DenseTable) -> None:
            async with self._push_slots:
                await self.ps.push_dense_grad(t.name, item.dense[t.name], sync=sync, timeout=self.strategy.rpc_timeout)

        await asyncio.gather(*(sparse(t) for t in self.sparse_tables), *(dense(t) for t in self.dense_tables))
        self.sends += 1

    def _empty_item(self) -> GradItem:
        return GradItem(
            {t.name: (np.zeros(0, np.int64), np.zeros((0, t.dim), np.float32)) for t in self.sparse_tables},
            {t.name: np.zeros(t.shape, np.float32) for t in self.dense_tables},
            0,
        )

    # ----------------------------------------------------------------- sync / half_async

    async def _maybe_step(self) -> None:
        """When every still-active worker has handed in its gradients, run one trainer step."""
        async with self._step_lock:
            if not self.pending or any(w not in self.pending for w in self.active):
                return
            workers = sorted(self.pending)
            items = [self.pending.pop(w) for w in workers]
            item = merge_items(items, self._average(across_workers=True))
            sync = self.mode == "sync"
            if sync:
                await self._vote(has_data=True)
            await self._push(item, sync=sync)
            self.pushed_batches += len(workers)
            await self._pull_dense()
            for w, done in zip(workers, items):
                self.reply(w, Record(Kind.OK, done.step, Kind.GRADS))

    async def _vote(self, has_data: bool) -> int:
        """Sync mode: every trainer says whether it still has data this round (a summed barrier),
        so trainers that ran out keep joining rounds with empty gradients instead of hanging
        the others."""
        self.round += 1
        return await self.ps.barrier(
            f"aps.sync.{self.epoch}.{self.round}", value=int(has_data), timeout=self.strategy.rpc_timeout
        )

    async def _sync_idle_rounds(self) -> None:
        while await self._vote(has_data=False):
            await self._push(self._empty_item(), sync=True)
            await self._pull_dense()

    # ----------------------------------------------------------------- async

    async def _send_loop(self) -> None:
        assert self._queue is not None and self.strategy.max_merge_var_num is not None
        assert self.strategy.min_send_grad_num_before_recv is not None
        queue = self._queue
        while True:
            items = [await queue.get()]
            while len(items) < self.strategy.max_merge_var_num and not queue.empty():
                items.append(queue.get_nowait())
            try:
                await self._push(merge_items(items, self._average(across_workers=False)), sync=False)
                self.pushed_batches += len(items)
                if self.sends % self.strategy.min_send_grad_num_before_recv == 0:
                    await self._pull_dense()
            finally:
                for _ in items:
                    queue.task_done()

    # ----------------------------------------------------------------- geo

    def trainer_steps(self) -> int:
        return int(self.shared.stats[:, STAT["steps"]].sum())

    async def _geo_loop(self) -> None:
        while True:
            await asyncio.sleep(0.005)
            if self.trainer_steps() - self._geo_last_steps >= self.strategy.k_steps:
                await self.geo_sync()

    async def geo_sync(self) -> None:
        """Send ``(local - old) / trainers`` for touched rows, then take in others' changes."""
        async with self._step_lock:
            self._geo_last_steps = self.trainer_steps()
            scale = 1.0 / self.num_trainers
            for t in self.sparse_tables:
                dirty = self.shared.dirty[t.name]
                # workers keep setting flags meanwhile: scan a snapshot. A row written after the
                # snapshot keeps (or gets again) its flag, because workers write rows first and
                # set flags after, and deltas are read only after the clear below.
                ids = np.flatnonzero(dirty.copy()).astype(np.int64)
                dirty[ids] = 0
                if len(ids):
                    delta = np.empty((len(ids), t.dim), dtype=np.float32)
                    geo_delta(self.shared.params[t.name], self._geo_old_sparse[t.name], ids, scale, delta)
                    await self.ps.push_sparse_delta(t.name, ids, delta, timeout=self.strategy.rpc_timeout)
                changed, rows = await self.ps.pull_sparse_changed(t.name, timeout=self.strategy.rpc_timeout)
                if len(changed):
                    geo_apply(self.shared.params[t.name], self._geo_old_sparse[t.name], changed, rows)
            for t in self.dense_tables:
                local, old = self.shared.params[t.name], self._geo_old_dense[t.name]
                delta = (local - old) * np.float32(scale)
                old += delta
                await self.ps.push_dense_delta(t.name, delta, timeout=self.strategy.rpc_timeout)
                server = await self.ps.pull_dense(t.name, timeout=self.strategy.rpc_timeout)
                local += server - old
                old[...] = server
            self.geo_syncs += 1
