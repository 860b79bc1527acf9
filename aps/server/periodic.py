"""Work a pserver does every so often on its own: its checkpoints (``--checkpoint-every``,
autosave.py) and shrinks of its hash tables (``--shrink-every``, the core's
:meth:`~aps.server.hash_upkeep.HashUpkeep.shrink_all`).

One loop for both, handed only the operation to run: a failure is logged and the next run comes
on time (a full disk or a bad table must not stop the server), and stopping lets a run under
way finish rather than leave it half done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

log = structlog.get_logger("aps.server")


class Periodic:
    """Runs ``work`` every ``every`` seconds (0: never) until stopped; a failure is logged as
    ``failed`` with ``context``."""

    def __init__(self, work: Callable[[], Awaitable[Any]], every: float, failed: str, **context: Any) -> None:
        self.work = work
        self.every = every
        self.failed = failed
        self.context = context
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.every > 0:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Stop the schedule, letting a run under way finish."""
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), self.every)
                return
            except TimeoutError:
                pass
            try:
                await self.work()
            except Exception as exc:  # the server keeps serving; each failure is logged
                log.error(self.failed, error=str(exc), **self.context)
