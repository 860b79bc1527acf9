"""A pserver facing bad input: garbage bytes, lying headers, unknown opcodes, requests before the
handshake, and requests the client would never send (wrong dtypes, shapes, ranges, owners).

Every refusal must be a typed error (an Error frame with the right code, seen by the client as
``aps.ServerError``) or a closed connection; the server keeps serving everybody else.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import numpy as np
import pytest

import aps
from aps import wire
from aps.client.link import Link
from aps.errors import ErrorCode
from aps.sharding import dense_blocks
from aps.specs import spec_to_dict
from aps.wire.frame import HEADER, MAGIC, PROTOCOL_VERSION, Flag, encode_header
from tests.conftest import eventually
from tests.server.raw import Raw

pytestmark = pytest.mark.timeout(30)

EMB = aps.SparseTable("emb", rows=100, dim=4, init=aps.Uniform(-1, 1), optimizer=aps.SGD(lr=0.5))
DENSE = aps.DenseTable("w", shape=(50, 400), init=aps.Constant(1.0), optimizer=aps.SGD(lr=0.1))


# ---------------------------------------------------------------- helpers


async def ops_count(server: aps.PServer) -> int:
    return sum(s.count for s in server.core.stats.ops.values())


async def open_link(server: aps.PServer, client_id: int = 5) -> Link:
    return await Link.open(server.address, client_id, -1, None, wire.DEFAULT_MAX_FRAME, 1)


async def expect_code(link: Link, msg: wire.Message, code: ErrorCode, request_id: int, flags: int = 0) -> aps.ServerError:
    with pytest.raises(aps.ServerError) as info:
        await link.request(msg, request_id, flags)
    assert info.value.code == code, str(info.value)
    assert not info.value.retriable
    return info.value


async def assert_client_works(server: aps.PServer) -> None:
    async with aps.connect([server.address], timeout=5) as ps:
        await ps.ping()
        await ps.create_table(EMB)
        rows = await ps.pull_sparse("emb", [3, 4])
        assert rows.shape == (2, 4) and np.all(np.abs(rows) <= 1)


@pytest.fixture
async def server() -> AsyncIterator[aps.PServer]:
    srv = await aps.serve(port=0)
    yield srv
    await srv.aclose()


@pytest.fixture
async def cluster2() -> AsyncIterator[list[aps.PServer]]:
    servers = [await aps.serve(port=0, server_index=k, num_servers=2) for k in range(2)]
    yield servers
    for srv in servers:
        await srv.aclose()


# ---------------------------------------------------------------- framing level


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"\x00" * 24,
        bytes(range(256)),
        HEADER.pack(MAGIC, PROTOCOL_VERSION + 1, 17, 0, 0, 1, 0, 0),
        HEADER.pack(MAGIC, PROTOCOL_VERSION, 17, 0, 1, 1, 0, 0),
    ],
    ids=["http", "zeros", "bytes", "version", "reserved"],
)
async def test_garbage_closes_connection_and_server_keeps_serving(server: aps.PServer, garbage: bytes) -> None:
    raw = await Raw.open(server)
    raw.send_bytes(garbage)
    assert await raw.closed_by_peer() == b""  # no reply frame, just closed
    raw.close()
    await assert_client_works(server)
    await eventually(lambda: server.core.stats.connections == 0)


async def test_garbage_after_hello_closes_only_that_connection(server: aps.PServer) -> None:
    async with aps.connect([server.address], timeout=5) as ps:
        await ps.create_table(EMB)
        before = await ps.pull_sparse("emb", [1, 2, 3])
        raw = await Raw.open(server)
        await raw.hello()
        raw.send_bytes(b"\xde\xad\xbe\xef" * 10)
        assert await raw.closed_by_peer() == b""
        raw.close()
        after = await ps.pull_sparse("emb", [1, 2, 3])  # the other connection was never touched
        np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize("length", [wire.DEFAULT_MAX_FRAME + 1, 0xFFFFFFFF])
async def test_huge_declared_length_closed_before_body(server: aps.PServer, length: int) -> None:
    raw = await Raw.open(server)
    await raw.hello()
    # a valid header in every other respect; no body byte is ever sent
    raw.send_bytes(HEADER.pack(MAGIC, PROTOCOL_VERSION, int(wire.Op.PUSH_DENSE_GRAD), 0, 0, 2, length, 0))
    assert await raw.closed_by_peer(timeout=3.0) == b""
    raw.close()
    await assert_client_works(server)


async def test_declared_length_over_configured_max_frame() -> None:
    srv = await aps.serve(port=0, max_frame=8192)
    try:
        raw = await Raw.open(srv)
        reply = await raw.hello()
        assert reply.max_frame == 8192
        raw.send_bytes(HEADER.pack(MAGIC, PROTOCOL_VERSION, int(wire.Op.PING), 0, 0, 2, 8193, 0))
        assert await raw.closed_by_peer() == b""
        raw.close()
        # exactly max_frame is fine (a ping with a junk payload: BAD_REQUEST, connection kept)
        raw = await Raw.open(srv)
        await raw.hello()
        raw.send_bytes(HEADER.pack(MAGIC, PROTOCOL_VERSION, int(wire.Op.PING), 0, 0, 3, 8192, 0) + bytes(8192))
        rid, err = await raw.recv()
        assert rid == 3 and isinstance(err, wire.Error) and err.code == ErrorCode.BAD_REQUEST
        ok = await raw.call(wire.Ping(), 4)
        assert isinstance(ok, wire.Ok) and ok.op == wire.Op.PING
        raw.close()
    finally:
        await srv.aclose()


# ---------------------------------------------------------------- message level


async def test_unknown_opcode_after_hello_is_error_and_connection_stays(server: aps.PServer) -> None:
    raw = await Raw.open(server)
    await raw.hello()
    for rid, opcode in ((10, 100), (11, 0), (12, 254)):
        raw.send_bytes(encode_header(opcode, 0, rid, 0))
        got_rid, err = await raw.recv()
        assert got_rid == rid
        assert isinstance(err, wire.Error) and err.code == ErrorCode.UNKNOWN_OPCODE and not err.retriable
    reply = await raw.call(wire.Ping(), 13)
    assert isinstance(reply, wire.Ok) and reply.op == wire.Op.PING
    stats = await raw.call(wire.Stats(), 14)
    assert isinstance(stats, wire.TextReply) and json.loads(stats.text)["ops"]["Ping"]["count"] == 1
    raw.close()


@pytest.mark.parametrize(
    "msg",
    [wire.Ok(op=wire.Op.PING), wire.TextReply(op=wire.Op.STATS, text=b"{}"), wire.HelloReply(),
     wire.ArrayReply(op=wire.Op.PULL_DENSE, values=np.zeros(2, np.float32)), wire.ChangedReply(),
     wire.Error(code=1, message="x")],
    ids=lambda m: type(m).__name__,
)
async def test_reply_frames_sent_to_server_are_unknown_opcode(server: aps.PServer, msg: wire.Message) -> None:
    raw = await Raw.open(server)
    await raw.hello()
    err = await raw.call(msg, 20)
    assert isinstance(err, wire.Error) and err.code == ErrorCode.UNKNOWN_OPCODE, err
    assert isinstance(await raw.call(wire.Ping(), 21), wire.Ok)
    raw.close()


async def test_bad_payload_after_hello_is_bad_request_and_connection_stays(server: aps.PServer) -> None:
    raw = await Raw.open(server)
    await raw.hello()
    payload = b"\x05\x00emb"  # a string field claiming 5 bytes, holding 3
    raw.send_bytes(encode_header(int(wire.Op.PULL_SPARSE), 0, 30, len(payload)) + payload)
    rid, err = await raw.recv()
    assert rid == 30 and isinstance(err, wire.Error) and err.code == ErrorCode.BAD_REQUEST
    assert isinstance(await raw.call(wire.Ping(), 31), wire.Ok)
    raw.close()


@pytest.mark.parametrize("msg", [wire.Ping(), wire.Stats(), wire.PullSparse(table="emb", ids=np.arange(2)),
                                 wire.Auth(mac=b"x" * 32)], ids=lambda m: type(m).__name__)
async def test_request_before_hello_is_auth_required_and_closed(server: aps.PServer, msg: wire.Message) -> None:
    raw = await Raw.open(server)
    raw.send(msg, 1)
    rid, err = await raw.recv()
    assert rid == 1 and isinstance(err, wire.Error) and err.code == ErrorCode.AUTH_REQUIRED
    assert await raw.closed_by_peer() == b""
    raw.close()
    await assert_client_works(server)


async def test_duplicate_hello_is_bad_request(server: aps.PServer) -> None:
    raw = await Raw.open(server)
    await raw.hello()
    err = await raw.call(wire.Hello(client_id=9), 2)
    assert isinstance(err, wire.Error) and err.code == ErrorCode.BAD_REQUEST
    assert isinstance(await raw.call(wire.Ping(), 3), wire.Ok)
    raw.close()


async def test_token_server_refuses_requests_without_auth() -> None:
    srv = await aps.serve(port=0, token="s3cret")
    try:
        raw = await Raw.open(srv)
        reply = await raw.hello()
        assert reply.auth_required == 1 and len(reply.nonce) == 16
        raw.send(wire.Ping(), 2)
        rid, err = await raw.recv()
        assert rid == 2 and isinstance(err, wire.Error) and err.code == ErrorCode.AUTH_REQUIRED
        assert await raw.closed_by_peer() == b""
        raw.close()
        raw = await Raw.open(srv)
        await raw.hello()
        raw.send(wire.Auth(mac=b"\0" * 32), 2)
        rid, err = await raw.recv()
        assert rid == 2 and isinstance(err, wire.Error) and err.code == ErrorCode.AUTH_FAILED
        assert await raw.closed_by_peer() == b""
        raw.close()
    finally:
        await srv.aclose()


# ---------------------------------------------------------------- requests the client never sends


async def test_sparse_requests_with_bad_arrays(server: aps.PServer) -> None:
    async with aps.connect([server.address], timeout=5) as ps:
        await ps.create_table(EMB)
        before = await ps.pull_sparse("emb", np.arange(100))
    link = await open_link(server)
    try:
        rid = iter(range(100, 1000))
        f64_ids = np.array([1.0, 2.0])
        await expect_code(link, wire.PullSparse(table="emb", ids=f64_ids), ErrorCode.BAD_REQUEST, next(rid))
        await expect_code(link, wire.PullSparse(table="emb", ids=np.array([1, 2], np.int32)), ErrorCode.BAD_REQUEST, next(rid))
        await expect_code(link, wire.PullSparse(table="emb", ids=np.zeros((2, 2), np.int64)), ErrorCode.BAD_REQUEST, next(rid))
        grads = np.ones((2, 4), np.float32)
        await expect_code(link, wire.PushSparseGrad(table="emb", ids=f64_ids, values=grads), ErrorCode.BAD_REQUEST, next(rid))
        ids = np.array([1, 2], np.int64)
        for bad_values in (np.ones((2, 3), np.float32), np.ones((3, 4), np.float32), np.ones(8, np.float32),
                           np.ones((2, 4), np.float64)):
            await expect_code(link, wire.PushSparseGrad(table="emb", ids=ids, values=bad_values), ErrorCode.SHAPE_MISMATCH, next(rid))
            await expect_code(link, wire.PushSparseDelta(table="emb", ids=ids, values=bad_values), ErrorCode.SHAPE_MISMATCH, next(rid))
        for bad_ids in (np.array([0, 100]), np.array([-1]), np.array([1 << 62])):
            err = await expect_code(link, wire.PullSparse(table="emb", ids=bad_ids), ErrorCode.ID_OUT_OF_RANGE, next(rid))
            assert "emb" in err.message
            values = np.ones((len(bad_ids), 4), np.float32)
            await expect_code(link, wire.PushSparseGrad(table="emb", ids=bad_ids, values=values), ErrorCode.ID_OUT_OF_RANGE, next(rid))
        await expect_code(link, wire.PullSparse(table="nope", ids=ids), ErrorCode.UNKNOWN_TABLE, next(rid))
        await expect_code(link, wire.PushSparseGrad(table="nope", ids=ids, values=grads), ErrorCode.UNKNOWN_TABLE, next(rid))
        await expect_code(link, wire.PullSparseChanged(table="nope"), ErrorCode.UNKNOWN_TABLE, next(rid))
        await expect_code(link, wire.TableInfo(table="nope"), ErrorCode.UNKNOWN_TABLE, next(rid))
        # the connection is still fine, and no refused push changed a single value
        reply = await link.request(wire.PullSparse(table="emb", ids=np.arange(100)), next(rid))
        assert isinstance(reply, wire.ArrayReply)
        np.testing.assert_array_equal(reply.values, before)
    finally:
        link.close()


async def test_raw_socket_bad_sparse_requests_get_typed_errors(server: aps.PServer) -> None:
    """The same refusals over a bare socket: an Error frame per request, the connection kept."""
    async with aps.connect([server.address], timeout=5) as ps:
        await ps.create_table(EMB)
    raw = await Raw.open(server)
    await raw.hello()
    cases = [
        (wire.PullSparse(table="emb", ids=np.array([1.0, 2.0])), ErrorCode.BAD_REQUEST),
        (wire.PushSparseGrad(table="emb", ids=np.array([1, 2]), values=np.ones((2, 5), np.float32)), ErrorCode.SHAPE_MISMATCH),
        (wire.PushSparseGrad(table="emb", ids=np.array([1, 2]), values=np.ones((2, 4), np.float64)), ErrorCode.SHAPE_MISMATCH),
        (wire.PullSparse(table="emb", ids=np.array([100])), ErrorCode.ID_OUT_OF_RANGE),
        (wire.PullSparse(table="nope", ids=np.array([1])), ErrorCode.UNKNOWN_TABLE),
        (wire.PushDenseGrad(table="emb", values=np.ones(3, np.float32)), ErrorCode.BAD_REQUEST),
    ]
    for rid, (msg, code) in enumerate(cases, start=10):
        raw.send(msg, rid)
    replies = [await raw.recv() for _ in cases]  # pipelined: answered in order, each by its id
    assert [rid for rid, _ in replies] == list(range(10, 10 + len(cases)))
    for (_, reply), (_, code) in zip(replies, cases):
        assert isinstance(reply, wire.Error) and reply.code == code and not reply.retriable, reply
        err = aps.ServerError(reply.code, reply.message)
        assert err.code == code and code.name in str(err)
    ok = await raw.call(wire.PullSparse(table="emb", ids=np.array([99, 0])), 50)
    assert isinstance(ok, wire.ArrayReply) and ok.values.shape == (2, 4) and ok.values.dtype == np.float32
    raw.close()


async def test_ids_not_owned_by_this_server(cluster2: list[aps.PServer]) -> None:
    async with aps.connect([s.address for s in cluster2], timeout=5) as ps:
        await ps.create_table(EMB)
    for k, srv in enumerate(cluster2):
        link = await open_link(srv)
        try:
            foreign = np.array([1 - k, 2 + (1 - k)], np.int64)  # both owned by the other server
            err = await expect_code(link, wire.PullSparse(table="emb", ids=foreign), ErrorCode.BAD_REQUEST, 10)
            assert "does not own" in err.message
            mixed = np.array([k, 1 - k], np.int64)
            await expect_code(link, wire.PushSparseGrad(table="emb", ids=mixed, values=np.ones((2, 4), np.float32)),
                              ErrorCode.BAD_REQUEST, 11)
            own = np.array([k, k + 2, k + 98], np.int64)
            reply = await link.request(wire.PullSparse(table="emb", ids=own), 12)
            assert isinstance(reply, wire.ArrayReply) and reply.values.shape == (3, 4)
        finally:
            link.close()


async def test_dense_requests_with_bad_ranges(cluster2: list[aps.PServer]) -> None:
    async with aps.connect([s.address for s in cluster2], timeout=5) as ps:
        await ps.create_table(DENSE)
        await ps.create_table(EMB)
    blocks = dense_blocks("w", DENSE.size, 2)
    assert len(blocks) == 2
    rid = iter(range(100, 1000))
    for block in blocks:
        link = await open_link(cluster2[block.server])
        other = await open_link(cluster2[1 - block.server], client_id=6)
        try:
            b = block.index
            ok = await link.request(wire.PullDense(table="w", block=b, offset=0, count=block.size), next(rid))
            assert isinstance(ok, wire.ArrayReply) and ok.values.shape == (block.size,) and np.all(ok.values == 1.0)
            # wrong length / offset: past the end of the block
            await expect_code(link, wire.PullDense(table="w", block=b, offset=0, count=block.size + 1), ErrorCode.ID_OUT_OF_RANGE, next(rid))
            await expect_code(link, wire.PullDense(table="w", block=b, offset=block.size, count=1), ErrorCode.ID_OUT_OF_RANGE, next(rid))
            too_long = np.ones(block.size + 1, np.float32)
            await expect_code(link, wire.PushDenseGrad(table="w", block=b, offset=0, values=too_long), ErrorCode.ID_OUT_OF_RANGE, next(rid))
            await expect_code(link, wire.PushDenseDelta(table="w", block=b, offset=0, values=too_long), ErrorCode.ID_OUT_OF_RANGE, next(rid))
            ten = np.ones(10, np.float32)
            await expect_code(link, wire.PushDenseGrad(table="w", block=b, offset=block.size - 5, values=ten), ErrorCode.ID_OUT_OF_RANGE, next(rid))
            # sync pushes are validated before waiting for other trainers
            await expect_code(link, wire.PushDenseGrad(table="w", block=b, offset=block.size - 5, values=ten),
                              ErrorCode.ID_OUT_OF_RANGE, next(rid), flags=int(Flag.SYNC | Flag.FINAL))
            # a block this server does not hold
            await expect_code(other, wire.PullDense(table="w", block=b, offset=0, count=1), ErrorCode.ID_OUT_OF_RANGE, next(rid))
            await expect_code(other, wire.PushDenseGrad(table="w", block=b, offset=0, values=ten), ErrorCode.ID_OUT_OF_RANGE, next(rid))
            await expect_code(link, wire.PullDense(table="w", block=7, offset=0, count=1), ErrorCode.ID_OUT_OF_RANGE, next(rid))
            # wrong dtype / rank
            await expect_code(link, wire.PushDenseGrad(table="w", block=b, offset=0, values=np.ones(10, np.float64)),
                              ErrorCode.SHAPE_MISMATCH, next(rid))
            await expect_code(link, wire.PushDenseDelta(table="w", block=b, offset=0, values=np.ones((2, 5), np.float32)),
                              ErrorCode.SHAPE_MISMATCH, next(rid))
            # wrong table kind / unknown table
            await expect_code(link, wire.PullDense(table="emb", block=b, offset=0, count=1), ErrorCode.BAD_REQUEST, next(rid))
            await expect_code(link, wire.PullSparse(table="w", ids=np.arange(1)), ErrorCode.BAD_REQUEST, next(rid))
            await expect_code(link, wire.PullDense(table="nope", block=b, offset=0, count=1), ErrorCode.UNKNOWN_TABLE, next(rid))
            # nothing above changed the block
            again = await link.request(wire.PullDense(table="w", block=b, offset=0, count=block.size), next(rid))
            assert isinstance(again, wire.ArrayReply) and np.all(again.values == 1.0)
        finally:
            link.close()
            other.close()


async def test_bad_create_table_requests(server: aps.PServer) -> None:
    link = await open_link(server)
    try:
        await expect_code(link, wire.CreateTable(spec_json="{not json"), ErrorCode.BAD_REQUEST, 10)
        await expect_code(link, wire.CreateTable(spec_json='{"type": "Pickle"}'), ErrorCode.BAD_REQUEST, 11)
        await expect_code(link, wire.CreateTable(spec_json=json.dumps(spec_to_dict(aps.SGD(lr=0.1)))), ErrorCode.BAD_REQUEST, 12)
        bad_rows = spec_to_dict(EMB)
        bad_rows["rows"] = -5
        await expect_code(link, wire.CreateTable(spec_json=json.dumps(bad_rows)), ErrorCode.BAD_REQUEST, 13)
        extra = spec_to_dict(EMB)
        extra["colour"] = "red"
        await expect_code(link, wire.CreateTable(spec_json=json.dumps(extra)), ErrorCode.BAD_REQUEST, 14)
        assert server.core.specs == {}
        ok = await link.request(wire.CreateTable(spec_json=json.dumps(spec_to_dict(EMB))), 15)
        assert isinstance(ok, wire.Ok) and ok.op == wire.Op.CREATE_TABLE
        assert server.core.specs == {"emb": EMB}
    finally:
        link.close()


async def test_coordination_misuse(server: aps.PServer) -> None:
    async with aps.connect([server.address], timeout=5) as ps:
        with pytest.raises(aps.ServerError) as info:
            await ps.worker_done(trainer_id=5)  # the cluster has 1 trainer
        assert info.value.code == ErrorCode.BAD_REQUEST
        waiting = asyncio.ensure_future(ps.barrier("b", count=3, timeout=5))
        await asyncio.sleep(0.05)
        async with aps.connect([server.address], timeout=5) as other:
            with pytest.raises(aps.ServerError) as info:
                await other.barrier("b", count=2)
            assert info.value.code == ErrorCode.BAD_REQUEST
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting


async def test_reply_larger_than_max_frame_is_too_large_error() -> None:
    srv = await aps.serve(port=0, max_frame=8192)
    try:
        async with aps.connect([srv.address], timeout=5) as ps:
            await ps.create_table(EMB)
        link = await open_link(srv)
        try:
            ids = np.arange(100, dtype=np.int64) % 100
            ids = np.tile(ids, 6)  # 600 ids: a 4.8 KB request, a 9.6 KB reply
            await expect_code(link, wire.PullSparse(table="emb", ids=ids), ErrorCode.TOO_LARGE, 10)
            small = await link.request(wire.PullSparse(table="emb", ids=ids[:10]), 11)  # still usable
            assert isinstance(small, wire.ArrayReply) and small.values.shape == (10, 4)
        finally:
            link.close()
    finally:
        await srv.aclose()


async def test_unencodable_request_leaves_no_waiter_and_link_stays_usable() -> None:
    srv = await aps.serve(port=0, max_frame=8192)
    try:
        link = await Link.open(srv.address, 5, -1, None, 8192, 1)
        try:
            assert link.max_frame == 8192
            with pytest.raises(aps.LocalProtocolError):
                await link.request(wire.PushDenseGrad(table="w", values=np.ones(5000, np.float32)), 10)
            assert link.waiters == {}
            assert isinstance(await link.request(wire.Ping(), 11), wire.Ok)
        finally:
            link.close()
    finally:
        await srv.aclose()


async def test_rows_larger_than_a_frame_fail_loudly() -> None:
    """A row that cannot fit in one frame is a typed error on both paths, never a hang."""
    srv = await aps.serve(port=0, max_frame=8192)
    try:
        async with aps.connect([srv.address], timeout=5, retries=1, backoff=0.01) as ps:
            await ps.create_table(aps.SparseTable("huge", rows=10, dim=4096))
            with pytest.raises(aps.ServerError) as info:
                await ps.pull_sparse("huge", [1])
            assert info.value.code == ErrorCode.TOO_LARGE
            with pytest.raises(aps.LocalProtocolError):
                await ps.push_sparse_grad("huge", [1], np.ones((1, 4096), np.float32))
            await ps.ping()
    finally:
        await srv.aclose()


# ---------------------------------------------------------------- client-side misuse


async def test_client_side_misuse_raises_config_error_before_sending(cluster2: list[aps.PServer]) -> None:
    async with aps.connect([s.address for s in cluster2], timeout=5) as ps:
        await ps.create_table(EMB)
        await ps.create_table(DENSE)
        sent = [await ops_count(s) for s in cluster2]
        misuse = [
            ps.pull_sparse("emb", np.array([1.0, 2.0])),  # float ids
            ps.pull_sparse("emb", np.array([[1, 2]])),  # 2-d ids
            ps.pull_sparse("emb", ["a", "b"]),
            ps.pull_sparse("emb", [0, 100]),  # out of range
            ps.pull_sparse("emb", [-1]),
            ps.push_sparse_grad("emb", [1, 2], np.ones((2, 3))),  # shape mismatch
            ps.push_sparse_grad("emb", [1, 2], np.ones((3, 4))),
            ps.push_sparse_grad("emb", [1, 2], np.ones((2, 4), np.int64)),  # not floats
            ps.push_sparse_delta("emb", [1, 200], np.ones((2, 4))),
            ps.push_sparse_grad("emb", np.array([1.5]), np.ones((1, 4))),
            ps.pull_dense("emb"),  # wrong table kind
            ps.push_dense_grad("emb", np.ones(4)),
            ps.pull_sparse("w", [1]),
            ps.push_sparse_grad("w", [1], np.ones((1, 400))),
            ps.pull_sparse_changed("w"),
            ps.push_dense_grad("w", np.ones(DENSE.size - 1)),  # wrong size
            ps.push_dense_grad("w", np.ones((400, 50))),  # right size, wrong shape
            ps.push_dense_delta("w", np.ones(DENSE.shape, np.int32)),
            ps.create_table({"name": "x"}),  # type: ignore[arg-type]
            ps.worker_done(),  # not a trainer
        ]
        for call in misuse:
            with pytest.raises(aps.ConfigError):
                await call
        assert [await ops_count(s) for s in cluster2] == sent  # nothing reached a server
    with pytest.raises(aps.ConfigError):
        await ps.ping()  # closed client


@pytest.mark.parametrize("addresses", [[], ["localhost"], ["host:port"], [":80"]], ids=str)
def test_bad_addresses_are_config_errors(addresses: list[str]) -> None:
    with pytest.raises(aps.ConfigError):
        aps.connect(addresses)


async def test_addresses_in_wrong_order_is_config_error(cluster2: list[aps.PServer]) -> None:
    with pytest.raises(aps.ConfigError, match="order or count"):
        await aps.connect([cluster2[1].address, cluster2[0].address], timeout=5)
    with pytest.raises(aps.ConfigError, match="order or count"):
        await aps.connect([cluster2[0].address], timeout=5)
