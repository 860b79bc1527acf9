"""Reading ``.npy`` / ``.npz`` arrays from several threads at once, and writing small ``.npz``
files fast.

numpy parses each array's header with ``ast.literal_eval``, and under CPython 3.11.7 (this
project's CI interpreter) two threads parsing at the same moment can fail with "SystemError:
AST constructor recursion depth mismatch": the parser's recursion counter is shared. Pservers
read checkpoints off the event loop, in threads, and several servers of one process (tests, an
embedded cluster) load at once; a clean-clone run failed a reshard test that way. So every
array read of the checkpoint and export readers goes through :data:`_HEADERS`, one lock: the
reads it serialises are one logical shard's file or one memory-mapped header at a time.

A hash table's save writes 1,024 ``.npz`` files of a dozen arrays each, whatever the table's
size, and ``np.savez`` spends about 2 ms of Python a file on them (zipfile's members, numpy's
headers), 2 s a table: most of a small table's save, once an epoch. :func:`write_npz` writes the
same kind of archive (stored members, each a ``.npy`` file, read by ``np.load``) from a list of
headers and the arrays' own buffers, in one call.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
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


#: zip's limit for a member or an archive without its 64-bit extension
_ZIP32 = 0xFFFFFFFF
#: 1980-01-01 00:00, zip's earliest date: members carry no time (np.savez writes its own clock's)
_DOS_TIME, _DOS_DATE = 0, (0 << 9) | (1 << 5) | 1


def _npy_header(arr: np.ndarray) -> bytes:
    """The ``.npy`` (version 1.0) header of the C-contiguous ``arr``, padded as numpy pads it
    (magic, version, length and dictionary a multiple of 64 bytes)."""
    fields = {"descr": np.lib.format.dtype_to_descr(arr.dtype), "fortran_order": False, "shape": arr.shape}
    text = "{" + "".join(f"{key!r}: {value!r}, " for key, value in fields.items()) + "}"
    size = 10 + len(text) + 1  # magic 6, version 2, length 2, the text and its newline
    text += " " * (-size % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


def write_npz(path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray]) -> None:
    """What ``np.savez(path, **arrays)`` writes, about 10x faster for small arrays: a zip of
    stored (uncompressed) members ``NAME.npy``, written in one call from the arrays' buffers.
    Object arrays are refused (no pickle); archives past zip's 4 GiB limits go to ``np.savez``."""
    pieces: list[bytes | memoryview] = []
    central: list[bytes] = []
    offset = 0
    for name, value in arrays.items():
        arr = np.asarray(value)
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")  # (np.ascontiguousarray makes a 0-d array 1-d)
        if arr.dtype.hasobject:
            raise ValueError(f"array {name!r} holds Python objects; they are never written")
        header = _npy_header(arr)
        data = memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else b""
        size = len(header) + len(data)
        if size >= _ZIP32 or offset >= _ZIP32:
            np.savez(Path(path), allow_pickle=False, **arrays)  # zip64: rare enough for numpy's writer
            return
        crc = zlib.crc32(data, zlib.crc32(header))
        member = f"{name}.npy".encode()
        fixed = (20, 0, 0, _DOS_TIME, _DOS_DATE, crc, size, size, len(member), 0)  # stored, no flags, no extra
        pieces += [struct.pack("<IHHHHHIIIHH", 0x04034B50, *fixed), member, header, data]
        central.append(struct.pack("<IH", 0x02014B50, 20) + struct.pack("<HHHHHIIIHHHHHII", *fixed, 0, 0, 0, 0o600 << 16, offset)
                       + member)
        offset += 30 + len(member) + size
    directory = b"".join(central)
    if offset + len(directory) >= _ZIP32:
        np.savez(Path(path), allow_pickle=False, **arrays)
        return
    pieces += [directory, struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(central), len(central), len(directory), offset, 0)]
    with open(path, "wb") as f:
        f.writelines(pieces)
