"""A local process without a token against a default aps-server (real processes): declared but
unsent bodies, unauthenticated connections and idle connections from one host must not starve
the clients that do real work, and tables are held to a server-wide budget."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import aps
from aps import wire
from aps.errors import ErrorCode
from aps.wire.frame import encode_header
from bench.hostile import read_frame
from bench.pservers import ServerProcess

MIB = 1 << 20
EMB = aps.SparseTable("emb", rows=1 << 16, dim=16, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
#: a real push of 256 KiB: 4096 rows of 16 float32
IDS = np.arange(4096, dtype=np.int64) * 16
GRAD = np.ones((len(IDS), 16), np.float32)


async def real_push(address: str, token: str | None = None) -> float:
    """A well-behaved client creates the table, pushes 256 KiB and reads it back; the value."""
    async with aps.connect([address], token=token, timeout=20, retries=3) as ps:
        await ps.create_table(EMB)
        await ps.push_sparse_grad("emb", IDS, GRAD)
        return float((await ps.pull_sparse("emb", IDS[-1:]))[0, 0])


async def hello(port: int, client_id: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(wire.encode_bytes(wire.Hello(client_id=client_id), 1))
    assert isinstance(await read_frame(reader, 5), wire.HelloReply)
    return reader, writer


async def declared_bodies(server: ServerProcess, conns: int, declared: int, sent: int) -> tuple[int, float]:
    """``conns`` connections (HELLO done: no token) each declare a ``declared``-byte body and send
    ``sent`` bytes of it, then stay open while a real client pushes. (RSS growth, pushed value).
    The server has served a push before the reading (its kernels load in a thread at start)."""
    await real_push(server.address)
    await asyncio.sleep(0.5)
    before = server.rss()[0]
    writers = []
    try:
        for i in range(conns):
            _reader, writer = await hello(server.port, i + 1)
            writer.write(encode_header(int(wire.Op.PUSH_SPARSE_GRAD), 0, 2, declared, declared) + bytes(sent))
            writers.append(writer)
        await asyncio.sleep(1.0)
        grown = server.rss()[0] - before
        return grown, await real_push(server.address)
    finally:
        for writer in writers:
            writer.close()


@pytest.mark.slow
def test_declared_bodies_commit_no_memory_and_starve_no_one(tmp_path: Path) -> None:
    """16 connections declaring 64 MiB and sending 1.2 KB each filled the 1 GiB in-flight budget
    and made the server commit 1 GiB: a real 256 KiB push was refused TOO_LARGE."""
    server = ServerProcess.start(tmp_path, "--no-exit-when-done")
    try:
        grown, value = asyncio.run(declared_bodies(server, 16, 64 * MIB, 1200))
        assert value == -2.0  # SGD lr 1 on a zero table: the second push was applied
        # what was received, plus each connection's own receive buffer (128 KiB) and bookkeeping
        # received bytes plus each connection's own receive buffer (32 KiB until a frame needs more)
        assert grown < 16 * 1200 + 16 * 48 * 1024, f"RSS grew {grown / MIB:.2f} MiB for 19 KB received"
        print(f"RSS grew {grown / MIB:.2f} MiB with 16 x 64 MiB declared and 16 x 1.2 KB received")
    finally:
        server.stop()


async def unauthenticated_fill(server: ServerProcess, conns: int, token: str) -> float:
    """``conns`` connections that never authenticate each send most of a 4 KiB HELLO-sized frame
    and stay open while a client with the token pushes."""
    writers = []
    try:
        for _ in range(conns):
            _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(encode_header(int(wire.Op.HELLO), 0, 1, 4000) + bytes(3900))
            writers.append(writer)
        await asyncio.sleep(0.5)
        return await real_push(server.address, token)
    finally:
        for writer in writers:
            writer.close()


@pytest.mark.slow
def test_unauthenticated_connections_have_a_budget_of_their_own(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("the-token\n")
    server = ServerProcess.start(
        tmp_path, "--no-exit-when-done", "--token-file", str(tmp_path / "token"),
        "--max-frame", str(MIB), "--max-connection-bytes", str(2 * MIB), "--max-inflight-bytes", str(2 * MIB),
    )
    try:
        assert asyncio.run(unauthenticated_fill(server, 600, "the-token")) == -1.0  # 2.3 MiB declared by 600
    finally:
        server.stop()


async def idle_then_client(server: ServerProcess, idle: int, token: str | None) -> None:
    socks = []
    try:
        for _ in range(idle):
            socks.append((await asyncio.open_connection("127.0.0.1", server.port))[1])
        await asyncio.sleep(0.3)
        async with aps.connect([server.address], token=token, timeout=5, deadline=5) as ps:
            await ps.ping()
    finally:
        for writer in socks:
            writer.close()


@pytest.mark.slow
@pytest.mark.parametrize("token", [None, "the-token"], ids=["no_token", "token"])
def test_idle_connections_from_one_host_do_not_lock_it_out(tmp_path: Path, token: str | None) -> None:
    """512 idle connections from 127.0.0.1 took every per-address slot: 41 of 50 connects failed."""
    args = ["--no-exit-when-done"]
    if token is not None:
        (tmp_path / "token").write_text(token + "\n")
        args += ["--token-file", str(tmp_path / "token")]
    server = ServerProcess.start(tmp_path, *args)
    try:
        asyncio.run(idle_then_client(server, 512, token))
    finally:
        server.stop()


async def create_tables(address: str, sizes_mib: list[int]) -> list[str]:
    """Create one table of each size; what each create answered ("ok" or the refusal)."""
    answers = []
    async with aps.connect([address], timeout=30) as ps:
        for i, size in enumerate(sizes_mib):
            spec = aps.SparseTable(f"t{i}", rows=size * MIB // 64, dim=16, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
            try:
                await ps.create_table(spec)
                answers.append("ok")
            except aps.ServerError as exc:
                assert exc.code == ErrorCode.BAD_REQUEST
                answers.append(str(exc))
    return answers


def test_tables_are_held_to_a_server_wide_budget(tmp_path: Path) -> None:
    """--max-table-bytes capped each table, not their sum: one client created five 1 GB tables."""
    server = ServerProcess.start(tmp_path, "--no-exit-when-done", "--max-table-bytes", str(16 * MIB),
                                 "--max-tables-bytes", str(40 * MIB))
    try:
        answers = asyncio.run(create_tables(server.address, [16, 16, 16, 4]))
        assert answers[:2] == ["ok", "ok"] and answers[3] == "ok", answers
        assert "--max-tables-bytes" in answers[2] and "t2" in answers[2], answers
    finally:
        server.stop()


def test_the_default_tables_budget_is_a_share_of_memory() -> None:
    from aps.server.config import TABLES_SHARE_OF_MEMORY, ServerConfig, physical_memory

    assert ServerConfig().max_tables_bytes == int(physical_memory() * TABLES_SHARE_OF_MEMORY) > 0
