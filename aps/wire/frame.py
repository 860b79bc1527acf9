"""Frame header and the incremental (sans-IO) frame decoder.

A frame is a fixed 24-byte little-endian header followed by ``length`` payload bytes::

    0  2s  magic     b"AP"
    2  u8  version   PROTOCOL_VERSION
    3  u8  opcode    see messages.Op
    4  u16 flags     Flag bits
    6  u16 reserved  must be 0
    8  u64 request   id chosen by the client, echoed in the reply
    16 u32 length    payload bytes that follow
    20 u32 reserved  must be 0

The decoder checks the header - including ``length`` against the configured maximum - before a
single payload byte is buffered, so a peer cannot make us allocate a huge body by lying.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntFlag

import numpy as np

from ..errors import LocalProtocolError, RemoteProtocolError

MAGIC = b"AP"
PROTOCOL_VERSION = 3
HEADER = struct.Struct("<2sBBHHQII")
HEADER_SIZE = HEADER.size  # 24
#: default largest payload accepted (and produced) by either side; bigger arrays are chunked
DEFAULT_MAX_FRAME = 64 * 1024 * 1024
#: payloads longer than this are received straight into their own buffer instead of the shared one
_DIRECT_BODY = 256 * 1024
#: numpy backs arrays of this many bytes and more with transparent huge pages (where enabled) ...
_HUGE_BODY = 4 * 1024 * 1024
#: ... of this size: such a body gets its own buffer once this much of it has arrived
_HUGE_PAGE = 2 * 1024 * 1024
#: a receive buffer grown past this (by the start of a huge body) is replaced by a small one
#: once that body has its own buffer
_KEEP_BUF = 1024 * 1024
#: initial size of a decoder's receive buffer (it grows, by doubling, to hold a whole small
#: frame): small, because every connection has one from its first byte, a hostile idle one too
_RECV_CHUNK = 32 * 1024
#: get_buffer() lends at least this much room, compacting first; the transport's size hint
#: (uvloop asks for 64 KiB on every read) never grows the buffer by itself, a frame does
_MIN_ROOM = 16 * 1024


class Flag(IntFlag):
    """Bits of the header's flags field."""

    NONE = 0
    REPLY = 1  # set on every server -> client frame
    FINAL = 2  # last chunk of a logical push: the optimizer step counter advances after it
    SYNC = 4  # sync-mode push: held until every trainer has pushed, then applied once
    #: PUSH_SPARSE_*: the ids are unique and ascending (a trainer's merged push); the server
    #: verifies it in its one pass over the ids and refuses the push (BAD_REQUEST) if not
    SORTED = 8
    #: PULL_SPARSE / PULL_DENSE: tag the reply with the model version it was read at (aps-serve
    #: does, in the reply's optional ``model_version``; a pserver ignores the bit)
    MODEL_VERSION = 16


@dataclass(slots=True)
class Frame:
    """One decoded frame: header fields plus its payload: a writable, 8-byte aligned buffer (a
    bytearray, or for a large body a memoryview of its own numpy buffer)."""

    opcode: int
    flags: int
    request_id: int
    payload: bytearray | memoryview


def encode_header(opcode: int, flags: int, request_id: int, length: int, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """The 24 header bytes; refuses (locally) what the peer would refuse."""
    if length > max_frame:
        raise LocalProtocolError(f"payload of {length} bytes exceeds the max frame of {max_frame}")
    if not 0 <= request_id < 1 << 64:
        raise LocalProtocolError(f"request id {request_id} does not fit in 64 bits")
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, opcode, flags, 0, request_id, length, 0)


class FrameDecoder:
    """Bytes in, frames out. Feed with :meth:`receive_data`, drain with :meth:`next_frame`.

    Never touches a socket. Raises :class:`RemoteProtocolError` on a bad header; after that the
    stream is unusable (there is no way to find the next frame boundary) and must be closed.

    ``on_header(opcode, request_id, length)``, when set, is called once per frame as soon as its
    header is in and valid, before any of its body is buffered (a server charges the declared
    length to a memory budget there). Whatever it raises comes out of :meth:`next_frame` and
    leaves the stream broken, as a bad header does.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self.on_header: Callable[[int, int, int], None] | None = None
        self._announced = False  # on_header was called for the frame at the front
        # received bytes live in _buf[_pos:_end]; _buf has room after _end that
        # get_buffer() lends to the transport (asyncio.BufferedProtocol), so nothing is
        # concatenated per read
        self._buf = bytearray(_RECV_CHUNK)
        self._pos = 0
        self._end = 0
        self._pending: tuple[int, int, int] | None = None  # header of the body being filled
        self._body: memoryview | None = None
        self._filled = 0
        self._lent_body = False  # the last get_buffer() view was into _body
        self._broken = False

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes received from the peer."""
        view = memoryview(data)
        while len(view):
            room = self.get_buffer(len(view))
            n = min(len(room), len(view))
            room[:n] = view[:n]
            room.release()
            self.buffer_updated(n)
            view = view[n:]

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Writable room for the next bytes from the peer (``asyncio.BufferedProtocol``): the rest
        of a large frame's own body buffer while one is being received, else free space at the
        end of the receive buffer (compacted, or grown by doubling when that leaves less than
        16 KiB). ``sizehint`` is honoured only within the room the buffer already has: a buffer
        grows because a frame needs it, not because the transport could read more, so a
        connection that sends a few bytes costs a few KiB, not the hint. Call
        :meth:`buffer_updated` with how many bytes were written into it."""
        self._lent_body = self._body is not None and self._filled < len(self._body)
        if self._lent_body:
            assert self._body is not None
            return memoryview(self._body)[self._filled :]
        want = _MIN_ROOM
        if len(self._buf) - self._end < want:
            self._compact()
            if len(self._buf) - self._end < want:  # grow by doubling: amortised, never per read
                # a new buffer, not a resize: a view lent earlier may still be alive
                grown = bytearray(len(self._buf) + max(want, len(self._buf)))
                grown[: self._end] = memoryview(self._buf)[: self._end]
                self._buf = grown
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were written at the start of the last :meth:`get_buffer` view."""
        if self._lent_body:
            self._filled += nbytes
        else:  # the receive buffer (a complete large body's trailing bytes go there too)
            self._end += nbytes

    @property
    def pending_length(self) -> int | None:
        """Declared payload length of the frame being received (header in, body not complete),
        or None between frames."""
        if self._body is not None:
            return len(self._body)
        if self._announced:
            return int(HEADER.unpack_from(self._buf, self._pos)[6])
        return None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        header = HEADER_SIZE if self._body is not None else 0  # the header of a large body in progress
        return self._end - self._pos + self._filled + header

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None when more bytes are needed."""
        if self._broken:
            raise RemoteProtocolError("stream is broken by an earlier protocol error")
        if self._body is not None:
            if self._filled < len(self._body):
                return None
            assert self._pending is not None
            opcode, flags, request_id = self._pending
            frame = Frame(opcode, flags, request_id, self._body)
            self._body, self._pending, self._filled = None, None, 0
            self._announced = False
            return frame
        buf, pos, end = self._buf, self._pos, self._end
        if end - pos < HEADER_SIZE:
            if pos == end:
                self._pos = self._end = 0
            return None
        magic, version, opcode, flags, reserved, request_id, length, reserved2 = HEADER.unpack_from(buf, pos)
        if not self._announced:
            self._check_header(magic, version, reserved, reserved2, length)
            if self.on_header is not None:
                try:
                    self.on_header(opcode, request_id, length)
                except BaseException:
                    self._broken = True
                    raise
            self._announced = True
        start = pos + HEADER_SIZE
        available = end - start
        if available >= length:
            payload = buf[start : start + length]  # its own copy: the receive buffer is reused
            self._pos = start + length
            if self._pos == end:
                self._pos = self._end = 0
            self._announced = False
            return Frame(opcode, flags, request_id, payload)
        if length < _DIRECT_BODY or (length >= _HUGE_BODY and available < _HUGE_PAGE):
            return None
        # a large body gets its own buffer once its header is in (a huge one once 2 MiB of it
        # is); get_buffer() lends the rest of it to the transport, so it is received in place,
        # never copied. The buffer is numpy's uninitialised memory (malloc): pages are committed
        # as the peer's bytes are written into them, so a peer that declares a body and sends
        # little of it commits what it sent, never what it declared. numpy asks for transparent
        # huge pages on arrays of 4 MiB and more, which commit 2 MiB at the first byte written:
        # such a body starts in the receive buffer (growing by doubling), so that the bytes a
        # peer must send before anything is committed in huge pages stay on the order of what
        # gets committed. (The receive buffer used to hold every large body's first half, then a
        # zero-filled bytearray took it over: three passes over memory per received byte, most
        # of a geo exchange's server time.)
        body = memoryview(np.empty(length, np.uint8))
        body[:available] = memoryview(buf)[start:end]
        self._pos = self._end = 0
        if len(self._buf) > _KEEP_BUF:
            self._buf = bytearray(_RECV_CHUNK)  # a new one: a view lent earlier may still be alive
        self._body, self._pending, self._filled = body, (opcode, flags, request_id), available
        return None

    def _check_header(self, magic: bytes, version: int, reserved: int, reserved2: int, length: int) -> None:
        problem = None
        if magic != MAGIC:
            problem = f"bad magic {magic!r} (not an aps peer?)"
        elif version != PROTOCOL_VERSION:
            problem = f"protocol version {version}, this side speaks {PROTOCOL_VERSION}"
        elif reserved or reserved2:
            problem = "reserved header fields are not zero"
        elif length > self.max_frame:
            problem = f"declared payload of {length} bytes exceeds the max frame of {self.max_frame}"
        if problem is not None:
            self._broken = True
            raise RemoteProtocolError(problem)

    def _compact(self) -> None:
        """Move the unread bytes to the front of the receive buffer."""
        if self._pos:
            n = self._end - self._pos
            self._buf[:n] = self._buf[self._pos : self._end]
            self._pos, self._end = 0, n
