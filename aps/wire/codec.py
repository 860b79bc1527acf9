"""Field encoding: how scalars, strings, byte strings and ndarrays are laid out in a payload.

Every message is a fixed sequence of typed fields (see messages.py). Arrays are sent raw, with
their data aligned to 8 bytes from the start of the payload so the receiver can take zero-copy
``np.frombuffer`` views that numba kernels accept.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..errors import LocalProtocolError, RemoteProtocolError

_SCALARS = {
    "u8": struct.Struct("<B"),
    "u16": struct.Struct("<H"),
    "u32": struct.Struct("<I"),
    "u64": struct.Struct("<Q"),
    "i64": struct.Struct("<q"),
    "f64": struct.Struct("<d"),
}
_U16 = _SCALARS["u16"]
_U32 = _SCALARS["u32"]
_ARRAY_HEAD = struct.Struct("<BB6x")  # dtype code, ndim, padding
_DIM = struct.Struct("<Q")

#: dtype codes on the wire (stable)
DTYPE_CODES: dict[np.dtype, int] = {
    np.dtype("<f4"): 1,
    np.dtype("<i8"): 2,
    np.dtype("u1"): 3,
    np.dtype("<f8"): 4,
    np.dtype("<i4"): 5,
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
_MAX_NDIM = 8
_ZEROS = bytes(8)


def _pad(offset: int) -> int:
    return -offset % 8


class PayloadWriter:
    """Collects a payload as a list of buffers (arrays are referenced, not copied)."""

    __slots__ = ("parts", "size", "_small")

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.size = 0
        self._small = bytearray()

    def _flush_small(self) -> None:
        if self._small:
            self.parts.append(bytes(self._small))
            self._small.clear()

    def write(self, kind: str, value: Any) -> None:
        if kind in _SCALARS:
            try:
                raw = _SCALARS[kind].pack(value)
            except struct.error as exc:
                raise LocalProtocolError(f"value {value!r} does not fit a {kind}") from exc
        elif kind == "str":
            encoded = str(value).encode("utf-8")
            if len(encoded) > 0xFFFF:
                raise LocalProtocolError("string field longer than 65535 bytes")
            raw = _U16.pack(len(encoded)) + encoded
        elif kind == "bytes":
            raw = _U32.pack(len(value)) + bytes(value)
        elif kind == "arr":
            self._write_array(value)
            return
        else:  # pragma: no cover - schema bug
            raise LocalProtocolError(f"unknown field kind {kind}")
        self._small += raw
        self.size += len(raw)

    def _write_array(self, array: Any) -> None:
        arr = np.asarray(array)
        dtype = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        code = DTYPE_CODES.get(np.dtype(dtype))
        if code is None:
            raise LocalProtocolError(f"dtype {arr.dtype} cannot be sent")
        if arr.ndim > _MAX_NDIM:
            raise LocalProtocolError(f"arrays of {arr.ndim} dimensions cannot be sent")
        head = _ARRAY_HEAD.pack(code, arr.ndim) + b"".join(_DIM.pack(d) for d in arr.shape)
        head += _ZEROS[: _pad(self.size + len(head))]
        self._small += head
        self.size += len(head)
        if arr.nbytes:
            data = np.ascontiguousarray(arr, dtype=dtype)
            if data.nbytes < 4096:
                self._small += data.tobytes()
            else:
                self._flush_small()
                self.parts.append(memoryview(data).cast("B"))
            self.size += data.nbytes
        pad = _pad(self.size)
        self._small += _ZEROS[:pad]
        self.size += pad

    def finish(self) -> list[Any]:
        self._flush_small()
        return self.parts


class PayloadReader:
    """Reads fields back from a received payload; every bound is checked."""

    __slots__ = ("buf", "view", "pos")

    def __init__(self, buf: bytearray | bytes) -> None:
        self.buf = buf
        self.view = memoryview(buf)
        self.pos = 0

    def _need(self, n: int, what: str) -> int:
        start = self.pos
        if n < 0 or start + n > len(self.buf):
            raise RemoteProtocolError(f"payload truncated while reading {what}")
        self.pos = start + n
        return start

    def read(self, kind: str) -> Any:
        if kind in _SCALARS:
            st = _SCALARS[kind]
            return st.unpack_from(self.buf, self._need(st.size, kind))[0]
        if kind == "str":
            (n,) = _U16.unpack_from(self.buf, self._need(2, "str length"))
            start = self._need(n, "str")
            try:
                return bytes(self.view[start : start + n]).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RemoteProtocolError("string field is not UTF-8") from exc
        if kind == "bytes":
            (n,) = _U32.unpack_from(self.buf, self._need(4, "bytes length"))
            start = self._need(n, "bytes")
            return bytes(self.view[start : start + n])
        if kind == "arr":
            return self._read_array()
        raise RemoteProtocolError(f"unknown field kind {kind}")  # pragma: no cover

    def _read_array(self) -> np.ndarray:
        code, ndim = _ARRAY_HEAD.unpack_from(self.buf, self._need(_ARRAY_HEAD.size, "array header"))
        dtype = CODE_DTYPES.get(code)
        if dtype is None:
            raise RemoteProtocolError(f"unknown dtype code {code}")
        if ndim > _MAX_NDIM:
            raise RemoteProtocolError(f"array with {ndim} dimensions")
        shape = tuple(_DIM.unpack_from(self.buf, self._need(8, "array shape"))[0] for _ in range(ndim))
        self._need(_pad(self.pos), "array padding")
        count = 1
        for d in shape:
            count *= d
        nbytes = count * dtype.itemsize
        start = self._need(nbytes, "array data")
        self._need(_pad(self.pos), "array padding")
        if count == 0:
            try:
                return np.empty(shape, dtype=dtype)
            except ValueError as exc:  # e.g. shape (0, 2**62): numpy refuses the other dimension
                raise RemoteProtocolError(f"array shape {shape} is too big") from exc
        return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start).reshape(shape)

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise RemoteProtocolError(f"{len(self.buf) - self.pos} unexpected trailing payload bytes")
