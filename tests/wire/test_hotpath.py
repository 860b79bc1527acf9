"""The hot pair's one-step codecs (aps/wire/hotpath.py) against the generic field-by-field codec:
same bytes out, same messages (and the same errors) in."""

from __future__ import annotations

import numpy as np
import pytest

from aps import wire
from aps.errors import LocalProtocolError, RemoteProtocolError
from aps.wire.messages import decode_generic, encode_generic


def _frame(raw: bytes) -> wire.Frame:
    decoder = wire.FrameDecoder(1 << 20)
    decoder.receive_data(raw)
    frame = decoder.next_frame()
    assert frame is not None
    return frame


def _bytes(parts: list) -> bytes:
    return b"".join(bytes(p) for p in parts)


@pytest.mark.parametrize("table", ["t", "emb", "ü" * 7, "x" * 300, ""])
@pytest.mark.parametrize("count", [0, 1, 2, 7, 512, 513, 3000])
def test_pull_request_bytes_and_message_equal_the_generic_codec(table: str, count: int) -> None:
    ids = np.random.default_rng(count).integers(0, 1 << 40, count).astype(np.int64)
    msg = wire.PullSparse(table=table, ids=ids)
    raw = _bytes(wire.encode(msg, 77, flags=0))
    assert raw == _bytes(encode_generic(msg, 77, flags=0))
    fast, slow = wire.decode(_frame(raw)), decode_generic(_frame(raw))
    assert isinstance(fast, wire.PullSparse) and fast.table == slow.table == table
    assert fast.ids.dtype == np.int64 and np.array_equal(fast.ids, ids) and np.array_equal(slow.ids, ids)


@pytest.mark.parametrize("shape", [(1, 64), (3, 10), (1, 1), (2, 3), (0, 5), (16, 64), (17, 64), (100, 100)])
def test_rows_reply_bytes_and_message_equal_the_generic_codec(shape: tuple[int, int]) -> None:
    values = np.random.default_rng(3).random(shape, dtype=np.float32)
    msg = wire.ArrayReply(op=wire.Op.PULL_SPARSE, values=values, version=12345)
    raw = _bytes(wire.encode(msg, 9))
    assert raw == _bytes(encode_generic(msg, 9))
    fast, slow = wire.decode(_frame(raw)), decode_generic(_frame(raw))
    assert isinstance(fast, wire.ArrayReply) and fast.version == slow.version == 12345
    assert fast.op == slow.op == wire.Op.PULL_SPARSE
    assert fast.values.dtype == np.float32 and fast.values.shape == shape
    assert np.array_equal(fast.values, values) and np.array_equal(slow.values, values)
    if values.size:
        fast.values[0, 0] = 1.0  # a writable view of the received payload, as the generic one is


@pytest.mark.parametrize("shape", [(1, 4), (3, 10), (100, 100)])
def test_rows_reply_with_a_model_version_equals_the_generic_codec(shape: tuple[int, int]) -> None:
    values = np.random.default_rng(4).random(shape, dtype=np.float32)
    msg = wire.ArrayReply(op=wire.Op.PULL_SPARSE, values=values, version=7, model_version=-(1 << 62))
    raw = _bytes(wire.encode(msg, 9))
    assert raw == _bytes(encode_generic(msg, 9))
    plain = _bytes(wire.encode(wire.ArrayReply(op=wire.Op.PULL_SPARSE, values=values, version=7), 9))
    assert len(raw) == len(plain) + 8  # the optional field at the end; without it, the frame of before
    fast, slow = wire.decode(_frame(raw)), decode_generic(_frame(raw))
    assert isinstance(fast, wire.ArrayReply) and isinstance(slow, wire.ArrayReply)
    assert (fast.version, fast.model_version) == (slow.version, slow.model_version) == (7, -(1 << 62))
    assert np.array_equal(fast.values, values)
    assert wire.decode(_frame(plain)).model_version is None  # type: ignore[attr-defined]


def test_other_arrays_take_the_generic_codec_and_still_match() -> None:
    for ids in (np.arange(5, dtype=np.int32), np.arange(12, dtype=np.int64).reshape(3, 4), np.arange(10, dtype=np.int64)[::2]):
        msg = wire.PullSparse(table="t", ids=ids)
        assert _bytes(wire.encode(msg, 1)) == _bytes(encode_generic(msg, 1))
    for values in (np.arange(6, dtype=np.float64).reshape(2, 3), np.ones(4, np.float32), np.ones((4, 3), np.float32).T):
        msg = wire.ArrayReply(op=wire.Op.PULL_DENSE, values=values, version=1)
        assert _bytes(wire.encode(msg, 1)) == _bytes(encode_generic(msg, 1))


def test_refusals_are_the_generic_ones() -> None:
    msg = wire.PullSparse(table="t", ids=np.arange(3, dtype=np.int64))
    with pytest.raises(LocalProtocolError, match="exceeds the max frame"):
        wire.encode(msg, 1, max_frame=16)
    with pytest.raises(LocalProtocolError, match="64 bits"):
        wire.encode(msg, -1)


def _mangled(raw: bytes, payload: bytes) -> wire.Frame:
    frame = _frame(raw)
    return wire.Frame(frame.opcode, frame.flags, frame.request_id, bytearray(payload))


@pytest.mark.parametrize("cut", [0, 1, 2, 5, 13, 20, -8, -1])
def test_broken_payloads_fail_as_the_generic_codec_fails(cut: int) -> None:
    for msg in (wire.PullSparse(table="tab", ids=np.arange(4, dtype=np.int64)),
                wire.ArrayReply(op=wire.Op.PULL_SPARSE, values=np.ones((2, 3), np.float32), version=4)):
        raw = _bytes(wire.encode(msg, 5))
        payload = raw[wire.HEADER_SIZE:]
        # 16 bytes more, not 8: 8 would be an ARRAY reply's optional model_version
        for broken in (payload[:cut], payload + b"\0" * 16, b"\xff\xff" + payload[2:]):
            frame = _mangled(raw, broken)
            with pytest.raises(RemoteProtocolError) as generic:
                decode_generic(frame)
            with pytest.raises(RemoteProtocolError) as fast:
                wire.decode(_mangled(raw, broken))
            assert str(fast.value) == str(generic.value)


def test_a_table_name_that_is_not_utf8_is_refused_as_before() -> None:
    raw = _bytes(wire.encode(wire.PullSparse(table="ab", ids=np.arange(1, dtype=np.int64)), 5))
    payload = bytearray(raw[wire.HEADER_SIZE:])
    payload[2:4] = b"\xff\xfe"
    with pytest.raises(RemoteProtocolError, match="UTF-8"):
        wire.decode(_mangled(raw, bytes(payload)))
