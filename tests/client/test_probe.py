"""wait_listening: a trainer may start before its pservers (real sockets on loopback)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from aps.client.probe import wait_listening
from aps.errors import ConnectionLost

pytestmark = pytest.mark.timeout(30)


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_returns_once_a_late_server_listens() -> None:
    port = _unused_port()
    accepted = 0

    def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()

    async def listen_later() -> asyncio.Server:
        await asyncio.sleep(0.4)
        return await asyncio.start_server(count, "127.0.0.1", port)

    later = asyncio.ensure_future(listen_later())
    started = time.monotonic()
    await wait_listening([f"127.0.0.1:{port}"], 10)
    waited = time.monotonic() - started
    server = await later
    try:
        assert 0.35 <= waited < 5.0
        await asyncio.sleep(0.05)
        assert accepted == 1  # one probe that got in, closed at once
    finally:
        server.close()
        await server.wait_closed()


async def test_every_address_is_waited_for_and_the_missing_one_is_named() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    up = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    down = f"127.0.0.1:{_unused_port()}"
    try:
        await wait_listening([up], 1)
        started = time.monotonic()
        with pytest.raises(ConnectionLost, match=rf"pserver {down} did not accept connections within 0.5 s"):
            await wait_listening([up, down], 0.5)
        assert 0.45 <= time.monotonic() - started < 3.0
    finally:
        server.close()
        await server.wait_closed()
