"""Busy polling (aps.connect(busy_poll=...), Link.busy_poll): the same rows as a sleeping client,
other tasks still run, a dead pserver still fails the call, TLS and bad values are refused."""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

import aps
from aps.errors import ConfigError, ConnectionLost

pytestmark = pytest.mark.timeout(90)

TABLE = aps.SparseTable("emb", rows=5000, dim=16, init=aps.Uniform(-1, 1), optimizer=aps.SGD(lr=0.5), seed=4)


async def _client(address: str, **kw) -> aps.PSClient:
    return await aps.connect([address], timeout=20, **kw)


@pytest.mark.slow
async def test_spinning_client_reads_what_a_sleeping_one_reads(processes) -> None:
    """Against a real aps-server process: one-id pulls, pushes and batched pulls interleaved,
    with every link spinning; rows equal a plain client's and the numpy model's."""
    (address,) = processes.start_servers(1, 1)
    plain, spinning = await _client(address), await _client(address, busy_poll=0.001)
    try:
        assert all(link is not None and link._spin_sock is not None for link in spinning._links)
        assert all(link is not None and link._spin_sock is None for link in plain._links)
        await plain.create_table(TABLE)
        expected = await plain.pull_sparse("emb", np.arange(TABLE.rows))
        rng = np.random.default_rng(7)
        for step in range(300):
            ids = rng.integers(0, TABLE.rows, 1 + step % 3)
            np.testing.assert_array_equal(await spinning.pull_sparse("emb", ids), expected[ids])
            if step % 10 == 0:
                grads = rng.standard_normal((len(ids), TABLE.dim)).astype(np.float32)
                await spinning.push_sparse_grad("emb", ids, grads)
                np.subtract.at(expected, ids, np.float32(0.5) * grads)
        np.testing.assert_allclose(await spinning.pull_sparse("emb", np.arange(TABLE.rows)), expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(await plain.pull_sparse("emb", np.arange(TABLE.rows)), expected, rtol=1e-6, atol=1e-6)
    finally:
        await plain.aclose()
        await spinning.aclose()


@pytest.mark.slow
async def test_a_spinning_caller_does_not_starve_other_tasks(processes) -> None:
    """A tight loop of spun pulls never awaits a pending future; the link still lets the event
    loop run at least every few milliseconds, so a ticker task keeps ticking."""
    (address,) = processes.start_servers(1, 1)
    ps = await _client(address, busy_poll=0.01)
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    try:
        await ps.create_table(TABLE)
        task = asyncio.ensure_future(ticker())
        loop = asyncio.get_running_loop()
        started = loop.time()
        pulls = 0
        while loop.time() - started < 1.0:
            await ps.pull_sparse("emb", np.array([pulls % TABLE.rows]))
            pulls += 1
        stop.set()
        await task
        assert pulls > 100
        assert ticks >= 100, f"the event loop ran other tasks only {ticks} times in 1 s of spinning pulls"
    finally:
        await ps.aclose()


@pytest.mark.slow
async def test_a_pserver_killed_while_the_client_spins_fails_the_call(processes) -> None:
    (address,) = processes.start_servers(1, 1)
    ps = await _client(address, busy_poll=0.05, deadline=0.5, retries=0)
    try:
        await ps.create_table(TABLE)
        await ps.pull_sparse("emb", np.array([1]))
        os.kill(processes.procs[-1].pid, signal.SIGKILL)
        processes.procs[-1].wait()
        with pytest.raises(ConnectionLost):
            for i in range(100):
                await ps.pull_sparse("emb", np.array([i]))
    finally:
        await ps.aclose()


async def test_in_process_server_still_answers_a_spinning_client() -> None:
    """A pserver on the client's own event loop cannot answer while the client spins: the spin
    gives up after its time and the call completes in the loop as usual."""
    async with await aps.serve(port=0) as srv:
        async with aps.connect([srv.address], busy_poll=0.0005) as ps:
            await ps.create_table(TABLE)
            rows = await ps.pull_sparse("emb", np.arange(10))
            assert rows.shape == (10, TABLE.dim)


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), "fast", True])
def test_bad_busy_poll_values_are_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="busy_poll"):
        aps.connect(["127.0.0.1:1"], busy_poll=value)  # type: ignore[arg-type]
