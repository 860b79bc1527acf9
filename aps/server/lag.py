"""Parameter versions and the lagged-gradient rule of async mode.

Every table shard (sparse) and every dense block of a pserver has a version: the number of
gradient updates applied to it so far (a logical push counts once, after its FINAL chunk; a sync
round counts once). Pull replies carry the version they read; a gradient push names the version
its gradient was computed from (``based_on``). In async mode a gradient more than ``limit``
updates behind (``ratio x num_trainers``, the reference's async_lagged_grad_discard_ratio times
its num_gradient_servers) is dropped and counted, so that a straggler cannot drag the parameters
back towards where they were long ago.

Versions only ever grow (a LOAD does not reset them), so a version a client read before a load
never looks newer than the parameters it describes.
"""

from __future__ import annotations

from typing import Any

#: the block number that stands for a whole sparse table shard
SPARSE = -1


class UpdateVersions:
    """Versions per (table, block) and the gradients dropped as lagged, per table."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._versions: dict[tuple[str, int], int] = {}
        self.dropped: dict[str, int] = {}

    def version(self, table: str, block: int = SPARSE) -> int:
        return self._versions.get((table, block), 0)

    def applied(self, table: str, block: int = SPARSE) -> None:
        """One more gradient update of ``table`` (``block`` for a dense table)."""
        key = (table, block)
        self._versions[key] = self._versions.get(key, 0) + 1

    def lagged(self, table: str, block: int, based_on: int) -> bool:
        """Whether a gradient computed from version ``based_on`` must be dropped (it is then
        counted). ``based_on < 0`` (not stated) is never dropped."""
        if based_on < 0:
            return False
        if self.version(table, block) - based_on <= self.limit:
            return False
        self.dropped[table] = self.dropped.get(table, 0) + 1
        return True

    def as_dict(self) -> dict[str, Any]:
        """The stats op's view: the limit (None: off) and the drops per table and in all."""
        return {
            "limit": None if self.limit == float("inf") else self.limit,
            "dropped": sum(self.dropped.values()),
            "dropped_by_table": dict(sorted(self.dropped.items())),
        }
