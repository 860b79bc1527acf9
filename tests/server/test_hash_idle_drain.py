"""A hash table's index resize left draining when the pushes stop is finished by the server once
the table is idle (aps/server/hash_upkeep.py), never while the write gate is closed; every key
reads the same row after it. A real pserver over TCP on port 0."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np
import pytest

import aps
from aps.server import hash_upkeep
from aps.storage.hash.store import HashSparseStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def quiet_longer(monkeypatch) -> None:
    """A second of quiet before the drain, so a loaded machine still reads the table between
    the last push (and the upkeep it started) and the drain's first step."""
    monkeypatch.setattr(hash_upkeep, "DRAIN_QUIET_S", 1.0)


def store_of(server: aps.PServer) -> HashSparseStore:
    store = server.core.tables["emb"]
    assert isinstance(store, HashSparseStore)
    return store


async def drained(store: HashSparseStore) -> bool:
    """Whether the store's resize is drained within 8 s."""
    for _ in range(160):
        if not store.resize_draining:
            return True
        await asyncio.sleep(0.05)
    return False


def emb() -> aps.HashTable:
    return aps.HashTable("emb", dim=8, init=aps.Uniform(-0.01, 0.01), optimizer=aps.Adagrad(lr=0.05))


async def fill_until_draining(ps: aps.PSClient, store: HashSparseStore) -> np.ndarray:
    """Push new keys, 500 a push, until a push leaves the index draining a resize (of more old
    slots than the next pushes' pace would drain at once); returns the keys pushed."""
    rng = np.random.default_rng(0)
    pushed: list[np.ndarray] = []
    grads = np.full((500, 8), 0.5, np.float32)
    while not (store.resize_draining and store.index.slots > 60_000):
        keys = rng.integers(-(1 << 62), 1 << 62, 500)
        await ps.push_sparse_grad("emb", keys, grads)
        pushed.append(keys)
    return np.concatenate(pushed)


@contextlib.asynccontextmanager
async def draining_table() -> AsyncIterator[tuple[aps.PServer, aps.PSClient, HashSparseStore, np.ndarray]]:
    """A pserver whose table ``emb`` was just left draining a resize by its pushes."""
    server = await aps.serve()
    try:
        async with aps.connect([server.address]) as ps:
            await ps.create_table(emb())
            store = store_of(server)
            keys = await fill_until_draining(ps, store)
            while server.core.gate.busy or server.core.hash_upkeep.running:  # the last push's growth ahead
                await asyncio.sleep(0.01)
            yield server, ps, store, keys
    finally:
        await server.aclose()


async def test_an_idle_table_drains_its_resize_and_keeps_every_row() -> None:
    async with draining_table() as (_, ps, store, keys):
        before = await ps.pull_sparse("emb", keys)
        held = store.index.nbytes
        old_slots = store.index._old.nbytes
        assert await drained(store), "the idle table's resize is drained"
        assert store.index.nbytes == held - old_slots, "its old slot array is given back"
        assert len(store) == np.unique(keys).shape[0]
        np.testing.assert_array_equal(await ps.pull_sparse("emb", keys), before)


async def test_no_drain_step_runs_while_the_write_gate_is_closed() -> None:
    async with draining_table() as (server, ps, store, keys):
        cursor = store.index._meta.copy()
        server.core.gate.close()  # as a save does while its thread reads the tables
        await asyncio.sleep(1.5)
        assert store.resize_draining and np.array_equal(store.index._meta, cursor), "nothing moved"
        server.core.gate.open()
        assert await drained(store)
        assert (await ps.table_info("emb")).keys == np.unique(keys).shape[0]
