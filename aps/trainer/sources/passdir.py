"""Pass folders: ``ROOT/<day>/<pass>/``, trained in order, each once, when complete.

This is how the reference's users feed online training ("day/pass" training, PaddleRec's online
trainer): an upstream job writes an hour's (or a few minutes') events into a new folder and
marks it complete with a done-file. Here:

* days are the folders directly in ``ROOT``, passes the folders in a day; both sort *naturally*
  (digit runs by value: ``2`` before ``10``), so ``20261126/7`` and ``20261126/0007`` both work,
  as long as one job keeps one convention. Names starting with ``.`` or ``_`` are skipped.
* a pass is complete once its done-file exists; the default name, ``_SUCCESS``, is what Hadoop
  and Spark jobs write into an output folder when they finish it, so their output needs no extra
  step. A pass's data are its regular files whose names start with neither ``.`` nor ``_``
  (the done-file itself, ``_logs``, temporaries).
* passes are taken strictly in order: while the next pass is incomplete the trainer waits for
  it, even if a later one is complete, because training out of order would be silent.
* the run ends cleanly when (a) the root's own done-file ``ROOT/_SUCCESS`` exists and every
  complete pass was trained ("no more passes are coming"), (b) the ``last_pass`` was trained, or
  (c) no next pass became complete within ``wait`` seconds; :attr:`PassDir.stop_reason` says which.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from typing import Any

import structlog

from ...errors import ConfigError
from ..files import split_files
from .base import Pass

log = structlog.get_logger("aps.trainer")

DEFAULT_DONE_FILE = "_SUCCESS"
#: seconds between two "still waiting" lines while the trainer waits for a pass
WAIT_LOG_EVERY = 60.0
_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key that orders digit runs by value (``p2`` before ``p10``); two spellings of one
    number (``0007``, ``7``) order by value, then by spelling, so the order is always total."""
    parts = _DIGITS.split(name)
    return tuple((int(p), p) if i % 2 else p for i, p in enumerate(parts))


def pass_key(name: str) -> tuple[tuple[Any, ...], ...]:
    """Sort key of a pass name ``DAY/PASS``."""
    return tuple(natural_key(part) for part in name.split("/"))


def _visible(name: str) -> bool:
    return not name.startswith((".", "_"))


def _subdirs(path: str) -> list[str]:
    try:
        with os.scandir(path) as it:
            names = [e.name for e in it if _visible(e.name) and e.is_dir()]
    except FileNotFoundError:
        return []
    return sorted(names, key=natural_key)


def pass_files(folder: str, done_file: str = DEFAULT_DONE_FILE) -> list[str]:
    """The data files of a pass folder (regular, not hidden, not ``_``-prefixed, not the
    done-file), sorted."""
    with os.scandir(folder) as it:
        return sorted(e.path for e in it if _visible(e.name) and e.name != done_file and e.is_file())


class PassDir:
    """Passes of ``root`` for trainer ``trainer_id`` of ``num_trainers`` (each trainer trains its
    share of a pass's files, split as :func:`aps.trainer.files.split_files` splits a file list)."""

    def __init__(
        self,
        root: str,
        *,
        trainer_id: int = 0,
        num_trainers: int = 1,
        done_file: str = DEFAULT_DONE_FILE,
        wait: float = 600.0,
        last_pass: str | None = None,
        poll: float = 1.0,
    ) -> None:
        if not os.path.isdir(root):
            raise ConfigError(f"pass root {root!r}: no such directory")
        if not done_file or "/" in done_file:
            raise ConfigError(f"done-file must be a plain file name, got {done_file!r}")
        if not wait >= 0:
            raise ConfigError(f"pass wait must be >= 0 seconds, got {wait}")
        if not poll > 0:
            raise ConfigError(f"poll interval must be > 0 seconds, got {poll}")
        if last_pass is not None and last_pass.count("/") != 1:
            raise ConfigError(f"last pass must be DAY/PASS, got {last_pass!r}")
        self.root = root
        self.trainer_id = trainer_id
        self.num_trainers = num_trainers
        self.done_file = done_file
        self.wait = wait
        self.last_pass = last_pass
        self.poll = poll
        self.stop_reason: str | None = None
        self._after: str | None = None
        self._seq = 0

    async def open(self, position: dict[str, Any] | None) -> None:
        """Continue after the checkpoint's pass (``{"pass": "DAY/PASS", "seq": n}``), or start at
        the first pass."""
        if position:
            if position.get("source") != "passes" or not isinstance(position.get("pass"), str):
                raise ConfigError(f"the checkpoint's position {position!r} is not a pass folder's")
            self._after, self._seq = position["pass"], int(position["seq"]) + 1

    def pending(self) -> list[str]:
        """Names of every pass after the last one taken, in order, complete or not."""
        out = []
        after = pass_key(self._after) if self._after else None
        for day in _subdirs(self.root):
            for name in _subdirs(os.path.join(self.root, day)):
                full = f"{day}/{name}"
                if after is None or pass_key(full) > after:
                    out.append(full)
        return out

    def _complete(self, name: str) -> bool:
        return os.path.exists(os.path.join(self.root, name, self.done_file))

    def _finished(self) -> str | None:
        """Why no pass will come any more, or None."""
        if self.last_pass is not None and self._after is not None and pass_key(self._after) >= pass_key(self.last_pass):
            return f"last pass {self.last_pass} trained"
        if os.path.exists(os.path.join(self.root, self.done_file)) and not self.pending():
            return f"end marker {os.path.join(self.root, self.done_file)} found and every pass before it trained"
        return None

    async def next_pass(self) -> Pass | None:
        started = time.monotonic()
        logged = 0.0
        while True:
            reason = self._finished()
            if reason is not None:
                self.stop_reason = reason
                return None
            pending = self.pending()
            if pending and self._complete(pending[0]):
                return self._take(pending[0])
            waited = time.monotonic() - started
            if waited >= self.wait:
                what = f"pass {pending[0]} not complete (no {self.done_file})" if pending else "no new pass folder"
                self.stop_reason = f"{what} within --pass-wait {self.wait:g} s"
                return None
            if logged == 0.0 or waited - logged >= WAIT_LOG_EVERY:
                log.info(
                    "waiting for the next pass",
                    next=pending[0] if pending else f"a folder after {self._after or '(none yet)'}",
                    done_file=self.done_file,
                    waited_s=round(waited, 1),
                    timeout_s=self.wait,
                )
                logged = max(waited, 1e-9)
            await asyncio.sleep(min(self.poll, max(0.0, self.wait - waited)) or self.poll)

    def _take(self, name: str) -> Pass:
        files = split_files(pass_files(os.path.join(self.root, name), self.done_file), self.trainer_id, self.num_trainers)
        seq = self._seq
        self._after, self._seq = name, seq + 1
        return Pass(seq, name, files, {"source": "passes", "pass": name, "seq": seq}, day=name.split("/")[0])

    async def position(self, done: Pass) -> dict[str, Any]:
        """The pass's name and number: every trainer takes the same passes."""
        return done.position

    async def committed(self, done: Pass) -> None:
        """Nothing to do: a pass folder's position lives in the checkpoint alone."""

    async def aclose(self) -> None:
        """Nothing held."""
