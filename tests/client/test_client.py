"""PSClient against real in-process pservers on port 0: sharding, chunking, idempotent create,
auth, retry de-duplication, connection loss, timeouts, barriers, sync pushes, change tracking,
worker_done shutdown, stats and checkpoints."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest

import aps
from aps import wire
from aps.client.link import Link
from aps.errors import ErrorCode
from aps.wire.frame import Flag, FrameDecoder, encode_header
from tests.server.raw import silent_server

pytestmark = pytest.mark.timeout(60)

SPARSE = aps.SparseTable("emb", rows=1000, dim=8, init=aps.Uniform(-0.1, 0.1), optimizer=aps.SGD(lr=0.5), seed=3)
DENSE = aps.DenseTable("fc", shape=(100, 250), init=aps.Normal(0.0, 0.05), optimizer=aps.SGD(lr=0.25))
WIDE = aps.SparseTable("wide", rows=5000, dim=64, init=aps.Normal(0, 0.1), optimizer=aps.Adam(lr=0.01))
BIG_DENSE = aps.DenseTable("big", shape=(60, 700), init=aps.Uniform(-1, 1), optimizer=aps.Adagrad(lr=0.1))
FAST = dict(retries=2, backoff=0.01, deadline=0.3)


# ---------------------------------------------------------------- helpers


@contextlib.asynccontextmanager
async def cluster(n: int, **options) -> AsyncIterator[list[aps.PServer]]:
    servers = []
    try:
        for k in range(n):
            servers.append(await aps.serve(port=0, server_index=k, num_servers=n, **options))
        yield servers
    finally:
        for srv in servers:
            await srv.aclose()


def addrs(servers: list[aps.PServer]) -> list[str]:
    return [s.address for s in servers]


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


PUSH_IDS = np.array([5, 3, 5, 0, 999, 3, 5, 17, 18, 19, 500, 501, 502], dtype=np.int64)
PUSH_GRADS = rng(1).standard_normal((len(PUSH_IDS), 8)).astype(np.float32)
DENSE_GRAD = rng(2).standard_normal(DENSE.shape).astype(np.float32)


async def run_workload(n: int) -> dict[str, np.ndarray]:
    """Initial rows, rows after SGD pushes with duplicate ids, dense before/after, on n servers."""
    async with cluster(n) as servers, aps.connect(addrs(servers), timeout=10) as ps:
        await ps.create_table(SPARSE)
        await ps.create_table(DENSE)
        all_ids = np.arange(SPARSE.rows)
        out = {"init": await ps.pull_sparse("emb", all_ids), "dense_init": await ps.pull_dense("fc")}
        await ps.push_sparse_grad("emb", PUSH_IDS, PUSH_GRADS)
        await ps.push_dense_grad("fc", DENSE_GRAD)
        out["after"] = await ps.pull_sparse("emb", all_ids)
        out["dense_after"] = await ps.pull_dense("fc")
        out["ordered"] = await ps.pull_sparse("emb", PUSH_IDS)
        return out


# ---------------------------------------------------------------- sharding


async def test_results_identical_on_1_2_3_servers() -> None:
    results = [await run_workload(n) for n in (1, 2, 3)]
    base = results[0]
    init = base["init"]
    # sane init: in range, every column varies (no column stuck at a constant), rows differ
    assert init.shape == (1000, 8) and init.dtype == np.float32
    assert np.all(init >= -0.1) and np.all(init < 0.1)
    assert np.all(init.std(axis=0) > 0.03)
    assert len(np.unique(init[:, 0])) > 990
    assert base["dense_init"].shape == DENSE.shape and abs(float(base["dense_init"].std()) - 0.05) < 0.005
    for other in results[1:]:
        for key in base:
            np.testing.assert_array_equal(other[key], base[key], err_msg=key)
    # the SGD math: duplicate ids sum their gradients; untouched rows did not move
    expected = init.copy()
    summed = np.zeros_like(init)
    np.add.at(summed, PUSH_IDS, PUSH_GRADS)
    expected -= 0.5 * summed
    np.testing.assert_allclose(base["after"], expected, rtol=1e-6, atol=1e-7)
    untouched = np.setdiff1d(np.arange(1000), PUSH_IDS)
    np.testing.assert_array_equal(base["after"][untouched], init[untouched])
    np.testing.assert_allclose(base["dense_after"], base["dense_init"] - 0.25 * DENSE_GRAD, rtol=1e-6, atol=1e-7)
    # rows come back in caller order, repeats included
    np.testing.assert_array_equal(base["ordered"], base["after"][PUSH_IDS])


async def test_pull_order_and_repeats_on_three_servers() -> None:
    async with cluster(3) as servers, aps.connect(addrs(servers), timeout=10) as ps:
        await ps.create_table(SPARSE)
        full = await ps.pull_sparse("emb", np.arange(1000))
        for ids in ([7], [2, 1, 0], [999, 0, 999, 0, 3, 3, 3], list(range(999, -1, -7)), []):
            got = await ps.pull_sparse("emb", np.array(ids, dtype=np.int64))
            assert got.shape == (len(ids), 8)
            np.testing.assert_array_equal(got, full[np.array(ids, dtype=np.int64)])
        got = await ps.pull_sparse("emb", np.array([4, 1], dtype=np.uint32))  # any integer dtype
        np.testing.assert_array_equal(got, full[[4, 1]])


# ---------------------------------------------------------------- chunking


async def chunk_workload(n: int, max_frame: int) -> dict[str, np.ndarray]:
    opts = {} if max_frame == wire.DEFAULT_MAX_FRAME else {"max_frame": max_frame}
    gen = rng(7)
    ids = gen.integers(0, WIDE.rows, size=1500)
    ids[::10] = 42  # a repeated id spread over many chunks
    grads = gen.standard_normal((len(ids), WIDE.dim)).astype(np.float32)
    dense_grad = gen.standard_normal(BIG_DENSE.shape).astype(np.float32)
    async with cluster(n, **opts) as servers, aps.connect(addrs(servers), timeout=45, max_frame=max_frame) as ps:
        await ps.create_table(WIDE)
        await ps.create_table(BIG_DENSE)
        out = {"pull": await ps.pull_sparse("wide", ids), "dense": await ps.pull_dense("big")}
        for _ in range(2):
            await ps.push_sparse_grad("wide", ids, grads)
            await ps.push_dense_grad("big", dense_grad)
        out["pushed"] = await ps.pull_sparse("wide", np.arange(WIDE.rows))
        out["dense_pushed"] = await ps.pull_dense("big")
        await ps.push_sparse_delta("wide", ids, grads)
        await ps.push_dense_delta("big", dense_grad)
        out["delta"] = await ps.pull_sparse("wide", ids)
        out["dense_delta"] = await ps.pull_dense("big")
        stats = await ps.stats()
        out["requests"] = np.array([sum(s["ops"]["PullSparse"]["count"] for s in stats.values())])
        return out


@pytest.mark.parametrize("n", [1, 2])
async def test_chunked_equals_unchunked(n: int) -> None:
    small = await chunk_workload(n, 8192)
    whole = await chunk_workload(n, wire.DEFAULT_MAX_FRAME)
    # 1500 rows of 64 floats need ~100 frames of 8 KiB; a 42000-float dense table ~40
    assert small["requests"][0] > 50 * 2 and whole["requests"][0] == 3 * n
    for key in ("pull", "dense", "pushed", "dense_pushed", "delta", "dense_delta"):
        np.testing.assert_allclose(small[key], whole[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert small["dense"].shape == BIG_DENSE.shape


async def test_client_max_frame_smaller_than_server_s() -> None:
    async with cluster(2) as servers:
        async with aps.connect(addrs(servers), max_frame=8192) as small, aps.connect(addrs(servers)) as big:
            await small.create_table(WIDE)
            ids = np.arange(0, 5000, 3)
            np.testing.assert_array_equal(await small.pull_sparse("wide", ids), await big.pull_sparse("wide", ids))
            ops = (await small.stats())[servers[0].address]["ops"]
            assert ops["PullSparse"]["count"] > 20  # the small client chunked


async def test_server_max_frame_smaller_than_client_s() -> None:
    """The client learns the server's max frame at hello and chunks for it."""
    async with cluster(1, max_frame=8192) as servers, aps.connect(addrs(servers)) as ps:
        await ps.create_table(BIG_DENSE)
        dense = await ps.pull_dense("big")
        assert dense.shape == BIG_DENSE.shape and np.all(np.abs(dense) <= 1)
        await ps.push_dense_delta("big", np.ones(BIG_DENSE.shape, np.float32))
        np.testing.assert_allclose(await ps.pull_dense("big"), dense + 1, rtol=1e-6)


async def test_pull_dense_into_an_array_of_the_callers() -> None:
    """``out=``: the values land in the caller's array (split over 2 servers and many frames),
    which is returned; an array of another shape or dtype is refused before any request."""
    async with cluster(2, max_frame=8192) as servers, aps.connect(addrs(servers)) as ps:
        await ps.create_table(BIG_DENSE)
        out = np.full(BIG_DENSE.shape, np.nan, np.float32)
        assert await ps.pull_dense("big", out=out) is out
        np.testing.assert_array_equal(out, await ps.pull_dense("big"))
        for bad in (np.zeros(BIG_DENSE.shape, np.float64), np.zeros((1, *BIG_DENSE.shape), np.float32),
                    np.zeros(BIG_DENSE.shape[::-1], np.float32).T):
            with pytest.raises(aps.ConfigError, match="out must be C-contiguous float32"):
                await ps.pull_dense("big", out=bad)


# ---------------------------------------------------------------- tables


async def test_create_table_idempotent_and_table_exists() -> None:
    async with cluster(2) as servers:
        async with aps.connect(addrs(servers)) as a, aps.connect(addrs(servers)) as b:
            await a.create_table(SPARSE)
            rows = await a.pull_sparse("emb", [1, 2, 3])
            await a.push_sparse_grad("emb", [1], np.ones((1, 8)))
            await b.create_table(SPARSE)  # same spec: no-op, does not reset the table
            await a.create_table(SPARSE)
            np.testing.assert_allclose(await b.pull_sparse("emb", [1, 2, 3]), rows - np.array([[0.5], [0], [0]]), rtol=1e-6)
            for different in (
                aps.SparseTable("emb", rows=1000, dim=16),
                aps.SparseTable("emb", rows=1000, dim=8, init=aps.Uniform(-0.1, 0.1), optimizer=aps.SGD(lr=0.4), seed=3),
                aps.DenseTable("emb", shape=(1000, 8)),
            ):
                with pytest.raises(aps.ServerError) as info:
                    await b.create_table(different)
                assert info.value.code == ErrorCode.TABLE_EXISTS and not info.value.retriable
            # another client learns the spec from the servers
            async with aps.connect(addrs(servers)) as c:
                assert await c.table_spec("emb") == SPARSE
                np.testing.assert_array_equal(await c.pull_sparse("emb", [2, 3]), rows[1:])
                with pytest.raises(aps.ServerError) as info:
                    await c.table_spec("missing")
                assert info.value.code == ErrorCode.UNKNOWN_TABLE
                with pytest.raises(aps.ServerError) as info:
                    await c.pull_sparse("missing", [1])
                assert info.value.code == ErrorCode.UNKNOWN_TABLE


# ---------------------------------------------------------------- auth


async def test_auth_with_token() -> None:
    async with cluster(2, token="let-me-in") as servers:
        async with aps.connect(addrs(servers), token="let-me-in") as ps:
            await ps.create_table(SPARSE)
            assert (await ps.pull_sparse("emb", [1, 2])).shape == (2, 8)
        with pytest.raises(aps.ServerError) as info:
            await aps.connect(addrs(servers), token="wrong", timeout=5, **FAST)
        assert info.value.code == ErrorCode.AUTH_FAILED
        with pytest.raises(aps.TokenMissing, match="requires a token and none was given"):
            await aps.connect(addrs(servers), timeout=5, **FAST)  # a setting to fix here: a ConfigError
        # the servers still serve the right token afterwards
        async with aps.connect(addrs(servers), token="let-me-in") as ps:
            assert (await ps.pull_sparse("emb", [3])).shape == (1, 8)
    async with cluster(1) as servers, aps.connect(addrs(servers), token="unneeded") as ps:
        await ps.ping()  # a token the server does not need is harmless


# ---------------------------------------------------------------- retries and de-duplication


async def test_replayed_push_with_same_request_id_is_applied_once() -> None:
    async with cluster(1) as servers, aps.connect(addrs(servers)) as ps:
        await ps.create_table(SPARSE)
        before = await ps.pull_sparse("emb", [4, 5])
        client_id = 0xC0FFEE
        first = await Link.open(servers[0].address, client_id, -1, None, wire.DEFAULT_MAX_FRAME, 1)
        second = await Link.open(servers[0].address, client_id, -1, None, wire.DEFAULT_MAX_FRAME, 3)
        other = await Link.open(servers[0].address, client_id + 1, -1, None, wire.DEFAULT_MAX_FRAME, 1)
        try:
            push = wire.PushSparseGrad(table="emb", ids=np.array([4], np.int64), values=np.ones((1, 8), np.float32))
            flags = int(Flag.FINAL)
            assert isinstance(await first.request(push, 100, flags), wire.Ok)
            first.close()
            assert isinstance(await second.request(push, 100, flags), wire.Ok)  # replay: answered, not applied
            assert isinstance(await second.request(push, 100, flags), wire.Ok)
            rows = await ps.pull_sparse("emb", [4, 5])
            np.testing.assert_allclose(rows, before - np.array([[0.5], [0.0]]), rtol=1e-6)
            # a new request id is a new push; the same id from another client is another push
            assert isinstance(await second.request(push, 101, flags), wire.Ok)
            assert isinstance(await other.request(push, 100, flags), wire.Ok)
            rows = await ps.pull_sparse("emb", [4, 5])
            np.testing.assert_allclose(rows, before - np.array([[1.5], [0.0]]), rtol=1e-6)
            # reads are not cached: the same id on a pull returns fresh data
            r1 = await second.request(wire.PullSparse(table="emb", ids=np.array([4])), 200)
            assert isinstance(await second.request(push, 102, flags), wire.Ok)
            r2 = await second.request(wire.PullSparse(table="emb", ids=np.array([4])), 200)
            np.testing.assert_allclose(r2.values, r1.values - 0.5, rtol=1e-6)  # type: ignore[attr-defined]
        finally:
            for link in (first, second, other):
                link.close()


class DropReplyProxy:
    """A TCP proxy to one pserver that cuts the connection instead of forwarding the first reply
    with a given opcode (the request was applied; the client never hears so)."""

    def __init__(self, server: aps.PServer, opcode: int) -> None:
        self.server = server
        self.opcode = opcode
        self.dropped = 0
        self.connections = 0
        self._listener: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> str:
        self._listener = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self._listener.sockets[0].getsockname()[1]}"

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.connections += 1
        sreader, swriter = await asyncio.open_connection(self.server.host, self.server.port)

        async def up() -> None:
            while data := await creader.read(65536):
                swriter.write(data)
            swriter.close()

        async def down() -> None:
            dec = FrameDecoder(1 << 30)
            while data := await sreader.read(65536):
                dec.receive_data(data)
                while (frame := dec.next_frame()) is not None:
                    if not self.dropped and frame.opcode == self.opcode and frame.flags & Flag.REPLY:
                        self.dropped += 1
                        cwriter.close()
                        swriter.close()
                        return
                    cwriter.write(encode_header(frame.opcode, frame.flags, frame.request_id, len(frame.payload),
                                                max_frame=1 << 30) + bytes(frame.payload))
            cwriter.close()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        self._tasks.update(tasks)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def aclose(self) -> None:
        assert self._listener is not None
        self._listener.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def test_client_retry_after_lost_reply_is_applied_once() -> None:
    async with cluster(1) as servers, aps.connect(addrs(servers)) as direct:
        await direct.create_table(SPARSE)
        before = await direct.pull_sparse("emb", [6, 7])
        proxy = DropReplyProxy(servers[0], int(wire.Op.PUSH_SPARSE_GRAD))
        address = await proxy.start()
        try:
            async with aps.connect([address], timeout=10, **FAST) as ps:
                await ps.push_sparse_grad("emb", [6, 6], np.ones((2, 8), np.float32))
                assert proxy.dropped == 1 and proxy.connections == 2  # lost once, reconnected, retried
                after = await ps.pull_sparse("emb", [6, 7])
        finally:
            await proxy.aclose()
        np.testing.assert_allclose(after, before - np.array([[1.0], [0.0]]), rtol=1e-6)  # once, not twice
        ops = (await direct.stats())[servers[0].address]["ops"]
        assert ops["PushSparseGrad"]["count"] == 2  # two arrivals, one application


# ---------------------------------------------------------------- connection loss and timeouts


async def test_server_closed_between_requests_raises_connection_lost_fast() -> None:
    async with cluster(1) as servers:
        ps = await aps.connect(addrs(servers), timeout=10, **FAST)
        await ps.create_table(SPARSE)
        await servers[0].aclose()
        started = time.monotonic()
        with pytest.raises(aps.ConnectionLost) as info:
            await ps.pull_sparse("emb", [1, 2])
        assert time.monotonic() - started < 2.0
        assert info.value.__cause__ is not None
        await ps.aclose()


async def test_closing_a_client_fails_its_calls_in_flight_without_reconnecting() -> None:
    """aclose() while a call waits (a barrier the other trainer never reaches): the call fails
    with ConnectionLost at once instead of reconnecting a closed client and waiting again."""
    async with cluster(1, num_trainers=2) as servers:
        ps = await aps.connect(addrs(servers), timeout=30)  # the default 120 s reconnect deadline
        waiting = asyncio.ensure_future(ps.barrier("never"))
        await asyncio.sleep(0.2)
        assert not waiting.done() and servers[0].core.stats.connections == 1
        await ps.aclose()
        with pytest.raises(aps.ConnectionLost):
            await asyncio.wait_for(waiting, 5)
        await asyncio.sleep(0.5)  # time for a reconnect, had there been one
        assert servers[0].core.stats.connections == 0
        assert all(link is None for link in ps._links)


async def test_server_closed_during_requests_fails_every_waiter() -> None:
    async with cluster(2) as servers:
        ps = await aps.connect(addrs(servers), timeout=10, **FAST)
        await ps.create_table(SPARSE)
        waiting = asyncio.ensure_future(ps.barrier("never", count=5))  # parked on server 0
        pulls = [asyncio.ensure_future(ps.pull_sparse("emb", np.arange(1000))) for _ in range(20)]
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await asyncio.gather(*(s.aclose() for s in servers))
        results = await asyncio.wait_for(asyncio.gather(waiting, *pulls, return_exceptions=True), timeout=5)
        assert time.monotonic() - started < 3.0
        assert isinstance(results[0], aps.ConnectionLost)  # SHUTTING_DOWN, retried, then nobody to reconnect to
        for r in results[1:]:
            assert isinstance(r, aps.ConnectionLost) or (isinstance(r, np.ndarray) and r.shape == (1000, 8))
        with pytest.raises(aps.ConnectionLost):
            await ps.ping()
        await ps.aclose()


async def test_unreachable_server_raises_connection_lost() -> None:
    async with cluster(1) as servers:
        address = servers[0].address
    with pytest.raises(aps.ConnectionLost) as info:
        await aps.connect([address], timeout=5, **FAST)
    assert isinstance(info.value.__cause__, OSError)


async def test_barrier_nobody_joins_times_out_and_connection_stays_usable() -> None:
    async with cluster(1) as servers, aps.connect(addrs(servers)) as ps:
        await ps.create_table(SPARSE)
        started = time.monotonic()
        with pytest.raises(aps.RequestTimeout):
            await ps.barrier("lonely", count=2, timeout=0.5)
        assert 0.4 < time.monotonic() - started < 2.0
        assert (await ps.pull_sparse("emb", [1])).shape == (1, 8)
        with pytest.raises(aps.RequestTimeout):
            await ps.barrier("b2", count=3, timeout=0.3)


async def test_silent_server_times_out_instead_of_hanging() -> None:
    """A peer that accepts TCP but never answers (hung process, wrong service) must not hang us."""
    async with silent_server() as address:
        started = time.monotonic()
        with pytest.raises(aps.RequestTimeout):
            await aps.connect([address], timeout=0.5, **FAST)
        assert time.monotonic() - started < 2.0


async def test_concurrent_small_pulls_are_coalesced_and_each_gets_its_rows() -> None:
    async with cluster(1) as servers, aps.connect(addrs(servers), timeout=10) as ps:
        await ps.create_table(SPARSE)
        await ps.push_sparse_grad("emb", np.arange(50), np.ones((50, SPARSE.dim), np.float32))
        whole = await ps.pull_sparse("emb", np.arange(1000))
        before = servers[0].core.stats.as_dict()["ops"]["PullSparse"]["count"]
        rng = np.random.default_rng(5)
        asks = [rng.integers(0, 1000, int(rng.integers(1, 4))) for _ in range(64)]
        got = await asyncio.gather(*(ps.pull_sparse("emb", ids) for ids in asks))
        for ids, rows in zip(asks, got):
            np.testing.assert_array_equal(rows, whole[ids])
        sent = servers[0].core.stats.as_dict()["ops"]["PullSparse"]["count"] - before
        assert 3 <= sent <= 6  # the first two alone, the 62 queued behind them in one or a few more
        coalescer = ps._coalescers["emb"]
        assert coalescer.pulls - coalescer.requests >= 58 and coalescer.idle


async def test_a_failed_coalesced_pull_fails_each_pull_it_served() -> None:
    async with cluster(1) as servers, aps.connect(addrs(servers), timeout=10, **FAST) as ps:
        await ps.create_table(SPARSE)
        first = asyncio.ensure_future(ps.pull_sparse("emb", [1]))
        second = asyncio.ensure_future(ps.pull_sparse("emb", [0]))  # the two that go at once
        await asyncio.sleep(0)
        queued = [second] + [asyncio.ensure_future(ps.pull_sparse("emb", [i])) for i in (2, 3)]
        await asyncio.sleep(0)
        await servers[0].aclose()  # what was queued behind the first goes to a server gone
        results = await asyncio.gather(first, *queued, return_exceptions=True)
        assert all(isinstance(r, (np.ndarray, aps.ConnectionLost)) for r in results), results
        assert any(isinstance(r, aps.ConnectionLost) for r in results[1:]), results
        assert ps._coalescers["emb"].idle  # idle again: a later pull is sent, not queued forever


async def test_small_pull_deadlines_fail_in_their_order_and_the_link_stays_usable() -> None:
    """A one-request pull's deadline is watched by its link (one timer for all): a shorter one
    registered after a longer one still fails first, a late reply is dropped, and the same
    connection keeps serving."""
    from aps.specs import spec_to_dict

    held: list[asyncio.StreamWriter] = []
    late: list[tuple[int, wire.Message]] = []

    async def answer_some(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        decoder = FrameDecoder()
        while data := await reader.read(65536):
            decoder.receive_data(data)
            while (frame := decoder.next_frame()) is not None:
                msg = wire.decode(frame)
                reply: wire.Message | None = None
                if isinstance(msg, wire.Hello):
                    reply = wire.HelloReply(server_index=0, num_servers=1, max_frame=1 << 20, nonce=bytes(16))
                elif isinstance(msg, wire.TableInfo):
                    reply = wire.TextReply(op=wire.Op.TABLE_INFO, text=json.dumps(spec_to_dict(SPARSE)).encode())
                elif isinstance(msg, wire.PullSparse):
                    rows = np.full((len(msg.ids), SPARSE.dim), float(msg.ids[0]), dtype=np.float32)
                    reply = wire.ArrayReply(op=wire.Op.PULL_SPARSE, values=rows, version=int(msg.ids[0]))
                    if msg.ids[0] != 1:  # answered only after the test has seen the timeouts
                        late.append((frame.request_id, reply))
                        reply = None
                if reply is not None:
                    writer.write(wire.encode_bytes(reply, frame.request_id))

    server = await asyncio.start_server(answer_some, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with aps.connect([address], timeout=5, **FAST) as ps:
            assert (await ps.pull_sparse("emb", [1]))[0, 0] == 1.0
            link = ps._links[0]
            started = time.monotonic()
            slow = asyncio.ensure_future(ps.pull_sparse("emb", [7], timeout=1.0))
            await asyncio.sleep(0)
            with pytest.raises(aps.RequestTimeout, match="0.3 s"):
                await ps.pull_sparse("emb", [0], timeout=0.3)
            first = time.monotonic() - started
            assert 0.25 < first < 0.9 and not slow.done()
            with pytest.raises(aps.RequestTimeout, match="1.0 s"):
                await slow
            assert 0.9 < time.monotonic() - started < 2.5
            for request_id, reply in late:  # the replies nobody waits for any more
                held[0].write(wire.encode_bytes(reply, request_id))
            rows = await ps.pull_sparse("emb", [1, 1])
            assert rows.shape == (2, SPARSE.dim) and np.all(rows == 1.0)
            assert ps._links[0] is link and not link.closed and not link.waiters
    finally:
        for w in held:
            w.close()
        server.close()


async def test_barrier_releases_both_clients() -> None:
    async with cluster(2, num_trainers=2) as servers:
        async with aps.connect(addrs(servers), trainer_id=0) as a, aps.connect(addrs(servers), trainer_id=1) as b:
            first = asyncio.ensure_future(a.barrier("epoch-0", value=3))  # count 0: the cluster's 2 trainers
            await asyncio.sleep(0.1)
            assert not first.done()
            assert await asyncio.wait_for(b.barrier("epoch-0", value=4), 5) == 7
            assert await asyncio.wait_for(first, 5) == 7  # both get the sum of the values
            # the same name can be used again for the next round
            totals = await asyncio.wait_for(asyncio.gather(a.barrier("epoch-0", count=2), b.barrier("epoch-0", count=2, value=-1)), 5)
            assert totals == [-1, -1]


# ---------------------------------------------------------------- sync mode


@pytest.mark.parametrize("max_frame", [wire.DEFAULT_MAX_FRAME, 8192], ids=["whole", "chunked"])
async def test_sync_push_applies_mean_gradient_once(max_frame: int) -> None:
    table = aps.SparseTable("s", rows=300, dim=32, init=aps.Uniform(-1, 1), optimizer=aps.SGD(lr=0.2))
    gen = rng(11)
    ids_a = gen.integers(0, 300, size=400)
    ids_b = np.concatenate([ids_a[:50], gen.integers(0, 300, size=100)])  # overlapping ids
    ga = gen.standard_normal((len(ids_a), 32)).astype(np.float32)
    gb = gen.standard_normal((len(ids_b), 32)).astype(np.float32)
    da = gen.standard_normal(DENSE.shape).astype(np.float32)
    db = gen.standard_normal(DENSE.shape).astype(np.float32)
    async with cluster(2, num_trainers=2, max_frame=max_frame) as servers:
        a = await aps.connect(addrs(servers), trainer_id=0, max_frame=max_frame)
        b = await aps.connect(addrs(servers), trainer_id=1, max_frame=max_frame)
        try:
            await a.create_table(table)
            await a.create_table(DENSE)
            before = await a.pull_sparse("s", np.arange(300))
            dense_before = await a.pull_dense("fc")
            push_a = asyncio.ensure_future(a.push_sparse_grad("s", ids_a, ga, sync=True))
            dense_a = asyncio.ensure_future(a.push_dense_grad("fc", da, sync=True))
            await asyncio.sleep(0.2)
            assert not push_a.done() and not dense_a.done()  # held until the other trainer pushes
            np.testing.assert_array_equal(await a.pull_sparse("s", np.arange(300)), before)  # nothing applied yet
            await asyncio.wait_for(
                asyncio.gather(b.push_sparse_grad("s", ids_b, gb, sync=True), b.push_dense_grad("fc", db, sync=True), push_a, dense_a),
                10,
            )
            summed = np.zeros_like(before)
            np.add.at(summed, ids_a, ga)
            np.add.at(summed, ids_b, gb)
            np.testing.assert_allclose(await b.pull_sparse("s", np.arange(300)), before - 0.2 * summed / 2, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(await b.pull_dense("fc"), dense_before - 0.25 * (da + db) / 2, rtol=1e-5, atol=1e-6)
        finally:
            await a.aclose()
            await b.aclose()


# ---------------------------------------------------------------- change tracking (geo)


@pytest.mark.parametrize("n", [1, 2])
async def test_pull_sparse_changed_reports_others_pushes_only(n: int) -> None:
    async with cluster(n) as servers:
        async with aps.connect(addrs(servers)) as a, aps.connect(addrs(servers)) as b:
            await a.create_table(SPARSE)
            ids, rows = await b.pull_sparse_changed("emb")  # registers b
            assert ids.shape == (0,) and rows.shape == (0, 8)
            await a.push_sparse_delta("emb", [3, 7, 7, 12], np.ones((4, 8), np.float32))
            await a.push_sparse_grad("emb", [40], np.ones((1, 8), np.float32))
            await b.push_sparse_delta("emb", [20, 3], np.full((2, 8), 2.0, np.float32))  # b's own: not reported
            ids, rows = await b.pull_sparse_changed("emb")
            order = np.argsort(ids)
            ids, rows = ids[order], rows[order]
            np.testing.assert_array_equal(ids, [3, 7, 12, 40])
            np.testing.assert_array_equal(rows, await b.pull_sparse("emb", ids))  # the server's current values
            ids, rows = await b.pull_sparse_changed("emb")
            assert len(ids) == 0 and rows.shape == (0, 8)
            # a registered only now: it sees nothing of the past, then b's next push
            assert len((await a.pull_sparse_changed("emb"))[0]) == 0
            await b.push_sparse_delta("emb", [999], np.ones((1, 8), np.float32))
            ids, rows = await a.pull_sparse_changed("emb")
            np.testing.assert_array_equal(ids, [999])
            np.testing.assert_array_equal(rows, await a.pull_sparse("emb", [999]))
            assert len((await b.pull_sparse_changed("emb"))[0]) == 0


async def test_pull_sparse_changed_drains_more_rows_than_a_frame() -> None:
    async with cluster(2, max_frame=8192) as servers:
        async with aps.connect(addrs(servers)) as a, aps.connect(addrs(servers)) as b:
            await a.create_table(WIDE)
            await b.pull_sparse_changed("wide")
            touched = np.arange(0, 5000, 7)  # 715 rows of 64 floats: ~30 replies per server
            await a.push_sparse_delta("wide", touched, np.ones((len(touched), 64), np.float32))
            ids, rows = await b.pull_sparse_changed("wide")
            order = np.argsort(ids)
            np.testing.assert_array_equal(ids[order], touched)
            np.testing.assert_array_equal(rows[order], await b.pull_sparse("wide", touched))
            ops = (await b.stats())[servers[0].address]["ops"]
            assert ops["PullSparseChanged"]["count"] > 10
            assert len((await b.pull_sparse_changed("wide"))[0]) == 0


# ---------------------------------------------------------------- lifecycle, stats, checkpoints


async def test_embedded_server_outlives_its_trainers_by_default() -> None:
    """aps.serve() is for an application's own loop: the trainers finishing does not stop it."""
    async with cluster(1, num_trainers=1) as servers:
        async with aps.connect(addrs(servers), trainer_id=0) as a:
            await a.create_table(SPARSE)
            await a.worker_done()
        await asyncio.sleep(0.2)
        assert not servers[0].closing and servers[0].core.done_trainers == {0}
        async with aps.connect(addrs(servers)) as reader:  # still serving
            rows = await reader.pull_sparse(SPARSE.name, [1, 2])
            assert rows.shape == (2, SPARSE.dim) and np.all(np.abs(rows) <= 0.1) and np.any(rows != 0)


async def test_worker_done_from_all_trainers_stops_servers() -> None:
    async with cluster(2, num_trainers=2, exit_when_done=True) as servers:
        a = await aps.connect(addrs(servers), trainer_id=0)
        b = await aps.connect(addrs(servers), trainer_id=1)
        try:
            await a.worker_done()
            await a.worker_done()  # repeated: still one trainer
            await asyncio.sleep(0.1)
            waits = [asyncio.ensure_future(s.wait_closed()) for s in servers]
            assert not any(w.done() for w in waits)
            await b.worker_done()
            await asyncio.wait_for(asyncio.gather(*waits), 5)
            assert all(s.exit_reason == "all trainers sent worker_done" for s in servers)
        finally:
            await a.aclose()
            await b.aclose()


async def test_stats_count_every_op() -> None:
    async with cluster(2) as servers, aps.connect(addrs(servers)) as ps:
        await ps.create_table(SPARSE)
        await ps.create_table(DENSE)
        for _ in range(3):
            await ps.pull_sparse("emb", [0, 1, 2, 3])  # both servers
        await ps.push_sparse_grad("emb", [0, 2], np.ones((2, 8)))  # server 0 only, server 1 gets an empty push
        await ps.pull_dense("fc")
        await ps.ping()
        with pytest.raises(aps.ServerError):
            await ps.create_table(aps.SparseTable("emb", rows=5, dim=1))
        stats = await ps.stats()
        assert list(stats) == addrs(servers)
        for k, addr in enumerate(addrs(servers)):
            s = stats[addr]
            assert s["server_index"] == k and s["num_servers"] == 2
            assert s["tables"]["emb"]["rows"] == 1000 and s["tables"]["fc"]["kind"] == "dense"
            ops = s["ops"]
            assert ops["PullSparse"]["count"] == 3
            assert ops["PushSparseGrad"]["count"] == 1
            assert ops["CreateTable"]["count"] == 3 and ops["CreateTable"]["errors"] == 1
            assert ops["Ping"]["count"] == 1
            assert ops["PullSparse"]["bytes_in"] > 0 and ops["PullSparse"]["bytes_out"] > 0
            assert s["connections"] == 1
        assert sum(stats[a]["ops"]["PullDense"]["count"] for a in stats) == 2  # 25000 floats: two blocks


async def test_save_load_round_trip(tmp_path) -> None:
    sparse = aps.SparseTable("emb", rows=1000, dim=8, init=aps.Uniform(-0.1, 0.1), optimizer=aps.Adam(lr=0.05))
    dense = aps.DenseTable("fc", shape=(100, 250), init=aps.Normal(0, 0.05), optimizer=aps.Adagrad(lr=0.1))
    ids = np.array([1, 2, 3, 500, 999, 2], np.int64)
    g1 = rng(3).standard_normal((len(ids), 8)).astype(np.float32)
    g2 = rng(4).standard_normal((len(ids), 8)).astype(np.float32)
    d1 = rng(5).standard_normal(dense.shape).astype(np.float32)
    path = str(tmp_path / "ckpt")
    async with cluster(2, checkpoint_root=str(tmp_path)) as servers, aps.connect(addrs(servers)) as ps:
        await ps.create_table(sparse)
        await ps.create_table(dense)
        await ps.push_sparse_grad("emb", ids, g1)
        await ps.push_dense_grad("fc", d1)
        saved = await ps.pull_sparse("emb", np.arange(1000))
        saved_dense = await ps.pull_dense("fc")
        await ps.save(path)
        # train on: values and optimizer state move on
        await ps.push_sparse_grad("emb", ids, g2)
        await ps.push_dense_grad("fc", d1)
        trained = await ps.pull_sparse("emb", np.arange(1000))
        trained_dense = await ps.pull_dense("fc")
        assert not np.allclose(trained, saved)
        await ps.load(path)
        np.testing.assert_array_equal(await ps.pull_sparse("emb", np.arange(1000)), saved)
        np.testing.assert_array_equal(await ps.pull_dense("fc"), saved_dense)
        # optimizer state came back too: the same steps give the same result
        await ps.push_sparse_grad("emb", ids, g2)
        await ps.push_dense_grad("fc", d1)
        np.testing.assert_allclose(await ps.pull_sparse("emb", np.arange(1000)), trained, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(await ps.pull_dense("fc"), trained_dense, rtol=1e-6, atol=1e-7)
        assert await ps.table_spec("emb") == sparse
    # a cluster of another size loads the same checkpoint (re-sharded)
    async with cluster(3, checkpoint_root=str(tmp_path)) as servers, aps.connect(addrs(servers)) as ps:
        await ps.load(path)
        assert await ps.table_spec("fc") == dense
        np.testing.assert_array_equal(await ps.pull_sparse("emb", np.arange(1000)), saved)
        np.testing.assert_array_equal(await ps.pull_dense("fc"), saved_dense)


async def test_save_and_load_failures_are_server_errors(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    async with cluster(1, checkpoint_root=str(tmp_path)) as servers, aps.connect(addrs(servers)) as ps:
        await ps.create_table(SPARSE)
        before = await ps.pull_sparse("emb", [1, 2])
        with pytest.raises(aps.ServerError) as info:
            await ps.save(str(blocker / "ckpt"))
        assert info.value.code == ErrorCode.IO_ERROR
        with pytest.raises(aps.ServerError) as info:
            await ps.load(str(tmp_path / "missing"))
        assert info.value.code in (ErrorCode.BAD_REQUEST, ErrorCode.IO_ERROR)
        np.testing.assert_array_equal(await ps.pull_sparse("emb", [1, 2]), before)  # a failed load changes nothing
