"""A pserver's own checkpoints: periodic, on SIGTERM, the last K kept, the newest resumed.

Each pserver writes only its own shard, under ``DIR/auto-<milliseconds>-shard-<k>-of-<n>/``
(the usual checkpoint layout with one shard in it), so servers that share a directory never
touch each other's files and a restarted server finds its own newest copy by name. These are
not whole-cluster checkpoints: every server saves on its own clock, with its own save id, so
``--init-model`` refuses a mix of them; what reads them is ``--resume``, which loads one shard.

Why one shard alone is enough to resume: in async and geo modes the other shards keep training
while one restarts; the restarted shard rolls back to its last checkpoint and loses at most the
updates applied to it since (docs/operations.md, "Restarting a pserver"). Sync mode needs every
shard from one save, so a resumed pserver refuses sync pushes (core.py).
"""

from __future__ import annotations

import re
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from ..checkpoints.shards import shard_dir_name
from ..errors import ConfigError
from .periodic import Periodic

log = structlog.get_logger("aps.server")

_AUTO_RE = re.compile(r"^auto-(\d{13})-(shard-\d{5}-of-\d{5})$")


#: writes the server's shard at a path with a save id; returns the seconds it took, or None when
#: the server holds no tables (core_checkpoints.CheckpointHandlers.save_own_shard)
SaveShard = Callable[[str, str], Awaitable[float | None]]


class AutoCheckpoints:
    """Writes this server's shard to ``directory`` every ``every`` seconds (0: only on demand)
    and keeps the newest ``keep`` of its own periodic checkpoints there.

    It is handed the one operation it needs (``save``), not the server's core: what a save
    holds (the write gate, the tables) stays the core's business."""

    def __init__(self, save: SaveShard, shard: int, num_shards: int, directory: str, every: float, keep: int) -> None:
        if keep < 1:
            raise ConfigError(f"keep_checkpoints must be >= 1, got {keep}")
        if not every >= 0 or every == float("inf"):
            raise ConfigError(f"checkpoint_every must be a number of seconds >= 0 (0: off), got {every}")
        self.save = save
        self.directory = Path(directory)
        self.every = every
        self.keep = keep
        self.shard = shard_dir_name(shard, num_shards)
        # a full disk must not stop the server; it is logged each time
        self._periodic = Periodic(lambda: self.save_now("periodic"), every, "periodic checkpoint failed", directory=str(self.directory))

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._periodic.start()

    async def stop(self) -> None:
        """Stop the periodic saves, letting one that is being written finish."""
        await self._periodic.stop()

    async def save_now(self, reason: str) -> Path | None:
        """Write a checkpoint now (after the writes already queued); None when there are no tables."""
        path = self.directory / f"auto-{int(time.time() * 1000):013d}-{self.shard}"
        seconds = await self.save(str(path), f"{path.name}-{uuid.uuid4().hex[:8]}")
        if seconds is None:
            return None
        log.info("checkpoint written", reason=reason, path=str(path), seconds=round(seconds, 3))
        self.prune()
        return path

    def prune(self) -> None:
        """Delete this server's periodic checkpoints beyond the newest ``keep`` complete ones,
        and its leftovers of saves that were killed (no complete shard inside)."""
        mine = sorted(p for p in self.directory.iterdir() if (m := _AUTO_RE.match(p.name)) and m.group(2) == self.shard)
        complete = [p for p in mine if (p / self.shard / "manifest.json").is_file()]
        doomed = set(complete[: -self.keep]) | (set(mine) - set(complete))
        for path in sorted(doomed):
            shutil.rmtree(path, ignore_errors=True)
