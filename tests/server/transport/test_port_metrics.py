"""Prometheus export of a multi-port pserver's per-port counts and of the lagged-gradient
discards: real traffic over TCP on port 0, then a real HTTP scrape, values asserted exactly."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import aps
from tests.test_telemetry import ascrape, value

pytestmark = pytest.mark.timeout(60)

EMB = aps.SparseTable("emb", rows=64, dim=4, init=aps.Constant(0.5), optimizer=aps.SGD(lr=1.0))
FC = aps.DenseTable("fc", shape=(100, 200), init=aps.Constant(0.25), optimizer=aps.SGD(lr=1.0))
GRAD = np.full((1, 4), 0.125, dtype=np.float32)


async def test_per_port_counts_and_lagged_drops_are_scraped() -> None:
    plan = {"ports_num": 2, "ports_num_for_sparse": 1}
    async with await aps.serve(
        port=0, num_trainers=1, async_lagged_grad_discard_ratio=2.0, metrics_port=0, exit_when_done=False, **plan
    ) as server:
        async with aps.connect([server.address], **plan) as fresh, aps.connect([server.address], **plan) as stale:
            await fresh.create_table(EMB)
            await fresh.create_table(FC)
            await stale.pull_sparse("emb", [1])  # reads version 0
            for _ in range(3):  # 3 updates: the stale gradient is 3 behind, over the limit of 2
                await fresh.pull_sparse("emb", [2])
                await fresh.push_sparse_grad("emb", [2], GRAD)
            await stale.push_sparse_grad("emb", [1], GRAD)  # dropped
            await stale.push_sparse_grad("emb", [1], GRAD)  # dropped again
            await fresh.pull_dense("fc")
            await fresh.push_dense_grad("fc", np.ones(FC.shape, np.float32))
        async with asyncio.timeout(5):
            while server.core.stats.connections:  # both clients' connections closed
                await asyncio.sleep(0.01)
        scraped = await ascrape(server.metrics_port)  # type: ignore[arg-type]

    ports = server.core.stats.ports
    assert [p.port for p in ports] == server.ports and [p.kind for p in ports] == ["dense", "dense", "sparse"]
    for p in ports:
        key = {"port": str(p.port), "kind": p.kind}
        assert value(scraped, "aps_server_port_connections", **key) == 0
        assert value(scraped, "aps_server_port_connections_accepted_total", **key) == p.connections_total == 2
        assert value(scraped, "aps_server_port_frames_total", **key) == p.frames > 0
        assert value(scraped, "aps_server_port_received_bytes_total", **key) == p.bytes_in > 0
        for op, count in p.ops.items():
            assert value(scraped, "aps_server_port_requests_total", op=op.lower(), **key) == count
    sparse = {"port": str(ports[2].port), "kind": "sparse"}
    assert value(scraped, "aps_server_port_requests_total", op="push_sparse_grad", **sparse) == 5
    assert value(scraped, "aps_server_port_requests_total", op="pull_sparse", **sparse) == 4
    control = {"port": str(ports[0].port), "kind": "dense"}
    assert value(scraped, "aps_server_port_requests_total", op="create_table", **control) == 2
    assert value(scraped, "aps_server_lagged_grads_dropped_total", table="emb") == 2
    assert value(scraped, "aps_server_lagged_grads_dropped_total", table="fc") == 0
    assert value(scraped, "aps_server_lagged_grad_limit") == 2.0
    assert value(scraped, "aps_server_connections_refused_total") == 0


async def test_no_lag_limit_gauge_when_the_rule_is_off() -> None:
    async with await aps.serve(port=0, metrics_port=0, exit_when_done=False) as server:
        async with aps.connect([server.address]) as ps:
            await ps.create_table(EMB)
            await ps.push_sparse_grad("emb", [3], GRAD)
        scraped = await ascrape(server.metrics_port)  # type: ignore[arg-type]
    assert "aps_server_lagged_grad_limit" not in scraped
    assert value(scraped, "aps_server_lagged_grads_dropped_total", table="emb") == 0
    (port,) = server.ports
    assert value(scraped, "aps_server_port_requests_total", op="push_sparse_grad", port=str(port), kind="dense") == 1
