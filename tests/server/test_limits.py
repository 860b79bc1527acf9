"""Resource limits of a pserver, attacked over real TCP on port 0: handshake and frame deadlines,
bytes in flight per connection and per server, reply sizes computed before a reply is built,
barrier arrivals and sync chunks withdrawn when their client goes, and a table-size budget.

After every attack a well-behaved client must still be served.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
import structlog

import aps
from aps import wire
from aps.client.link import Link
from aps.errors import ErrorCode
from aps.specs import spec_to_dict
from aps.storage.tables import shard_nbytes
from aps.wire.frame import Flag, FrameDecoder, encode_header
from tests.conftest import eventually
from tests.server.raw import Raw

pytestmark = pytest.mark.timeout(60)

EMB = aps.SparseTable("emb", rows=1000, dim=16, init=aps.Uniform(-1, 1), optimizer=aps.SGD(lr=0.5))
KIB, MIB = 1 << 10, 1 << 20


# ---------------------------------------------------------------- helpers


def header(op: wire.Op, request_id: int, length: int, flags: int = 0) -> bytes:
    return encode_header(int(op), flags, request_id, length, max_frame=1 << 32)


def replies_in(data: bytes) -> list[tuple[int, wire.Message]]:
    dec = FrameDecoder(1 << 30)
    dec.receive_data(data)
    out = []
    while (frame := dec.next_frame()) is not None:
        out.append((frame.request_id, wire.decode(frame)))
    return out


async def served(server: aps.PServer) -> None:
    """A fresh, well-behaved client gets answers."""
    async with aps.connect([server.address], timeout=5) as ps:
        await ps.ping()
        await ps.create_table(EMB)
        assert (await ps.pull_sparse("emb", [1, 2, 999])).shape == (3, 16)


@contextlib.asynccontextmanager
async def pserver(**options) -> AsyncIterator[aps.PServer]:
    srv = await aps.serve(port=0, **options)
    try:
        yield srv
    finally:
        await srv.aclose()


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# ---------------------------------------------------------------- deadlines


async def test_silent_connection_is_closed_after_the_handshake_timeout() -> None:
    async with pserver(handshake_timeout=0.5) as srv:
        started = time.monotonic()
        silent = await Raw.open(srv)
        half_hello = await Raw.open(srv)  # a HELLO cut short counts as no handshake
        half_hello.send_bytes(wire.encode_bytes(wire.Hello(client_id=3), 1)[:30])
        hello = await Raw.open(srv)
        await hello.hello()  # the handshake done in time: kept open
        assert await silent.closed_by_peer() == b""
        assert await half_hello.closed_by_peer() == b""
        assert 0.4 < time.monotonic() - started < 2.0
        await asyncio.sleep(0.3)
        hello.send(wire.Ping(), 2)
        rid, ok = await hello.recv()
        assert rid == 2 and isinstance(ok, wire.Ok)
        for raw in (silent, half_hello, hello):
            raw.close()
        await served(srv)


async def test_handshake_deadline_with_a_token_needs_auth_too() -> None:
    async with pserver(handshake_timeout=0.5, token="s3cret") as srv:
        raw = await Raw.open(srv)
        reply = await raw.hello()  # HELLO alone is not the handshake when a token is set
        assert reply.auth_required == 1
        assert await raw.closed_by_peer() == b""
        raw.close()


@pytest.mark.parametrize("sent", ["header_and_part_of_body", "part_of_header"])
async def test_half_sent_frame_is_closed_after_the_frame_timeout(sent: str) -> None:
    async with pserver(frame_timeout=0.5) as srv:
        raw = await Raw.open(srv)
        await raw.hello()
        frame = header(wire.Op.PING, 2, 100) + bytes(100)
        with structlog.testing.capture_logs() as logs:
            started = time.monotonic()
            raw.send_bytes(frame[:40] if sent == "header_and_part_of_body" else frame[:10])
            assert await raw.closed_by_peer() == b""
            assert 0.4 < time.monotonic() - started < 2.0
        warnings = [e for e in logs if e.get("log_level") == "warning" and "in time" in e.get("event", "")]
        assert warnings and warnings[0]["peer"].startswith("127.0.0.1:"), logs
        raw.close()
        await eventually(lambda: srv.inflight_bytes == 0 and srv.core.stats.connections == 0)
        await served(srv)


@pytest.mark.alone  # a latency bound: its half-frame gaps must stay well inside the frame deadline
async def test_frames_sent_steadily_are_not_cut_by_the_frame_timeout() -> None:
    """The deadline is per frame: a connection busy for longer than it is fine. (A 0.3 s deadline
    against 0.1 s gaps was cut twice in clean-clone runs on a loaded 2-core machine: the deadline is
    now 10x the gap and the connection busy 2.5x the deadline.)"""
    async with pserver(frame_timeout=1.0) as srv:
        raw = await Raw.open(srv)
        await raw.hello()
        ping = wire.encode_bytes(wire.Ping(), 5)
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < 2.5:
            raw.send_bytes(ping[:10])  # every frame arrives in two halves, 0.1 s apart
            await asyncio.sleep(0.1)
            raw.send_bytes(ping[10:])
            n += 1
        for _ in range(n):
            rid, ok = await raw.recv()
            assert rid == 5 and isinstance(ok, wire.Ok)
        raw.close()


# ---------------------------------------------------------------- bytes in flight


async def test_body_larger_than_the_connection_budget_is_never_buffered() -> None:
    async with pserver(max_frame=64 * KIB, max_connection_bytes=128 * KIB) as srv:
        raw = await Raw.open(srv)
        await raw.hello()
        raw.send_bytes(header(wire.Op.PUSH_DENSE_GRAD, 2, 200 * KIB))  # over the budget (and the frame)
        assert await raw.closed_by_peer() == b""
        raw.close()
        await eventually(lambda: srv.inflight_bytes == 0 and srv.core.stats.connections == 0)
        await served(srv)


async def test_waiting_requests_count_and_a_frame_over_the_rest_is_refused() -> None:
    """Sync chunks waiting for another trainer hold their bytes; the next frame that would pass
    the connection's budget gets a retriable TOO_LARGE and the connection is closed. Everything
    is released once it is gone."""
    async with pserver(num_trainers=2, max_frame=64 * KIB, max_connection_bytes=150 * KIB) as srv:
        async with aps.connect([srv.address], timeout=5) as ps:
            await ps.create_table(EMB)
        raw = await Raw.open(srv)
        await raw.hello()
        ids = np.arange(800, dtype=np.int64)
        grads = np.ones((800, 16), np.float32)
        for rid in (10, 11):  # two chunks of one sync push, not FINAL: they wait in the round
            raw.send(wire.PushSparseGrad(table="emb", ids=ids, values=grads), rid, int(Flag.SYNC))
        await eventually(lambda: srv.core.sync_rounds.pending_bytes() == 2 * (ids.nbytes + grads.nbytes))
        held = srv.inflight_bytes
        assert 2 * (ids.nbytes + grads.nbytes) < held < 120 * KIB
        raw.send_bytes(header(wire.Op.PUSH_DENSE_GRAD, 12, 40 * KIB))  # fits a frame, not the budget
        rest = await raw.closed_by_peer()
        (rid, err), = replies_in(rest)
        assert rid == 12 and isinstance(err, wire.Error) and err.code == ErrorCode.TOO_LARGE and err.retriable
        assert "--max-connection-bytes" in err.message
        raw.close()
        await eventually(lambda: srv.inflight_bytes == 0 and srv.core.sync_rounds.pending_bytes() == 0)
        await served(srv)


@pytest.mark.slow
async def test_server_budget_counts_what_arrives_and_bounds_memory() -> None:
    """50 connections each declare a body below the per-connection budget but together far above
    the server's. Declaring holds nothing (before, the declared bodies filled the budget and the
    server committed them); the bytes that arrive are charged, and a connection whose bytes
    would pass the server's budget is refused."""
    body = 8 * MIB
    async with pserver(max_frame=body, max_connection_bytes=16 * MIB, max_inflight_bytes=64 * MIB) as srv:
        raws = [await Raw.open(srv) for _ in range(50)]
        for i, raw in enumerate(raws):
            await raw.hello(client_id=100 + i)
        before = rss()
        for raw in raws:
            raw.send_bytes(header(wire.Op.PUSH_DENSE_GRAD, 2, body))  # and then nothing
        await eventually(lambda: srv.inflight_bytes == 50 * wire.HEADER_SIZE)
        assert srv.core.stats.connections == 50
        assert rss() - before < 16 * MIB, "declared bodies were allocated"
        await served(srv)  # nothing declared stands in the way
        for raw in raws:
            raw.send_bytes(bytes(2 * MIB))  # a quarter of each body: 100 MiB in all
        await eventually(lambda: srv.core.stats.connections <= 32)
        grown = rss() - before
        assert srv.inflight_bytes <= 64 * MIB
        # every connection's 2 MiB is received before the charge refuses the ones past the
        # budget: memory is at most about twice the 100 MiB received, never what was declared.
        # (Not twice the 64 MiB held: a refused body's memory goes back to malloc, which keeps
        # it when earlier big frees in the process raised glibc's mmap threshold, the usual case
        # in a long test run: 171-187 MiB measured there, under 160 MiB in a fresh process.)
        received = 50 * 2 * MIB
        assert grown < 2 * received + 32 * MIB, f"RSS grew by {grown / MIB:.0f} MiB (50 x 8 MiB would be 400)"
        refused = 0
        for raw in raws:
            try:
                data = await raw.closed_by_peer(timeout=0.3)
            except TimeoutError:
                continue  # still open: its bytes fit
            (rid, err), = replies_in(data)
            assert rid == 2 and isinstance(err, wire.Error) and err.code == ErrorCode.TOO_LARGE and err.retriable
            assert "--max-inflight-bytes" in err.message
            refused += 1
        assert refused >= 50 - 32, refused
        for raw in raws:
            raw.close()
        await eventually(lambda: srv.inflight_bytes == 0 and srv.core.stats.connections == 0)


async def test_a_client_that_does_not_read_its_replies_stops_being_read() -> None:
    """Requests pipelined by a peer that never reads the replies are left unparsed once the
    replies back up, instead of being turned into ever more buffered reply bytes."""
    table = aps.DenseTable("d", shape=(8 * 1024,))
    async with pserver() as srv:
        async with aps.connect([srv.address], timeout=5) as ps:
            await ps.create_table(table)
        raw = await Raw.open(srv)
        await raw.hello()
        pull = wire.encode_bytes(wire.PullDense(table="d", block=0, offset=0, count=8 * 1024), 7)  # 32 KiB reply
        n = 3000  # 96 MiB of replies if all were built
        raw.send_bytes(pull * n)
        await asyncio.sleep(0.5)
        answered = srv.core.stats.ops["PullDense"].count
        assert answered < n // 2, answered
        conn = next(iter(srv.connections))
        assert conn.transport is not None and conn.transport.get_write_buffer_size() < 16 * MIB
        got = 0
        while got < n:  # reading resumes the server: every request is answered
            rid, reply = await raw.recv()
            assert rid == 7 and isinstance(reply, wire.ArrayReply) and reply.values.shape == (8 * 1024,)
            got += 1
        raw.close()


# ---------------------------------------------------------------- reply sizes


async def test_pull_whose_reply_exceeds_the_frame_is_refused_before_it_is_built() -> None:
    async with pserver(max_frame=64 * KIB) as srv:
        table = aps.SparseTable("wide", rows=100_000, dim=64, init=aps.Uniform(-1, 1))
        async with aps.connect([srv.address], timeout=10) as ps:
            await ps.create_table(table)
            ids = np.random.default_rng(0).integers(0, table.rows, 8000)  # a 64 KB request, a 2 MB reply
            link = await Link.open(srv.address, 5, -1, None, wire.DEFAULT_MAX_FRAME, 1)
            try:
                started = time.monotonic()
                with pytest.raises(aps.ServerError) as info:
                    await link.request(wire.PullSparse(table="wide", ids=ids), 10)
                assert time.monotonic() - started < 1.0
                assert info.value.code == ErrorCode.TOO_LARGE and not info.value.retriable
                assert "2048024 bytes" in info.value.message and "65536" in info.value.message
            finally:
                link.close()
            rows = await ps.pull_sparse("wide", ids)  # the client splits the same pull into frames
            assert rows.shape == (8000, 64)
            np.testing.assert_array_equal(rows[:10], await ps.pull_sparse("wide", ids[:10]))
            ops = (await ps.stats())[srv.address]["ops"]
            assert ops["PullSparse"]["count"] > 30
        await served(srv)


async def test_huge_pull_with_the_default_frame_is_refused_at_once() -> None:
    async with pserver() as srv:
        async with aps.connect([srv.address], timeout=10) as ps:
            await ps.create_table(aps.SparseTable("t", rows=10, dim=64))
        link = await Link.open(srv.address, 5, -1, None, wire.DEFAULT_MAX_FRAME, 1)
        try:
            ids = np.zeros(2_000_000, np.int64)  # 16 MB asking for 512 MB
            started = time.monotonic()
            with pytest.raises(aps.ServerError) as info:
                await link.request(wire.PullSparse(table="t", ids=ids), 10)
            assert info.value.code == ErrorCode.TOO_LARGE
            assert time.monotonic() - started < 1.0
            assert isinstance(await link.request(wire.Ping(), 11), wire.Ok)
        finally:
            link.close()


async def test_dense_pull_too_large_and_changed_rows_capped_to_a_frame() -> None:
    async with pserver(max_frame=8 * KIB) as srv:
        dense = aps.DenseTable("d", shape=(10_000,))
        sparse = aps.SparseTable("s", rows=2000, dim=16)
        async with aps.connect([srv.address], timeout=10) as ps:
            await ps.create_table(dense)
            await ps.create_table(sparse)
            link = await Link.open(srv.address, 9, -1, None, wire.DEFAULT_MAX_FRAME, 1)
            try:
                with pytest.raises(aps.ServerError) as info:
                    await link.request(wire.PullDense(table="d", block=0, offset=0, count=10_000), 10)
                assert info.value.code == ErrorCode.TOO_LARGE
                with pytest.raises(aps.ServerError) as info:  # a bad range still says so first
                    await link.request(wire.PullDense(table="d", block=0, offset=0, count=10**12), 11)
                assert info.value.code == ErrorCode.ID_OUT_OF_RANGE
                assert (await ps.pull_dense("d")).shape == (10_000,)
                # changed rows asked without a limit: one frame's worth at a time, the rest "more"
                await link.request(wire.PullSparseChanged(table="s", max_rows=0), 12)  # registers
                await ps.push_sparse_delta("s", np.arange(2000), np.ones((2000, 16), np.float32))
                got, rid = [], 13
                while True:
                    reply = await link.request(wire.PullSparseChanged(table="s", max_rows=0), rid)
                    assert isinstance(reply, wire.ChangedReply) and 0 < len(reply.ids) < 2000
                    got.append(reply.ids)
                    rid += 1
                    if not reply.more:
                        break
                np.testing.assert_array_equal(np.sort(np.concatenate(got)), np.arange(2000))
            finally:
                link.close()
        await served(srv)


# ---------------------------------------------------------------- disconnects


async def test_barrier_arrival_of_a_gone_client_does_not_count() -> None:
    async with pserver() as srv:
        gone = await aps.connect([srv.address], timeout=5)
        waiting = asyncio.ensure_future(gone.barrier("b", count=2))
        await eventually(lambda: srv.core.barriers.pending() == {"b": 1})
        waiting.cancel()  # the caller gives up and the client goes away
        await gone.aclose()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await eventually(lambda: srv.core.barriers.pending() == {})
        await eventually(lambda: srv.inflight_bytes == 0)
        async with aps.connect([srv.address], timeout=5) as a, aps.connect([srv.address], timeout=5) as b:
            with pytest.raises(aps.RequestTimeout):
                await a.barrier("b", count=2, value=1, timeout=0.5)  # alone: the gone one is not counted
            first = asyncio.ensure_future(a.barrier("b", count=2, value=1))
            assert await asyncio.wait_for(b.barrier("b", count=2, value=2), 5) == 3
            assert await asyncio.wait_for(first, 5) == 3
        await served(srv)


def _connection_of(srv: aps.PServer, client_id: int):
    return next(c for c in srv.connections if c.client_id == client_id)


def frames_of(srv: aps.PServer, op: str) -> int:
    """Frames of opcode ``op`` the server has received, over all its ports."""
    return sum(p.ops.get(op, 0) for p in srv.core.stats.ports)


async def test_barrier_retried_after_a_lost_connection_still_counts_once() -> None:
    async with pserver() as srv:
        async with aps.connect([srv.address], timeout=10, retries=3, backoff=0.05) as a, \
                aps.connect([srv.address], timeout=10) as b:
            first = asyncio.ensure_future(a.barrier("epoch", count=2, value=5))
            await eventually(lambda: srv.core.barriers.pending() == {"epoch": 1})
            dropped = _connection_of(srv, a.client_id)
            dropped.abort("test: the network drops it")  # the network drops a's connection
            # a reconnects and retries (a second BARRIER frame); its arrival counts again, once
            await eventually(lambda: frames_of(srv, "BARRIER") == 2 and _connection_of(srv, a.client_id) is not dropped)
            assert srv.core.barriers.pending() == {"epoch": 1}
            assert await asyncio.wait_for(b.barrier("epoch", count=2, value=7), 5) == 12
            assert await asyncio.wait_for(first, 5) == 12


async def test_partial_sync_push_of_a_gone_client_is_dropped() -> None:
    table = aps.SparseTable("s", rows=10, dim=4, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
    async with pserver(num_trainers=2) as srv:
        async with aps.connect([srv.address], timeout=5) as ps:
            await ps.create_table(table)
        link = await Link.open(srv.address, 1234, 0, None, wire.DEFAULT_MAX_FRAME, 1)
        stale = wire.PushSparseGrad(table="s", ids=np.array([1], np.int64), values=np.full((1, 4), 100.0, np.float32))
        pending = asyncio.ensure_future(link.request(stale, 10, int(Flag.SYNC)))  # no FINAL: partial
        await eventually(lambda: srv.core.sync_rounds.pending_bytes() > 0)
        link.close()
        with pytest.raises(aps.ConnectionLost):
            await pending
        await eventually(lambda: srv.core.sync_rounds.pending_bytes() == 0 and srv.inflight_bytes == 0)
        async with aps.connect([srv.address], timeout=5) as a, aps.connect([srv.address], timeout=5) as b:
            ones = np.ones((1, 4), np.float32)
            await asyncio.wait_for(asyncio.gather(a.push_sparse_grad("s", [1], ones, sync=True),
                                                  b.push_sparse_grad("s", [1], 3 * ones, sync=True)), 5)
            np.testing.assert_allclose(await a.pull_sparse("s", [1]), -2.0 * ones)  # mean of 1 and 3 only


async def test_sync_push_retried_after_a_lost_connection_is_applied_once() -> None:
    """Withdrawing a gone client's chunks must not lose its retried push, nor apply it twice."""
    table = aps.SparseTable("s", rows=10, dim=4, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
    async with pserver(num_trainers=2) as srv:
        async with aps.connect([srv.address], timeout=10, retries=3, backoff=0.05) as a, \
                aps.connect([srv.address], timeout=10) as b:
            await a.create_table(table)
            ones = np.ones((1, 4), np.float32)
            first = asyncio.ensure_future(a.push_sparse_grad("s", [2], 2 * ones, sync=True))
            await eventually(lambda: srv.core.sync_rounds.pending_bytes() > 0)
            _connection_of(srv, a.client_id).abort("test: the network drops it")
            await asyncio.sleep(0.3)  # a reconnects and pushes again (same request id)
            await asyncio.wait_for(b.push_sparse_grad("s", [2], 4 * ones, sync=True), 5)
            await asyncio.wait_for(first, 5)
            np.testing.assert_allclose(await a.pull_sparse("s", [2]), -3.0 * ones)  # (2 + 4) / 2, once
            assert srv.core.sync_rounds.pending_bytes() == 0


async def test_change_tracking_of_a_gone_client_is_dropped_and_it_resyncs_on_return() -> None:
    table = aps.SparseTable("g", rows=50, dim=2, init=aps.Constant(0.0))
    async with pserver(client_linger=0.2) as srv:
        async with aps.connect([srv.address], timeout=5) as ps:
            await ps.create_table(table)
            geo = await Link.open(srv.address, 4242, -1, None, wire.DEFAULT_MAX_FRAME, 1)
            reply = await geo.request(wire.PullSparseChanged(table="g"), 10)  # registers: nothing yet
            assert isinstance(reply, wire.ChangedReply) and len(reply.ids) == 0
            shard = srv.core.tables["g"]
            assert 4242 in shard._dirty
            geo.close()
            await eventually(lambda: 4242 not in shard._dirty)  # released after the linger
            await ps.push_sparse_delta("g", [3, 4], np.ones((2, 2), np.float32))
            back = await Link.open(srv.address, 4242, -1, None, wire.DEFAULT_MAX_FRAME, 20)
            try:
                reply = await back.request(wire.PullSparseChanged(table="g"), 30)
                # its tracking was dropped, so every row counts as changed (never a silent miss)
                assert isinstance(reply, wire.ChangedReply)
                np.testing.assert_array_equal(reply.ids, np.arange(50))
                reply = await back.request(wire.PullSparseChanged(table="g"), 31)
                assert len(reply.ids) == 0  # tracked again from here
            finally:
                back.close()


# ---------------------------------------------------------------- create_table


@pytest.mark.parametrize(
    "field,value",
    [("rows", 10.5), ("rows", True), ("rows", -1), ("rows", "7"), ("rows", None), ("rows", 1 << 64),
     ("dim", 0), ("dim", 2.0), ("seed", 0.5), ("colour", "red"), ("optimizer", {"type": "SGD", "lr": True}),
     ("optimizer", {"type": "SGD", "lr": 0.1, "decay": {"type": "Uniform"}}), ("init", [1, 2])],
)
async def test_bad_table_specs_are_bad_request(field: str, value: object) -> None:
    async with pserver() as srv:
        link = await Link.open(srv.address, 5, -1, None, wire.DEFAULT_MAX_FRAME, 1)
        try:
            spec = spec_to_dict(EMB)
            spec[field] = value
            with pytest.raises(aps.ServerError) as info:
                await link.request(wire.CreateTable(spec_json=json.dumps(spec)), 10)
            assert info.value.code == ErrorCode.BAD_REQUEST, info.value
            assert srv.core.specs == {}
        finally:
            link.close()
        await served(srv)


@pytest.mark.parametrize("shape", [[10.5], [True, 3], [], "ab", 7, [0, 3], [1 << 62, 8]])
async def test_bad_dense_shapes_are_bad_request(shape: object) -> None:
    async with pserver() as srv:
        link = await Link.open(srv.address, 5, -1, None, wire.DEFAULT_MAX_FRAME, 1)
        try:
            spec = {"type": "DenseTable", "name": "d", "shape": shape}
            with pytest.raises(aps.ServerError) as info:
                await link.request(wire.CreateTable(spec_json=json.dumps(spec)), 10)
            assert info.value.code == ErrorCode.BAD_REQUEST, info.value
            deep = "[" * 30_000 + "]" * 30_000  # JSON nested too deep for the parser
            with pytest.raises(aps.ServerError) as info:
                await link.request(wire.CreateTable(spec_json=deep), 11)
            assert info.value.code == ErrorCode.BAD_REQUEST, info.value
        finally:
            link.close()


def test_specs_refuse_wrong_types_locally() -> None:
    for kwargs in ({"rows": 10.5, "dim": 4}, {"rows": True, "dim": 4}, {"rows": 10, "dim": -1}):
        with pytest.raises(aps.ConfigError):
            aps.SparseTable("t", **kwargs)
    spec = aps.SparseTable("t", rows=np.int64(10), dim=np.int32(4))  # numpy integers are fine
    assert type(spec.rows) is int and json.loads(json.dumps(spec_to_dict(spec)))["rows"] == 10


async def test_table_over_the_size_budget_is_refused_before_allocation() -> None:
    limit = 1 * MIB
    async with pserver(max_table_bytes=limit, server_index=1, num_servers=2) as srv:
        link = await Link.open(srv.address, 5, -1, None, wire.DEFAULT_MAX_FRAME, 1)
        try:
            huge = aps.SparseTable("huge", rows=1 << 40, dim=1 << 20, optimizer=aps.Adam())
            started = time.monotonic()
            with pytest.raises(aps.ServerError) as info:
                await link.request(wire.CreateTable(spec_json=json.dumps(spec_to_dict(huge))), 10)
            assert time.monotonic() - started < 1.0
            err = info.value
            assert err.code == ErrorCode.BAD_REQUEST and "'huge'" in err.message
            assert str(shard_nbytes(huge, 1, 2)) in err.message and str(limit) in err.message
            assert "--max-table-bytes" in err.message
            # Adam: values, m and v (3 x 4 bytes per element) plus an int64 step per row; this
            # server holds every second row
            rows = 2 * (limit // (3 * 4 * 16 + 8))  # exactly at the limit on server 1
            fits = aps.SparseTable("fits", rows=rows, dim=16, optimizer=aps.Adam())
            assert shard_nbytes(fits, 1, 2) <= limit
            assert isinstance(await link.request(wire.CreateTable(spec_json=json.dumps(spec_to_dict(fits))), 11), wire.Ok)
            over = aps.SparseTable("over", rows=rows + 2, dim=16, optimizer=aps.Adam())
            assert shard_nbytes(over, 1, 2) > limit
            with pytest.raises(aps.ServerError) as info:
                await link.request(wire.CreateTable(spec_json=json.dumps(spec_to_dict(over))), 12)
            assert info.value.code == ErrorCode.BAD_REQUEST and "'over'" in info.value.message
            assert set(srv.core.specs) == {"fits"}
        finally:
            link.close()


def test_contradictory_limits_are_config_errors() -> None:
    with pytest.raises(aps.ConfigError, match="max_connection_bytes"):
        aps.PServer(aps.ServerConfig(max_frame=1 * MIB, max_connection_bytes=MIB))
    with pytest.raises(aps.ConfigError, match="max_inflight_bytes"):
        aps.PServer(aps.ServerConfig(max_connection_bytes=512 * MIB, max_inflight_bytes=256 * MIB))
    with pytest.raises(aps.ConfigError, match="frame_timeout"):
        aps.PServer(aps.ServerConfig(frame_timeout=-1))
    aps.PServer(aps.ServerConfig(max_connection_bytes=0, max_inflight_bytes=0, frame_timeout=0, handshake_timeout=0))


def test_decoder_announces_each_header_once_before_buffering_its_body() -> None:
    frames = [wire.encode_bytes(wire.Ping(), 1), header(wire.Op.PING, 2, 300_000) + bytes(300_000),
              wire.encode_bytes(wire.Stats(), 3)]
    stream = b"".join(frames)
    for step in (1, 7, 65536, len(stream)):  # whole, in chunks, one byte at a time
        dec = FrameDecoder(1 << 20)
        seen: list[tuple[int, int, int]] = []
        dec.on_header = lambda op, rid, n: seen.append((op, rid, n))
        got = []
        for i in range(0, len(stream), step):
            dec.receive_data(stream[i : i + step])
            while (frame := dec.next_frame()) is not None:
                got.append(frame.request_id)
        assert got == [1, 2, 3] and [s[1:] for s in seen] == [(1, 0), (2, 300_000), (3, 0)]
    dec = FrameDecoder(1 << 20)

    def refuse(op: int, rid: int, n: int) -> None:
        raise OverflowError("no")

    dec.on_header = refuse
    dec.receive_data(header(wire.Op.PING, 2, 300_000) + bytes(1000))
    with pytest.raises(OverflowError):
        dec.next_frame()
    assert dec._body is None  # nothing allocated for the refused body
    with pytest.raises(aps.RemoteProtocolError):
        dec.next_frame()
