"""The write gate: what a push sees while a save or load of the tables runs off the event loop.

Saving a large table takes seconds (a 5 GB shard is mostly disk time), loading one too. That
work runs in a thread so the loop keeps answering pings, pulls and stats. Writes are another
matter: a push applied while the save thread copies a table would land in some rows of the
checkpoint and not in others, and a push applied during a load would be overwritten by it.

So while a save, a load or a table creation is running, requests that change tables (pushes of
every kind, create_table, load, save) wait behind the gate in arrival order and run, in that
order, as soon as it opens. Reads (pulls, table info, stats, ping, barriers) never wait. A
checkpoint therefore holds exactly the pushes answered before the SAVE arrived, and none after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class WriteGate:
    """Holds writes while exclusive work (a save, a load) runs; releases them in arrival order."""

    def __init__(self) -> None:
        self._open: asyncio.Future[None] | None = None  # not None: closed, set when it opens
        self._waiting = 0  # writes parked behind the gate that have not run yet

    @property
    def busy(self) -> bool:
        """True while a write must wait: exclusive work runs, or earlier writes still queue."""
        return self._open is not None or self._waiting > 0

    def close(self) -> None:
        """Close the gate (synchronously, so a write arriving right after is already held)."""
        if self._open is not None:
            raise RuntimeError("the write gate is already closed")
        self._open = asyncio.get_running_loop().create_future()

    def open(self) -> None:
        """Let the held writes run, in the order they arrived."""
        opened, self._open = self._open, None
        if opened is not None and not opened.done():
            opened.set_result(None)

    def hold(self, work: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        """Close the gate now and run ``work`` (a save, a load, a shrink) while writes wait.
        Not a coroutine: the gate is closed when this returns, before anything is awaited."""
        self.close()
        return self.exclusive(work)

    async def exclusive(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work`` with the gate closed by the caller; open it however ``work`` ends."""
        try:
            return await work()
        finally:
            self.open()

    async def after(self, write: Callable[[], T | Awaitable[T]]) -> T:
        """Run ``write`` once the gate is open and every write held before it has run."""
        self._waiting += 1
        try:
            while self._open is not None:
                await asyncio.shield(self._open)
            # an awaited done future does not yield: yield once so writes woken before us run first
            await asyncio.sleep(0)
            while self._open is not None:  # a save that one of those started holds us again
                await asyncio.shield(self._open)
        finally:
            self._waiting -= 1
        result = write()
        if isinstance(result, Awaitable):
            return await result  # type: ignore[no-any-return]
        return result
