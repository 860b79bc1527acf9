"""The messages of the aps protocol and their encoding to / decoding from frames.

Each message class lists its fields in ``FIELDS`` as ``(name, kind)``; the payload is those fields
in that order (see codec.py for the kinds). A request and its reply share an opcode; replies have
``Flag.REPLY`` set. Any request may be answered by an :class:`Error` instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar

import numpy as np

from ..errors import LocalProtocolError, RemoteProtocolError
from .codec import FieldPlan, PayloadReader, PayloadWriter
from .frame import DEFAULT_MAX_FRAME, HEADER_SIZE, Flag, Frame, encode_header
from .hotpath import encode_pull, encode_rows_reply, read_pull, read_rows_reply

_EMPTY_F32 = np.zeros((0, 0), dtype=np.float32)
_EMPTY_I64 = np.zeros(0, dtype=np.int64)


class Op(IntEnum):
    HELLO = 1
    AUTH = 2
    CREATE_TABLE = 3
    TABLE_INFO = 4
    PULL_SPARSE = 5
    PUSH_SPARSE_GRAD = 6
    PUSH_SPARSE_DELTA = 7
    PULL_SPARSE_CHANGED = 8
    PULL_DENSE = 9
    PUSH_DENSE_GRAD = 10
    PUSH_DENSE_DELTA = 11
    BARRIER = 12
    SAVE = 13
    LOAD = 14
    STATS = 15
    WORKER_DONE = 16
    PING = 17
    SHRINK = 18
    ERROR = 255


class Message:
    """Base of every message; subclasses are dataclasses with OP and FIELDS."""

    OP: ClassVar[Op]
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()
    #: requests that change server state; the server remembers their ids to drop replays
    MUTATES: ClassVar[bool] = False


# ----------------------------------------------------------------------------- requests


@dataclass(slots=True)
class Hello(Message):
    OP = Op.HELLO
    FIELDS = (("client_id", "u64"), ("trainer_id", "i64"))
    client_id: int = 0
    trainer_id: int = -1  # -1: not a trainer (a library user)


@dataclass(slots=True)
class Auth(Message):
    OP = Op.AUTH
    FIELDS = (("mac", "bytes"),)
    mac: bytes = b""


@dataclass(slots=True)
class CreateTable(Message):
    OP = Op.CREATE_TABLE
    FIELDS = (("spec_json", "str"),)
    spec_json: str = ""


@dataclass(slots=True)
class TableInfo(Message):
    """``detail`` 1 (optional, new in version 3): the reply is ``{"spec": ..., "keys": ...,
    "bytes": ..., ...}``, the shard's contents beside its spec; absent: the spec alone."""

    OP = Op.TABLE_INFO
    FIELDS = (("table", "str"), ("detail", "u8?"))
    table: str = ""
    detail: int | None = None


@dataclass(slots=True)
class PullSparse(Message):
    OP = Op.PULL_SPARSE
    FIELDS = (("table", "str"), ("ids", "arr"))
    table: str = ""
    ids: np.ndarray = field(default_factory=lambda: _EMPTY_I64)


@dataclass(slots=True)
class PushSparseGrad(Message):
    OP = Op.PUSH_SPARSE_GRAD
    FIELDS = (("table", "str"), ("ids", "arr"), ("values", "arr"), ("based_on", "i64"), ("shows", "arr?"), ("clicks", "arr?"))
    MUTATES = True
    table: str = ""
    ids: np.ndarray = field(default_factory=lambda: _EMPTY_I64)
    values: np.ndarray = field(default_factory=lambda: _EMPTY_F32)
    #: the table version (of this server's shard) the gradient was computed from, as a
    #: PULL_SPARSE reply gave it; -1: not stated (never discarded as lagged)
    based_on: int = -1
    #: hash tables only (optional, new in version 3): float32[n] shows and clicks of each
    #: occurrence, for the keys' statistics; absent: one show and no click per occurrence
    shows: np.ndarray | None = None
    clicks: np.ndarray | None = None


@dataclass(slots=True)
class PushSparseDelta(Message):
    OP = Op.PUSH_SPARSE_DELTA
    FIELDS = (("table", "str"), ("ids", "arr"), ("values", "arr"), ("shows", "arr?"), ("clicks", "arr?"))
    MUTATES = True
    table: str = ""
    ids: np.ndarray = field(default_factory=lambda: _EMPTY_I64)
    values: np.ndarray = field(default_factory=lambda: _EMPTY_F32)
    #: hash tables only (optional): float32[n] shows and clicks of each key since its previous
    #: delta (geo's local steps), for the keys' statistics; absent: one show and no click each
    shows: np.ndarray | None = None
    clicks: np.ndarray | None = None


@dataclass(slots=True)
class PullSparseChanged(Message):
    OP = Op.PULL_SPARSE_CHANGED
    FIELDS = (("table", "str"), ("max_rows", "u64"))
    table: str = ""
    max_rows: int = 0


@dataclass(slots=True)
class PullDense(Message):
    OP = Op.PULL_DENSE
    FIELDS = (("table", "str"), ("block", "u32"), ("offset", "u64"), ("count", "u64"))
    table: str = ""
    block: int = 0
    offset: int = 0
    count: int = 0


@dataclass(slots=True)
class PushDenseGrad(Message):
    OP = Op.PUSH_DENSE_GRAD
    FIELDS = (("table", "str"), ("block", "u32"), ("offset", "u64"), ("values", "arr"), ("based_on", "i64"))
    MUTATES = True
    table: str = ""
    block: int = 0
    offset: int = 0
    values: np.ndarray = field(default_factory=lambda: _EMPTY_F32)
    #: the version of this block the gradient was computed from, as a PULL_DENSE reply gave
    #: it; -1: not stated (never discarded as lagged)
    based_on: int = -1


@dataclass(slots=True)
class PushDenseDelta(Message):
    OP = Op.PUSH_DENSE_DELTA
    FIELDS = (("table", "str"), ("block", "u32"), ("offset", "u64"), ("values", "arr"))
    MUTATES = True
    table: str = ""
    block: int = 0
    offset: int = 0
    values: np.ndarray = field(default_factory=lambda: _EMPTY_F32)


@dataclass(slots=True)
class Barrier(Message):
    OP = Op.BARRIER
    FIELDS = (("name", "str"), ("count", "u32"), ("value", "i64"))
    name: str = ""
    count: int = 0  # participants; 0 means the server's number of trainers
    value: int = 0  # summed over the participants and returned to each (a tiny allreduce)


@dataclass(slots=True)
class Save(Message):
    """``save_id`` is the same on every server of one save (the client draws it per call), so a
    loader can tell shards of one save from a mix of two."""

    OP = Op.SAVE
    FIELDS = (("path", "str"), ("save_id", "str"), ("mode", "str?"), ("extra", "str?"), ("rows_as", "str?"))
    path: str = ""
    save_id: str = ""
    #: optional (new in version 3): "full", "base" or "delta" (hash tables' keys by score or
    #: delta score; docs/operations.md); absent: "full"
    mode: str | None = None
    #: optional: a JSON object merged into this save's manifest ``extra`` (an online trainer's
    #: position); needs ``mode`` sent
    extra: str | None = None
    #: optional: what a base or delta save writes hash tables' rows as, "stored" or "int8"
    #: (codes and a scale a row, for serving: aps/checkpoints/hash_files.py); absent: "stored";
    #: needs ``extra`` sent
    rows_as: str | None = None


@dataclass(slots=True)
class Load(Message):
    OP = Op.LOAD
    FIELDS = (("path", "str"), ("deltas", "str?"))
    MUTATES = True
    path: str = ""
    #: optional: a JSON list of delta save paths applied over the base ``path`` in order
    deltas: str | None = None


@dataclass(slots=True)
class Stats(Message):
    OP = Op.STATS


@dataclass(slots=True)
class WorkerDone(Message):
    OP = Op.WORKER_DONE
    FIELDS = (("trainer_id", "u32"),)
    trainer_id: int = 0


@dataclass(slots=True)
class Ping(Message):
    OP = Op.PING


@dataclass(slots=True)
class Shrink(Message):
    """Evict a hash table's keys by score (new in version 3): advance the table's day by
    ``days`` (optional; absent: 0), decay every key's show and click by ``decay``, then delete
    the keys whose score ``0.1 (show - click) + click`` is under ``threshold``, that no push
    reached in more than ``ttl`` of the shard's steps (-1: no TTL), or unseen for more than the
    table's ``ttl_days`` days."""

    OP = Op.SHRINK
    FIELDS = (("table", "str"), ("decay", "f64"), ("threshold", "f64"), ("ttl", "i64"), ("days", "u32?"))
    MUTATES = True
    table: str = ""
    decay: float = 0.98
    threshold: float = 0.8
    ttl: int = -1
    days: int | None = None


# ----------------------------------------------------------------------------- replies


@dataclass(slots=True)
class Ok(Message):
    """Empty success reply (OP is the request's; set per instance)."""

    op: int = 0


@dataclass(slots=True)
class HelloReply(Message):
    OP = Op.HELLO
    FIELDS = (
        ("server_index", "u32"),
        ("num_servers", "u32"),
        ("max_frame", "u32"),
        ("auth_required", "u8"),
        ("lease_ms", "u32"),
        ("nonce", "bytes"),
    )
    server_index: int = 0
    num_servers: int = 1
    max_frame: int = DEFAULT_MAX_FRAME
    auth_required: int = 0
    #: a trainer silent this long is taken for gone (aps-server --trainer-timeout); 0: never.
    #: A trainer's client sends heartbeats well within it.
    lease_ms: int = 0
    nonce: bytes = b""


@dataclass(slots=True)
class TextReply(Message):
    """A JSON document (table spec, stats); never on the hot path."""

    FIELDS = (("text", "bytes"),)
    op: int = 0
    text: bytes = b""


@dataclass(slots=True)
class ArrayReply(Message):
    """Rows or a dense range, with the version they were read at: the number of gradient
    updates applied so far to the table's shard (sparse) or to the block (dense) on this server.
    A push of a gradient computed from these values names it (``based_on``)."""

    FIELDS = (("values", "arr"), ("version", "i64"), ("model_version", "i64?"))
    op: int = 0
    values: np.ndarray = field(default_factory=lambda: _EMPTY_F32)
    version: int = 0
    #: optional (new in version 3): the model version (export) the values come from, sent by
    #: aps-serve when the request has the MODEL_VERSION flag; absent from a pserver
    model_version: int | None = None


@dataclass(slots=True)
class ChangedReply(Message):
    OP = Op.PULL_SPARSE_CHANGED
    FIELDS = (("ids", "arr"), ("values", "arr"), ("more", "u8"))
    ids: np.ndarray = field(default_factory=lambda: _EMPTY_I64)
    values: np.ndarray = field(default_factory=lambda: _EMPTY_F32)
    more: int = 0


@dataclass(slots=True)
class BarrierReply(Message):
    OP = Op.BARRIER
    FIELDS = (("total", "i64"),)
    total: int = 0


@dataclass(slots=True)
class ShrinkReply(Message):
    OP = Op.SHRINK
    FIELDS = (("evicted", "u64"), ("keys", "u64"))
    evicted: int = 0
    keys: int = 0  # keys the shard holds after the shrink


@dataclass(slots=True)
class Error(Message):
    OP = Op.ERROR
    FIELDS = (("code", "u16"), ("retriable", "u8"), ("message", "str"))
    code: int = 0
    retriable: int = 0
    message: str = ""


REQUESTS: dict[int, type[Message]] = {
    cls.OP: cls
    for cls in (
        Hello, Auth, CreateTable, TableInfo, PullSparse, PushSparseGrad, PushSparseDelta,
        PullSparseChanged, PullDense, PushDenseGrad, PushDenseDelta, Barrier, Save, Load, Stats,
        WorkerDone, Ping, Shrink,
    )
}

#: which reply class answers each request opcode
REPLIES: dict[int, type[Message]] = {op: Ok for op in REQUESTS}
REPLIES.update(
    {
        Op.HELLO: HelloReply,
        Op.TABLE_INFO: TextReply,
        Op.STATS: TextReply,
        Op.PULL_SPARSE: ArrayReply,
        Op.PULL_DENSE: ArrayReply,
        Op.PULL_SPARSE_CHANGED: ChangedReply,
        Op.BARRIER: BarrierReply,
        Op.SHRINK: ShrinkReply,
    }
)


_REPLY_CLASSES = (Ok, TextReply, ArrayReply, HelloReply, ChangedReply, BarrierReply, ShrinkReply)
_REPLY_BIT = int(Flag.REPLY)  # a plain int: IntFlag arithmetic costs a microsecond a time


#: reply classes whose opcode is a field of the message (they answer several requests)
_OP_IN_MESSAGE = frozenset((Ok, TextReply, ArrayReply))
_REPLY_SET = frozenset(_REPLY_CLASSES)
_ERROR_OP = int(Op.ERROR)
_PULL_OP = int(Op.PULL_SPARSE)
#: each message class's compiled fields, built on first use
_PLANS: dict[type[Message], FieldPlan] = {}


def message_op(msg: Message) -> int:
    op = getattr(msg, "op", None)
    return int(op) if op else int(msg.OP)


def _plan(cls: type[Message]) -> FieldPlan:
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = FieldPlan(cls.FIELDS)
    return plan


def encode(msg: Message, request_id: int, flags: int = 0, max_frame: int = DEFAULT_MAX_FRAME) -> list[Any]:
    """Encode a message into a list of buffers (header first) ready for ``writelines``."""
    cls = type(msg)
    if cls is PullSparse or cls is ArrayReply:  # the one-id hot pair: one step (hotpath.py)
        if cls is PullSparse:
            frame = encode_pull(msg.table, msg.ids, request_id, int(flags), _PULL_OP, max_frame)  # type: ignore[attr-defined]
        else:
            frame = encode_rows_reply(
                msg.values, msg.version, message_op(msg), request_id, int(flags) | _REPLY_BIT, max_frame,  # type: ignore[attr-defined]
                msg.model_version,  # type: ignore[attr-defined]
            )
        if frame is not None:
            return [frame]
    return encode_generic(msg, request_id, flags, max_frame)


def encode_generic(msg: Message, request_id: int, flags: int = 0, max_frame: int = DEFAULT_MAX_FRAME) -> list[Any]:
    """:func:`encode` field by field, for every message (the hot pair's reference)."""
    cls = type(msg)
    writer = PayloadWriter()
    _plan(cls).write(writer, msg)
    parts = writer.finish()
    if cls in _OP_IN_MESSAGE:
        op = message_op(msg)
        flags = int(flags) | _REPLY_BIT
    else:
        op = int(cls.OP)
        if cls in _REPLY_SET:
            flags = int(flags) | _REPLY_BIT
    header = encode_header(op, flags, request_id, writer.size, max_frame)
    if parts and type(parts[0]) is bytes:
        parts[0] = header + parts[0]
    else:
        parts.insert(0, header)
    return parts


def encode_bytes(msg: Message, request_id: int, flags: int = 0, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """Like :func:`encode`, joined into one bytes object (tests, small messages)."""
    return b"".join(bytes(p) for p in encode(msg, request_id, flags, max_frame))


def payload_size(msg: Message) -> int:
    """Encoded payload size without building it (used to plan chunking)."""
    writer = PayloadWriter()
    _plan(type(msg)).write(writer, msg)
    return writer.size


def decode(frame: Frame) -> Message:
    """Turn a frame into a message; raises RemoteProtocolError on an unknown op or bad payload."""
    opcode = frame.opcode
    if opcode == _PULL_OP:  # the one-id hot pair: one step when it parses (hotpath.py)
        if frame.flags & _REPLY_BIT:
            rows = read_rows_reply(frame.payload)
            if rows is not None:
                return ArrayReply(op=opcode, values=rows[0], version=rows[1], model_version=rows[2])
        else:
            pull = read_pull(frame.payload)
            if pull is not None:
                return PullSparse(table=pull[0], ids=pull[1])
    return decode_generic(frame)


def decode_generic(frame: Frame) -> Message:
    """:func:`decode` field by field, for every message (the hot pair's reference)."""
    opcode = frame.opcode
    if opcode == _ERROR_OP:
        cls: type[Message] = Error
    else:
        found = (REPLIES if frame.flags & _REPLY_BIT else REQUESTS).get(opcode)
        if found is None:
            raise RemoteProtocolError(f"unknown opcode {opcode}")
        cls = found
    values = _plan(cls).read(PayloadReader(frame.payload))
    if cls in _OP_IN_MESSAGE:
        values["op"] = opcode
    return cls(**values)


__all__ = [
    "HEADER_SIZE", "Op", "Message", "REQUESTS", "REPLIES", "encode", "encode_bytes", "decode",
    "payload_size", "LocalProtocolError",
] + [cls.__name__ for cls in REQUESTS.values()] + ["Ok", "HelloReply", "TextReply", "ArrayReply", "ChangedReply", "BarrierReply", "ShrinkReply", "Error"]
