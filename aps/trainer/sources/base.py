"""The contract between the online trainer and its data sources."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Pass:
    """One unit of online training: scored, trained, then (maybe) checkpointed.

    ``seq`` counts the passes of a job from 0 and goes on across restarts (it is saved in the
    checkpoint), so every trainer of a job calls the same pass by the same number; ``name`` is
    what a person reads (``20261126/0007`` for a pass folder). ``files`` are this trainer's files
    of the pass (possibly none: it still takes part in the pass's barriers). ``position`` is what
    the checkpoint written after this pass records, for a restart to continue after it."""

    seq: int
    name: str
    files: list[str]
    position: dict[str, Any] = field(default_factory=dict)
    #: records of this pass read a second time (a stream's entries pending since a crash)
    reread: int = 0
    #: the day the pass belongs to (a pass folder's day; a stream's UTC date): a new day is
    #: when an exporting trainer shrinks its hash tables and writes a base
    day: str = ""


class Source(Protocol):
    """What :func:`aps.trainer.online.run_passes` needs of a source."""

    #: why :meth:`next_pass` returned None (a line for the log and the result)
    stop_reason: str | None

    async def open(self, position: dict[str, Any] | None) -> None:
        """Start reading after ``position`` (a checkpoint's, on resume) or from the start."""

    async def next_pass(self) -> Pass | None:
        """The next pass, waiting for it as the source allows; None when no more come."""

    async def position(self, done: Pass) -> dict[str, Any]:
        """What the checkpoint written after ``done`` records, for a restart to go on after it
        (asked of trainer 0 at that checkpoint, once every trainer has read ``done``)."""

    async def committed(self, done: Pass) -> None:
        """A checkpoint covering ``done`` and every pass before it is written."""

    async def aclose(self) -> None:
        """Release connections and temporary files."""
