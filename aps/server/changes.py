"""GEO's reads of changed rows (PULL_SPARSE_CHANGED) and the change tracking behind them.

Each geo client's changes are tracked per table in a bitmap that the shard keeps
(storage/tracking.py); all bitmaps of a server share one budget (``--max-tracking-bytes``). A
client whose tracking was dropped (over the budget, or gone too long), or a shard rolled back to
a checkpoint under it, gets every row at its next read: nothing it missed stays missed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from .. import wire
from ..errors import ErrorCode, ServerError
from ..storage.tracking import TrackingBudget
from .config import ServerConfig
from .table_set import Shard, TableSet

log = structlog.get_logger("aps.server")


class ChangeReads:
    """The changed-rows reads of one server, over its tables; ``rolled_back()``: the shards were
    loaded from a checkpoint under the clients (a resumed server), so any row may have changed."""

    def __init__(self, config: ServerConfig, tables: TableSet, rolled_back: Callable[[], bool]) -> None:
        self.config = config
        self.tables = tables
        self.rolled_back = rolled_back
        #: change tracking over all sparse tables, bounded by max_tracking_bytes (tracking.py)
        self.tracking = TrackingBudget(config.max_tracking_bytes)

    def read(self, client_id: int, msg: wire.PullSparseChanged) -> wire.Message | Awaitable[wire.Message]:
        """PULL_SPARSE_CHANGED: the rows of ``msg.table`` changed since ``client_id`` last read
        them, at most a frame's worth (the rest is "more", kept for its next read). A shard whose
        requests run in threads (a disk table: its rows may be on disk) is read in one."""
        shard, kind = self.tables.get(msg.table, by_ids=True)
        # its change tracking was dropped (it was away too long, or over the tracking budget), or
        # this shard was rolled back to a checkpoint under it (a resumed server): any row may have changed
        lost = self.tracking.was_dropped(client_id, msg.table) or self.rolled_back()
        quiet = kind.quiet(shard)
        if quiet is None:
            return self._charged(client_id, shard, self._changed(shard, client_id, msg.max_rows, lost))
        return self._read_off_loop(quiet, shard, client_id, msg.max_rows, lost)

    async def _read_off_loop(self, quiet: asyncio.Lock, shard: Shard, client_id: int, max_rows: int, lost: bool) -> wire.Message:
        async with quiet:
            reply = await asyncio.to_thread(self._changed, shard, client_id, max_rows, lost)
        return self._charged(client_id, shard, reply)

    def _charged(self, client_id: int, shard: Shard, reply: wire.Message) -> wire.Message:
        """``reply``, once the client's tracking on ``shard`` is charged to the budget (on the loop)."""
        self._charge(client_id, shard)
        return reply

    def _changed(self, shard: Shard, client_id: int, max_rows: int, lost: bool) -> wire.Message:
        """The reply: the shard's changed rows for ``client_id`` (every row when a new client's
        changes were ``lost``), at most a frame's worth. Touches the shard only (``local``: a
        fixed table's local rows, a hash table's slab rows, a disk table's keys)."""
        new_client = not shard.is_tracked(client_id)
        local = shard.changed(client_id)
        if new_client and lost:
            local = shard.all_rows()
        # at most what fits in one frame (ids int64 + rows float32 + headers); the rest is "more":
        # marked again in the client's own bitmap, so its next read sends them (with newer changes)
        fit = max(0, (self.config.max_frame - 64) // (8 + 4 * shard.spec.dim))
        limit = min(max_rows or len(local), fit)
        more = len(local) > limit
        if more:
            shard.mark_for(client_id, local[limit:])
            if not limit:  # not even one row fits: refuse, keeping the rows for a later call
                raise ServerError(
                    ErrorCode.TOO_LARGE,
                    f"table {shard.name!r}: one row of {shard.spec.dim} float32 does not fit in the max frame of "
                    f"{self.config.max_frame}",
                )
            local = local[:limit]
        ids, values = shard.changed_rows(local)
        return wire.ChangedReply(ids=ids, values=values, more=int(more))

    def _charge(self, client_id: int, shard: Shard) -> None:
        """Charge ``client_id``'s bitmap on ``shard`` to the tracking budget (once; a read makes
        it the most recently used) and drop the tracking the budget says to."""
        victims = self.tracking.read(client_id, shard.name, shard.tracking_bytes)
        for victim in victims:
            self.drop(*victim, over_budget=True)
        if victims:
            log.info("change tracking dropped over the tracking budget (those clients get every row next time)",
                     pairs=len(victims), budget=self.config.max_tracking_bytes, held=self.tracking.bytes)

    def drop(self, client_id: int, table: str, *, over_budget: bool) -> None:
        """Stop tracking ``table``'s changes for ``client_id``; its next read of changes returns
        every row (the drop is remembered in ``self.tracking``), so nothing is missed."""
        shard = self.tables.tables.get(table)
        if shard is not None and self.tables.kinds.of(shard).by_ids:
            shard.untrack(client_id)
        self.tracking.dropped(client_id, table, over_budget=over_budget)

    def forget(self, client_id: int) -> None:
        """A client gone for good: drop its tracking on every table."""
        for table in self.tracking.tables_of(client_id):
            self.drop(client_id, table, over_budget=False)
