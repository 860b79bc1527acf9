"""The v2 launch parameters in process, over real TCP: a pserver on ports_num + ports_num_for_sparse
consecutive ports, a client that spreads dense traffic over the dense ports and sparse traffic
over the sparse ones, the same values as on one port, and loud errors for mismatched plans."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

import aps
from aps.client.lanes import PortPlan, lane_address
from aps.errors import ConfigError
from aps.server import ServerConfig

pytestmark = pytest.mark.timeout(60)

EMB = aps.SparseTable("emb", rows=500, dim=8, init=aps.Uniform(-0.1, 0.1), optimizer=aps.Adagrad(lr=0.1), seed=4)
#: 40,000 elements: blocks of max(8192, size / servers) elements, so several per server
FC = aps.DenseTable("fc", shape=(200, 200), init=aps.Normal(0.0, 0.05), optimizer=aps.SGD(lr=0.5))
DENSE_OPS = {"PULL_DENSE", "PUSH_DENSE_GRAD"}
SPARSE_OPS = {"PULL_SPARSE", "PUSH_SPARSE_GRAD"}


async def workload(ps: aps.PSClient) -> tuple[np.ndarray, np.ndarray]:
    """Tables, 6 rounds of pull + push on both, and what they hold at the end."""
    rng = np.random.default_rng(7)
    await ps.create_table(EMB)
    await ps.create_table(FC)
    for _ in range(6):
        ids = rng.integers(0, EMB.rows, 40)
        await ps.pull_sparse("emb", ids)
        await ps.push_sparse_grad("emb", ids, rng.standard_normal((40, 8)).astype(np.float32))
        await ps.pull_dense("fc")
        await ps.push_dense_grad("fc", rng.standard_normal(FC.shape).astype(np.float32))
    return await ps.pull_sparse("emb", np.arange(EMB.rows)), await ps.pull_dense("fc")


async def test_one_server_on_dense_and_sparse_ports() -> None:
    async with await aps.serve(port=0, ports_num=2, ports_num_for_sparse=2) as server:
        assert server.ports == [server.port + i for i in range(4)]
        for port in server.ports:  # every one is listening
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        async with aps.connect([server.address], ports_num=2, ports_num_for_sparse=2) as ps:
            rows, dense = await workload(ps)
            stats = (await ps.stats())[server.address]
    ports = stats["ports"]
    assert [p["port"] for p in ports] == server.ports
    assert [p["kind"] for p in ports] == ["dense", "dense", "sparse", "sparse"]
    assert all(p["connections_total"] >= 1 for p in ports)
    for p in ports[:2]:  # dense ports: dense traffic (each its share), never sparse
        assert set(p["ops"]) & DENSE_OPS and not set(p["ops"]) & SPARSE_OPS, p
    for p in ports[2:]:  # sparse ports: sparse traffic only, calls taking them in turn
        assert set(p["ops"]) - {"HELLO", "PING"} <= SPARSE_OPS and p["frames"] > 1, p
    assert ports[2]["ops"].get("PUSH_SPARSE_GRAD", 0) + ports[3]["ops"].get("PUSH_SPARSE_GRAD", 0) == 6
    # one dense block (40,000 elements on one server) pulled and pushed 7 + 6 times, taking the
    # two dense ports in turn; control requests on the first port only
    assert ports[0]["ops"].get("PULL_DENSE", 0) + ports[1]["ops"].get("PULL_DENSE", 0) == 7
    assert ports[0]["ops"].get("PUSH_DENSE_GRAD", 0) + ports[1]["ops"].get("PUSH_DENSE_GRAD", 0) == 6
    assert ports[0]["ops"]["CREATE_TABLE"] == 2 and all("CREATE_TABLE" not in p["ops"] for p in ports[1:])
    assert ports[2]["ops"].get("PULL_SPARSE", 0) + ports[3]["ops"].get("PULL_SPARSE", 0) == 7

    # the same workload on one plain port gives the same values
    async with await aps.serve(port=0) as plain, aps.connect([plain.address]) as ps:
        rows1, dense1 = await workload(ps)
        assert [p["kind"] for p in (await ps.stats())[plain.address]["ports"]] == ["dense"]
    np.testing.assert_array_equal(rows, rows1)
    np.testing.assert_array_equal(dense, dense1)


async def test_two_servers_sparse_ports_only_when_asked() -> None:
    servers = [await aps.serve(port=0, server_index=k, num_servers=2, ports_num_for_sparse=1) for k in range(2)]
    try:
        addresses = [s.address for s in servers]
        async with aps.connect(addresses, ports_num=1, ports_num_for_sparse=1) as ps:
            rows, dense = await workload(ps)
            stats = await ps.stats()
        for address in addresses:
            dense_port, sparse_port = stats[address]["ports"]
            assert set(sparse_port["ops"]) - {"HELLO", "PING"} == SPARSE_OPS
            assert not set(dense_port["ops"]) & SPARSE_OPS and set(dense_port["ops"]) & DENSE_OPS
        # a client that knows only the first ports still works: everything on the dense port
        async with aps.connect(addresses) as ps:
            np.testing.assert_array_equal(await ps.pull_sparse("emb", np.arange(EMB.rows)), rows)
            np.testing.assert_array_equal(await ps.pull_dense("fc"), dense)
            stats = await ps.stats()
        assert stats[addresses[0]]["ports"][0]["ops"]["PULL_SPARSE"] >= 1
    finally:
        for server in servers:
            await server.aclose()


async def test_client_with_more_ports_than_the_server_fails_loudly() -> None:
    async with await aps.serve(port=0) as server:
        with pytest.raises((aps.ConnectionLost, ConfigError)):
            await aps.connect([server.address], ports_num=1, ports_num_for_sparse=1, timeout=5, deadline=0)


def _bindable(port: int) -> bool:
    """Whether a listening socket could take ``port`` now (as the pserver binds: SO_REUSEADDR)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def test_fixed_port_taken_is_a_config_error() -> None:
    for _ in range(200):  # a taken port whose neighbours are free to bind (not only not listening)
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        if _bindable(port - 1) and _bindable(port + 1):
            break
        taken.close()
    try:
        taken.listen()
        # the run port-1 .. port+1 needs the taken one in the middle: refused, naming it
        config = ServerConfig(port=port - 1, ports_num=3)
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            await aps.PServer(config).start()
    finally:
        taken.close()


def test_plan_and_settings() -> None:
    plan = PortPlan(2, ports_num=2, ports_num_for_sparse=3)
    assert plan.lanes == 5
    assert [plan.dense_lane(0) for _ in range(5)] == [0, 1, 0, 1, 0]
    assert [plan.sparse_lane(0) for _ in range(4)] == [2, 3, 4, 2]
    assert plan.sparse_lane(1) == 2  # each server has its own turn
    no_sparse = PortPlan(1, ports_num=2)
    assert [no_sparse.sparse_lane(0), no_sparse.dense_lane(0), no_sparse.sparse_lane(0)] == [0, 1, 0]
    assert lane_address("10.0.0.2:7164", 3) == "10.0.0.2:7167"
    for bad in (dict(ports_num=0), dict(ports_num_for_sparse=-1), dict(ports_num=True)):
        with pytest.raises(ConfigError):
            PortPlan(1, **bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ports_num"):
        ServerConfig(ports_num=0)
    with pytest.raises(ConfigError, match="past 65535"):
        ServerConfig(port=65534, ports_num=2, ports_num_for_sparse=1)
    assert ServerConfig(ports_num=2, ports_num_for_sparse=1).num_ports == 3


async def test_sync_rounds_and_geo_exchange_over_several_ports() -> None:
    """Sync pushes of two trainers meet in one round though they arrive on different ports;
    GEO deltas and changed-row pulls go over the sparse ports."""
    table = aps.SparseTable("s", rows=50, dim=2, init=aps.Constant(1.0), optimizer=aps.SGD(lr=1.0))
    dense = aps.DenseTable("d", shape=(10,), init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
    plan = dict(ports_num=2, ports_num_for_sparse=2)
    async with await aps.serve(port=0, num_trainers=2, **plan) as server:
        clients = [aps.connect([server.address], trainer_id=k, **plan) for k in range(2)]
        for ps in clients:
            await ps.open()
        try:
            await clients[0].create_table(table)
            await clients[0].create_table(dense)
            await clients[1].pull_sparse("s", [0])  # trainer 1's sparse turn is now one port ahead
            grads = [np.full((1, 2), g, np.float32) for g in (0.25, 0.75)]
            await asyncio.gather(*(ps.push_sparse_grad("s", [4], g, sync=True) for ps, g in zip(clients, grads)))
            await asyncio.gather(*(ps.push_dense_grad("d", np.full(10, g, np.float32), sync=True)
                                   for ps, g in zip(clients, (1.0, 3.0))))
            np.testing.assert_allclose(await clients[0].pull_sparse("s", [4]), [[0.5, 0.5]])  # 1 - mean(0.25, 0.75)
            np.testing.assert_allclose(await clients[1].pull_dense("d"), np.full(10, -2.0))
            await clients[1].pull_sparse_changed("s")  # registers trainer 1
            await clients[0].push_sparse_delta("s", [7, 9], np.ones((2, 2), np.float32))
            ids, rows = await clients[1].pull_sparse_changed("s")
            assert sorted(ids.tolist()) == [7, 9] and np.allclose(rows, 2.0)
            stats = (await clients[0].stats())[server.address]["ports"]
        finally:
            for ps in clients:
                await ps.aclose()
    sparse_ops = set().union(*(p["ops"] for p in stats[2:])) - {"HELLO", "PING"}
    assert sparse_ops == {"PULL_SPARSE", "PUSH_SPARSE_GRAD", "PUSH_SPARSE_DELTA", "PULL_SPARSE_CHANGED"}
    assert not set().union(*(p["ops"] for p in stats[:2])) & sparse_ops
