"""Every ConnectionLost the client side raises says why as a CloseReason (real sockets on
loopback): a handshake that never came, a client closed while it connected, a pserver that
never listened (the probe, fleet's launch barrier), and a pserver that stayed away past the
client's deadline. The link's own reasons (closed, peer closed, reset, connect failed) are
tests/server/transport/test_close_reasons.py's."""

from __future__ import annotations

import asyncio
import socket

import pytest

import aps
from aps import wire
from aps.client.lanes import PortPlan
from aps.client.pool import LinkPool
from aps.client.probe import wait_listening
from aps.client.retry import RetryPolicy
from aps.errors import CloseReason, ConnectionLost
from aps.fleet import wait_for_pservers
from tests.server.raw import silent_server

pytestmark = pytest.mark.timeout(30)


def pool(address: str, timeout: float) -> LinkPool:
    return LinkPool(
        [address], PortPlan(1), RetryPolicy(0, 0.05, 0.0), client_id=5, trainer_id=-1, token=None,
        max_frame=wire.DEFAULT_MAX_FRAME, ssl=None, timeout=timeout, heartbeat=0.0,
    )


def unused_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_a_handshake_that_never_comes_is_a_handshake_timeout() -> None:
    async with silent_server() as address:
        links = pool(address, timeout=0.2)
        with pytest.raises(ConnectionLost, match="did not answer the handshake within 0.2 s") as info:
            await links.link(0)
        assert info.value.reason is CloseReason.HANDSHAKE_TIMEOUT
        await links.aclose()


async def test_a_client_closed_while_it_connected_is_closed() -> None:
    srv = await aps.serve(port=0)
    try:
        links = pool(srv.address, timeout=5)
        connecting = asyncio.ensure_future(links.link(0))
        await asyncio.sleep(0)  # the connect has started; its handshake needs the network
        await links.aclose()
        with pytest.raises(ConnectionLost, match="client closed while connecting") as info:
            await connecting
        assert info.value.reason is CloseReason.CLOSED
    finally:
        await srv.aclose()


async def test_a_pserver_that_never_listens_is_a_failed_connect_for_the_probe_and_fleet() -> None:
    address = unused_address()
    with pytest.raises(ConnectionLost, match="did not accept connections within 0.2 s") as info:
        await wait_listening([address], 0.2)
    assert info.value.reason is CloseReason.CONNECT_FAILED
    with pytest.raises(ConnectionLost, match="did not accept connections within 0.2 s") as info:
        await asyncio.to_thread(wait_for_pservers, [address], 0.2, 0.05)
    assert info.value.reason is CloseReason.CONNECT_FAILED


async def test_a_pserver_gone_past_the_deadline_says_why_it_is_unreachable() -> None:
    srv = await aps.serve(port=0)
    async with aps.connect([srv.address], timeout=10, deadline=0.3, backoff=0.02) as ps:
        await ps.ping()
        await srv.aclose()  # a shutdown: the connection ends, and nothing listens any more
        with pytest.raises(ConnectionLost, match="still unreachable") as info:
            await ps.ping()
        assert info.value.reason is CloseReason.CONNECT_FAILED
