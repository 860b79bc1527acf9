"""geo on hash tables: the trainer maps each batch's keys to rows of its local cache.

A hash table's keys are any int64, so geo's local replica of it is a bounded cache
(:class:`~aps.trainer.local_cache.LocalCache`). Workers cannot look keys up themselves: the
index changes as keys come and go, and only the trainer may change it. So a worker publishes its
batch's keys (its id mailbox half of the step) and asks the trainer (PULL); the trainer maps them
to rows, pulls the pservers' rows of the keys it did not hold, writes the rows into the worker's
row mailbox and says OK. The worker asks for its *next* batch's rows while the current one
computes (as async mode's prefetch), so the round trip costs no compute time unless pulling
new keys takes longer than a batch. The rows of a batch are pinned until the worker is done
with it: at its PULL two steps later, its PULL of the same step again (a scoring pass), or the
end of its epoch.

Our own deltas never come back to us from the pservers (only other trainers' changes do), so a
key must not be pulled while a delta of it is on its way: its fresh row would lack that delta
for good. A pull of new keys first waits for the pushes in flight that carry any of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from ..local_cache import CacheCounts, LocalCache
from .base import Link


class HashReplicas:
    """The geo caches of a trainer's hash tables and the batches in flight that use them."""

    def __init__(self, link: Link) -> None:
        self.link = link
        shared = link.shared
        self.caches = {
            t.name: LocalCache(t.name, shared.params[t.name], shared.dirty[t.name], shared.key_counts[t.name])
            for t in link.sparse_tables if t.keyed
        }
        #: worker -> step -> (cache, rows) of that batch, pinned until it is done
        self._in_flight: dict[int, dict[int, list[tuple[LocalCache, np.ndarray]]]] = {}
        #: per table, the ticket of the pull still filling each row (0: filled)
        self._loading = {name: np.zeros(c.capacity, np.int64) for name, c in self.caches.items()}
        self._loads: dict[int, asyncio.Event] = {}
        self._tickets = 0
        #: per table, the delta pushes in flight: (their keys, the push)
        self._pushing: dict[str, list[tuple[np.ndarray, asyncio.Future[None]]]] = {name: [] for name in self.caches}

    # ------------------------------------------------------------ a worker's batch

    async def map_batch(self, worker: int, step: int, counts: list[int]) -> None:
        """Map the keys ``worker`` published for ``step`` to cache rows (pulling the new ones)
        and write the rows into its row mailbox half of ``step``."""
        self._release(worker, lambda s: s <= step - 2 or s == step)
        scale = 1.0 / self.link.num_trainers
        batch = self._in_flight.setdefault(worker, {}).setdefault(step, [])
        work: list[asyncio.Future[None]] = []  # pulls of new keys, pushes of evicted rows
        waits: list[asyncio.Event] = []  # loads of other requests that fill rows of this batch
        for t, n in zip(self.link.sparse_tables, counts):
            cache = self.caches.get(t.name)
            if cache is None or n == 0:
                continue
            keys = self.link.shared.all_mailbox_ids[worker][t.name][step % 2][:n].copy()
            rows, missing, evicted = cache.admit(keys, scale)
            batch.append((cache, rows))
            loading = self._loading[t.name]
            hits = loading[rows]
            waits += [self._loads[int(k)] for k in np.unique(hits[hits != 0]) if int(k) in self._loads]
            if len(evicted.keys):
                work.append(self.push(t.name, evicted.keys, evicted.deltas, evicted.counts))
            if missing.size:
                self._tickets += 1
                ticket = self._tickets
                self._loads[ticket] = asyncio.Event()
                loading[rows[missing]] = ticket
                work.append(asyncio.ensure_future(self._load(t.name, cache, keys[missing], rows[missing], ticket)))
            self.link.shared.all_mailbox_rows[worker][t.name][step % 2][:n] = rows
        try:
            await asyncio.gather(*work)
        finally:
            for f in work:
                f.cancel()  # only those left when another failed
        await asyncio.gather(*(event.wait() for event in waits))

    async def _load(self, name: str, cache: LocalCache, keys: np.ndarray, rows: np.ndarray, ticket: int) -> None:
        """Pull the pservers' rows of keys new to the cache into their rows (an unknown key reads
        its initial row; nothing is inserted on the pservers)."""
        try:
            deps = [f for pushed, f in self._pushing[name] if np.isin(keys, pushed).any()]
            if deps:
                await asyncio.gather(*deps)
            values = await self.link.ps.pull_sparse(name, keys, timeout=self.link.strategy.rpc_timeout)
            cache.fill(rows, values)
            loading = self._loading[name]
            loading[rows[loading[rows] == ticket]] = 0
        finally:
            self._loads.pop(ticket).set()

    def report(self) -> CacheCounts | None:
        """The caches' evictions so far and rows held now, summed over the hash tables (None:
        the trainer has none)."""
        if not self.caches:
            return None
        return sum((c.report() for c in self.caches.values()), CacheCounts())

    def worker_done(self, worker: int) -> None:
        """``worker`` finished its epoch: none of its batches uses the cache any more."""
        self._release(worker, lambda s: True)

    def _release(self, worker: int, done: Callable[[int], bool]) -> None:
        steps = self._in_flight.get(worker, {})
        for s in [s for s in steps if done(s)]:
            for cache, rows in steps.pop(s):
                cache.release(rows)

    # ------------------------------------------------------------ the exchange's pushes

    def push(self, name: str, keys: np.ndarray, deltas: np.ndarray, counts: np.ndarray) -> asyncio.Future[None]:
        """Push deltas with their shows and clicks (keys unique), remembered while in flight
        (see the module)."""
        order = np.argsort(keys)
        keys, deltas, counts = keys[order], deltas[order], counts[order]
        push = asyncio.ensure_future(self.link.ps.push_sparse_delta(
            name, keys, deltas, shows=counts[:, 0], clicks=counts[:, 1], sorted_unique=True,
            timeout=self.link.strategy.rpc_timeout,
        ))
        entry = (keys, push)
        self._pushing[name].append(entry)
        push.add_done_callback(lambda _: self._pushing[name].remove(entry))
        return push

