"""Message encode/decode: every class round-trips, arrays keep dtype/shape/alignment, bad payloads
raise RemoteProtocolError, unsendable values raise LocalProtocolError (no sockets here)."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aps import wire
from aps.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from aps.wire.codec import CODE_DTYPES, DTYPE_CODES
from aps.wire.frame import Flag, Frame, FrameDecoder, encode_header
from aps.wire.messages import message_op

HS = wire.HEADER_SIZE
RNG = np.random.default_rng(1234)


# ---------------------------------------------------------------- helpers


def to_frames(data: bytes, max_frame: int = wire.DEFAULT_MAX_FRAME) -> list[Frame]:
    dec = FrameDecoder(max_frame)
    dec.receive_data(data)
    out = []
    while (f := dec.next_frame()) is not None:
        out.append(f)
    assert dec.buffered == 0
    return out


def roundtrip(msg: wire.Message, request_id: int = 7, flags: int = 0) -> tuple[wire.Message, Frame]:
    data = wire.encode_bytes(msg, request_id, flags)
    (frame,) = to_frames(data)
    assert frame.request_id == request_id
    return wire.decode(frame), frame


def assert_same(a: wire.Message, b: wire.Message) -> None:
    assert type(a) is type(b)
    for f in fields(a):  # type: ignore[arg-type]
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            x, y = np.asarray(x), np.asarray(y)
            assert y.dtype == x.dtype.newbyteorder("<") or y.dtype == x.dtype, f.name
            assert y.shape == x.shape, f.name
            assert np.ascontiguousarray(x, dtype=y.dtype).tobytes() == y.tobytes(), f.name  # bitwise (NaNs too)
        else:
            assert x == y, (f.name, x, y)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def i64(n: int, hi: int = 1 << 40) -> np.ndarray:
    return RNG.integers(0, hi, size=n, dtype=np.int64)


# one (or more) instance of every message class, with non-default values everywhere
SAMPLES: list[wire.Message] = [
    wire.Hello(client_id=(1 << 64) - 1, trainer_id=3),
    wire.Hello(client_id=12345, trainer_id=-1),
    wire.Auth(mac=bytes(range(32))),
    wire.CreateTable(spec_json='{"type": "SparseTable", "name": "emb", "rows": 10, "dim": 4}'),
    wire.TableInfo(table="fc/w:0"),
    wire.TableInfo(table="emb", detail=1),
    wire.PullSparse(table="emb", ids=i64(17)),
    wire.PushSparseGrad(table="e", ids=i64(5), values=f32(5, 3)),
    wire.PushSparseGrad(table="h", ids=np.array([-1, 0, -(1 << 63)], np.int64), values=f32(3, 2), based_on=4, shows=f32(3), clicks=f32(3)),
    wire.PushSparseGrad(table="h", ids=i64(2), values=f32(2, 2), shows=f32(2)),
    wire.PushSparseDelta(table="emb.delta", ids=i64(1), values=f32(1, 9)),
    wire.PullSparseChanged(table="emb", max_rows=1 << 40),
    wire.PullDense(table="w", block=(1 << 32) - 1, offset=(1 << 64) - 1, count=12),
    wire.PushDenseGrad(table="w", block=2, offset=8192, values=f32(1001)),
    wire.PushDenseDelta(table="w", block=0, offset=3, values=f32(7)),
    wire.Barrier(name="epoch-1", count=4, value=-(1 << 63)),
    wire.Barrier(name="", count=0, value=12),
    wire.Save(path="/tmp/ckpt/ü"),
    wire.Load(path="relative/dir"),
    wire.Stats(),
    wire.WorkerDone(trainer_id=9),
    wire.Ping(),
    wire.Shrink(table="emb", decay=0.5, threshold=2.0, ttl=100),
    wire.Shrink(table="emb"),
    wire.ShrinkReply(evicted=(1 << 64) - 1, keys=3),
    wire.Ok(op=wire.Op.CREATE_TABLE),
    wire.Ok(op=wire.Op.PUSH_SPARSE_GRAD),
    wire.Ok(op=wire.Op.AUTH),
    wire.HelloReply(server_index=2, num_servers=3, max_frame=8192, auth_required=1, nonce=b"\x00\xff" * 8),
    wire.TextReply(op=wire.Op.STATS, text=b'{"requests": 3}'),
    wire.TextReply(op=wire.Op.TABLE_INFO, text="ü".encode() * 100),
    wire.ArrayReply(op=wire.Op.PULL_SPARSE, values=f32(6, 5)),
    wire.ArrayReply(op=wire.Op.PULL_DENSE, values=f32(2000)),  # > 4096 bytes: referenced, not copied
    wire.ChangedReply(ids=i64(4), values=f32(4, 3), more=1),
    wire.ChangedReply(),
    wire.BarrierReply(total=(1 << 63) - 1),
    wire.BarrierReply(total=-5),
    wire.Error(code=int(ErrorCode.SHAPE_MISMATCH), retriable=0, message="table 'emb': bad shape ü"),
    wire.Error(code=int(ErrorCode.SHUTTING_DOWN), retriable=1, message=""),
]
REPLY_CLASSES = {wire.Ok, wire.HelloReply, wire.TextReply, wire.ArrayReply, wire.ChangedReply, wire.BarrierReply, wire.ShrinkReply}


def test_samples_cover_every_message_class() -> None:
    covered = {type(m) for m in SAMPLES}
    assert covered == set(wire.REQUESTS.values()) | REPLY_CLASSES | {wire.Error}
    assert set(wire.REPLIES.values()) <= REPLY_CLASSES  # a new reply class must be added to SAMPLES


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_roundtrip(msg: wire.Message) -> None:
    back, frame = roundtrip(msg, request_id=(1 << 64) - 2)
    assert_same(msg, back)
    assert frame.opcode == message_op(msg)
    is_reply = type(msg) in REPLY_CLASSES
    assert bool(frame.flags & Flag.REPLY) == is_reply
    assert len(frame.payload) == wire.payload_size(msg)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_roundtrip_keeps_request_flags(msg: wire.Message) -> None:
    flags = int(Flag.FINAL | Flag.SYNC)
    back, frame = roundtrip(msg, request_id=0, flags=flags)
    assert_same(msg, back)
    assert frame.flags & flags == flags


def test_encode_returns_header_first_and_large_arrays_by_reference() -> None:
    values = f32(3000)
    parts = wire.encode(wire.ArrayReply(op=wire.Op.PULL_DENSE, values=values), 1)
    assert bytes(parts[0][:2]) == b"AP"
    assert any(isinstance(p, memoryview) for p in parts)  # zero-copy for the big array
    assert sum(len(p) for p in parts) == HS + wire.payload_size(wire.ArrayReply(op=wire.Op.PULL_DENSE, values=values))


def test_error_frame_decodes_with_or_without_reply_flag() -> None:
    err = wire.Error(code=7, retriable=0, message="nope")
    for flags in (0, int(Flag.REPLY)):
        back, _ = roundtrip(err, flags=flags)
        assert isinstance(back, wire.Error) and back.code == 7 and back.message == "nope"


def test_request_and_reply_share_opcode_but_not_class() -> None:
    req, _ = roundtrip(wire.PullSparse(table="t", ids=i64(3)))
    rep, _ = roundtrip(wire.ArrayReply(op=wire.Op.PULL_SPARSE, values=f32(3, 2)))
    assert isinstance(req, wire.PullSparse) and isinstance(rep, wire.ArrayReply)
    assert rep.op == wire.Op.PULL_SPARSE


def test_many_messages_back_to_back_in_one_stream() -> None:
    stream = b"".join(wire.encode_bytes(m, i) for i, m in enumerate(SAMPLES))
    frames = to_frames(stream)
    assert [f.request_id for f in frames] == list(range(len(SAMPLES)))
    for msg, frame in zip(SAMPLES, frames):
        assert_same(msg, wire.decode(frame))


# ---------------------------------------------------------------- arrays


@pytest.mark.parametrize("dtype", sorted(DTYPE_CODES, key=lambda d: DTYPE_CODES[d]), ids=str)
@pytest.mark.parametrize("shape", [(0,), (0, 8), (3, 0), (5,), (2, 3), (2, 3, 4), (1,) * 8], ids=str)
def test_array_every_dtype_and_shape(dtype: np.dtype, shape: tuple[int, ...]) -> None:
    arr = (RNG.standard_normal(shape) * 100).astype(dtype)
    back, _ = roundtrip(wire.ArrayReply(op=wire.Op.PULL_DENSE, values=arr))
    assert isinstance(back, wire.ArrayReply)
    assert back.values.dtype == dtype and back.values.shape == shape
    assert np.array_equal(back.values, arr)
    assert back.values.flags.writeable


def test_dtype_codes_are_stable() -> None:
    assert {str(d): c for d, c in DTYPE_CODES.items()} == {"float32": 1, "int64": 2, "uint8": 3, "float64": 4, "int32": 5}
    assert CODE_DTYPES[1] == np.float32 and CODE_DTYPES[2] == np.int64


def test_big_endian_and_non_contiguous_arrays_are_sent_as_values() -> None:
    be = np.arange(12, dtype=">f4").reshape(3, 4)
    back, _ = roundtrip(wire.ArrayReply(op=wire.Op.PULL_SPARSE, values=be))
    assert back.values.dtype == np.dtype("<f4") and np.array_equal(back.values, be)
    strided = np.arange(40, dtype=np.int64)[::3]
    back, _ = roundtrip(wire.PullSparse(table="t", ids=strided))
    assert back.ids.dtype == np.int64 and np.array_equal(back.ids, strided)
    transposed = f32(4, 6).T
    back, _ = roundtrip(wire.PushSparseGrad(table="t", ids=i64(6), values=transposed))
    assert back.values.shape == (6, 4) and np.array_equal(back.values, transposed)


@pytest.mark.parametrize("bad", [np.zeros(3, np.int16), np.zeros(3, np.bool_), np.zeros(3, np.complex64),
                                 np.zeros(3, np.uint64), np.array(["a"])], ids=str)
def test_unsendable_dtype_is_local_error(bad: np.ndarray) -> None:
    with pytest.raises(LocalProtocolError):
        wire.encode(wire.ArrayReply(op=wire.Op.PULL_DENSE, values=bad), 1)


def test_too_many_dims_is_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        wire.encode(wire.ArrayReply(op=wire.Op.PULL_DENSE, values=np.zeros((1,) * 9, np.float32)), 1)


@pytest.mark.parametrize("name_len", range(1, 10))
@pytest.mark.parametrize("n", [0, 1, 3, 4])
def test_decoded_arrays_are_8_byte_aligned_and_writable(name_len: int, n: int) -> None:
    msg = wire.PushSparseGrad(table="t" * name_len, ids=i64(n), values=f32(n, 3))
    (frame,) = to_frames(wire.encode_bytes(msg, 1))
    back = wire.decode(frame)
    assert isinstance(back, wire.PushSparseGrad)
    for arr in (back.ids, back.values):
        assert arr.ctypes.data % 8 == 0
        assert arr.flags.writeable and arr.flags.c_contiguous
    assert np.array_equal(back.ids, msg.ids) and np.array_equal(back.values, msg.values)
    if n:
        back.values[0, 0] = 42.0  # writable in place (the server may update into it)
        assert back.values[0, 0] == 42.0
    # the same after a small odd-sized frame went first in the stream
    stream = wire.encode_bytes(wire.TableInfo(table="x" * 3), 0) + wire.encode_bytes(msg, 1)
    second = wire.decode(to_frames(stream)[1])
    assert second.values.ctypes.data % 8 == 0 and second.ids.ctypes.data % 8 == 0  # type: ignore[attr-defined]


def test_changed_reply_arrays_aligned() -> None:
    back, _ = roundtrip(wire.ChangedReply(ids=i64(3), values=f32(3, 5), more=0))
    assert back.ids.ctypes.data % 8 == 0 and back.values.ctypes.data % 8 == 0  # type: ignore[attr-defined]


# ---------------------------------------------------------------- scalar / string limits


@pytest.mark.parametrize(
    "msg",
    [
        wire.Barrier(name="b", count=1 << 32),
        wire.Barrier(name="b", count=-1),
        wire.Barrier(name="b", value=1 << 63),
        wire.BarrierReply(total=-(1 << 63) - 1),
        wire.WorkerDone(trainer_id=-1),
        wire.Hello(client_id=-1),
        wire.Hello(client_id=1 << 64),
        wire.Hello(trainer_id=1 << 63),
        wire.PullDense(table="w", offset=1 << 64),
        wire.TableInfo(table="x" * 65536),
        wire.Save(path="é" * 40000),  # 80000 utf-8 bytes
        wire.Error(code=1 << 16, message=""),
    ],
    ids=lambda m: type(m).__name__,
)
def test_field_out_of_range_is_local_error(msg: wire.Message) -> None:
    with pytest.raises(LocalProtocolError):
        wire.encode(msg, 1)


def test_limits_that_fit() -> None:
    back, _ = roundtrip(wire.TableInfo(table="x" * 65535))
    assert back.table == "x" * 65535  # type: ignore[attr-defined]
    back, _ = roundtrip(wire.Barrier(name="", count=(1 << 32) - 1))
    assert back.count == (1 << 32) - 1  # type: ignore[attr-defined]
    back, _ = roundtrip(wire.Hello(client_id=0, trainer_id=-(1 << 63)))
    assert back.trainer_id == -(1 << 63)  # type: ignore[attr-defined]


def test_payload_over_max_frame_is_local_error() -> None:
    msg = wire.PushDenseGrad(table="w", values=f32(2000))
    with pytest.raises(LocalProtocolError):
        wire.encode(msg, 1, max_frame=4096)
    assert wire.payload_size(msg) > 8000
    assert len(wire.encode_bytes(msg, 1, max_frame=wire.payload_size(msg))) == HS + wire.payload_size(msg)


# ---------------------------------------------------------------- remote errors


def frame_of(msg: wire.Message, payload: bytes | None = None, opcode: int | None = None, flags: int | None = None) -> Frame:
    data = wire.encode_bytes(msg, 3)
    (frame,) = to_frames(data)
    return Frame(
        frame.opcode if opcode is None else opcode,
        frame.flags if flags is None else flags,
        3,
        bytearray(frame.payload if payload is None else payload),
    )


WITH_FIELDS = [m for m in SAMPLES if m.FIELDS]


def _without_optional_tails(msg: wire.Message) -> set[int]:
    """Payload sizes of ``msg`` with its optional fields dropped from the last one back."""
    optional = [name for name, kind in msg.FIELDS if kind.endswith("?")]
    sizes = set()
    for k in range(len(optional)):
        shorter = replace(msg, **dict.fromkeys(optional[k:], None))  # type: ignore[type-var]
        sizes.add(wire.payload_size(shorter))
    return sizes


@pytest.mark.parametrize("msg", WITH_FIELDS, ids=lambda m: type(m).__name__)
def test_every_truncation_is_remote_error(msg: wire.Message) -> None:
    payload = bytes(to_frames(wire.encode_bytes(msg, 1))[0].payload)
    step = max(1, len(payload) // 200)
    for cut in list(range(0, len(payload), step)) + [len(payload) - 1]:
        if cut in _without_optional_tails(msg):
            continue  # a whole message: the same one without its trailing optional fields
        with pytest.raises(RemoteProtocolError):
            wire.decode(frame_of(msg, payload[:cut]))


# bytes after a message whose optional fields are absent are read as those fields
WHOLE = [m for m in SAMPLES if all(getattr(m, name) is not None for name, kind in m.FIELDS if kind.endswith("?"))]


@pytest.mark.parametrize("msg", WHOLE, ids=lambda m: type(m).__name__)
def test_trailing_payload_bytes_are_remote_error(msg: wire.Message) -> None:
    payload = bytes(to_frames(wire.encode_bytes(msg, 1))[0].payload)
    for extra in (b"\0", b"\0" * 8, b"junk"):
        with pytest.raises(RemoteProtocolError, match="trailing"):
            wire.decode(frame_of(msg, payload + extra))


def test_truncated_frame_via_decoder_is_remote_error_from_decode() -> None:
    msg = wire.PushSparseGrad(table="emb", ids=i64(4), values=f32(4, 2))
    payload = bytes(to_frames(wire.encode_bytes(msg, 1))[0].payload)
    short = payload[:-12]
    (frame,) = to_frames(encode_header(int(wire.Op.PUSH_SPARSE_GRAD), 0, 5, len(short)) + short)
    with pytest.raises(RemoteProtocolError, match="truncated"):
        wire.decode(frame)


@pytest.mark.parametrize("opcode", [0, 19, 100, 254])
@pytest.mark.parametrize("flags", [0, int(Flag.REPLY)])
def test_unknown_opcode(opcode: int, flags: int) -> None:
    with pytest.raises(RemoteProtocolError, match="unknown opcode"):
        wire.decode(Frame(opcode, flags, 1, bytearray()))


def test_request_opcode_with_reply_flag_decodes_as_the_reply_class() -> None:
    frame = frame_of(wire.Ping(), flags=int(Flag.REPLY))
    back = wire.decode(frame)
    assert isinstance(back, wire.Ok) and back.op == wire.Op.PING


def array_payload(code: int, ndim: int, dims: list[int], data: bytes) -> bytes:
    head = bytes([code, ndim]) + b"\0" * 6 + b"".join(d.to_bytes(8, "little") for d in dims)
    return head + data


def test_unknown_dtype_code_is_remote_error() -> None:
    with pytest.raises(RemoteProtocolError, match="dtype"):
        wire.decode(Frame(int(wire.Op.PULL_DENSE), int(Flag.REPLY), 1, bytearray(array_payload(99, 1, [1], b"\0" * 8))))


def test_too_many_dims_received_is_remote_error() -> None:
    with pytest.raises(RemoteProtocolError, match="dimensions"):
        wire.decode(Frame(int(wire.Op.PULL_DENSE), int(Flag.REPLY), 1, bytearray(array_payload(1, 9, [1] * 9, b"\0" * 8))))


def test_lying_array_shape_is_remote_error() -> None:
    payload = array_payload(1, 2, [1 << 40, 1 << 30], b"\0" * 8)
    with pytest.raises(RemoteProtocolError, match="truncated"):
        wire.decode(Frame(int(wire.Op.PULL_DENSE), int(Flag.REPLY), 1, bytearray(payload)))


def test_zero_size_array_with_absurd_other_dim_is_remote_error() -> None:
    # count is 0, so no data bytes are needed, but numpy cannot build a (0, 2**62) array
    payload = array_payload(1, 2, [0, 1 << 62], b"")
    with pytest.raises(RemoteProtocolError, match="too big"):
        wire.decode(Frame(int(wire.Op.PULL_DENSE), int(Flag.REPLY), 1, bytearray(payload)))
    version = (7).to_bytes(8, "little")  # the reply's version field follows the array
    ok = wire.decode(Frame(int(wire.Op.PULL_DENSE), int(Flag.REPLY), 1, bytearray(array_payload(1, 2, [0, 1 << 20], b"") + version)))
    assert ok.values.shape == (0, 1 << 20)  # type: ignore[attr-defined]
    assert ok.version == 7  # type: ignore[attr-defined]


def test_invalid_utf8_is_remote_error() -> None:
    payload = (3).to_bytes(2, "little") + b"\xff\xfe\xfd"
    with pytest.raises(RemoteProtocolError, match="UTF-8"):
        wire.decode(Frame(int(wire.Op.TABLE_INFO), 0, 1, bytearray(payload)))


# ---------------------------------------------------------------- property tests

ids_st = hnp.arrays(np.int64, st.integers(0, 50), elements=st.integers(-(1 << 63), (1 << 63) - 1))
names_st = st.text(max_size=40)


@st.composite
def rows_st(draw):
    n = draw(st.integers(0, 20))
    dim = draw(st.integers(1, 9))
    ids = draw(hnp.arrays(np.int64, n, elements=st.integers(0, (1 << 63) - 1)))
    values = draw(hnp.arrays(np.float32, (n, dim), elements=st.floats(width=32, allow_nan=True)))
    return ids, values


@st.composite
def message_st(draw):
    kind = draw(st.sampled_from(["pull", "grad", "delta", "dense", "changed", "array", "text", "error", "barrier", "barrier_reply"]))
    name = draw(names_st)
    if kind == "pull":
        return wire.PullSparse(table=name, ids=draw(ids_st))
    if kind in ("grad", "delta", "changed"):
        ids, values = draw(rows_st())
        if kind == "changed":
            return wire.ChangedReply(ids=ids, values=values, more=draw(st.integers(0, 1)))
        cls = wire.PushSparseGrad if kind == "grad" else wire.PushSparseDelta
        return cls(table=name, ids=ids, values=values)
    if kind == "dense":
        values = draw(hnp.arrays(np.float32, st.integers(0, 100), elements=st.floats(width=32)))
        return wire.PushDenseGrad(table=name, block=draw(st.integers(0, (1 << 32) - 1)),
                                  offset=draw(st.integers(0, (1 << 64) - 1)), values=values)
    if kind == "array":
        dtype = draw(st.sampled_from(sorted(DTYPE_CODES, key=str)))
        shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=5))
        return wire.ArrayReply(op=wire.Op.PULL_DENSE, values=draw(hnp.arrays(dtype, shape)))
    if kind == "text":
        return wire.TextReply(op=wire.Op.STATS, text=draw(st.binary(max_size=200)))
    if kind == "error":
        return wire.Error(code=draw(st.integers(0, 0xFFFF)), retriable=draw(st.integers(0, 1)), message=name)
    if kind == "barrier_reply":
        return wire.BarrierReply(total=draw(st.integers(-(1 << 63), (1 << 63) - 1)))
    return wire.Barrier(name=name, count=draw(st.integers(0, (1 << 32) - 1)), value=draw(st.integers(-(1 << 63), (1 << 63) - 1)))


@settings(max_examples=200, deadline=None)
@given(msg=message_st(), request_id=st.integers(0, (1 << 64) - 1))
def test_property_roundtrip(msg: wire.Message, request_id: int) -> None:
    back, frame = roundtrip(msg, request_id)
    assert_same(msg, back)
    for f in fields(back):  # type: ignore[arg-type]
        value = getattr(back, f.name)
        if isinstance(value, np.ndarray) and value.size:
            assert value.ctypes.data % 8 == 0 or value.dtype.itemsize == 1


@settings(max_examples=100, deadline=None)
@given(msgs=st.lists(message_st(), min_size=1, max_size=6), data=st.data())
def test_property_stream_in_random_chunks(msgs: list[wire.Message], data) -> None:
    stream = b"".join(wire.encode_bytes(m, i) for i, m in enumerate(msgs))
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(stream) - 1)), max_size=25))))
    dec = FrameDecoder()
    got: list[wire.Message] = []
    prev = 0
    for cut in [c for c in cuts if c < len(stream)] + [len(stream)]:
        dec.receive_data(stream[prev:cut])
        prev = cut
        while (frame := dec.next_frame()) is not None:
            assert frame.request_id == len(got)
            got.append(wire.decode(frame))
    assert len(got) == len(msgs)
    for a, b in zip(msgs, got):
        assert_same(a, b)


@settings(max_examples=150, deadline=None)
@given(msg=message_st(), junk=st.binary(min_size=1, max_size=16), data=st.data())
def test_property_corrupted_payload_never_crashes_differently(msg: wire.Message, junk: bytes, data) -> None:
    """Truncated, extended or overwritten payloads either decode or raise RemoteProtocolError."""
    payload = bytearray(to_frames(wire.encode_bytes(msg, 1))[0].payload)
    mode = data.draw(st.sampled_from(["truncate", "extend", "overwrite"]))
    if mode == "truncate":
        if not payload:
            return
        cut = data.draw(st.integers(0, len(payload) - 1))
        with pytest.raises(RemoteProtocolError):
            wire.decode(frame_of(msg, bytes(payload[:cut])))
        return
    if mode == "extend":
        try:
            back = wire.decode(frame_of(msg, bytes(payload) + junk))
        except RemoteProtocolError:
            return
        # only an unset optional trailing field may take the bytes: an ARRAY reply's model_version
        assert isinstance(msg, wire.ArrayReply) and msg.model_version is None and len(junk) == 8
        assert isinstance(back, wire.ArrayReply) and back.model_version == int.from_bytes(junk, "little", signed=True)
        return
    if not payload:
        return
    at = data.draw(st.integers(0, len(payload) - 1))
    payload[at : at + len(junk)] = junk[: len(payload) - at]
    try:
        back = wire.decode(frame_of(msg, bytes(payload)))
    except RemoteProtocolError:
        return
    assert type(back) is type(msg)  # same opcode, same class: only field values may differ


def test_optional_trailing_fields_are_absent_from_old_frames_and_none_when_read_back() -> None:
    """A PUSH_SPARSE_GRAD without shows and clicks is byte for byte the frame of before they
    existed (an old server reads it), and a frame of before reads back with both None."""
    plain = wire.PushSparseGrad(table="e", ids=np.array([7], np.int64), values=np.array([[0.5, 0.25]], np.float32), based_on=12)
    data = wire.encode_bytes(plain, 1)
    assert len(data) == HS + 72  # docs/protocol.md's byte-by-byte example
    back = wire.decode(to_frames(data)[0])
    assert isinstance(back, wire.PushSparseGrad) and back.shows is None and back.clicks is None
    with_shows = wire.encode_bytes(wire.PushSparseGrad(table="e", ids=plain.ids, values=plain.values, based_on=12,
                                                       shows=np.array([3.0], np.float32)), 1)
    assert with_shows[HS : HS + 72] == data[HS:]  # appended after every old field
    read = wire.decode(to_frames(with_shows)[0])
    assert isinstance(read, wire.PushSparseGrad) and read.shows.tolist() == [3.0] and read.clicks is None  # type: ignore[union-attr]
    assert wire.decode(to_frames(wire.encode_bytes(wire.TableInfo(table="t"), 2))[0]) == wire.TableInfo(table="t", detail=None)


def test_a_later_optional_field_without_the_earlier_one_cannot_be_sent() -> None:
    msg = wire.PushSparseGrad(table="e", ids=np.array([1], np.int64), values=f32(1, 2), clicks=np.ones(1, np.float32))
    with pytest.raises(LocalProtocolError, match="'clicks' is set but 'shows'"):
        wire.encode_bytes(msg, 1)


@pytest.mark.parametrize("values", [np.zeros(0, np.float32), np.ones((2, 3), np.float32), np.arange(5, dtype=np.int64)])
def test_an_array_reply_takes_exactly_eight_more_bytes_as_its_model_version(values: np.ndarray) -> None:
    """ARRAY's optional model_version (aps-serve): a reply of before plus 8 bytes reads them as
    the version; any other extension is refused, as before."""
    payload = to_frames(wire.encode_bytes(wire.ArrayReply(op=wire.Op.PULL_DENSE, values=values, version=3), 1))[0].payload
    msg = wire.ArrayReply(op=wire.Op.PULL_DENSE, values=values, version=3)
    back = wire.decode(frame_of(msg, bytes(payload) + (-2).to_bytes(8, "little", signed=True)))
    assert isinstance(back, wire.ArrayReply) and (back.version, back.model_version) == (3, -2)
    for extra in (1, 7, 9, 16):
        with pytest.raises(RemoteProtocolError):
            wire.decode(frame_of(msg, bytes(payload) + bytes(extra)))
