"""Leftovers of saves that were killed midway: found and removed at the next save or at start.

A save writes its shard into a hidden temporary directory next to the final one and renames it
into place (checkpoint.py); a pserver killed midway leaves that temporary behind, as big as the
shard (489 MB was seen), and a save into the same directory only cleans its own. Saves go to a
new directory each epoch, so this module looks around: at every save, the save's directory and
its siblings (``model/epoch_*``); at start, the checkpoint root and directories two levels
below it. Only this server's shard's names are touched (``.shard-K-of-N.tmp-*``, and
``.shard-K-of-N.old-*``, the previous copy moved aside during the rename), and a temporary
that holds a complete shard whose final directory is missing (killed between the two renames)
is kept: it is the newest copy.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import structlog

log = structlog.get_logger("aps.server")


def _directories(top: Path, depth: int) -> Iterator[Path]:
    """``top`` and its subdirectories down to ``depth`` levels (not hidden, no symlinks)."""
    yield top
    if depth <= 0:
        return
    try:
        entries = list(os.scandir(top))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
            yield from _directories(Path(entry.path), depth - 1)


def _stale(directory: Path, name: str) -> Iterator[Path]:
    """Leftovers of killed saves of shard directory ``name`` in ``directory``."""
    final = directory / name
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        if entry.name.startswith(f".{name}.tmp-"):
            if final.is_dir() or not os.path.isfile(os.path.join(entry.path, "manifest.json")):
                yield Path(entry.path)
        elif entry.name.startswith(f".{name}.old-") and final.is_dir():
            yield Path(entry.path)


def remove_stale_saves(tops: list[Path], name: str, depth: int) -> list[Path]:
    """Remove the leftovers of killed saves of shard directory ``name`` (``shard-K-of-N``) in
    each of ``tops`` and their subdirectories down to ``depth`` levels; returns what went."""
    removed = []
    for top in tops:
        for directory in _directories(top, depth):
            for path in _stale(directory, name):
                shutil.rmtree(path, ignore_errors=True)
                if not path.exists():
                    removed.append(path)
                    log.warning("removed a stale temporary of a save that was killed midway", path=str(path))
    return removed
