"""The pserver's work on hash tables (:class:`~aps.specs.HashTable`) beyond the push pipeline
(core.py, with the kind's checks in kinds/hash.py): SHRINK, the scheduled shrinks, and the
upkeep that keeps whole-table walks off the event loop.

Why the upkeep: a shard's slab doubles by copying every row, and a ``max_keys`` cap evicts
after finding the lowest scores among all keys; done inside a push, either would hold the event
loop (and every ping) for as long as the table is big. So after a push the server looks at what
the shard will need soon (:attr:`HashSparseStore.growth_due`,
:attr:`HashSparseStore.eviction_due`) and does it ahead, behind the write gate: the slab copy
and the search for victims run in a thread while pulls, pings and stats are answered; the
deletes then run on the loop in slices of :data:`DELETE_SLICE` keys, each a few milliseconds.
SHRINK works the same way.

And after the pushes stop: a shard's index resizes in pieces (aps/storage/hash/index.py), each
insert draining some of the old slot array into the new one, both held until it is drained. A
table filled and then only read would hold the rest of its old array for good (at 50M keys in
200,000-key pushes, 4 bytes a key). So once no push reached a draining table for
:data:`DRAIN_QUIET_S`, the upkeep drains the rest on the loop, :data:`DRAIN_STEP` slots at a
time (a few milliseconds each, yielding between), while the write gate is open: a step moves
slots, so it is a write like a push, never beside a save or a shrink's walk in a thread.

Why an object of its own, not part of the core: it needs only the tables, the write gate and
the stats, and owns only its upkeep tasks; the core holds one and hands it those requests.
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import structlog

from .. import wire
from ..errors import ErrorCode, ServerError
from ..specs import MAX_DAYS
from ..storage.hash.store import HashSparseStore
from .gate import WriteGate
from .stats import ServerStats
from .table_set import TableSet
from .transport.service import Reply

log = structlog.get_logger("aps.server")

#: keys deleted per slice on the event loop (a shrink or a cap's eviction yields between slices)
DELETE_SLICE = 1 << 16
#: seconds without a push to a table whose index still drains a resize before the upkeep
#: drains the rest (pushes drain it themselves meanwhile)
DRAIN_QUIET_S = 0.25
#: old index slots one drain step moves on the loop (about 18 ns a slot: ~5 ms)
DRAIN_STEP = 1 << 18


class HashUpkeep:
    """Shrinks of hash table shards, and their growth and eviction ahead of need."""

    def __init__(self, table_set: TableSet, gate: WriteGate, stats: ServerStats) -> None:
        self.table_set = table_set
        self.gate = gate
        self.stats = stats
        #: per hash table, the slab growth or cap eviction running ahead of need
        self._upkeep: dict[str, asyncio.Task[None]] = {}
        #: per hash table whose index drains a resize, the task that drains the rest once it is
        #: idle, and the loop time of its last push
        self._drains: dict[str, asyncio.Task[None]] = {}
        self._last_push: dict[str, float] = {}

    @property
    def running(self) -> bool:
        """True while some table's growth or eviction is under way."""
        return bool(self._upkeep)

    # ----------------------------------------------------------------- shrink

    def shrink(self, msg: wire.Shrink) -> Reply:
        """The SHRINK request: check its arguments, then shrink the table behind the gate."""
        store, _ = self.table_set.keyed(msg.table)
        days = msg.days or 0
        if not (0.0 < msg.decay <= 1.0) or not math.isfinite(msg.threshold) or msg.ttl < -1 or days > MAX_DAYS:
            raise ServerError(
                ErrorCode.BAD_REQUEST,
                f"table {msg.table!r}: shrink needs decay in (0, 1], a finite threshold, ttl >= -1 and days <= {MAX_DAYS}; "
                f"got {msg.decay}, {msg.threshold}, {msg.ttl}, {days}",
            )
        ttl = None if msg.ttl < 0 else msg.ttl
        return self.gate.hold(lambda: self._shrink_off_loop(store, msg.decay, msg.threshold, ttl, days))

    async def _shrink_off_loop(
        self, store: HashSparseStore, decay: float | None, threshold: float | None, ttl: int | None, days: int = 0
    ) -> wire.Message:
        quiet = self.table_set.kinds.of(store).quiet(store)
        if quiet is not None:  # a kind whose requests run in threads (disk tables): its shrink too, whole
            async with quiet:
                evicted = await asyncio.to_thread(store.shrink, decay, threshold, ttl, days)
        else:
            dead = await asyncio.to_thread(store.shrink_plan, decay, threshold, ttl, days)
            evicted = await _delete_in_slices(store, dead)
        self.stats.shrinks += 1
        self.stats.shrink_evicted += evicted
        log.info("shrink", table=store.name, evicted=evicted, keys=len(store), day=store.day)
        return wire.ShrinkReply(evicted=evicted, keys=len(store))

    async def shrink_all(self) -> int:
        """Shrink every hash table with the reference's decay and threshold, one table at a
        time behind the write gate, off the loop (``aps-server --shrink-every``); returns the
        keys deleted in all."""
        evicted = 0
        stores = [t for t in self.table_set.tables.values() if self.table_set.kinds.of(t).keyed]
        for store in stores:
            reply = await self.gate.hold(lambda store=store: self._shrink_off_loop(store, None, None, None))
            evicted += reply.evicted
        log.info("scheduled shrink", tables=len(stores), evicted=evicted)
        return evicted

    # ----------------------------------------------------------------- upkeep

    def after_push(self, store: HashSparseStore) -> None:
        """A push changed ``store``: start growing or evicting ahead of need (see the module's
        note), once at a time; and if its index drains a resize, drain the rest once it is idle."""
        self._watch_drain(store)
        if store.name in self._upkeep or not (store.growth_due or store.eviction_due):
            return
        self.gate.close()  # writes run only with the gate open, so it is open here
        task = asyncio.get_running_loop().create_task(self.gate.exclusive(lambda: self._upkeep_off_loop(store)))
        self._upkeep[store.name] = task
        task.add_done_callback(lambda t, name=store.name: self._upkeep_done(name, t))

    async def _upkeep_off_loop(self, store: HashSparseStore) -> None:
        if store.growth_due:
            await asyncio.to_thread(store.reserve)
        due = store.eviction_due
        if due:
            await _delete_in_slices(store, await asyncio.to_thread(store.evict_plan, due))

    def _upkeep_done(self, name: str, task: asyncio.Task[None]) -> None:
        self._upkeep.pop(name, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("hash table upkeep failed", table=name, error=repr(task.exception()))

    def _watch_drain(self, store: HashSparseStore) -> None:
        if not store.resize_draining:
            return
        loop = asyncio.get_running_loop()
        self._last_push[store.name] = loop.time()
        if store.name not in self._drains:
            task = loop.create_task(self._drain_when_idle(store))
            self._drains[store.name] = task
            task.add_done_callback(lambda t, name=store.name: self._drain_done(name, t))

    async def _drain_when_idle(self, store: HashSparseStore) -> None:
        """Wait until no push reached ``store`` for :data:`DRAIN_QUIET_S`, then drain its
        index's resize a step at a time while the write gate is open and no upkeep of it runs
        (waiting again when either is not so); ends when the drain is done or the table was
        dropped or replaced."""
        loop = asyncio.get_running_loop()
        while store.resize_draining and self.table_set.tables.get(store.name) is store:
            quiet_for = loop.time() - self._last_push.get(store.name, 0.0)
            if quiet_for < DRAIN_QUIET_S or self.gate.busy or store.name in self._upkeep:
                await asyncio.sleep(max(DRAIN_QUIET_S - quiet_for, 0.05))
                continue
            store.drain_resize(DRAIN_STEP)
            await asyncio.sleep(0)

    def _drain_done(self, name: str, task: asyncio.Task[None]) -> None:
        self._drains.pop(name, None)
        self._last_push.pop(name, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("hash index drain failed", table=name, error=repr(task.exception()))

    def stop(self) -> None:
        """The server is stopping: cancel the upkeep in flight (it holds nothing a client waits on)."""
        for task in [*self._upkeep.values(), *self._drains.values()]:
            task.cancel()


async def _delete_in_slices(store: HashSparseStore, keys: np.ndarray) -> int:
    """Delete ``keys`` from ``store`` on the loop, yielding to other requests between slices."""
    count = 0
    for start in range(0, len(keys), DELETE_SLICE):
        count += store.delete_keys(keys[start : start + DELETE_SLICE])
        await asyncio.sleep(0)
    return count
