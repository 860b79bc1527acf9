"""The pserver's requests on hash tables (:class:`~aps.specs.HashTable`): pull, gradient push
with shows and clicks, SHRINK, and the upkeep that keeps whole-table walks off the event loop.

A mixin of :class:`~aps.server.core.ServerCore`. Why the upkeep:
a shard's slab doubles by copying every row, and a ``max_keys`` cap evicts after finding the
lowest scores among all keys; done inside a push, either would hold the event loop (and every
ping) for as long as the table is big. So after a push the server looks at what the shard will
need soon (:attr:`HashSparseStore.growth_due`, :attr:`HashSparseStore.eviction_due`) and does it
ahead, behind the write gate: the slab copy and the search for victims run in a thread while
pulls, pings and stats are answered; the deletes then run on the loop in slices of
:data:`DELETE_SLICE` keys, each a few milliseconds. SHRINK works the same way.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import structlog

from .. import wire
from ..errors import ErrorCode, ServerError
from ..sharding import LogicalSharding
from ..specs import MAX_DAYS
from ..storage.hash.store import DELETE_THRESHOLD, SHOW_CLICK_DECAY, HashSparseStore
from .config import ServerConfig
from .coordination import SyncRounds
from .gate import WriteGate
from .lag import SPARSE, UpdateVersions
from .stats import ServerStats

log = structlog.get_logger("aps.server")

Reply = wire.Message | Awaitable[wire.Message]
_FINAL = int(wire.Flag.FINAL)
_SYNC = int(wire.Flag.SYNC)
_SORTED = int(wire.Flag.SORTED)
#: keys deleted per slice on the event loop (a shrink or a cap's eviction yields between slices)
DELETE_SLICE = 1 << 16


class HashHandlers:
    """Pull, push, shrink and upkeep of hash table shards; the state is the core's."""

    config: ServerConfig
    tables: dict[str, Any]
    gate: WriteGate
    versions: UpdateVersions
    sync_rounds: SyncRounds
    stats: ServerStats
    _upkeep: dict[str, asyncio.Task[None]]
    #: ServerCore._shard: a table's shard, refused unless of the given kinds
    _shard: Callable[[str, type | tuple[type, ...], str], Any]

    def _hash(self, name: str) -> HashSparseStore:
        return self._shard(name, HashSparseStore, "is not a hash table")  # type: ignore[no-any-return]

    def _hash_keys(self, store: HashSparseStore, keys: np.ndarray) -> np.ndarray:
        """A request's keys, refused unless a 1-d int64 array of keys this server owns."""
        if keys.dtype != np.int64 or keys.ndim != 1:
            raise ServerError(ErrorCode.BAD_REQUEST, f"keys must be a 1-d int64 array, got {keys.dtype} {keys.shape}")
        n, k = self.config.num_servers, self.config.server_index
        bad = LogicalSharding(n).first_foreign(keys, k)
        if bad >= 0:
            key = keys[bad : bad + 1]
            shard = int(LogicalSharding.logical(key)[0])
            raise ServerError(
                ErrorCode.BAD_REQUEST,
                f"table {store.name!r}: key {int(key[0])} (logical shard {shard}) sent to server {k} of {n}, which does not own it",
            )
        return keys

    # ----------------------------------------------------------------- data path

    def _pull_hash(self, store: HashSparseStore, msg: wire.PullSparse) -> wire.Message:
        """(The caller checked the reply fits in a frame.)"""
        keys = self._hash_keys(store, msg.ids)
        return wire.ArrayReply(op=wire.Op.PULL_SPARSE, values=store.pull(keys), version=self.versions.version(msg.table))

    def _push_keys(self, store: HashSparseStore, ids: np.ndarray, values: np.ndarray, flags: int) -> np.ndarray:
        """A push's keys, refused unless they are this server's, the values are float32
        [n, dim] and keys flagged SORTED are unique and ascending (which lets the store skip
        sorting the keys' rows: ``distinct``)."""
        keys = self._hash_keys(store, ids)
        n, dim = len(keys), store.spec.dim
        if values.dtype != np.float32 or values.shape != (n, dim):
            raise ServerError(
                ErrorCode.SHAPE_MISMATCH,
                f"table {store.name!r}: values must be float32 [{n}, {dim}], got {values.dtype} {list(values.shape)}",
            )
        if flags & _SORTED and n > 1 and not bool(np.all(keys[1:] > keys[:-1])):
            raise ServerError(ErrorCode.BAD_REQUEST, f"table {store.name!r}: push flagged SORTED but its keys are not unique and ascending")
        return keys

    @staticmethod
    def _check_counts(store: HashSparseStore, msg: wire.PushSparseGrad | wire.PushSparseDelta, n: int) -> None:
        """A push's optional shows and clicks: float32, one per key."""
        for name, arr in (("shows", msg.shows), ("clicks", msg.clicks)):
            if arr is not None and (arr.dtype != np.float32 or arr.shape != (n,)):
                raise ServerError(
                    ErrorCode.SHAPE_MISMATCH, f"table {store.name!r}: {name} must be float32 [{n}], got {arr.dtype} {list(arr.shape)}"
                )

    def _push_hash(self, client_id: int, store: HashSparseStore, msg: wire.PushSparseGrad, flags: int) -> Reply:
        keys = self._push_keys(store, msg.ids, msg.values, flags)
        n = len(keys)
        self._check_counts(store, msg, n)
        if flags & _SYNC:
            scale = 1.0 / self.config.num_trainers
            dim = store.spec.dim
            # a round holds each pushed row with its show and click (the defaults of a push
            # without them: one show, no click), so every trainer's statistics are added
            # unscaled while the gradients are averaged
            rows = np.empty((n, dim + 2), np.float32)
            rows[:, :dim] = msg.values
            rows[:, dim] = 1.0 if msg.shows is None else msg.shows
            rows[:, dim + 1] = 0.0 if msg.clicks is None else msg.clicks

            def apply(ids: np.ndarray | None, values: np.ndarray) -> None:
                assert ids is not None
                grads, shows, clicks = (np.ascontiguousarray(values[:, k]) for k in (slice(0, dim), dim, dim + 1))
                store.push_grad(ids, grads, shows=shows, clicks=clicks, scale=scale, advance_step=True)
                self.versions.applied(store.name)
                self._hash_upkeep(store)

            return self.sync_rounds.add(
                (msg.table,), client_id, keys, rows, bool(flags & _FINAL), apply, result=wire.Ok(op=wire.Op.PUSH_SPARSE_GRAD)
            )
        if self.versions.lagged(msg.table, SPARSE, msg.based_on):
            return wire.Ok(op=wire.Op.PUSH_SPARSE_GRAD)  # dropped (counted): computed from parameters too old
        final = bool(flags & _FINAL)
        store.push_grad(
            keys, msg.values, shows=msg.shows, clicks=msg.clicks, advance_step=final, client=client_id, distinct=bool(flags & _SORTED)
        )
        if final:
            self.versions.applied(msg.table)
        self._hash_upkeep(store)
        return wire.Ok(op=wire.Op.PUSH_SPARSE_GRAD)

    def _push_hash_delta(self, client_id: int, store: HashSparseStore, msg: wire.PushSparseDelta, flags: int) -> wire.Message:
        """GEO's delta push: admission applies, then ``param += delta`` on the held keys and
        their shows and clicks are added; the last chunk of a push advances the shard's step
        (the clock of last_step and ttl)."""
        keys = self._push_keys(store, msg.ids, msg.values, flags)
        self._check_counts(store, msg, len(keys))
        store.push_delta(
            keys, msg.values, shows=msg.shows, clicks=msg.clicks, advance_step=bool(flags & _FINAL), client=client_id,
            distinct=bool(flags & _SORTED),
        )
        self._hash_upkeep(store)
        return wire.Ok(op=wire.Op.PUSH_SPARSE_DELTA)

    # ----------------------------------------------------------------- shrink and upkeep

    def _shrink(self, client_id: int, msg: wire.Shrink, flags: int) -> Reply:
        store = self._hash(msg.table)
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
        self, store: HashSparseStore, decay: float, threshold: float, ttl: int | None, days: int = 0
    ) -> wire.Message:
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
        stores = [t for t in self.tables.values() if isinstance(t, HashSparseStore)]
        for store in stores:
            reply = await self.gate.hold(lambda store=store: self._shrink_off_loop(store, SHOW_CLICK_DECAY, DELETE_THRESHOLD, None))
            evicted += reply.evicted
        log.info("scheduled shrink", tables=len(stores), evicted=evicted)
        return evicted

    def _hash_upkeep(self, store: HashSparseStore) -> None:
        """Start growing or evicting ahead of need (see the module's note), once at a time."""
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

    def stop_upkeep(self) -> None:
        """The server is stopping: cancel the upkeep in flight (it holds nothing a client waits on)."""
        for task in list(self._upkeep.values()):
            task.cancel()


async def _delete_in_slices(store: HashSparseStore, keys: np.ndarray) -> int:
    """Delete ``keys`` from ``store`` on the loop, yielding to other requests between slices."""
    count = 0
    for start in range(0, len(keys), DELETE_SLICE):
        count += store.delete_keys(keys[start : start + DELETE_SLICE])
        await asyncio.sleep(0)
    return count
