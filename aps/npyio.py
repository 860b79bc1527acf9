"""Reading ``.npy`` / ``.npz`` arrays from several threads at once.

numpy parses each array's header with ``ast.literal_eval``, and under CPython 3.11.7 (this
project's CI interpreter) two threads parsing at the same moment can fail with "SystemError:
AST constructor recursion depth mismatch": the parser's recursion counter is shared. Pservers
read checkpoints off the event loop, in threads, and several servers of one process (tests, an
embedded cluster) load at once; a clean-clone run failed a reshard test that way. So every
array read of the checkpoint and export readers goes through :data:`_HEADERS`, one lock: the
reads it serialises are one logical shard's file or one memory-mapped header at a time.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any, BinaryIO

import numpy as np

#: held while numpy parses an array header (see the module's note)
_HEADERS = threading.Lock()


def load(file: str | os.PathLike[str] | BinaryIO, **options: Any) -> Any:
    """``np.load(file, allow_pickle=False, **options)``: an array (memory-mapped with
    ``mmap_mode``), or an ``NpzFile`` whose members are read with :func:`members`."""
    with _HEADERS:
        return np.load(file, allow_pickle=False, **options)


def members(npz: Any, names: Iterable[str]) -> dict[str, np.ndarray]:
    """The named arrays of an open ``NpzFile``, read under the lock."""
    with _HEADERS:
        return {name: npz[name] for name in names}
