"""Dense tables (:class:`~aps.specs.DenseTable`): a flattened tensor in blocks, this server's
blocks by :func:`~aps.sharding.dense_blocks`; pulled and pushed by (block, offset, count)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import wire
from ...errors import ErrorCode, ServerError
from ...specs import DenseTable
from ...storage.tables import DenseShard, make_shard, shard_nbytes
from ..transport.reply_size import check_float32_reply
from .base import Accepted, Push, TableKind


class DenseKind(TableKind):
    spec_type = DenseTable
    store_type = DenseShard
    by_ids = False

    def new_nbytes(self, spec: DenseTable) -> int:
        return shard_nbytes(spec, self.index, self.servers)

    def create(self, spec: DenseTable, max_table_bytes: int) -> DenseShard:
        return make_shard(spec, self.index, self.servers)  # type: ignore[return-value]

    def pull_block(self, store: DenseShard, block: int, offset: int, count: int, max_frame: int) -> np.ndarray:
        held = store.blocks.get(block)
        if held is not None and offset + count <= held.size:  # else pull names the bad range
            check_float32_reply(max_frame, (count,), store.name)
        return store.pull(block, offset, count)

    def accept(self, store: DenseShard, msg: Push, flags: int) -> Accepted:
        assert isinstance(msg, (wire.PushDenseGrad, wire.PushDenseDelta))
        if msg.values.dtype != np.float32 or msg.values.ndim != 1:
            raise ServerError(
                ErrorCode.SHAPE_MISMATCH, f"dense values must be a 1-d float32 array, got {msg.values.dtype} {msg.values.shape}"
            )
        # the range too: a push that waits for its sync round, or is dropped as lagged, is refused all the same
        store.check_range(msg.block, msg.offset, len(msg.values))
        # not msg: a sync round keeps the values alone
        return Accepted(None, msg.values, True, msg.block, (msg.table, msg.block, msg.offset), {"offset": msg.offset})

    def apply_grad(self, store: DenseShard, push: Accepted, advance_step: bool, client: int) -> None:
        store.push_grad(push.part, push.extra["offset"], push.values, advance_step=advance_step)

    def apply_delta(self, store: DenseShard, push: Accepted, advance_step: bool, client: int) -> None:
        store.push_delta(push.part, push.extra["offset"], push.values)

    def round_final(self, push: Accepted, final: bool) -> bool:
        return True  # each chunk of a dense push is a round of its own (keyed by its offset)

    def apply_round(self, store: DenseShard, ids: np.ndarray | None, rows: np.ndarray, push: Accepted, scale: float, final: bool) -> bool:
        store.push_grad(push.part, push.extra["offset"], rows, scale=scale, advance_step=final)
        return final

    def contents(self, store: DenseShard) -> dict[str, int]:
        keys = sum(b.size for b in store.blocks.values())
        return {"keys": keys, "bytes": store.nbytes, "admitted": 0, "rejected": 0, "evicted": 0, "over_budget": 0}

    def gauges(self, store: DenseShard) -> dict[str, int]:
        return {"values": sum(b.size for b in dict(store.blocks).values())}

    def size(self, spec: DenseTable) -> dict[str, Any]:
        return {"shape": list(spec.shape), "size": spec.size}
