"""Writes that survive a crash: a file's bytes and a directory's entries fsync'd before what
depends on them (a manifest after its files, a done marker after its manifest)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync the file."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: into a temporary beside it, fsync'd, then renamed
    over ``path``, so a reader sees the old file or the whole new one, never one being written
    (call :func:`fsync_dir` after it for the rename to be durable)."""
    tmp = path.with_name(f".{path.name}.tmp")
    write_synced(tmp, data)
    os.replace(tmp, path)


def _libc_syncfs() -> ctypes._CFuncPtr | None:
    """Linux's syncfs(2), or None where the C library lacks it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return libc.syncfs
    except (OSError, AttributeError):
        return None


def sync_tree(directory: Path) -> None:
    """Make every file written under ``directory`` durable, before a manifest names them.

    Why not an fsync per file: a hash table's checkpoint is one file per logical shard (1024 of
    them), and each fsync waits for its own journal commit (~7 ms here): 7 s to save a table of
    5,000 keys. On Linux one ``syncfs`` on the directory's filesystem flushes them all in one
    commit (it reports write-back errors since Linux 5.8); elsewhere, or where syncfs is missing,
    each regular file under ``directory`` is fsync'd."""
    syncfs = _libc_syncfs()
    if syncfs is not None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            if syncfs(fd) == 0:
                return
            code = ctypes.get_errno()
            if code != errno.ENOSYS:
                raise OSError(code, f"syncfs({directory}): {os.strerror(code)}")
        finally:
            os.close(fd)
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
