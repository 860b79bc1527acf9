"""Hash tables (:class:`~aps.specs.HashTable`): rows for 64-bit keys that arrive at run time,
this server's keys by :class:`~aps.sharding.LogicalSharding`; pushes carry each key's shows and
clicks for the statistics that admission, shrink and the base/delta exports read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ... import wire
from ...errors import ErrorCode, ServerError
from ...sharding import LogicalSharding
from ...specs import HashTable
from ...storage.hash.store import HashSparseStore, budget_keys, claim_nbytes, planned_nbytes
from ...storage.tables import TablesBudget
from .base import SPARSE, Accepted, Push, TableKind, check_rows, refuse_unsorted

#: slab rows a hash table without max_keys starts with (it doubles as keys come)
START_ROWS = 1024


class HashKind(TableKind):
    spec_type = HashTable
    store_type = HashSparseStore
    by_ids = True
    keyed = True

    def __init__(self, index: int, servers: int, data_dir: Path | None = None) -> None:
        super().__init__(index, servers, data_dir)
        self.sharding = LogicalSharding(servers)

    def new_nbytes(self, spec: HashTable) -> int:
        """A table with ``max_keys`` counts that many keys; one without counts its first slab,
        and is then held to the keys that fit the budget (:meth:`create`)."""
        return planned_nbytes(spec, spec.max_keys or START_ROWS)

    def holds(self, spec: HashTable) -> str:
        return f"{spec.max_keys or START_ROWS} keys x (row, optimizer state, statistics and index)"

    def claim_nbytes(self, spec: HashTable) -> int:
        """Its first slab (all of ``max_keys``) and its index at its peak; its growth claims
        more, as it comes."""
        return claim_nbytes(spec, spec.max_keys or START_ROWS)

    def create(self, spec: HashTable, max_table_bytes: int) -> HashSparseStore:
        if spec.disk is not None:  # a server built without the disk kind: never an all-RAM table instead
            raise ServerError(ErrorCode.BAD_REQUEST, f"table {spec.name!r}: this server keeps no tables on disk")
        return HashSparseStore(spec, key_limit=budget_keys(spec, max_table_bytes) if max_table_bytes else None)

    def count_in_budget(self, store: HashSparseStore, budget: TablesBudget) -> None:
        store.share_budget(budget)

    def keys(self, store: HashSparseStore, keys: np.ndarray) -> np.ndarray:
        """A request's keys, refused unless a 1-d int64 array of keys this server owns."""
        if keys.dtype != np.int64 or keys.ndim != 1:
            raise ServerError(ErrorCode.BAD_REQUEST, f"keys must be a 1-d int64 array, got {keys.dtype} {keys.shape}")
        bad = self.sharding.first_foreign(keys, self.index)
        if bad >= 0:
            key = keys[bad : bad + 1]
            shard = int(LogicalSharding.logical(key)[0])
            raise ServerError(
                ErrorCode.BAD_REQUEST,
                f"table {store.name!r}: key {int(key[0])} (logical shard {shard}) sent to server {self.index} of "
                f"{self.servers}, which does not own it",
            )
        return keys

    def pull_rows(self, store: HashSparseStore, ids: np.ndarray) -> np.ndarray:
        return store.pull(self.keys(store, ids))

    def accept(self, store: HashSparseStore, msg: Push, flags: int) -> Accepted:
        """The keys (this server's), the values float32 [n, dim], keys flagged SORTED unique and
        ascending (which lets the store skip sorting the keys' rows), shows and clicks float32 [n]."""
        assert isinstance(msg, (wire.PushSparseGrad, wire.PushSparseDelta))
        keys = self.keys(store, msg.ids)
        n = len(keys)
        check_rows(store.name, n, store.spec.dim, msg.values)
        sorted_flag = bool(flags & int(wire.Flag.SORTED))
        refuse_unsorted(flags, store.name, n <= 1 or bool(np.all(keys[1:] > keys[:-1])), "keys")
        for name, arr in (("shows", msg.shows), ("clicks", msg.clicks)):
            if arr is not None and (arr.dtype != np.float32 or arr.shape != (n,)):
                raise ServerError(
                    ErrorCode.SHAPE_MISMATCH, f"table {store.name!r}: {name} must be float32 [{n}], got {arr.dtype} {list(arr.shape)}"
                )
        return Accepted(keys, msg.values, sorted_flag, SPARSE, (msg.table,), {"shows": msg.shows, "clicks": msg.clicks})

    def apply_grad(self, store: HashSparseStore, push: Accepted, advance_step: bool, client: int) -> None:
        store.push_grad(
            push.ids, push.values, shows=push.extra["shows"], clicks=push.extra["clicks"], advance_step=advance_step,
            client=client, distinct=push.ordered,
        )

    def apply_delta(self, store: HashSparseStore, push: Accepted, advance_step: bool, client: int) -> None:
        """Admission applies, then ``param += delta`` on the held keys and their shows and
        clicks are added; the last chunk of a push advances the shard's step (the clock of
        last_step and ttl)."""
        store.push_delta(
            push.ids, push.values, shows=push.extra["shows"], clicks=push.extra["clicks"], advance_step=advance_step,
            client=client, distinct=push.ordered,
        )

    def round_rows(self, push: Accepted) -> np.ndarray:
        """Each pushed row with its show and click (a push without them: one show, no click), so
        every trainer's statistics are added unscaled while the gradients are averaged."""
        n, dim = push.values.shape
        rows = np.empty((n, dim + 2), np.float32)
        rows[:, :dim] = push.values
        shows, clicks = push.extra["shows"], push.extra["clicks"]
        rows[:, dim] = 1.0 if shows is None else shows
        rows[:, dim + 1] = 0.0 if clicks is None else clicks
        return rows

    def apply_round(
        self, store: HashSparseStore, ids: np.ndarray | None, rows: np.ndarray, push: Accepted, scale: float, final: bool
    ) -> bool:
        assert ids is not None
        dim = store.spec.dim
        grads, shows, clicks = (np.ascontiguousarray(rows[:, k]) for k in (slice(0, dim), dim, dim + 1))
        store.push_grad(ids, grads, shows=shows, clicks=clicks, scale=scale, advance_step=True)
        return True

    def contents(self, store: HashSparseStore) -> dict[str, int]:
        return store.counts()

    def gauges(self, store: HashSparseStore) -> dict[str, int]:
        held = store.counts()
        return {**held, "values": held["keys"] * store.spec.dim}

    def size(self, spec: HashTable) -> dict[str, Any]:
        return {"dim": spec.dim, "max_keys": spec.max_keys}

    def counts(self, store: HashSparseStore) -> dict[str, int]:
        """Keys held, admitted, rejected (over_budget: of them, for a size budget) and evicted."""
        return {k: v for k, v in store.counts().items() if k != "bytes"}
