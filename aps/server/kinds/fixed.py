"""Fixed sparse tables (:class:`~aps.specs.SparseTable`): ``rows`` x ``dim`` rows addressed by
id, this server's share by :class:`~aps.sharding.ModuloSharding`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import wire
from ...errors import ErrorCode, ServerError
from ...specs import SparseTable
from ...storage.optim import scan_ids
from ...storage.tables import SparseShard, shard_nbytes
from .base import SPARSE, Accepted, Push, TableKind, check_rows, refuse_unsorted

_STRICTLY_ASCENDING = 2  # scan_ids' order for unique, ascending ids


class FixedKind(TableKind):
    spec_type = SparseTable
    store_type = SparseShard
    by_ids = True

    def new_nbytes(self, spec: SparseTable) -> int:
        return shard_nbytes(spec, self.index, self.servers)

    def create(self, spec: SparseTable, max_table_bytes: int) -> SparseShard:
        return self.store_type(spec, self.index, self.servers)  # type: ignore[no-any-return]

    def local_ids(self, store: SparseShard, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """(local rows, order) of a request's global ids, in one compiled pass (:func:`scan_ids`):
        the one validation of a request's ids, so the shard is told they are checked; or the
        refusal of the first id that is out of range or not this server's."""
        if ids.dtype != np.int64 or ids.ndim != 1:
            raise ServerError(ErrorCode.BAD_REQUEST, f"ids must be a 1-d int64 array, got {ids.dtype} {ids.shape}")
        local = np.empty(len(ids), np.int64) if self.servers > 1 else ids
        bad, order = scan_ids(ids, store.spec.rows, self.servers, self.index, local)
        if bad >= 0:
            r = int(ids[bad])
            if not 0 <= r < store.spec.rows:
                raise ServerError(ErrorCode.ID_OUT_OF_RANGE, f"table {store.spec.name!r}: id {r} not in [0, {store.spec.rows})")
            raise ServerError(ErrorCode.BAD_REQUEST, f"id {r} sent to server {self.index} of {self.servers}, which does not own it")
        return local, order

    def pull_rows(self, store: SparseShard, ids: np.ndarray) -> np.ndarray:
        return store.pull(self.local_ids(store, ids)[0], checked=True)

    def accept(self, store: SparseShard, msg: Push, flags: int) -> Accepted:
        assert isinstance(msg, (wire.PushSparseGrad, wire.PushSparseDelta))
        if isinstance(msg, wire.PushSparseGrad) and (msg.shows is not None or msg.clicks is not None):
            raise ServerError(ErrorCode.BAD_REQUEST, f"table {msg.table!r}: shows and clicks are for hash tables only")
        local, order = self.local_ids(store, msg.ids)
        refuse_unsorted(flags, store.spec.name, order == _STRICTLY_ASCENDING, "ids")
        check_rows(store.spec.name, len(msg.ids), store.spec.dim, msg.values)
        return Accepted(local, msg.values, order > 0, SPARSE, (msg.table,), {})

    def apply_grad(self, store: SparseShard, push: Accepted, advance_step: bool, client: int) -> None:
        store.push_grad(push.ids, push.values, advance_step=advance_step, client=client, checked=True, ordered=push.ordered)

    def apply_delta(self, store: SparseShard, push: Accepted, advance_step: bool, client: int) -> None:
        store.push_delta(push.ids, push.values, client=client, checked=True, ordered=push.ordered)

    def apply_round(self, store: SparseShard, ids: np.ndarray | None, rows: np.ndarray, push: Accepted, scale: float, final: bool) -> bool:
        assert ids is not None
        store.push_grad(ids, rows, scale=scale, advance_step=True, client=None, checked=True)
        return True

    def contents(self, store: SparseShard) -> dict[str, int]:
        return {"keys": store.local_rows, "bytes": store.nbytes, "admitted": 0, "rejected": 0, "evicted": 0, "over_budget": 0}

    def gauges(self, store: SparseShard) -> dict[str, int]:
        return {"rows": store.local_rows, "values": store.values.size}

    def size(self, spec: SparseTable) -> dict[str, Any]:
        return {"rows": spec.rows, "dim": spec.dim}
