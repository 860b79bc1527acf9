"""Caps on open connections: idle connections that only say HELLO must not use up a pserver's
file descriptors and lock its trainers out. Over ``max_connections_per_address`` (or
``max_connections``) a new connection is closed at once and counted; other addresses, and the
same one once connections close, are served. aps-server raises its soft open-file limit to the
hard one so the default cap fits."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import aps
from aps import wire
from tests.conftest import ROOT, wait_port_file
from tests.server.raw import Raw
from tests.server.test_limits import pserver, served

pytestmark = pytest.mark.timeout(60)


async def raw_from(server: aps.PServer, source: str) -> Raw:
    reader, writer = await asyncio.open_connection(server.host, server.port, local_addr=(source, 0))
    return Raw(reader, writer)


async def test_connections_over_the_caps_are_closed_at_once_and_others_are_served() -> None:
    async with pserver(max_connections=6, max_connections_per_address=4) as server:
        held = [await raw_from(server, "127.0.0.2") for _ in range(4)]
        for k, raw in enumerate(held):
            await raw.hello(client_id=100 + k)
        extra = await raw_from(server, "127.0.0.2")  # admitted while in its handshake (counted apart)
        extra.send(wire.Hello(client_id=199), 1)
        assert await extra.closed_by_peer(timeout=3) == b""  # through it, over the address's cap: closed
        other = [await raw_from(server, "127.0.0.3") for _ in range(2)]
        for k, raw in enumerate(other):
            await raw.hello(client_id=200 + k)
        over_total = await raw_from(server, "127.0.0.4")
        assert await over_total.closed_by_peer(timeout=3) == b""
        stats = server.core.stats.as_dict()
        assert stats["connections"] == 6 and stats["connections_refused"] == 2
        for raw in held:
            raw.close()
        async with asyncio.timeout(5):
            while server.core.stats.connections > 2:
                await asyncio.sleep(0.01)
        await served(server)  # from 127.0.0.1, and the slots of 127.0.0.2 are free again
        again = await raw_from(server, "127.0.0.2")
        await again.hello(client_id=300)
        for raw in (*other, again, extra, over_total):
            raw.close()


async def test_idle_connections_in_their_handshake_make_room_for_new_ones() -> None:
    """Connections that never finish a handshake are counted apart from established ones: when
    an address's handshaking slots (or the server's) are full, the oldest is closed for the new
    one, so idle connections from a host cannot lock its clients out (before: 512 idle
    connections from 127.0.0.1 took every per-address slot and 41 of 50 connects failed)."""
    async with pserver(max_connections=8, max_connections_per_address=4) as server:
        idle = [await raw_from(server, "127.0.0.2") for _ in range(4)]
        client = await raw_from(server, "127.0.0.2")
        await client.hello(client_id=1)  # served
        assert await idle[0].closed_by_peer(timeout=3) == b""  # the oldest idle one made room
        await client.call(wire.Ping(), 2)
        others = [await raw_from(server, "127.0.0.3") for _ in range(4)]  # 8 open: the server is full
        late = await raw_from(server, "127.0.0.4")
        await late.hello(client_id=2)  # the oldest idle connection of any address made room
        assert await idle[1].closed_by_peer(timeout=3) == b""
        assert server.admission.evicted == 2 and server.core.stats.connections == 8
        for raw in (*idle, client, *others, late):
            raw.close()


def test_bad_caps_are_refused() -> None:
    with pytest.raises(aps.ConfigError, match="max_connections_per_address"):
        aps.PServer(aps.ServerConfig(max_connections_per_address=-1))


def _low_soft_limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


def test_aps_server_raises_its_open_file_limit(tmp_path: Path) -> None:
    """Started with a soft limit of 256 (the hard one higher), aps-server runs with soft = hard."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard open-file limit here is {hard}: nothing to raise")
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bin" / "aps-server"), "--port", "0", "--port-file", str(port_file)],
        preexec_fn=_low_soft_limit, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
    )
    try:
        wait_port_file(port_file, proc)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
        soft, hard_seen = line.split()[3:5]
        assert soft == hard_seen, line
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)
        if proc.poll() is None:
            proc.kill()


def test_aps_server_refuses_a_negative_cap_in_one_line() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bin" / "aps-server"), "--max-connections", "-1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "max_connections" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
