"""Which input files a trainer reads, and which of its workers reads each one.

Data is distributed by whole files, as in Paddle Fleet (``fleet.split_files``): every trainer is
given the same file list, and each one computes its own share from its id. That only works if all
trainers compute the same split, so :func:`split_files` sorts first — a list built with
``os.listdir`` on two machines may come in different orders, and the reference's unsorted split
then silently gives some files to two trainers and others to none.

Whole files leave trainers and workers idle when there are fewer files than them, and real data
often comes as one file (a day of logs, Criteo's ``train.txt``, a census table): one worker of
two then trains while the other waits, at half the machine's speed. So with fewer files than
takers, :func:`share_files` cuts the files' bytes, read as one run end to end, into as many
spans as there are takers, each cut moved to just past the end of a line (:class:`FilePart`):
every line is read by exactly one taker, and each span has nearly the same bytes. A worker
reads a part from its first byte; the line numbers its errors name are the file's own
(:func:`lines_before`).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import ConfigError, DataError

#: how much a cut reads at a time while it looks for the end of a line
_SCAN_BYTES = 1 << 16


def split_files(files: Sequence[str], trainer_id: int, num_trainers: int) -> list[str]:
    """The files trainer ``trainer_id`` of ``num_trainers`` reads (Paddle's ``split_files``).

    The sorted list is cut into ``num_trainers`` contiguous blocks whose sizes differ by at most
    one; the first ``len(files) % num_trainers`` trainers get the larger blocks. The blocks are
    disjoint and together hold every file, whatever order ``files`` came in. With fewer files
    than trainers some trainers get an empty list — the caller decides whether that is an error.
    """
    if isinstance(files, (str, bytes)):
        raise ConfigError("split_files expects a sequence of file names, not a single string")
    if num_trainers < 1:
        raise ConfigError(f"num_trainers must be >= 1, got {num_trainers}")
    if not 0 <= trainer_id < num_trainers:
        raise ConfigError(f"trainer_id {trainer_id} not in [0, {num_trainers})")
    ordered = sorted(str(f) for f in files)
    for a, b in zip(ordered, ordered[1:]):
        if a == b:
            # a repeated name would be trained twice, possibly by two trainers: never what was meant
            raise ConfigError(f"file {a!r} appears more than once in the input list")
    block, remainder = divmod(len(ordered), num_trainers)
    start = trainer_id * block + min(trainer_id, remainder)
    size = block + (1 if trainer_id < remainder else 0)
    return ordered[start : start + size]


def assign_to_workers(files: Sequence[str], num_workers: int) -> list[list[str]]:
    """Deal ``files`` round-robin to ``num_workers`` workers (worker ``k`` gets files k, k+n, ...).

    Returns one list per worker, possibly empty: when there are fewer files than workers the
    caller sees the empty lists and should warn, since those workers will sit idle.
    """
    if num_workers < 1:
        raise ConfigError(f"num_workers must be >= 1, got {num_workers}")
    out: list[list[str]] = [[] for _ in range(num_workers)]
    for k, f in enumerate(files):
        out[k % num_workers].append(f)
    return out


def _dir_files(directory: str) -> list[str]:
    """Regular, non-hidden files directly inside ``directory``, sorted (no recursion)."""
    with os.scandir(directory) as it:
        names = [e.path for e in it if not e.name.startswith(".") and e.is_file()]
    return sorted(names)


def expand_inputs(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Turn command-line inputs into a list of files.

    * a directory stands for its regular files (sorted, hidden files and subdirectories skipped),
    * a pattern with ``*``, ``?`` or ``[`` is globbed (matches sorted; matching directories are
      expanded as above),
    * anything else must be an existing file.

    Duplicates are dropped, keeping the first occurrence. A missing path, a pattern that matches
    nothing or a directory without files is a :class:`ConfigError` naming it: training on
    silently fewer files than asked for is worse than not starting.
    """
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise ConfigError("expand_inputs expects a sequence of paths, not a single path")
    out: list[str] = []
    seen: set[str] = set()

    def add(names: list[str]) -> None:
        for name in names:
            if name not in seen:
                seen.add(name)
                out.append(name)

    for raw in paths:
        path = os.fspath(raw)
        if os.path.isdir(path):
            found = _dir_files(path)
            if not found:
                raise ConfigError(f"input directory {path!r} contains no files")
            add(found)
        elif os.path.isfile(path):
            add([path])
        elif glob.has_magic(path):
            found = []
            for match in sorted(glob.glob(path)):
                if os.path.isdir(match):
                    found.extend(_dir_files(match))
                elif os.path.isfile(match):
                    found.append(match)
            if not found:
                raise ConfigError(f"input pattern {path!r} matches no files")
            add(found)
        else:
            raise ConfigError(f"input path {path!r} does not exist")
    return out


@dataclass(frozen=True, slots=True)
class FilePart:
    """The whole lines of ``path`` between byte ``start`` and byte ``stop`` (``start`` is 0 or
    just past a newline, ``stop`` just past a newline or the file's end)."""

    path: str
    start: int
    stop: int

    def __str__(self) -> str:
        return f"{self.path}[{self.start}:{self.stop}]"


def _line_end_at_or_after(f: BinaryIO, offset: int, size: int) -> int:
    """The offset just past the first newline at or after ``offset`` in the open file ``f``,
    or ``size`` (where the scan stops) when none comes before it."""
    f.seek(offset)
    at = offset
    while at < size:
        block = f.read(_SCAN_BYTES)
        if not block:
            break
        found = block.find(b"\n")
        if found >= 0:
            return at + found + 1
        at += len(block)
    return size


def _as_part(item: str | FilePart) -> FilePart:
    """A whole file as the part that is all of it."""
    if isinstance(item, FilePart):
        return item
    try:
        return FilePart(item, 0, os.path.getsize(item))
    except OSError as exc:
        raise DataError(f"cannot open input: {exc.strerror or exc}", item) from exc


def cut_parts(inputs: Sequence[str | FilePart], takers: int) -> list[list[FilePart]]:
    """``inputs`` (files, or parts of them) read end to end, cut into ``takers`` spans of nearly
    equal bytes, each cut moved past the end of the line it falls in: taker ``k`` gets the parts
    of span ``k`` in input order (a span may cover the end of one file and the start of the
    next). A span can be empty when the data has fewer lines than takers; empty inputs give no
    part."""
    if takers < 1:
        raise ConfigError(f"takers must be >= 1, got {takers}")
    parts = [_as_part(item) for item in inputs]
    total = sum(p.stop - p.start for p in parts)
    out: list[list[FilePart]] = [[] for _ in range(takers)]
    base = 0  # bytes of the inputs before this one
    for part in parts:
        size = part.stop - part.start
        if size <= 0:
            continue
        # the line-aligned cuts inside this input, in order; one at its start or end needs no scan
        with open(part.path, "rb") as f:
            cuts = [part.start]
            for k in range(1, takers):
                wanted = part.start + total * k // takers - base  # where span k starts, in the file
                if wanted <= part.start:
                    cuts.append(part.start)
                elif wanted >= part.stop:
                    cuts.append(part.stop)
                else:  # the span starts with the line after the one that byte ``wanted - 1`` is in
                    cuts.append(max(cuts[-1], _line_end_at_or_after(f, wanted - 1, part.stop)))
            cuts.append(part.stop)
        for k in range(takers):
            if cuts[k + 1] > cuts[k]:
                out[k].append(FilePart(part.path, cuts[k], cuts[k + 1]))
        base += size
    return out


def share_files(files: Sequence[str | FilePart], takers: int, whole: bool = False) -> list[list[str | FilePart]]:
    """Each of ``takers``' inputs: whole files dealt round-robin (:func:`assign_to_workers`) when
    there are at least as many files as takers or ``whole`` is asked for (a pipe command reads
    whole files); otherwise line-aligned parts of them (:func:`cut_parts`), so no taker idles
    while there are more lines than takers."""
    if whole or len(files) >= takers:
        return [list(share) for share in assign_to_workers(files, takers)]
    return [list(share) for share in cut_parts(files, takers)]


def lines_before(part: FilePart) -> int:
    """How many lines of its file come before ``part``: the number its first line's error
    messages start from, minus one. Reads the file up to the part, once per part and reader."""
    if part.start == 0:
        return 0
    count = 0
    with open(part.path, "rb") as f:
        left = part.start
        while left > 0:
            block = f.read(min(left, 1 << 22))
            if not block:
                break
            count += block.count(b"\n")
            left -= len(block)
    return count
