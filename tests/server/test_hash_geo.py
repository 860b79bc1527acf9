"""GEO on hash tables: PUSH_SPARSE_DELTA (admission applies, the delta is added to the row) and
PULL_SPARSE_CHANGED with per-client change tracking, where a key evicted and admitted again is
sent again; and GEO training with evictions converging like on a fixed table. Real pservers over
TCP on port 0, two clients each."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np
import pytest

import aps
from aps.storage.init_kernels import init_sparse_rows, table_seed

pytestmark = pytest.mark.timeout(60)

DIM = 8


@contextlib.asynccontextmanager
async def two_clients(n: int, **options) -> AsyncIterator[tuple[list[aps.PServer], aps.PSClient, aps.PSClient]]:
    servers = []
    try:
        for k in range(n):
            servers.append(await aps.serve(server_index=k, num_servers=n, **options))
        addresses = [s.address for s in servers]
        async with aps.connect(addresses) as a, aps.connect(addresses) as b:
            yield servers, a, b
    finally:
        for s in servers:
            await s.aclose()


def by_key(ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(ids)
    return ids[order], rows[order]


@pytest.mark.parametrize("n", [1, 2])
async def test_deltas_and_changed_keys_on_a_hash_table_with_an_eviction(n: int) -> None:
    spec = aps.HashTable("emb", dim=DIM, init=aps.Uniform(-0.1, 0.1))
    keys = np.array([-(1 << 63), -5, 0, 7, (1 << 62) + 3, (1 << 63) - 1], np.int64)
    initial = init_sparse_rows(spec.init, table_seed("emb", 0), keys, DIM)
    async with two_clients(n) as (servers, a, b):
        await a.create_table(spec)
        assert len((await a.pull_sparse_changed("emb"))[0]) == 0  # registers a
        assert len((await b.pull_sparse_changed("emb"))[0]) == 0  # registers b
        d1 = np.arange(len(keys) * DIM, dtype=np.float32).reshape(len(keys), DIM) / 100
        await a.push_sparse_delta("emb", keys, d1)
        info = await a.table_info("emb")
        assert info.keys == info.admitted == len(keys)  # admitted by the delta push
        ids, rows = by_key(*await b.pull_sparse_changed("emb"))
        np.testing.assert_array_equal(ids, np.sort(keys))
        np.testing.assert_array_equal(rows, (initial + d1)[np.argsort(keys)])  # initial row + delta
        # a's own push admitted them: sent back to a too (the server cannot tell a first admission
        # from a return after an eviction), with the row a holds already (initial + its delta)
        ids, rows = by_key(*await a.pull_sparse_changed("emb"))
        np.testing.assert_array_equal(rows, (initial + d1)[np.argsort(keys)])
        await a.push_sparse_delta("emb", keys, d1)  # held now: a's own change is not sent back to a
        assert len((await a.pull_sparse_changed("emb"))[0]) == 0
        assert len((await b.pull_sparse_changed("emb"))[0]) == len(keys)

        assert await a.shrink("emb") == len(keys)  # two shows each: every key evicted
        assert len((await b.pull_sparse_changed("emb"))[0]) == 0  # nothing held changed
        d2 = np.full((2, DIM), 0.5, np.float32)
        await b.push_sparse_delta("emb", keys[:2], d2)  # admitted again, from the initial row
        for reader in (a, b):  # the pusher too: its view (initial + d1 + d2) is not the server's
            ids, rows = by_key(*await reader.pull_sparse_changed("emb"))
            np.testing.assert_array_equal(ids, np.sort(keys[:2]))
            np.testing.assert_array_equal(rows, (initial[:2] + d2)[np.argsort(keys[:2])])
        assert (await a.table_info("emb")).keys == 2
        await b.push_sparse_delta("emb", keys[:2], d2)  # held now: b's own change is not sent back
        assert len((await b.pull_sparse_changed("emb"))[0]) == 0
        np.testing.assert_array_equal((await a.pull_sparse_changed("emb"))[1], ((initial[:2] + d2) + d2)[np.argsort(keys[:2])])


async def test_a_delta_for_a_key_not_admitted_is_dropped_and_not_reported() -> None:
    spec = aps.HashTable("emb", dim=DIM, admit_count=2)
    async with two_clients(2) as (servers, a, b):
        await a.create_table(spec)
        await b.pull_sparse_changed("emb")
        await a.push_sparse_delta("emb", [11, 12], np.ones((2, DIM), np.float32))
        info = await a.table_info("emb")
        assert (info.keys, info.rejected) == (0, 2)
        assert len((await b.pull_sparse_changed("emb"))[0]) == 0
        await a.push_sparse_delta("emb", [11], np.ones((1, DIM), np.float32))  # second occurrence: admitted
        ids, rows = await b.pull_sparse_changed("emb")
        initial = init_sparse_rows(spec.init, table_seed("emb", 0), np.array([11], np.int64), DIM)
        np.testing.assert_array_equal(ids, [11])
        np.testing.assert_array_equal(rows, initial + 1)  # only the delta of the push that admitted it


async def test_a_delta_push_carries_shows_and_clicks_that_shrink_scores() -> None:
    """GEO's deltas carry what the local steps saw of each key (one show each when absent):
    shrink's score ``0.1 (show - click) + click`` keeps exactly the keys it should."""
    async with two_clients(2) as (servers, a, b):
        await a.create_table(aps.HashTable("emb", dim=DIM))
        keys = np.array([-9, 4, 1 << 40, 77], np.int64)
        await a.push_sparse_delta("emb", keys, np.ones((4, DIM), np.float32), shows=[20, 5, 1, 0], clicks=[0, 1, 0, 0])
        await b.push_sparse_delta("emb", [77], np.ones((1, DIM), np.float32))  # default: one show
        # scores 2.0, 1.4, 0.1 and 0.1: each threshold deletes the keys under it
        assert [await a.shrink("emb", decay=1.0, threshold=t) for t in (0.5, 1.5, 2.5)] == [2, 1, 1]
        with pytest.raises(aps.ConfigError, match="shows must have shape"):
            await a.push_sparse_delta("emb", keys, np.ones((4, DIM), np.float32), shows=[1, 2])


# ---------------------------------------------------------------- GEO training with evictions

HOT, COLD, ROUNDS, K_STEPS, BATCH = 120, 1500, 24, 8, 48


def problem(seed: int = 0) -> dict[str, np.ndarray]:
    """Pairs of keys whose embeddings should sum to the sum of their targets: hot keys seen all
    the time, cold keys in two rounds 6 apart (shrink evicts them in between, and they come
    back from their initial rows), none in the last 10 rounds."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(-(1 << 63), (1 << 63) - 1, HOT + COLD + 64, dtype=np.int64))
    keys = rng.permutation(keys)[: HOT + COLD]
    return {"keys": keys, "targets": rng.standard_normal((len(keys), DIM)).astype(np.float32)}


def batches(client: int, rnd: int, seed: int = 1) -> list[np.ndarray]:
    """The index pairs client ``client`` trains on in round ``rnd`` (the same for both tables)."""
    rng = np.random.default_rng((seed, client, rnd))
    out = []
    cold_round = [i for i in range(COLD) if rnd in (i % 8, i % 8 + 6)]
    cold = HOT + rng.permutation(np.array(cold_round, np.int64))
    for step in range(K_STEPS):
        pairs = rng.integers(0, HOT, (BATCH, 2))
        share = cold[step::K_STEPS][:BATCH]
        pairs[: len(share), 1] = share
        out.append(pairs)
    return out


async def geo_client(ps: aps.PSClient, table: str, ids: np.ndarray, targets: np.ndarray, client: int, shrink: bool) -> None:
    """GEO-SGD: local SGD on a replica; every K_STEPS, push (local - old) / 2 and apply what
    the servers changed since: local += server - old."""
    local = (await ps.pull_sparse(table, ids)).astype(np.float64)
    old = local.copy()
    await ps.pull_sparse_changed(table)  # registers
    for rnd in range(ROUNDS):
        touched = []
        for pairs in batches(client, rnd):
            err = local[pairs[:, 0]] + local[pairs[:, 1]] - targets[pairs[:, 0]] - targets[pairs[:, 1]]
            grad = np.zeros_like(local)
            np.add.at(grad, pairs[:, 0], err)
            np.add.at(grad, pairs[:, 1], err)
            local -= 0.1 * grad
            touched.append(pairs.ravel())
        rows = np.unique(np.concatenate(touched))
        delta = (local[rows] - old[rows]) / 2
        old[rows] += delta
        await ps.push_sparse_delta(table, ids[rows], delta.astype(np.float32))
        changed, values = await ps.pull_sparse_changed(table)
        at = np.searchsorted(ids, changed) if table == "fixed" else index_of(ids, changed)
        local[at] += values - old[at]
        old[at] = values
        if shrink and client == 0 and rnd % 3 == 2:
            await ps.shrink(table, threshold=0.25)


def index_of(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    order = np.argsort(keys)
    return order[np.searchsorted(keys[order], wanted)]


def hot_loss(rows: np.ndarray, targets: np.ndarray) -> float:
    pairs = np.random.default_rng(9).integers(0, HOT, (2000, 2))
    err = rows[pairs[:, 0]] + rows[pairs[:, 1]] - targets[pairs[:, 0]] - targets[pairs[:, 1]]
    return float(np.mean(err**2))


async def train(kind: str) -> tuple[float, float, aps.TableInfo]:
    data = problem()
    keys, targets = data["keys"], data["targets"].astype(np.float64)
    init = aps.Uniform(-0.1, 0.1)
    if kind == "fixed":
        spec: aps.SparseTable | aps.HashTable = aps.SparseTable("fixed", rows=len(keys), dim=DIM, init=init)
        ids = np.arange(len(keys), dtype=np.int64)
    else:
        spec = aps.HashTable(kind, dim=DIM, init=init)
        ids = keys
    async with two_clients(2) as (servers, a, b):
        await a.create_table(spec)
        before = hot_loss(await a.pull_sparse(spec.name, ids[:HOT]), targets)
        await asyncio.gather(*(geo_client(ps, spec.name, ids, targets, c, kind != "fixed") for c, ps in enumerate((a, b))))
        after = hot_loss(await a.pull_sparse(spec.name, ids[:HOT]), targets)
        return before, after, await a.table_info(spec.name)


async def test_geo_training_on_a_hash_table_with_evictions_converges_like_on_a_fixed_table() -> None:
    before_fixed, fixed, _ = await train("fixed")
    before_hash, hashed, info = await train("hash")
    assert info.evicted > COLD // 2  # cold keys went, several times over the run
    assert info.keys < HOT + COLD // 2
    assert before_fixed > 1.0 and before_hash > 1.0
    assert fixed < 1e-4 * before_fixed  # it converges...
    assert hashed < 1e-4 * before_hash and hashed < 3 * fixed + 1e-6  # ...and so does the hash table, about as far
