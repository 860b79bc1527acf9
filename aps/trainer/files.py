"""Which input files a trainer reads, and which of its workers reads each one.

Data is distributed by whole files, as in Paddle Fleet (``fleet.split_files``): every trainer is
given the same file list, and each one computes its own share from its id. That only works if all
trainers compute the same split, so :func:`split_files` sorts first — a list built with
``os.listdir`` on two machines may come in different orders, and the reference's unsorted split
then silently gives some files to two trainers and others to none.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

from ..errors import ConfigError


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
