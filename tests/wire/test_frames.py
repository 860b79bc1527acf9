"""FrameDecoder: sans-IO framing fed whole, byte by byte, in random splits, with trailing bytes,
and refusing bad headers as soon as the 24 header bytes are in (no sockets here)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aps import wire
from aps.errors import LocalProtocolError, RemoteProtocolError
from aps.wire.frame import HEADER, MAGIC, PROTOCOL_VERSION, Flag, Frame, FrameDecoder, encode_header

HS = wire.HEADER_SIZE


def raw_frame(opcode: int, request_id: int, payload: bytes, flags: int = 0) -> bytes:
    return encode_header(opcode, flags, request_id, len(payload)) + payload


def drain(decoder: FrameDecoder) -> list[Frame]:
    out = []
    while (frame := decoder.next_frame()) is not None:
        out.append(frame)
    return out


def feed_in_pieces(decoder: FrameDecoder, data: bytes, cuts: list[int]) -> list[Frame]:
    """Feed ``data`` cut at ``cuts`` and drain after every piece (like a socket would)."""
    frames: list[Frame] = []
    prev = 0
    for cut in sorted(set(c for c in cuts if 0 < c < len(data))) + [len(data)]:
        decoder.receive_data(data[prev:cut])
        frames += drain(decoder)
        prev = cut
    return frames


def as_tuple(frame: Frame) -> tuple[int, int, int, bytes]:
    return (frame.opcode, frame.flags, frame.request_id, bytes(frame.payload))


# ---------------------------------------------------------------- header layout


def test_header_is_24_bytes_little_endian() -> None:
    head = encode_header(5, int(Flag.FINAL | Flag.SYNC), 0x0102030405060708, 0x11223344, max_frame=0xFFFFFFFF)
    assert len(head) == HS == 24
    assert head[:2] == MAGIC == b"AP"
    assert head[2] == PROTOCOL_VERSION
    assert head[3] == 5
    assert head[4:6] == (6).to_bytes(2, "little")
    assert head[6:8] == b"\0\0"
    assert head[8:16] == (0x0102030405060708).to_bytes(8, "little")
    assert head[16:20] == (0x11223344).to_bytes(4, "little")
    assert head[20:24] == b"\0\0\0\0"


def test_encode_header_refuses_locally() -> None:
    with pytest.raises(LocalProtocolError):
        encode_header(1, 0, 0, 101, max_frame=100)
    with pytest.raises(LocalProtocolError):
        encode_header(1, 0, 1 << 64, 0)
    with pytest.raises(LocalProtocolError):
        encode_header(1, 0, -1, 0)
    assert len(encode_header(1, 0, (1 << 64) - 1, 100, max_frame=100)) == HS


# ---------------------------------------------------------------- whole / byte at a time / splits


FRAMES = [
    (wire.Op.PING, 1, b""),
    (wire.Op.PULL_SPARSE, 2, bytes(range(40))),
    (wire.Op.STATS, (1 << 64) - 1, b"x" * 1000),
    (wire.Op.BARRIER, 7, b"\0" * 8),
]
STREAM = b"".join(raw_frame(op, rid, body) for op, rid, body in FRAMES)
EXPECTED = [(int(op), 0, rid, body) for op, rid, body in FRAMES]


def test_whole_stream_at_once() -> None:
    dec = FrameDecoder()
    dec.receive_data(STREAM)
    assert dec.buffered == len(STREAM)
    assert [as_tuple(f) for f in drain(dec)] == EXPECTED
    assert dec.buffered == 0
    assert dec.next_frame() is None


def test_one_byte_at_a_time() -> None:
    dec = FrameDecoder()
    frames = feed_in_pieces(dec, STREAM, list(range(1, len(STREAM))))
    assert [as_tuple(f) for f in frames] == EXPECTED
    assert dec.buffered == 0


def test_one_byte_at_a_time_returns_frame_exactly_on_last_byte() -> None:
    data = raw_frame(wire.Op.PING, 9, b"abcdefgh")
    dec = FrameDecoder()
    for i, b in enumerate(data):
        dec.receive_data(bytes([b]))
        frame = dec.next_frame()
        if i < len(data) - 1:
            assert frame is None
        else:
            assert frame is not None and as_tuple(frame) == (int(wire.Op.PING), 0, 9, b"abcdefgh")


@pytest.mark.parametrize("seed", range(20))
def test_random_splits(seed: int) -> None:
    rng = random.Random(seed)
    cuts = [rng.randrange(1, len(STREAM)) for _ in range(rng.randrange(1, 30))]
    dec = FrameDecoder()
    assert [as_tuple(f) for f in feed_in_pieces(dec, STREAM, cuts)] == EXPECTED


def test_back_to_back_with_trailing_partial_frame() -> None:
    tail = raw_frame(wire.Op.PULL_DENSE, 99, b"0123456789abcdef")
    dec = FrameDecoder()
    dec.receive_data(STREAM + tail[:30])  # the next frame's header and 6 payload bytes
    assert [as_tuple(f) for f in drain(dec)] == EXPECTED
    assert dec.buffered == 30
    assert dec.next_frame() is None  # stays buffered
    dec.receive_data(tail[30:35])
    assert dec.next_frame() is None
    dec.receive_data(tail[35:] + tail[:3])  # completes it, plus 3 bytes of yet another frame
    frame = dec.next_frame()
    assert frame is not None and as_tuple(frame) == (int(wire.Op.PULL_DENSE), 0, 99, b"0123456789abcdef")
    assert dec.next_frame() is None
    assert dec.buffered == 3
    dec.receive_data(tail[3:])
    assert [as_tuple(f) for f in drain(dec)] == [(int(wire.Op.PULL_DENSE), 0, 99, b"0123456789abcdef")]


def test_trailing_partial_header_only() -> None:
    dec = FrameDecoder()
    one = raw_frame(wire.Op.PING, 1, b"")
    dec.receive_data(one + one[:HS - 1])
    assert [f.request_id for f in drain(dec)] == [1]
    assert dec.buffered == HS - 1
    dec.receive_data(one[HS - 1 :])
    assert [f.request_id for f in drain(dec)] == [1]


def test_large_body_goes_to_own_buffer_and_trailing_bytes_survive() -> None:
    # > 256 KiB: the decoder switches to its direct-body path
    body = np.random.default_rng(0).integers(0, 256, size=300_000, dtype=np.uint8).tobytes()
    big = raw_frame(wire.Op.PUSH_DENSE_GRAD, 5, body, flags=int(Flag.FINAL))
    small = raw_frame(wire.Op.PING, 6, b"12345678")
    data = small + big + small + big[:100]
    for cuts in ([], [HS + 10], [len(small) + HS + 5, len(small) + 200_000], list(range(1000, len(data), 65536))):
        dec = FrameDecoder()
        frames = feed_in_pieces(dec, data, cuts)
        assert [f.request_id for f in frames] == [6, 5, 6]
        assert bytes(frames[1].payload) == body
        assert frames[1].flags == int(Flag.FINAL)
        assert dec.buffered == 100
        dec.receive_data(big[100:])
        last = dec.next_frame()
        assert last is not None and bytes(last.payload) == body
        assert dec.next_frame() is None and dec.buffered == 0


def test_large_body_chunk_carries_next_frames() -> None:
    body = bytes(300_000)
    big = raw_frame(wire.Op.PULL_DENSE, 1, body)
    small = raw_frame(wire.Op.PING, 2, b"")
    dec = FrameDecoder()
    dec.receive_data(big[: HS + 1000])
    assert dec.next_frame() is None  # a big body buffer now exists
    dec.receive_data(big[HS + 1000 :] + small + small[:5])  # body end + a frame + a partial frame
    assert [f.request_id for f in drain(dec)] == [1, 2]
    assert dec.buffered == 5


def test_payload_is_writable_and_aligned() -> None:
    for size in (8, 64, 4096, 300_000):
        dec = FrameDecoder()
        # an odd number of leading bytes would misalign a naive view into the receive buffer
        dec.receive_data(raw_frame(wire.Op.PING, 1, b"abc" * 3 + b"\0" * 7) + raw_frame(wire.Op.PING, 2, bytes(size)))
        frames = drain(dec)
        payload = frames[1].payload
        assert isinstance(payload, bytearray) and len(payload) == size
        arr = np.frombuffer(payload, dtype=np.float64)
        assert arr.ctypes.data % 8 == 0
        arr[0] = 1.5  # writable
        assert np.frombuffer(payload, dtype=np.float64)[0] == 1.5


# ---------------------------------------------------------------- bad headers


def bad_header(magic: bytes = MAGIC, version: int = PROTOCOL_VERSION, reserved: int = 0, length: int = 8,
               reserved2: int = 0) -> bytes:
    return HEADER.pack(magic, version, 17, 0, reserved, 1, length, reserved2)


@pytest.mark.parametrize(
    "head",
    [
        bad_header(magic=b"XX"),
        bad_header(magic=b"GE"),
        bad_header(version=PROTOCOL_VERSION + 1),
        bad_header(version=0),
        bad_header(reserved=1),
        bad_header(reserved2=0x80000000),
        bad_header(length=1001),
        bad_header(length=0xFFFFFFFF),
    ],
    ids=["magic", "http-ish", "version+1", "version0", "reserved", "reserved2", "len>max", "len-huge"],
)
def test_bad_header_raises_once_header_complete_and_stays_broken(head: bytes) -> None:
    dec = FrameDecoder(max_frame=1000)
    dec.receive_data(head[: HS - 1])
    assert dec.next_frame() is None  # not a full header yet: nothing to judge
    dec.receive_data(head[HS - 1 :])  # the header is complete, no body byte arrived
    with pytest.raises(RemoteProtocolError):
        dec.next_frame()
    # broken for good, even if perfectly valid bytes follow
    dec.receive_data(raw_frame(wire.Op.PING, 2, b""))
    with pytest.raises(RemoteProtocolError):
        dec.next_frame()
    with pytest.raises(RemoteProtocolError):
        dec.next_frame()


def test_length_exactly_max_frame_is_accepted() -> None:
    dec = FrameDecoder(max_frame=1000)
    dec.receive_data(raw_frame(wire.Op.PING, 3, bytes(1000)))
    frame = dec.next_frame()
    assert frame is not None and len(frame.payload) == 1000


def test_declared_length_one_over_max_is_refused() -> None:
    dec2 = FrameDecoder(max_frame=4096)
    dec2.receive_data(HEADER.pack(MAGIC, PROTOCOL_VERSION, 1, 0, 0, 1, 4097, 0))
    with pytest.raises(RemoteProtocolError, match="max frame"):
        dec2.next_frame()


# ---------------------------------------------------------------- property tests


frame_st = st.tuples(
    st.integers(0, 255),  # opcode
    st.integers(0, 0xFFFF),  # flags
    st.integers(0, (1 << 64) - 1),  # request id
    st.binary(max_size=300),
)


@settings(max_examples=150, deadline=None)
@given(frames=st.lists(frame_st, min_size=1, max_size=8), data=st.data())
def test_property_any_chunking_gives_same_frames(frames, data) -> None:
    stream = b"".join(raw_frame(op, rid, body, flags) for op, flags, rid, body in frames)
    cuts = data.draw(st.lists(st.integers(1, max(1, len(stream) - 1)), max_size=20))
    dec = FrameDecoder(max_frame=4096)
    got = [as_tuple(f) for f in feed_in_pieces(dec, stream, cuts)]
    assert got == [(op, flags, rid, body) for op, flags, rid, body in frames]
    assert dec.buffered == 0


@settings(max_examples=100, deadline=None)
@given(frames=st.lists(frame_st, min_size=1, max_size=4), keep=st.integers(1, HS + 50), data=st.data())
def test_property_trailing_partial_stays_buffered(frames, keep, data) -> None:
    stream = b"".join(raw_frame(op, rid, body, flags) for op, flags, rid, body in frames)
    op, flags, rid, body = frames[-1]
    extra = raw_frame(op, rid, body, flags)
    keep = min(keep, len(extra) - 1)
    cuts = data.draw(st.lists(st.integers(1, len(stream) + keep), max_size=10))
    dec = FrameDecoder(max_frame=4096)
    got = feed_in_pieces(dec, stream + extra[:keep], cuts)
    assert len(got) == len(frames)
    assert dec.buffered == keep
    dec.receive_data(extra[keep:])
    assert [as_tuple(f) for f in drain(dec)] == [(op, flags, rid, body)]


def test_buffered_receive_writes_a_large_body_in_place_and_keeps_trailing_bytes() -> None:
    """The BufferedProtocol path: get_buffer() lends the large body's own buffer, so the frame's
    payload is the very buffer the bytes were written into; bytes after it go to the receive
    buffer and come out as the next frame."""
    big = bytes(range(256)) * 2048  # 512 KiB: past the direct-body threshold
    data = raw_frame(6, 1, big) + raw_frame(17, 2, b"tail-8by")
    dec = FrameDecoder()
    lent: list[memoryview] = []
    frames: list[Frame] = []
    pos = 0
    while pos < len(data):  # as a protocol does: lend, fill, then parse what is complete
        room = dec.get_buffer(-1)
        n = min(len(room), len(data) - pos, 70_000)
        room[:n] = data[pos : pos + n]
        lent.append(room)
        dec.buffer_updated(n)
        frames += drain(dec)
        pos += n
    assert [(f.opcode, f.request_id) for f in frames] == [(6, 1), (17, 2)]
    assert bytes(frames[0].payload) == big and bytes(frames[1].payload) == b"tail-8by"
    body = np.asarray(frames[0].payload)
    in_place = [np.shares_memory(np.asarray(view), body) for view in lent]
    # written in place from the first read after its header on, never copied after
    assert in_place[0] is False and all(in_place[1:-1]) and in_place[-1] is False, in_place
    assert dec.buffered == 0


def test_a_huge_body_gets_its_own_buffer_only_once_2_mib_of_it_is_in() -> None:
    """A body of 4 MiB or more would be backed by transparent huge pages (numpy asks for them),
    which commit 2 MiB at the first byte: it stays in the receive buffer until 2 MiB of it has
    arrived, so a peer cannot commit 2 MiB per declared body by sending a few bytes of each.
    A smaller large body gets its own buffer at once."""
    mib = 1024 * 1024

    def lent_after(length: int, sent: int) -> memoryview:
        dec = FrameDecoder()
        data = encode_header(6, 0, 1, length) + bytes(sent)
        dec.receive_data(data)
        assert drain(dec) == []
        return dec.get_buffer(-1)

    assert isinstance(lent_after(8 * mib, 1 * mib).obj, bytearray)  # still the receive buffer
    assert isinstance(lent_after(8 * mib, 2 * mib).obj, np.ndarray)  # its own buffer from here
    assert isinstance(lent_after(3 * mib, 1000).obj, np.ndarray)  # not huge: its own at once


def test_buffered_receive_grows_for_a_small_frame_bigger_than_the_room() -> None:
    payload = b"x" * 200_000  # under the direct-body threshold, over the initial buffer
    data = raw_frame(9, 5, payload) * 2
    dec = FrameDecoder()
    for i in range(0, len(data), 1000):
        room = dec.get_buffer(1000)
        assert len(room) >= 1000
        piece = data[i : i + 1000]
        room[: len(piece)] = piece
        dec.buffer_updated(len(piece))
    frames = drain(dec)
    assert [bytes(f.payload) for f in frames] == [payload, payload] and dec.buffered == 0
