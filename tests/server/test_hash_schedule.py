"""Shrinks on a schedule (aps-server --shrink-every): every hash table of every pserver is shrunk
by the reference's rule without a client asking, off the event loop, and counted."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import aps
from aps.cli.server import build_parser, config_from_args
from aps.errors import ConfigError
from aps.server.collector import server_registry
from aps.storage.hash.store import HashSparseStore
from tests.server.test_hash_tables import cluster

pytestmark = pytest.mark.timeout(60)

DIM = 4


def held_keys(servers: list[aps.PServer], name: str) -> np.ndarray:
    parts = []
    for s in servers:
        store = s.core.tables[name]
        assert isinstance(store, HashSparseStore)
        parts.append(store.index.items()[0])
    return np.sort(np.concatenate(parts))


async def test_every_hash_table_is_shrunk_on_the_schedule_and_counted() -> None:
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(-(1 << 63), (1 << 63) - 1, 4000, dtype=np.int64))
    clicked = keys[::2]  # score 0.1 (1 - 1) + 1 = 1, 0.98 after a decay: kept (threshold 0.8)
    unclicked = keys[1::2]  # score 0.1, deleted at the first shrink
    clicks = np.zeros(len(keys), np.float32)
    clicks[::2] = 1.0
    async with cluster(2, shrink_every=0.3) as (servers, ps):
        for name in ("a", "b"):
            await ps.create_table(aps.HashTable(name, dim=DIM))
            await ps.push_sparse_grad(name, keys, np.ones((len(keys), DIM), np.float32), clicks=clicks)
        await ps.create_table(aps.SparseTable("fixed", rows=10, dim=DIM))  # not a hash table: left alone
        waits = []
        deadline = time.monotonic() + 20
        while min(s.core.stats.shrinks for s in servers) < 2:  # both tables on both servers
            assert time.monotonic() < deadline, "no scheduled shrink ran"
            started = time.perf_counter()
            await ps.ping()
            waits.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)
        for name in ("a", "b"):  # exactly the rule's survivors (the next shrinks delete none of them)
            assert held_keys(servers, name).tolist() == np.sort(clicked).tolist()
        stats = await ps.stats()
    assert sum(s["shrink_evicted"] for s in stats.values()) == 2 * len(unclicked)
    assert sum(s.core.stats.shrink_evicted for s in servers) == 2 * len(unclicked)
    total = sum(server_registry(s.core).get_sample_value("aps_server_shrink_evicted_keys_total") for s in servers)
    assert total == 2 * len(unclicked)
    assert len(waits) >= 5 and max(waits) < 0.5  # pings kept being answered


def test_shrink_every_is_a_server_option_and_a_flag() -> None:
    args = build_parser().parse_args(["--shrink-every", "600"])
    assert config_from_args(args).shrink_every == 600.0
    assert aps.ServerConfig().shrink_every == 0.0  # off unless asked
    with pytest.raises(ConfigError, match="shrink_every"):
        aps.ServerConfig(shrink_every=-1.0)
