"""Disk tables (``HashTable(disk=Disk(...))``): a hash table whose cold rows live on the pserver's
local disk (aps/storage/hash/disk_store.py). Its requests are a hash table's, checked the same
way; what differs is where they run: a pull or push may read or write disk, so it runs in a
thread and the event loop keeps answering meanwhile (pings, other tables, stats). One request of
a table runs at a time, in arrival order (an asyncio lock, which wakes its waiters first come
first served): a push's rows are in place before the pull after it reads them, as on any table.

A shrink of a disk table walks every row, in RAM and on disk, in a thread while the table's
requests wait (hash_upkeep.py), and so does a GEO read of changed rows (changes.py); there is
no upkeep after pushes: its rows in RAM are reserved whole at creation and go out to disk as
requests need room. The spec refuses ``max_keys``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np

from ...errors import ErrorCode, ServerError
from ...specs import HashTable
from ...storage.hash.disk_store import DiskHashStore, new_table_dir
from ...storage.tables import TablesBudget
from .base import Accepted
from .hash import HashKind

T = TypeVar("T")


class DiskKind(HashKind):
    spec_tier = "disk"
    store_type = DiskHashStore

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._locks: weakref.WeakKeyDictionary[DiskHashStore, asyncio.Lock] = weakref.WeakKeyDictionary()

    def new_nbytes(self, spec: HashTable) -> int:
        """Its RAM budget: what a shard holds in memory however many keys it has."""
        assert spec.disk is not None
        return spec.disk.ram_bytes

    def holds(self, spec: HashTable) -> str:
        return "the hot rows and the disk store's caches (disk.ram_bytes)"

    def claim_nbytes(self, spec: HashTable) -> int:
        return self.new_nbytes(spec)

    def create(self, spec: HashTable, max_table_bytes: int) -> DiskHashStore:
        if self.data_dir is None:
            raise ServerError(ErrorCode.BAD_REQUEST, f"table {spec.name!r}: this server has no data directory for disk tables")
        return DiskHashStore(spec, new_table_dir(self.data_dir, spec.name))

    def count_in_budget(self, store: DiskHashStore, budget: TablesBudget) -> None:
        budget.take(self.new_nbytes(store.spec))

    # ---------------------------------------------------------------- requests, off the loop

    def _serial(self, store: DiskHashStore, work: Callable[[], T]) -> Awaitable[T]:
        lock = self.quiet(store)

        async def run() -> T:
            async with lock:
                return await asyncio.to_thread(work)

        return run()

    def quiet(self, store: DiskHashStore) -> asyncio.Lock:
        """The shard's lock: each request holds it while it runs, and a save while it reads the
        shard, so that no request runs meanwhile."""
        lock = self._locks.get(store)
        if lock is None:
            lock = self._locks[store] = asyncio.Lock()
        return lock

    def pull_rows(self, store: DiskHashStore, ids: np.ndarray) -> Awaitable[np.ndarray]:
        keys = self.keys(store, ids)  # refused here, on the loop, before anything waits
        return self._serial(store, lambda: store.pull(keys))

    def apply_grad(self, store: DiskHashStore, push: Accepted, advance_step: bool, client: int) -> Awaitable[None]:
        return self._serial(store, lambda: HashKind.apply_grad(self, store, push, advance_step, client))  # type: ignore[arg-type]

    def apply_delta(self, store: DiskHashStore, push: Accepted, advance_step: bool, client: int) -> Awaitable[None]:
        return self._serial(store, lambda: HashKind.apply_delta(self, store, push, advance_step, client))  # type: ignore[arg-type]

    def apply_round(
        self, store: DiskHashStore, ids: np.ndarray | None, rows: np.ndarray, push: Accepted, scale: float, final: bool
    ) -> Awaitable[bool]:
        return self._serial(store, lambda: HashKind.apply_round(self, store, ids, rows, push, scale, final))  # type: ignore[arg-type]

    # ---------------------------------------------------------------- reports

    def gauges(self, store: DiskHashStore) -> dict[str, int]:
        held = store.counts()
        return {**held, "values": held["hot_keys"] * store.spec.dim}
