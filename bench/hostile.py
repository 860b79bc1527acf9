"""Hostile traffic against a live pserver, shared by tests/server/transport/test_fuzz.py (CI size) and
bench/fuzz_protocol.py (100k+ frames).

A *session* is one TCP connection: maybe a handshake (HELLO, a good or bad AUTH, or a HELLO
after a first frame that does not parse), then a run of hostile frames - random bytes, real
request frames with bytes flipped, frames cut short, headers promising huge bodies, requests
before the handshake - written in a few pieces, then a half-close, then every reply read until
the server closes. A session that did not complete the handshake must never be served. Sessions come from a seeded RNG, so a
failing run's frames are replayed from its seed.

A :class:`Probe` is the well-behaved client the attack must not hurt: it keeps two tables of its
own and a numpy copy of what they must hold, and checks them bit for bit (its deltas are
multiples of 1/4, so their float32 sums are exact whatever the order, and each row gets one
rounded addition per push, as on the server).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import aps
from aps import wire
from aps.errors import ErrorCode, RemoteProtocolError
from aps.specs import spec_to_dict
from aps.wire.auth import auth_mac
from aps.wire.frame import HEADER, Flag, FrameDecoder, encode_header
from aps.wire.handshake import HANDSHAKE_MAX_FRAME

#: tables the hostile frames aim at (created before the attack, so mutated requests reach the
#: handlers and kernels rather than stopping at UNKNOWN_TABLE)
TARGET_SPARSE = aps.SparseTable("fz", rows=64, dim=4, init=aps.Uniform(-1, 1), optimizer=aps.SGD(lr=0.5))
TARGET_DENSE = aps.DenseTable("fzd", shape=(40,), init=aps.Uniform(-1, 1), optimizer=aps.SGD(lr=0.5))
#: the probe's own tables; no hostile frame names them
PROBE_SPARSE = aps.SparseTable("probe", rows=512, dim=8, init=aps.Uniform(-1, 1), optimizer=aps.SGD(lr=1.0))
PROBE_DENSE = aps.DenseTable("probed", shape=(1000,), init=aps.Uniform(-1, 1), optimizer=aps.SGD(lr=1.0))
_BIG = 1 << 32


# ----------------------------------------------------------------------------- frames


def _frame(msg: wire.Message, request_id: int, flags: int = 0) -> bytes:
    return wire.encode_bytes(msg, request_id, flags, max_frame=1 << 31)


def request_templates(rng: np.random.Generator) -> list[tuple[str, bytes]]:
    """Real, well-formed request frames of every opcode aimed at the target tables; the
    mutators start from these. Fresh ids and values each call."""
    ids = rng.integers(0, TARGET_SPARSE.rows, size=int(rng.integers(1, 9)), dtype=np.int64)
    rows = rng.normal(size=(len(ids), TARGET_SPARSE.dim)).astype(np.float32)
    count = int(rng.integers(1, 41))
    dense = rng.normal(size=count).astype(np.float32)
    offset = int(rng.integers(0, 41 - count))
    rid = int(rng.integers(2, 1 << 20))
    spec = json.dumps(spec_to_dict(TARGET_SPARSE))
    final, sync = int(Flag.FINAL), int(Flag.SYNC)
    return [
        ("hello", _frame(wire.Hello(client_id=int(rng.integers(0, 1 << 62)), trainer_id=int(rng.integers(-1, 3))), rid)),
        ("auth", _frame(wire.Auth(mac=rng.bytes(32)), rid)),
        ("create_table", _frame(wire.CreateTable(spec_json=spec), rid)),
        ("table_info", _frame(wire.TableInfo(table="fz"), rid)),
        ("pull_sparse", _frame(wire.PullSparse(table="fz", ids=ids), rid)),
        ("push_sparse_grad", _frame(wire.PushSparseGrad(table="fz", ids=ids, values=rows), rid, final)),
        ("push_sparse_grad_sync", _frame(wire.PushSparseGrad(table="fz", ids=ids, values=rows), rid, sync | (final if rid % 2 else 0))),
        ("push_sparse_delta", _frame(wire.PushSparseDelta(table="fz", ids=ids, values=rows), rid)),
        ("pull_sparse_changed", _frame(wire.PullSparseChanged(table="fz", max_rows=int(rng.integers(0, 4))), rid)),
        ("pull_dense", _frame(wire.PullDense(table="fzd", block=0, offset=offset, count=count), rid)),
        ("push_dense_grad", _frame(wire.PushDenseGrad(table="fzd", block=0, offset=offset, values=dense), rid, final)),
        ("push_dense_delta", _frame(wire.PushDenseDelta(table="fzd", block=0, offset=offset, values=dense), rid)),
        ("barrier", _frame(wire.Barrier(name="fzb", count=int(rng.integers(0, 3)), value=rid), rid)),
        ("save", _frame(wire.Save(path="fz-ckpt", save_id=f"{rid:x}"), rid)),
        ("load", _frame(wire.Load(path="fz-missing"), rid)),
        ("stats", _frame(wire.Stats(), rid)),
        ("worker_done", _frame(wire.WorkerDone(trainer_id=int(rng.integers(0, 3))), rid)),
        ("ping", _frame(wire.Ping(), rid)),
    ]


#: how often each template is picked for mutation (SAVE writes and fsyncs files: rarer)
_TEMPLATE_WEIGHTS = {"save": 0.2, "load": 0.5, "stats": 0.5}
_INTERESTING = (0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 63, (1 << 64) - 1)


def _pick_template(rng: np.random.Generator, templates: list[tuple[str, bytes]], skip_hello: bool = False) -> tuple[str, bytes]:
    choices = [t for t in templates if not (skip_hello and t[0] == "hello")]
    weights = np.array([_TEMPLATE_WEIGHTS.get(name, 1.0) for name, _ in choices])
    return choices[int(rng.choice(len(choices), p=weights / weights.sum()))]


def mutate(rng: np.random.Generator, data: bytes, header: bool) -> bytes:
    """1 to 6 edits of a frame, its length unchanged: bit flips, random bytes, boundary values
    written over a 1/2/4/8 byte field (frames cut short are :func:`truncated_frame`).
    ``header``: the edits land in the 24-byte header (mostly a broken stream), else in the
    payload (field lengths, array heads, dtype codes, shapes, strings, JSON)."""
    buf = bytearray(data)
    low, high = (0, wire.HEADER_SIZE) if header or len(buf) <= wire.HEADER_SIZE else (wire.HEADER_SIZE, len(buf))
    for _ in range(int(rng.integers(1, 7))):
        pos = int(rng.integers(low, min(high, len(buf))))
        op = rng.random()
        if op < 0.35:
            buf[pos] ^= 1 << int(rng.integers(0, 8))
        elif op < 0.6:
            buf[pos] = int(rng.integers(0, 256))
        else:
            width = int(rng.choice([1, 2, 4, 8]))
            value = int(rng.choice(_INTERESTING)) & ((1 << (8 * width)) - 1)
            pos = max(low, pos - pos % width)
            buf[pos : pos + width] = value.to_bytes(width, "little")[: len(buf) - pos]
    return bytes(buf)


def random_frame(rng: np.random.Generator, raw: bool) -> bytes:
    """``raw``: plain random bytes (a broken stream at once); else a well-formed header over a
    random payload (random opcode, flags and request id), so the payload decoders see garbage."""
    if raw:
        return rng.bytes(int(rng.integers(1, 300)))
    body = rng.bytes(int(rng.integers(0, 400)))
    opcode = int(rng.integers(1, 18)) if rng.random() < 0.8 else int(rng.integers(0, 256))
    flags = int(rng.integers(0, 8)) if rng.random() < 0.9 else int(rng.integers(0, 1 << 16))
    return encode_header(opcode, flags, int(rng.integers(0, 1 << 63)), len(body), max_frame=_BIG) + body


def huge_frame(rng: np.random.Generator, max_frame: int) -> bytes:
    """A header declaring a body far larger than what follows (up to 4 GiB), plus a bit of it."""
    length = int(rng.choice([max_frame, max_frame + 1, (1 << 32) - 1, 1 << 31, int(rng.integers(1 << 18, max_frame + 1))]))
    opcode = int(rng.choice([int(wire.Op.PUSH_SPARSE_GRAD), int(wire.Op.PUSH_DENSE_GRAD), int(wire.Op.CREATE_TABLE), int(rng.integers(0, 256))]))
    return encode_header(opcode, 0, int(rng.integers(0, 1 << 32)), length, max_frame=_BIG) + rng.bytes(int(rng.integers(0, 4096)))


def cut_payload(frame: bytes, keep: int) -> bytes:
    """``frame`` with only the first ``keep`` bytes of its payload and a header that says so: a
    well-formed frame whose payload does not parse (every field of a request is required)."""
    header = list(HEADER.unpack_from(frame, 0))
    header[6] = keep
    return HEADER.pack(*header) + frame[wire.HEADER_SIZE : wire.HEADER_SIZE + keep]


def unparsable_request(rng: np.random.Generator, templates: list[tuple[str, bytes]]) -> bytes:
    """A real request other than HELLO whose payload is cut short (its header adjusted), so
    that it is a whole frame the server cannot decode."""
    choices = [data for name, data in templates if name != "hello" and len(data) > wire.HEADER_SIZE]
    data = choices[int(rng.integers(0, len(choices)))]
    return cut_payload(data, int(rng.integers(0, len(data) - wire.HEADER_SIZE)))


def opens_with_hello(data: bytes) -> bool:
    """Whether the first frame of ``data`` is a well-formed HELLO request, as the server reads
    it before the handshake (a hostile frame may be one): a server without a token is then right
    to serve what follows."""
    decoder = FrameDecoder(HANDSHAKE_MAX_FRAME)
    try:
        decoder.receive_data(data)
        frame = decoder.next_frame()
        return frame is not None and isinstance(wire.decode(frame), wire.Hello)
    except RemoteProtocolError:
        return False


def truncated_frame(rng: np.random.Generator, templates: list[tuple[str, bytes]]) -> bytes:
    """A real frame cut short: what follows it is read as the rest of its body."""
    _, data = _pick_template(rng, templates)
    return data[: int(rng.integers(1, len(data)))]


#: kinds of hostile frame and how often each is drawn. The ones in STREAM_BREAKERS leave the
#: stream without a frame boundary (the server must close, or wait for a body that never
#: comes), so a session sends them last and the frames before them reach the handlers.
FRAME_KINDS = {
    "mutated_payload": 0.40,
    "random_payload": 0.17,
    "template": 0.15,
    "mutated_header": 0.10,
    "random_bytes": 0.06,
    "truncated": 0.07,
    "huge_length": 0.05,
}
STREAM_BREAKERS = frozenset({"mutated_header", "random_bytes", "truncated", "huge_length"})
_KINDS = tuple(FRAME_KINDS)
_KIND_P = np.array(list(FRAME_KINDS.values())) / sum(FRAME_KINDS.values())


def hostile_frame(rng: np.random.Generator, templates: list[tuple[str, bytes]], max_frame: int) -> tuple[str, bytes]:
    kind = _KINDS[int(rng.choice(len(_KINDS), p=_KIND_P))]
    if kind in ("mutated_payload", "mutated_header"):
        return kind, mutate(rng, _pick_template(rng, templates)[1], header=kind == "mutated_header")
    if kind in ("random_payload", "random_bytes"):
        return kind, random_frame(rng, raw=kind == "random_bytes")
    if kind == "truncated":
        return kind, truncated_frame(rng, templates)
    if kind == "huge_length":
        return kind, huge_frame(rng, max_frame)
    return kind, _pick_template(rng, templates, skip_hello=True)[1]  # a real request, maybe out of place


# ----------------------------------------------------------------------------- sessions

#: how a session opens, and how often: no handshake at all, HELLO only, HELLO + a wrong AUTH,
#: a request that does not parse and then a HELLO (the server must refuse the connection at the
#: first frame: the HELLO comes too late), or a full handshake (with a token: the attacker holds
#: it; without: HELLO is all there is)
OPENINGS = {"none": 0.2, "hello": 0.2, "bad_auth": 0.2, "late_hello": 0.1, "authenticated": 0.3}
OPENINGS_NO_TOKEN = {"none": 0.2, "late_hello": 0.1, "authenticated": 0.7}


@dataclass
class Tally:
    """What a burst sent and what came back."""

    sessions: int = 0
    frames: int = 0
    bytes_sent: int = 0
    frames_by_kind: Counter[str] = field(default_factory=Counter)
    sessions_by_opening: Counter[str] = field(default_factory=Counter)
    replies: Counter[str] = field(default_factory=Counter)  # "ok:OP" or "error:CODE"
    endings: Counter[str] = field(default_factory=Counter)  # eof, reset, timeout, connect_failed
    #: replies other than HELLO's and ERROR to a session that never completed the handshake
    #: (HELLO first, then AUTH with the token where the server has one): a bypass, must stay 0
    unauthenticated_served: int = 0

    def add(self, other: Tally) -> None:
        self.sessions += other.sessions
        self.frames += other.frames
        self.bytes_sent += other.bytes_sent
        self.unauthenticated_served += other.unauthenticated_served
        for mine, theirs in ((self.frames_by_kind, other.frames_by_kind), (self.sessions_by_opening, other.sessions_by_opening),
                             (self.replies, other.replies), (self.endings, other.endings)):
            mine.update(theirs)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sessions": self.sessions, "frames": self.frames, "bytes_sent": self.bytes_sent,
            "frames_by_kind": dict(self.frames_by_kind), "sessions_by_opening": dict(self.sessions_by_opening),
            "replies": dict(self.replies), "endings": dict(self.endings),
            "unauthenticated_served": self.unauthenticated_served,
        }


@dataclass(frozen=True)
class Attack:
    """Where and how to attack: the server, its token (None: it has none), its max frame, how
    many hostile frames one session sends at most, how long a session waits for the server to
    finish answering after the half-close, and the pool of source addresses (127.x.y.z) the
    sessions connect from (the server throttles failed AUTH per address)."""

    host: str
    port: int
    token: str | None
    max_frame: int
    frames_per_session: int = 24
    read_timeout: float = 2.0
    sources: tuple[str, ...] = ()


def source_pool(rng: np.random.Generator, n: int) -> tuple[str, ...]:
    """``n`` loopback addresses other than 127.0.0.1 (which the probe uses)."""
    return tuple(f"127.{int(a)}.{int(b)}.{int(c)}" for a, b, c in rng.integers(1, 255, size=(n, 3)))


def _tally_replies(data: bytes, tally: Tally, handshaken: bool) -> None:
    """Count the server's replies by opcode / error code; a reply that serves a request on a
    connection that never completed the handshake is counted as a bypass."""
    decoder = FrameDecoder(_BIG - 1)
    decoder.receive_data(data)
    while True:
        try:
            frame = decoder.next_frame()
        except RemoteProtocolError:
            tally.replies["unparseable"] += 1
            return
        if frame is None:
            return
        msg = wire.decode(frame)
        if isinstance(msg, wire.Error):
            tally.replies[f"error:{ErrorCode(msg.code).name}"] += 1
            continue
        tally.replies[f"ok:{wire.Op(frame.opcode).name}"] += 1
        if not handshaken and frame.opcode != wire.Op.HELLO:
            tally.unauthenticated_served += 1


async def read_frame(reader: asyncio.StreamReader, timeout: float) -> wire.Message:
    """The next whole frame the server sends, decoded (TimeoutError after ``timeout`` s)."""
    async with asyncio.timeout(timeout):
        header = await reader.readexactly(wire.HEADER_SIZE)
        length = HEADER.unpack(header)[6]
        decoder = FrameDecoder(_BIG - 1)
        decoder.receive_data(header + await reader.readexactly(length))
    frame = decoder.next_frame()
    assert frame is not None
    return wire.decode(frame)


async def run_session(attack: Attack, rng: np.random.Generator, tally: Tally) -> None:
    """One hostile connection, start to end; everything it saw goes into ``tally``."""
    openings = OPENINGS if attack.token is not None else OPENINGS_NO_TOKEN
    opening = str(rng.choice(list(openings), p=list(openings.values())))
    templates = request_templates(rng)
    frames = [hostile_frame(rng, templates, attack.max_frame) for _ in range(int(rng.integers(1, attack.frames_per_session + 1)))]
    frames.sort(key=lambda kf: kf[0] in STREAM_BREAKERS)  # stable: the rest keep their order
    blob = b"".join(data for _, data in frames)
    # with no token a HELLO is the whole handshake, and a hostile frame may be one
    handshaken = opening == "authenticated" or (attack.token is None and opening == "none" and opens_with_hello(blob))
    source = attack.sources[int(rng.integers(0, len(attack.sources)))] if attack.sources else None
    tally.sessions += 1
    tally.sessions_by_opening[opening] += 1
    try:
        reader, writer = await asyncio.open_connection(attack.host, attack.port, local_addr=(source, 0) if source else None)
    except OSError:
        tally.endings["connect_failed"] += 1
        return
    received = bytearray()
    try:
        client_id = int(rng.integers(0, 1 << 62))
        if opening == "late_hello":
            writer.write(unparsable_request(rng, templates))
        if opening != "none":
            writer.write(_frame(wire.Hello(client_id=client_id, trainer_id=int(rng.integers(-1, 2))), 1))
        if opening == "bad_auth":
            writer.write(_frame(wire.Auth(mac=rng.bytes(int(rng.choice([0, 31, 32, 64])))), 2))
        elif opening == "authenticated" and attack.token is not None:
            hello = await read_frame(reader, attack.read_timeout)
            assert isinstance(hello, wire.HelloReply), hello
            writer.write(_frame(wire.Auth(mac=auth_mac(attack.token, hello.nonce, client_id)), 2))
            ok = await read_frame(reader, attack.read_timeout)
            assert isinstance(ok, wire.Ok), ok
        tally.frames += len(frames)  # attempted: the server may close before it has read them all
        tally.bytes_sent += len(blob)
        tally.frames_by_kind.update(kind for kind, _ in frames)
        cuts = sorted(int(c) for c in rng.integers(0, len(blob) + 1, size=int(rng.integers(0, 3))))
        for start, end in zip([0, *cuts], [*cuts, len(blob)]):
            writer.write(blob[start:end])
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(attack.read_timeout):
            while chunk := await reader.read(1 << 16):
                received += chunk
        tally.endings["eof"] += 1
    except TimeoutError:  # before OSError, of which it is a subclass
        tally.endings["timeout"] += 1
    except (OSError, asyncio.IncompleteReadError):  # reset, broken pipe, not connected
        tally.endings["reset"] += 1
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    _tally_replies(bytes(received), tally, handshaken)


async def burst(attack: Attack, rng: np.random.Generator, frames: int, concurrency: int) -> Tally:
    """Sessions on ``concurrency`` connections at a time until at least ``frames`` hostile frames
    went out. Each session draws from a child RNG seeded from ``rng`` as it starts, so the
    sessions of a run (not their timing) are fixed by its seed."""
    tally = Tally()

    async def worker() -> None:
        while tally.frames < frames:
            await run_session(attack, np.random.default_rng(int(rng.integers(0, 1 << 63))), tally)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tally


# ----------------------------------------------------------------------------- the probe


class Probe:
    """A well-behaved client that must be served exactly, whatever the attack does."""

    def __init__(self, address: str, token: str | None, seed: int) -> None:
        self.address = address
        self.token = token
        self.rng = np.random.default_rng(seed)
        self.client: aps.PSClient | None = None
        self.rows = np.zeros((0, 0), np.float32)
        self.dense = np.zeros(0, np.float32)
        self.checks = 0

    async def open(self) -> Probe:
        self.client = await aps.connect([self.address], token=self.token, timeout=30)
        for spec in (TARGET_SPARSE, TARGET_DENSE, PROBE_SPARSE, PROBE_DENSE):
            await self.client.create_table(spec)
        self.rows = await self.client.pull_sparse(PROBE_SPARSE.name, np.arange(PROBE_SPARSE.rows))
        self.dense = await self.client.pull_dense(PROBE_DENSE.name)
        return self

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    def _deltas(self, shape: tuple[int, ...]) -> np.ndarray:
        return (self.rng.integers(-8, 9, size=shape) / 4).astype(np.float32)  # exact in float32

    async def check(self) -> None:
        """Push known deltas, then read both tables back on this connection and on a fresh
        one; any difference from the numpy copy is an AssertionError naming it."""
        assert self.client is not None
        ids = self.rng.integers(0, PROBE_SPARSE.rows, size=64)
        deltas = self._deltas((64, PROBE_SPARSE.dim))
        await self.client.push_sparse_delta(PROBE_SPARSE.name, ids, deltas)
        summed = np.zeros_like(self.rows)  # repeated ids are summed first (exactly), then added once
        np.add.at(summed, ids, deltas)
        touched = np.unique(ids)
        self.rows[touched] += summed[touched]
        dense = self._deltas(self.dense.shape)
        await self.client.push_dense_delta(PROBE_DENSE.name, dense)
        self.dense += dense
        async with aps.connect([self.address], token=self.token, timeout=30) as fresh:
            for client in (self.client, fresh):
                rows = await client.pull_sparse(PROBE_SPARSE.name, np.arange(PROBE_SPARSE.rows))
                assert rows.tobytes() == self.rows.tobytes(), "probe: sparse rows differ from the numpy model"
                assert (await client.pull_dense(PROBE_DENSE.name)).tobytes() == self.dense.tobytes(), "probe: dense differs"
        self.checks += 1

    async def server_state(self) -> dict[str, Any]:
        assert self.client is not None
        return next(iter((await self.client.stats()).values()))

    async def settle(self, connections: int = 1, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until only ``connections`` connections are open on the server (the attack's are
        gone); its stats then."""
        deadline = time.monotonic() + timeout
        while True:
            state = await self.server_state()
            if state["connections"] <= connections or time.monotonic() > deadline:
                return state
            await asyncio.sleep(0.05)


def table_bytes(state: dict[str, Any]) -> int:
    """Bytes the server's tables hold (hostile CREATE_TABLEs may legitimately add some)."""
    return int(sum(t["bytes"] for t in state["tables"].values()))


def server_flags(token_file: Path | None, checkpoint_root: Path, *extra: str) -> list[str]:
    """aps-server flags of an attacked server: it must not exit on a hostile worker_done, and
    saves stay in a scratch directory."""
    flags = ["--no-exit-when-done", "--checkpoint-root", str(checkpoint_root), *extra]
    return flags + (["--token-file", str(token_file)] if token_file is not None else [])

