"""geo (GEO-SGD): workers train locally, the trainer exchanges deltas (docs/modes.md, "geo").

Workers apply SGD to the shared replica themselves (Hogwild) and mark the rows they write. Every
``k_steps`` trainer steps the exchange sends, for each touched row, ``delta = (local - old) /
trainer_num`` (and sets ``old += delta``), then takes in the rows other trainers changed since
its previous pull: ``local += server - old; old = server``. Dense tables use the same formula on
the whole tensor.

A hash table's replica is a bounded cache of rows (:mod:`aps.trainer.local_cache`), which the
trainer fills as workers ask for their batches' keys (:mod:`.geo_hash`); its exchange is the same
formula over the cached rows written since the last one, pushed with their keys.

The exchange is woken by the workers, not by a timer: the trainer publishes the step count (all
workers together) at which the next exchange is due in the shared clock, and the worker whose
step reaches it says so (a STEPS record, :meth:`GeoExchange.on_steps`). The end of an epoch, a
save and the final flush exchange directly, whatever the count.
"""

from __future__ import annotations

import asyncio

import numpy as np

from ...specs import SGD, TableSpec
from .. import local_cache
from ..ipc import Kind, Record
from ..model import Model
from ..replica import FixedReplica, GeoReplica
from ..shared import CLOCK_EXCHANGE_AT, STAT
from ..strategy import Strategy
from .base import Link, Mode
from .geo_hash import HashReplicas


class GeoExchange(Mode):
    """Local SGD on the replica; a delta exchange with the pservers every ``k_steps`` steps."""

    name = "geo"
    mailboxes = False
    local_sgd = True

    @classmethod
    def table_problem(cls, spec: TableSpec) -> str | None:
        if not isinstance(spec.optimizer, SGD):
            return (
                f"geo mode trains locally with SGD, but table {spec.name!r} declares "
                f"{type(spec.optimizer).__name__}; give every table SGD (a CTR or zoo model: --model-arg "
                "optimizer=sgd), or train in sync, async, half_async or hybrid, which take any optimizer"
            )
        if spec.optimizer.l2 or spec.optimizer.clip_norm is not None:
            # the pservers only add geo's deltas: their optimizer, decay and clip included, never runs
            return (
                f"geo mode trains locally with plain SGD, but table {spec.name!r} declares l2 or "
                "clip_norm, which only the pservers' optimizer applies; drop them or use another mode"
            )
        return None

    @classmethod
    def cache_rows(cls, model: Model, strategy: Strategy, num_servers: int) -> dict[str, int] | None:
        """Each hash table's replica is a cache of this many rows (:func:`local_cache.cache_rows`)."""
        assert strategy.workers is not None
        return {
            t.name: local_cache.cache_rows(t, strategy.workers, model.max_batch_ids(t.name), num_servers, strategy.geo_cache_rows)
            for t in model.sparse_tables() if t.keyed
        }

    def __init__(self, link: Link) -> None:
        super().__init__(link)
        self.hashes = HashReplicas(link)
        #: every sparse table's replica (fixed: the whole table; hash: its cache), one interface
        self.replicas: dict[str, GeoReplica] = {}
        self._old_dense: dict[str, np.ndarray] = {}
        #: the trainer's steps when the last exchange began; the next is due k_steps later
        self._last_steps = 0
        #: set when the next exchange is due: a worker's step reached it (:meth:`on_steps`), or
        #: the steps trained during an exchange already did
        self._due = asyncio.Event()
        #: delta exchanges done (the metric ``aps_trainer_geo_syncs``)
        self.exchanges = 0
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        link = self.link
        for t in link.sparse_tables:
            await link.ps.pull_sparse_changed(t.name)  # registers us for change tracking
        await link.pull_all_sparse()
        caches = self.hashes.caches
        self.replicas = {
            t.name: caches[t.name] if t.name in caches else FixedReplica(link.shared.params[t.name], link.shared.dirty[t.name])
            for t in link.sparse_tables
        }
        await link.pull_dense()
        self._old_dense = {t.name: link.shared.params[t.name].copy() for t in link.dense_tables}
        self._begin_interval()
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def on_pull(self, worker: int, rec: Record) -> None:
        """A worker asks for the cache rows of its batch's hash table keys (:mod:`.geo_hash`)."""
        await self.hashes.map_batch(worker, rec.step, rec.counts)
        self.link.reply(worker, Record(Kind.OK, step=rec.step, answers=Kind.PULL))

    async def on_steps(self, worker: int, rec: Record) -> None:
        """A worker's step brought the trainer's steps to the next exchange's count: wake the
        exchange (it checks the count itself, so a notice an exchange overtook is harmless)."""
        self._due.set()

    async def on_worker_done(self, worker: int) -> None:
        self.hashes.worker_done(worker)

    def report(self) -> dict[str, float]:
        """Every mode's counters, the exchanges done and, with hash tables, how their local
        caches fare (summed over the tables; the records' ``geo_cache_*`` fields)."""
        out = {**super().report(), "geo_syncs": self.exchanges}
        cache = self.hashes.report()
        if cache is not None:
            out.update(
                geo_cache_evictions=cache.evictions,
                geo_cache_evicted_deltas=cache.evicted_deltas,
                geo_cache_held=cache.held,
                geo_cache_capacity=cache.capacity,
            )
        return out

    async def flush(self) -> None:
        await self.exchange()

    async def after_barrier(self) -> None:
        await self.exchange()  # take in what the other trainers sent before the barrier

    def trainer_steps(self) -> int:
        return int(self.link.shared.stats[:, STAT["steps"]].sum())

    def _begin_interval(self) -> None:
        """Count the next ``k_steps`` from the trainer's steps now, and publish where they end
        for the workers (the shared clock's ``CLOCK_EXCHANGE_AT``)."""
        self._last_steps = self.trainer_steps()
        self.link.shared.clock[CLOCK_EXCHANGE_AT] = self._last_steps + self.link.strategy.k_steps

    def _is_due(self) -> bool:
        return self.trainer_steps() - self._last_steps >= self.link.strategy.k_steps

    async def _loop(self) -> None:
        """Exchange each time the next one is due (woken by :attr:`_due`, no timer). A wake-up
        that finds fewer steps than due (a flush exchanged meanwhile and began a new interval)
        waits again."""
        try:
            while True:
                await self._due.wait()
                self._due.clear()
                if self._is_due():
                    await self.exchange()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # surfaced by the trainer through check()
            self.failure = exc

    async def exchange(self) -> None:
        """Send ``(local - old) / trainers`` for touched rows, then take in others' changes."""
        link = self.link
        timeout = link.strategy.rpc_timeout
        async with self._lock:
            self._begin_interval()
            scale = 1.0 / link.num_trainers
            for name, replica in self.replicas.items():
                keys, deltas, counts = replica.take_changes(scale)
                if len(keys):
                    if counts is None:  # a fixed table: its ids come unique and ascending
                        await link.ps.push_sparse_delta(name, keys, deltas, sorted_unique=True, timeout=timeout)
                    else:  # a hash table's keys, with their shows and clicks (in flight: geo_hash.py)
                        await self.hashes.push(name, keys, deltas, counts)
                changed, rows = await link.ps.pull_sparse_changed(name, timeout=timeout)
                if len(changed):
                    replica.apply_server(changed, rows)
            for t in link.dense_tables:
                local, old = link.shared.params[t.name], self._old_dense[t.name]
                delta = (local - old) * np.float32(scale)
                old += delta
                await link.ps.push_dense_delta(t.name, delta, timeout=timeout)
                server = await link.ps.pull_dense(t.name, timeout=timeout)
                local += server - old
                old[...] = server
            self.exchanges += 1
            if self._is_due():
                # the workers trained k_steps more while this exchange ran: go again (a worker
                # says so too, unless its step counted while the new interval was published)
                self._due.set()
