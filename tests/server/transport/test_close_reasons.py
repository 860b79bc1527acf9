"""Why a connection closed, as a CloseReason value on both ends (real TCP on port 0): the
server connection's ``close_reason`` for each way the server ends one, and the ``reason`` of the
ConnectionLost a client's waiters get."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

import aps
from aps import wire
from aps.client.link import Link
from aps.errors import CloseReason, ConnectionLost
from aps.server.transport.connection import ConnectionState, ServerConnection
from aps.wire.frame import encode_header
from tests.conftest import eventually
from tests.server.raw import Raw
from tests.server.test_limits import pserver

pytestmark = pytest.mark.timeout(30)


async def the_connection(srv: aps.PServer) -> ServerConnection:
    await eventually(lambda: len(srv.connections) == 1, timeout=5)
    return next(iter(srv.connections))


async def closed_by_server(raw: Raw) -> None:
    """Read until the server closes the connection."""
    with contextlib.suppress(EOFError, ConnectionError):
        while True:
            await raw.recv(timeout=5)


async def test_server_connection_closes_carry_a_reason_value() -> None:
    async with pserver(handshake_timeout=0.2, max_handshake_bytes=1024) as srv:
        raw = await Raw.open(srv)  # says nothing
        conn = await the_connection(srv)
        assert (conn.state, conn.close_reason) == (ConnectionState.ACCEPTED, None)
        await closed_by_server(raw)
        await eventually(lambda: conn.state is ConnectionState.LOST, timeout=5)
        assert (conn.close_reason, conn.close_detail) == (CloseReason.HANDSHAKE_TIMEOUT, "no handshake within 0.2 s")

        raw = await Raw.open(srv)
        conn = await the_connection(srv)
        raw.send_bytes(b"\x00" * 64)  # not a frame header
        await closed_by_server(raw)
        await eventually(lambda: conn.state is ConnectionState.LOST, timeout=5)
        assert conn.close_reason is CloseReason.BAD_FRAME

        raw = await Raw.open(srv)
        conn = await the_connection(srv)
        raw.send_bytes(encode_header(int(wire.Op.HELLO), 0, 1, 2000, max_frame=1 << 32) + bytes(2000))  # over 1 KiB
        await closed_by_server(raw)
        await eventually(lambda: conn.state is ConnectionState.LOST, timeout=5)
        assert conn.close_reason is CloseReason.FRAME_REFUSED and "max-handshake-bytes" in conn.close_detail

        raw = await Raw.open(srv)
        conn = await the_connection(srv)
        raw.send(wire.Ping(), 1)  # before HELLO
        await closed_by_server(raw)
        await eventually(lambda: conn.state is ConnectionState.LOST, timeout=5)
        assert (conn.close_reason, conn.close_detail) == (CloseReason.HANDSHAKE_REFUSED, "the first message must be hello")

        async with aps.connect([srv.address], timeout=5) as ps:
            await ps.ping()
            conn = await the_connection(srv)
            assert conn.state is ConnectionState.SERVING
        await eventually(lambda: conn.state is ConnectionState.LOST, timeout=5)
        assert conn.close_reason is CloseReason.PEER_CLOSED


async def test_client_connection_lost_carries_the_reason() -> None:
    table = aps.SparseTable("s", rows=10, dim=4, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
    async with pserver(num_trainers=2) as srv:
        async with aps.connect([srv.address], timeout=5) as ps:
            await ps.create_table(table)
        push = wire.PushSparseGrad(table="s", ids=np.array([1], np.int64), values=np.ones((1, 4), np.float32))

        link = await Link.open(srv.address, 77, 0, None, wire.DEFAULT_MAX_FRAME, 1)
        waiting = asyncio.ensure_future(link.request(wire.Barrier(name="b", count=2), 10))
        await eventually(lambda: srv.core.barriers.pending() == {"b": 1}, timeout=5)
        link.close()  # our own close
        with pytest.raises(ConnectionLost) as info:
            await waiting
        assert info.value.reason is CloseReason.CLOSED and link.close_reason is CloseReason.CLOSED
        with pytest.raises(ConnectionLost) as info:
            await link.request(push, 11)
        assert info.value.reason is CloseReason.CLOSED

        link = await Link.open(srv.address, 78, 0, None, wire.DEFAULT_MAX_FRAME, 1)
        waiting = asyncio.ensure_future(link.request(wire.Barrier(name="c", count=2), 10))
        await eventually(lambda: srv.core.barriers.pending() == {"c": 1}, timeout=5)
        next(iter(srv.connections)).abort("test: the server drops it")
        with pytest.raises(ConnectionLost) as info:
            await waiting
        assert info.value.reason in (CloseReason.PEER_CLOSED, CloseReason.RESET)
        assert link.close_reason is info.value.reason

    with pytest.raises(ConnectionLost) as info:  # the server is gone
        await Link.open(srv.address, 79, 0, None, wire.DEFAULT_MAX_FRAME, 1)
    assert info.value.reason is CloseReason.CONNECT_FAILED
