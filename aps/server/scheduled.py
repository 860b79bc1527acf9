"""A pserver's work on its own clock, beside the requests: periodic checkpoints, scheduled
shrinks, the trainers' leases and the kernels' warm-up, started when the server listens and
stopped, last checkpoint included, after its requests are drained.

Why apart from the listener: none of it is transport (aps-serve has none of it), and why apart
from the request handlers: each is a timer with its own start and stop, not a request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from .autosave import AutoCheckpoints, SaveShard
from .config import ServerConfig
from .liveness import TrainerLeases
from .periodic import Periodic
from .warmup import warm_up_kernels

log = structlog.get_logger("aps.server")


class ScheduledWork:
    """The training core's timers (:meth:`ServerCore.start` / :meth:`ServerCore.stop`)."""

    def __init__(
        self, config: ServerConfig, save_own_shard: SaveShard, shrink_all: Callable[[], Awaitable[object]], leases: TrainerLeases,
    ) -> None:
        directory = config.checkpoint_dir or config.resume
        #: the periodic checkpoints (None without ``checkpoint_dir`` or ``resume``)
        self.checkpoints = (
            AutoCheckpoints(save_own_shard, config.server_index, config.num_servers, directory,
                            config.checkpoint_every, config.keep_checkpoints)
            if directory else None
        )
        #: every hash table shrunk every ``shrink_every`` seconds (0: never)
        self.shrinks = Periodic(shrink_all, config.shrink_every, "scheduled shrink failed")
        self.leases = leases

    def start(self, heard_all: bool) -> None:
        """``heard_all``: the leases start as if every trainer had just been heard from (a
        resumed server's trainers are already running, so none is late yet)."""
        warm_up_kernels()
        self.leases.start(heard_all=heard_all)
        if self.checkpoints is not None:
            self.checkpoints.start()
        self.shrinks.start()

    async def stop(self, checkpoint: bool) -> None:
        """A shrink under way and a periodic save being written finish first; ``checkpoint``:
        then one last save (a failed one is logged: the server still stops)."""
        await self.shrinks.stop()
        if self.checkpoints is None:
            return
        await self.checkpoints.stop()
        if checkpoint:
            try:
                await self.checkpoints.save_now("shutdown")
            except Exception as exc:  # still stop; the operator reads why there is no checkpoint
                log.error("checkpoint at shutdown failed", error=str(exc))
