"""SHA-256 of files: what an export's manifests record for every file it holds, so that a
reader (aps-serve) can refuse a file that was truncated, overwritten or copied wrong."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: bytes read per call while hashing a file
_CHUNK = 1 << 20


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 of a file's bytes, read in chunks (a table file may be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def bytes_sha256(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def dir_sha256(directory: Path) -> dict[str, str]:
    """``{file name: sha256}`` of every plain file directly in ``directory``, sorted by name."""
    return {p.name: file_sha256(p) for p in sorted(directory.iterdir()) if p.is_file()}
