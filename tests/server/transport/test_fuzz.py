"""Protocol fuzzing against a real pserver process, with and without a token.

Over 10k hostile frames per run, on hundreds of connections (bench/hostile.py draws them): random
bytes, real request frames with bytes flipped in the header or the payload, frames cut short,
headers promising bodies of up to 4 GiB, requests before the handshake, a HELLO after a first
frame that does not parse, wrong AUTHs. No session that has not completed the handshake may be
served, with a token or without (a targeted test checks such first frames one by one). Between
bursts a well-behaved client must be served bit-exact, both on its long-lived connection and on
a fresh one.

Memory: the server's RSS (/proc/PID/status) is read after N and after 2N hostile frames, once
the attack's connections are gone and their clients' linger time has passed (the server keeps a
gone client's change tracking and replay entries for ``--client-linger`` seconds; this test sets
1 s so that what is measured is what stays). Growth from N to 2N, less the bytes of any table a
hostile CREATE_TABLE made, must stay under RSS_GROWTH_BOUND, a constant: memory that leaked per
frame or per connection would pass it.

The RNG seed is printed and named in every failure; ``APS_FUZZ_SEED=S`` replays a run.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import aps
from aps import wire
from aps.errors import ErrorCode
from aps.wire.auth import auth_mac
from aps.wire.frame import encode_header
from bench import hostile  # the attack itself, shared with bench/fuzz_protocol.py
from bench.pservers import ServerProcess

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
#: limits of the attacked server: small, so that bodies it buffers for huge-length headers stay
#: small on a shared CI machine (bench/fuzz_protocol.py runs with the defaults)
MAX_FRAME = 1 * MIB
SERVER_LIMITS = (
    "--max-frame", str(MAX_FRAME), "--max-connection-bytes", str(4 * MIB), "--max-inflight-bytes", str(32 * MIB),
    "--max-table-bytes", str(1 * MIB), "--client-linger", "1",
    # two trainers, of which none ever completes a round: hostile sync pushes and default-count
    # barriers wait, and are withdrawn when their connection goes
    "--trainers", "2",
)
LINGER = 1.0
WARMUP_FRAMES = 3000  # before the first reading: allocator pools, caches, numba dispatch
BURST_FRAMES = 2000
BURSTS_PER_HALF = 2  # N = 4000 hostile frames between the two readings
#: RSS growth allowed from N to 2N frames; measured growth is 0 to 2 MiB (allocator noise)
RSS_GROWTH_BOUND = 8 * MIB
CONCURRENCY = 32


def fuzz_seed() -> int:
    return int(os.environ.get("APS_FUZZ_SEED") or np.random.SeedSequence().entropy % (1 << 32))


@dataclass
class Outcome:
    tally: hostile.Tally
    readings: list[tuple[int, int]]  # (server RSS, its tables' bytes) after the warm-up, N and 2N
    checks: int  # bit-exact probe checks passed


async def attack_and_measure(server: ServerProcess, token: str | None, seed: int) -> Outcome:
    rng = np.random.default_rng(seed)
    attack = hostile.Attack("127.0.0.1", server.port, token, MAX_FRAME, sources=hostile.source_pool(rng, 400))
    probe = await hostile.Probe(server.address, token, seed).open()
    total = hostile.Tally()
    readings: list[tuple[int, int]] = []

    async def fire(frames: int) -> None:
        total.add(await hostile.burst(attack, rng, frames, CONCURRENCY))
        assert server.alive(), f"the server died (exit status {server.proc.returncode}); log {server.log_path}"
        await probe.check()

    async def reading() -> None:
        await probe.settle()
        await asyncio.sleep(LINGER + 0.3)
        state = await probe.settle()
        # every attack connection is answered or closed: none is held (a junk AUTH after the
        # handshake, shed by a full throttle, once left its connection reading nothing for ever)
        assert state["connections"] <= 1, f"{state['connections'] - 1} attack connections still open after it ended"
        readings.append((server.rss()[0], hostile.table_bytes(state)))

    try:
        await fire(WARMUP_FRAMES)
        await reading()
        for _half in range(2):
            for _ in range(BURSTS_PER_HALF):
                await fire(BURST_FRAMES)
            await reading()
    finally:
        await probe.aclose()
    return Outcome(total, readings, probe.checks)


@pytest.mark.slow
@pytest.mark.parametrize("token", [None, "fuzz-token-5f1c"], ids=["no_token", "token"])
def test_hostile_frames_do_not_crash_leak_or_starve(tmp_path: Path, token: str | None) -> None:
    seed = fuzz_seed()
    print(f"fuzz seed {seed} (APS_FUZZ_SEED={seed} replays it)")
    token_file = None
    if token is not None:
        token_file = tmp_path / "token"
        token_file.write_text(token + "\n")
    server = ServerProcess.start(tmp_path, *hostile.server_flags(token_file, tmp_path, *SERVER_LIMITS))
    try:
        try:
            result = asyncio.run(attack_and_measure(server, token, seed))
        except AssertionError as exc:
            raise AssertionError(f"{exc} [fuzz seed {seed}]") from exc
        tally = result.tally
        (rss0, tables0), (rss1, tables1), (rss2, tables2) = result.readings
        where = f"[fuzz seed {seed}] {tally.as_dict()}"
        assert tally.frames >= WARMUP_FRAMES + 2 * BURSTS_PER_HALF * BURST_FRAMES >= 10_000, where
        assert tally.sessions >= 500 and result.checks == 1 + 2 * BURSTS_PER_HALF, where
        assert set(tally.frames_by_kind) == set(hostile.FRAME_KINDS), where
        openings = hostile.OPENINGS if token is not None else hostile.OPENINGS_NO_TOKEN
        assert set(tally.sessions_by_opening) == set(openings), where
        # refused the way docs/protocol.md says, never as a server bug, never served unauthenticated
        assert tally.replies["error:INTERNAL"] == 0, where
        assert tally.replies["error:BAD_REQUEST"] > 100 and tally.replies["error:AUTH_REQUIRED"] > 10, where
        assert tally.unauthenticated_served == 0, where
        if token is not None:
            assert tally.replies["error:AUTH_FAILED"] > 10, where
        # requests that got through reached the handlers and were answered
        assert sum(n for key, n in tally.replies.items() if key.startswith("ok:") and key != "ok:HELLO") > 100, where
        growth = (rss2 - rss1) - max(0, tables2 - tables1)
        print(f"server RSS: {rss0 / MIB:.1f} MiB after the warm-up, {rss1 / MIB:.1f} after N, {rss2 / MIB:.1f} after 2N "
              f"(N = {BURSTS_PER_HALF * BURST_FRAMES} frames); tables {tables0} -> {tables2} bytes")
        assert growth < RSS_GROWTH_BOUND, f"RSS grew {growth / MIB:.1f} MiB from N to 2N frames {where}"
        assert rss2 - rss0 - max(0, tables2 - tables0) < 2 * RSS_GROWTH_BOUND, where
    finally:
        status = server.stop()
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "request failed" not in log, f"[fuzz seed {seed}] server log: {log[-3000:]}"
    assert status == 0, f"[fuzz seed {seed}] the server exited with {status} on SIGTERM after the attack"


FIRST = aps.SparseTable("first", rows=16, dim=4, init=aps.Uniform(-1, 1), optimizer=aps.SGD(lr=1.0))
FIRST_IDS = np.array([1, 5, 9], dtype=np.int64)
FIRST_GRAD = wire.PushSparseGrad(table=FIRST.name, ids=FIRST_IDS, values=np.ones((3, 4), np.float32))


def first_frames() -> dict[str, tuple[bytes, ErrorCode]]:
    """Frames a connection may open with, none of them a well-formed HELLO, and the error each
    must get: valid requests, requests whose payload does not parse, an unknown opcode, a HELLO
    cut short."""
    pull = wire.encode_bytes(wire.PullSparse(table=FIRST.name, ids=FIRST_IDS), 11)
    push = wire.encode_bytes(FIRST_GRAD, 11, int(wire.Flag.FINAL))
    hello = wire.encode_bytes(wire.Hello(client_id=7), 11)
    return {
        "pull_sparse": (pull, ErrorCode.AUTH_REQUIRED),
        "push_sparse_grad": (push, ErrorCode.AUTH_REQUIRED),
        "pull_sparse_cut": (hostile.cut_payload(pull, 10), ErrorCode.AUTH_REQUIRED),
        "push_sparse_grad_cut": (hostile.cut_payload(push, 40), ErrorCode.AUTH_REQUIRED),
        "unknown_opcode": (encode_header(200, 0, 11, 8) + bytes(8), ErrorCode.AUTH_REQUIRED),
        "hello_cut": (hostile.cut_payload(hello, 8), ErrorCode.BAD_REQUEST),
    }


async def open_with(port: int, first: bytes) -> list[tuple[int, wire.Message]]:
    """``first``, then a HELLO, a push and a pull, in one write; every reply until the server
    closes the connection."""
    then = (wire.encode_bytes(wire.Hello(client_id=8), 12) + wire.encode_bytes(FIRST_GRAD, 13, int(wire.Flag.FINAL))
            + wire.encode_bytes(wire.PullSparse(table=FIRST.name, ids=FIRST_IDS), 14))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = bytearray()
    try:
        writer.write(first + then)
        writer.write_eof()  # a server that read on would answer and then close at this EOF
        async with asyncio.timeout(5):
            while chunk := await reader.read(1 << 16):
                received += chunk
    except ConnectionResetError:
        pass
    finally:
        writer.close()
    decoder = wire.FrameDecoder(1 << 20)
    decoder.receive_data(bytes(received))
    replies = []
    while (frame := decoder.next_frame()) is not None:
        replies.append((frame.request_id, wire.decode(frame)))
    return replies


@pytest.mark.slow
@pytest.mark.parametrize("token", [None, "first-token-9d2e"], ids=["no_token", "token"])
def test_a_first_frame_other_than_hello_is_refused_and_closes(tmp_path: Path, token: str | None) -> None:
    """Before the handshake any frame but a well-formed HELLO gets one error and the connection
    is closed: what follows it (a HELLO, a push, a pull) is never read, and no table changes. A
    frame whose payload did not parse used to get BAD_REQUEST with the connection left open, so
    a HELLO after it opened a server without a token to the requests that followed."""
    flags: tuple[str, ...] = ("--no-exit-when-done",)
    if token is not None:
        (tmp_path / "token").write_text(token + "\n")
        flags += ("--token-file", str(tmp_path / "token"))
    server = ServerProcess.start(tmp_path, *flags)

    async def run() -> tuple[dict[str, list[tuple[int, wire.Message]]], np.ndarray, np.ndarray]:
        async with aps.connect([server.address], token=token, timeout=30) as ps:
            await ps.create_table(FIRST)
            before = await ps.pull_sparse(FIRST.name, np.arange(FIRST.rows))
            seen = {name: await open_with(server.port, data) for name, (data, _code) in first_frames().items()}
            after = await ps.pull_sparse(FIRST.name, np.arange(FIRST.rows))
        return seen, before, after

    try:
        seen, before, after = asyncio.run(run())
    finally:
        server.stop()
    wrong = {
        name: seen[name] for name, (_data, code) in first_frames().items()
        if [(rid, type(msg), getattr(msg, "code", None)) for rid, msg in seen[name]] != [(11, wire.Error, code)]
    }
    assert not wrong, f"each first frame must get one ERROR (request 11) and a close; got {wrong}"
    assert after.tobytes() == before.tobytes(), "a connection that never completed the handshake changed a table"


TRACKED_ROWS = 1 << 20
TRACKING_CLIENTS = 128
TRACKING_BUDGET = 4 * MIB  # aps-server --max-tracking-bytes in the test


async def track_and_leave(address: str, clients: int) -> None:
    """``clients`` clients, each with its own client id, ask once for changed rows (which starts
    change tracking for them) and disconnect; then one push marks a row in every page of every
    bitmap still held."""
    for _ in range(clients):
        async with aps.connect([address], timeout=60) as ps:
            await ps.pull_sparse_changed("tracked")
    async with aps.connect([address], timeout=60) as ps:
        ids = np.arange(0, TRACKED_ROWS, 1024)
        await ps.push_sparse_grad("tracked", ids, np.ones((len(ids), 1), np.float32))


def settled_rss(server: ServerProcess, timeout: float = 15.0) -> int:
    """The server's RSS once it has stopped moving (four readings 0.25 s apart within 256 KiB):
    the kernel warm-up thread (aps/server/warmup.py) and the off-loop executor may still be
    loading or releasing memory when a request has just been answered."""
    readings = [server.rss()[0]]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.25)
        readings.append(server.rss()[0])
        last = readings[-4:]
        if len(last) == 4 and max(last) - min(last) < 256 * 1024:
            return last[-1]
    return readings[-1]


def test_gone_clients_change_tracking_does_not_grow_with_client_ids(tmp_path: Path) -> None:
    """Memory a server holds for clients that have gone must not grow with how many there were
    (issue 9: everything a connection holds is released when it goes, or bounded). Before the
    tracking budget, 128 client ids left 129 MiB of bitmaps behind for a minute on a 1M-row
    table; now tracking is charged to --max-tracking-bytes and gone clients' is dropped first.
    The baseline is read after one client has tracked, pushed and left, so that the kernels
    (loaded in a background thread at start) and the table are already in it."""
    server = ServerProcess.start(tmp_path, "--no-exit-when-done", "--max-tracking-bytes", str(TRACKING_BUDGET))

    async def create() -> None:
        async with aps.connect([server.address], timeout=60) as ps:
            spec = aps.SparseTable("tracked", rows=TRACKED_ROWS, dim=1, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
            await ps.create_table(spec)

    try:
        asyncio.run(create())
        asyncio.run(track_and_leave(server.address, 1))
        before = settled_rss(server)
        asyncio.run(track_and_leave(server.address, TRACKING_CLIENTS))
        growth = settled_rss(server) - before
        print(f"server RSS grew {growth / MIB:.1f} MiB for {TRACKING_CLIENTS} gone clients")
        # 128 bitmaps of 1M bits are 16 MiB (measured 17.9 MiB with the default 256 MiB budget);
        # the 4 MiB budget keeps them to it (measured 4.0 MiB)
        assert growth < TRACKING_BUDGET + 4 * MIB, f"server RSS grew {growth / MIB:.1f} MiB for {TRACKING_CLIENTS} gone clients"
    finally:
        server.stop()


async def hold_wrong_auths(server: ServerProcess, held: int) -> list[asyncio.StreamWriter]:
    """``held`` connections from 127.0.0.1 that send HELLO + a wrong AUTH and stay open."""
    conns = []
    for i in range(held):
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(wire.encode_bytes(wire.Hello(client_id=i), 1) + wire.encode_bytes(wire.Auth(mac=bytes(32)), 2))
        conns.append(writer)
    await asyncio.sleep(0.2)
    return conns


async def held_wrong_auths_then_valid_client(server: ServerProcess, token: str, held: int) -> float:
    """``held`` connections from 127.0.0.1 send HELLO + a wrong AUTH and stay open; then a client
    with the right token connects from the same address. Seconds until it is served."""
    conns = await hold_wrong_auths(server, held)
    started = asyncio.get_running_loop().time()
    try:
        async with aps.connect([server.address], token=token, timeout=20) as ps:
            await ps.ping()
        return asyncio.get_running_loop().time() - started
    finally:
        for writer in conns:
            writer.close()


@pytest.mark.slow
def test_wrong_token_guesses_do_not_lock_out_a_client_with_the_token(tmp_path: Path) -> None:
    """Throttling guesses must slow the guesser, not the clients that hold the token. When a
    right AUTH waited behind an address's failed ones, with 20 wrong AUTHs held open it waited
    7.9 s and with 270 it was never served; every AUTH is now checked as it arrives, only wrong
    ones are answered late, and those beyond the throttle's bounds are left to the handshake
    deadline (aps/server/transport/throttle.py)."""
    (tmp_path / "token").write_text("the-right-token\n")
    server = ServerProcess.start(tmp_path, "--no-exit-when-done", "--token-file", str(tmp_path / "token"),
                                 "--handshake-timeout", "3")
    try:
        waited = asyncio.run(held_wrong_auths_then_valid_client(server, "the-right-token", 270))
        assert waited < 1.0, f"the client with the token waited {waited:.1f} s"
    finally:
        server.stop()


async def junk_auth_after_auth(server: ServerProcess, token: str, held: int) -> list[wire.Message]:
    """``held`` wrong AUTHs from 127.0.0.1 fill the throttle's refusals for that address; then a
    connection from it authenticates, is served a PING, and sends a junk AUTH and a PING. The
    replies to those two (a TimeoutError when they do not come within 2 s)."""
    conns = await hold_wrong_auths(server, held)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    conns.append(writer)
    try:
        client_id = 1 << 40
        writer.write(wire.encode_bytes(wire.Hello(client_id=client_id), 1))
        hello = await hostile.read_frame(reader, 2)
        assert isinstance(hello, wire.HelloReply)
        writer.write(wire.encode_bytes(wire.Auth(mac=auth_mac(token, hello.nonce, client_id)), 2))
        assert isinstance(await hostile.read_frame(reader, 2), wire.Ok)
        writer.write(wire.encode_bytes(wire.Ping(), 3))  # a request: the connection is registered
        assert isinstance(await hostile.read_frame(reader, 2), wire.Ok)
        writer.write(wire.encode_bytes(wire.Auth(mac=bytes(32)), 4) + wire.encode_bytes(wire.Ping(), 5))
        return [await hostile.read_frame(reader, 2), await hostile.read_frame(reader, 2)]
    finally:
        for w in conns:
            w.close()


def test_a_junk_auth_on_an_authenticated_connection_is_answered_while_the_throttle_is_full(tmp_path: Path) -> None:
    """A wrong AUTH on a connection that has completed its handshake, sent while its address's
    scheduled refusals are full, was shed: never answered, and the connection read nothing more
    and was never closed (208 connections were held after a fuzz run). It is now answered at once
    (BAD_REQUEST: a connection authenticates once; no MAC is checked, so nothing is learnt) and
    the connection goes on serving."""
    (tmp_path / "token").write_text("the-right-token\n")
    server = ServerProcess.start(tmp_path, "--no-exit-when-done", "--token-file", str(tmp_path / "token"))
    try:
        auth_reply, ping_reply = asyncio.run(junk_auth_after_auth(server, "the-right-token", 80))
        assert isinstance(auth_reply, wire.Error) and auth_reply.code == ErrorCode.BAD_REQUEST, auth_reply
        assert "already authenticated" in auth_reply.message
        assert isinstance(ping_reply, wire.Ok), ping_reply
    finally:
        server.stop()
