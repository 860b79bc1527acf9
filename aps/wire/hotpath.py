"""One-step codecs for the hot pair: a PULL_SPARSE request and its ARRAY reply.

An online-serving client pulls one id at a time, and then the generic codec's field-by-field
dispatch (a writer or reader call per field, a dict of values, a dataclass built from it) is most
of what a request costs on either side. These functions write and read the same bytes in one
``struct`` call per part. They are not a second format: :func:`messages.encode` and
:func:`messages.decode` call them for these two messages, and the tests check them byte for byte
against the generic codec. Anything unusual (a big array, a dtype or shape the pull does not
use, a payload that does not parse) is left to the generic codec by returning None, so its
error messages stay the only ones.
"""

from __future__ import annotations

import struct

import numpy as np

from .codec import _INLINE_ARRAY, DTYPE_CODES
from .frame import HEADER, MAGIC, PROTOCOL_VERSION

_U16 = struct.Struct("<H")
_I64 = struct.Struct("<q")
_I64x2 = struct.Struct("<qq")
#: an int64 id vector's array header: dtype code, ndim 1, padding, length
_IDS_HEAD = struct.Struct("<BB6xQ")
#: a float32 row block's array header (dtype code, ndim 2, padding, rows, dim), then its data
#: starts 8-byte aligned at offset 24 of the reply payload
_ROWS_HEAD = struct.Struct("<BB6xQQ")
_I64_CODE = DTYPE_CODES[np.dtype("<i8")]
_F32_CODE = DTYPE_CODES[np.dtype("<f4")]
_I64_DTYPE = np.dtype("<i8")
_F32_DTYPE = np.dtype("<f4")
_ZEROS = bytes(8)


def encode_pull(table: str, ids: np.ndarray, request_id: int, flags: int, op: int, max_frame: int) -> bytes | None:
    """A whole PULL_SPARSE frame as one bytes object, or None (use the generic codec)."""
    if type(ids) is not np.ndarray or ids.dtype != _I64_DTYPE or ids.ndim != 1 or not ids.flags.c_contiguous:
        return None
    if ids.nbytes > _INLINE_ARRAY:  # checked before copying: a big array goes by reference
        return None
    data = ids.tobytes()
    name = table.encode("utf-8")
    if len(name) > 0xFFFF:
        return None
    head_end = 2 + len(name) + _IDS_HEAD.size
    pad = -head_end % 8
    size = head_end + pad + len(data)
    if size > max_frame or not 0 <= request_id < 1 << 64:
        return None
    return b"".join((
        HEADER.pack(MAGIC, PROTOCOL_VERSION, op, flags, 0, request_id, size, 0),
        _U16.pack(len(name)), name, _IDS_HEAD.pack(_I64_CODE, 1, len(ids)), _ZEROS[:pad], data,
    ))


def read_pull(payload: bytearray) -> tuple[str, np.ndarray] | None:
    """(table, ids) of a PULL_SPARSE payload, or None (let the generic codec read it)."""
    end = len(payload)
    if end < 2:
        return None
    (n,) = _U16.unpack_from(payload, 0)
    head = 2 + n
    if head + _IDS_HEAD.size > end:
        return None
    code, ndim, count = _IDS_HEAD.unpack_from(payload, head)
    start = head + _IDS_HEAD.size
    start += -start % 8
    if code != _I64_CODE or ndim != 1 or start + 8 * count != end:
        return None
    try:
        table = bytes(payload[2:head]).decode("utf-8")
    except UnicodeDecodeError:
        return None
    return table, np.frombuffer(payload, dtype=_I64_DTYPE, count=count, offset=start)


def encode_rows_reply(
    values: np.ndarray, version: int, op: int, request_id: int, flags: int, max_frame: int, model_version: int | None = None
) -> bytes | None:
    """A whole ARRAY reply frame carrying a few float32 rows (and the optional model version
    after the version), or None (use the generic codec)."""
    if values.dtype != _F32_DTYPE or values.ndim != 2 or not values.flags.c_contiguous:
        return None
    if values.nbytes > _INLINE_ARRAY:  # checked before copying: big replies go by reference
        return None
    data = values.tobytes()
    pad = -len(data) % 8
    tail = _I64.pack(version) if model_version is None else _I64x2.pack(version, model_version)
    size = _ROWS_HEAD.size + len(data) + pad + len(tail)
    if size > max_frame or not 0 <= request_id < 1 << 64:
        return None
    rows, dim = values.shape
    return b"".join((
        HEADER.pack(MAGIC, PROTOCOL_VERSION, op, flags, 0, request_id, size, 0),
        _ROWS_HEAD.pack(_F32_CODE, 2, rows, dim), data, _ZEROS[:pad], tail,
    ))


def read_rows_reply(payload: bytearray) -> tuple[np.ndarray, int, int | None] | None:
    """(rows, version, model version or None) of an ARRAY reply holding a float32 matrix, or
    None (generic codec)."""
    end = len(payload)
    if end < _ROWS_HEAD.size + 8:
        return None
    code, ndim, rows, dim = _ROWS_HEAD.unpack_from(payload, 0)
    if code != _F32_CODE or ndim != 2:
        return None
    count = rows * dim
    nbytes = 4 * count
    values_end = _ROWS_HEAD.size + nbytes + (-nbytes % 8)
    if count == 0 or end not in (values_end + 8, values_end + 16):
        return None
    (version,) = _I64.unpack_from(payload, values_end)
    model_version = _I64.unpack_from(payload, values_end + 8)[0] if end > values_end + 8 else None
    return np.frombuffer(payload, dtype=_F32_DTYPE, count=count, offset=_ROWS_HEAD.size).reshape(rows, dim), version, model_version
