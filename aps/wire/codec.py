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


#: header (dtype code, ndim, padding) plus the shape, one struct per ndim
_ARRAY_HEADS = tuple(struct.Struct(f"<BB6x{n}Q") for n in range(_MAX_NDIM + 1))
_SHAPES = tuple(struct.Struct(f"<{n}Q") for n in range(_MAX_NDIM + 1))
#: arrays whose dtype is sent as is (native little-endian), by dtype: the fast path
_NATIVE_CODES = dict(DTYPE_CODES)
#: arrays at most this big are copied into the small-fields buffer instead of sent by reference
_INLINE_ARRAY = 4096


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
        """Write one field of ``kind`` (see :func:`field_plan` for the compiled form)."""
        writer, arg = _WRITERS[kind]
        writer(self, value, arg)

    def scalar(self, value: Any, st: struct.Struct) -> None:
        try:
            raw = st.pack(value)
        except struct.error as exc:
            raise LocalProtocolError(f"value {value!r} does not fit a {st.format}") from exc
        self._small += raw
        self.size += len(raw)

    def string(self, value: Any, _: Any = None) -> None:
        encoded = str(value).encode("utf-8")
        if len(encoded) > 0xFFFF:
            raise LocalProtocolError("string field longer than 65535 bytes")
        self._small += _U16.pack(len(encoded))
        self._small += encoded
        self.size += 2 + len(encoded)

    def blob(self, value: Any, _: Any = None) -> None:
        self._small += _U32.pack(len(value))
        self._small += value
        self.size += 4 + len(value)

    def array(self, array: Any, _: Any = None) -> None:
        arr = array if type(array) is np.ndarray else np.asarray(array)
        code = _NATIVE_CODES.get(arr.dtype)
        dtype = arr.dtype
        if code is None:
            dtype = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
            code = DTYPE_CODES.get(np.dtype(dtype))
            if code is None:
                raise LocalProtocolError(f"dtype {arr.dtype} cannot be sent")
        ndim = arr.ndim
        if ndim > _MAX_NDIM:
            raise LocalProtocolError(f"arrays of {ndim} dimensions cannot be sent")
        head = _ARRAY_HEADS[ndim]
        small = self._small
        small += head.pack(code, ndim, *arr.shape)
        size = self.size + head.size
        pad = -size % 8  # the data starts 8-byte aligned in the payload
        if pad:
            small += _ZEROS[:pad]
            size += pad
        nbytes = arr.nbytes
        if nbytes:
            data = arr if arr.flags.c_contiguous and dtype is arr.dtype else np.ascontiguousarray(arr, dtype=dtype)
            if nbytes <= _INLINE_ARRAY:
                small += data.tobytes()
            else:
                self._flush_small()
                self.parts.append(memoryview(data).cast("B"))
                small = self._small
            size += nbytes
        pad = -size % 8
        if pad:
            small += _ZEROS[:pad]
        self.size = size + pad

    def finish(self) -> list[Any]:
        self._flush_small()
        return self.parts


class PayloadReader:
    """Reads fields back from a received payload; every bound is checked."""

    __slots__ = ("buf", "view", "pos", "end")

    def __init__(self, buf: bytearray | bytes) -> None:
        self.buf = buf
        self.view = memoryview(buf)
        self.pos = 0
        self.end = len(buf)

    def _need(self, n: int, what: str) -> int:
        start = self.pos
        if n < 0 or start + n > self.end:
            raise RemoteProtocolError(f"payload truncated while reading {what}")
        self.pos = start + n
        return start

    def read(self, kind: str) -> Any:
        """Read one field of ``kind`` (see :func:`field_plan` for the compiled form)."""
        entry = _READERS.get(kind)
        if entry is None:
            raise RemoteProtocolError(f"unknown field kind {kind}")  # pragma: no cover
        reader, arg = entry
        return reader(self, arg)

    def scalar(self, st: struct.Struct) -> Any:
        start = self.pos
        if start + st.size > self.end:
            raise RemoteProtocolError(f"payload truncated while reading {st.format}")
        self.pos = start + st.size
        return st.unpack_from(self.buf, start)[0]

    def string(self, _: Any = None) -> str:
        (n,) = _U16.unpack_from(self.buf, self._need(2, "str length"))
        start = self._need(n, "str")
        try:
            return bytes(self.view[start : start + n]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RemoteProtocolError("string field is not UTF-8") from exc

    def blob(self, _: Any = None) -> bytes:
        (n,) = _U32.unpack_from(self.buf, self._need(4, "bytes length"))
        start = self._need(n, "bytes")
        return bytes(self.view[start : start + n])

    def array(self, _: Any = None) -> np.ndarray:
        code, ndim = _ARRAY_HEAD.unpack_from(self.buf, self._need(_ARRAY_HEAD.size, "array header"))
        dtype = CODE_DTYPES.get(code)
        if dtype is None:
            raise RemoteProtocolError(f"unknown dtype code {code}")
        if ndim > _MAX_NDIM:
            raise RemoteProtocolError(f"array with {ndim} dimensions")
        shape = _SHAPES[ndim].unpack_from(self.buf, self._need(8 * ndim, "array shape"))
        self._need(-self.pos % 8, "array padding")
        count = 1
        for d in shape:
            count *= d
        nbytes = count * dtype.itemsize
        start = self._need(nbytes, "array data")
        self._need(-self.pos % 8, "array padding")
        if count == 0:
            try:
                return np.empty(shape, dtype=dtype)
            except ValueError as exc:  # e.g. shape (0, 2**62): numpy refuses the other dimension
                raise RemoteProtocolError(f"array shape {shape} is too big") from exc
        arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=start)
        return arr if ndim == 1 else arr.reshape(shape)

    def done(self) -> None:
        if self.pos != self.end:
            raise RemoteProtocolError(f"{self.end - self.pos} unexpected trailing payload bytes")


_WRITERS: dict[str, tuple[Any, Any]] = {kind: (PayloadWriter.scalar, st) for kind, st in _SCALARS.items()}
_WRITERS.update({"str": (PayloadWriter.string, None), "bytes": (PayloadWriter.blob, None), "arr": (PayloadWriter.array, None)})
_READERS: dict[str, tuple[Any, Any]] = {kind: (PayloadReader.scalar, st) for kind, st in _SCALARS.items()}
_READERS.update({"str": (PayloadReader.string, None), "bytes": (PayloadReader.blob, None), "arr": (PayloadReader.array, None)})


class FieldPlan:
    """A message's fields compiled once: the writer and reader method of each field, so that
    encoding and decoding a message is a loop over prepared calls instead of a dispatch on
    kind names per field (the fixed cost that dominated a one-id request).

    A kind ending in ``?`` (``"arr?"``) is an optional trailing field: new within a protocol
    version, so frames without it keep their meaning. It is written only when its value is not
    None, and read as None when the payload ends before it; only optional fields may follow an
    optional one, and a present one after an absent one cannot be sent."""

    __slots__ = ("names", "writers", "readers", "required")

    def __init__(self, fields: tuple[tuple[str, str], ...]) -> None:
        kinds = [kind.rstrip("?") for _, kind in fields]
        for kind in kinds:
            if kind not in _WRITERS:
                raise LocalProtocolError(f"unknown field kind {kind}")
        optional = [kind.endswith("?") for _, kind in fields]
        self.required = optional.index(True) if True in optional else len(fields)
        if not all(optional[self.required :]):
            raise LocalProtocolError("only optional fields may follow an optional field")
        self.names = tuple(name for name, _ in fields)
        self.writers = tuple((name, *_WRITERS[kind]) for (name, _), kind in zip(fields, kinds))
        self.readers = tuple((name, *_READERS[kind]) for (name, _), kind in zip(fields, kinds))

    def write(self, writer: PayloadWriter, msg: Any) -> None:
        required = self.required
        if required == len(self.writers):  # no optional field: the hot path
            for name, method, arg in self.writers:
                method(writer, getattr(msg, name), arg)
            return
        for i, (name, method, arg) in enumerate(self.writers):
            value = getattr(msg, name)
            if i >= required and value is None:
                for later, _, _ in self.writers[i + 1 :]:
                    if getattr(msg, later) is not None:
                        raise LocalProtocolError(f"optional field {later!r} is set but {name!r} before it is not")
                return
            method(writer, value, arg)

    def read(self, reader: PayloadReader) -> dict[str, Any]:
        required = self.required
        if required == len(self.readers):  # no optional field: the hot path
            values = {name: method(reader, arg) for name, method, arg in self.readers}
            reader.done()
            return values
        values = {}
        for i, (name, method, arg) in enumerate(self.readers):
            values[name] = None if i >= required and reader.pos == reader.end else method(reader, arg)
        reader.done()
        return values
