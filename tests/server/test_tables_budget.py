"""A pserver's budget for all its tables (``--max-tables-bytes``) holds against hash tables that
grow as keys come (issue 31, item 3): before, it was checked only when a table was created, and
20 M distinct keys took 7x a 512 MiB budget with no error and no log line."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import numpy as np
import pytest
import structlog

import aps
from aps.storage.hash.store import HashSparseStore, budget_keys, claim_nbytes, planned_nbytes
from aps.storage.tables import TablesBudget

DIM = 16
MIB = 1 << 20
BUDGET = 4 * MIB
BATCH = 5_000


def spec(name: str = "emb", **fields) -> aps.HashTable:
    args = dict(dim=DIM, init=aps.Uniform(-0.01, 0.01), optimizer=aps.Adagrad(lr=0.05), admit_probability=1.0, max_keys=None)
    args.update(fields)
    return aps.HashTable(name, **args)


def distinct_keys(n: int, seed: int) -> np.ndarray:
    """``n`` distinct int64 keys."""
    keys = np.unique(np.random.default_rng(seed).integers(-(1 << 62), 1 << 62, 2 * n, dtype=np.int64))
    return np.random.default_rng(seed).permutation(keys)[:n]


@contextlib.asynccontextmanager
async def server(budget: int = BUDGET) -> AsyncIterator[tuple[aps.PServer, aps.PSClient]]:
    """One real pserver on a port of its own, with ``max_tables_bytes=budget``, and a client."""
    srv = await aps.serve(max_tables_bytes=budget)
    try:
        async with aps.connect([srv.address]) as ps:
            yield srv, ps
    finally:
        await srv.aclose()


def tables_bytes(srv: aps.PServer) -> int:
    """What every table of ``srv`` holds now, summed."""
    return sum(shard.nbytes for shard in srv.core.tables.values())


async def flood(srv: aps.PServer, ps: aps.PSClient, table: str, keys: np.ndarray, budget: int) -> None:
    """Push ``keys`` in batches, checking after each push that the tables stay in ``budget``."""
    for part in np.array_split(keys, max(1, len(keys) // BATCH)):
        await ps.push_sparse_grad(table, part, np.ones((len(part), DIM), np.float32))
        assert tables_bytes(srv) <= budget


async def test_a_flood_of_distinct_keys_stays_in_the_budget_and_held_keys_keep_training() -> None:
    keys = distinct_keys(100_000, seed=1)
    async with server() as (srv, ps):
        await ps.create_table(spec())
        with structlog.testing.capture_logs() as logs:
            await flood(srv, ps, "emb", keys, BUDGET)
        info = await ps.table_info("emb")
        assert info.bytes <= srv.core.budget.taken <= BUDGET
        assert claim_nbytes(spec(), 8_192) < BUDGET and info.keys > 8_192  # the budget is used, not refused early
        assert info.rejected == len(keys) - info.keys == info.over_budget > 0
        assert info.evicted == 0
        refusals = [e for e in logs if e["event"].startswith("table size budget reached")]
        assert len(refusals) == 1, refusals  # the first refusal logs at once; the next within 10 s do not
        assert refusals[0]["table"] == "emb" and refusals[0]["max_tables_bytes"] == BUDGET
        assert refusals[0]["log_level"] == "warning" and refusals[0]["refused_since_last_line"] > 0
        (stats,) = (await ps.stats()).values()
        assert stats["tables"]["emb"]["over_budget"] == info.over_budget
        assert stats["tables_budget"] == {"limit": BUDGET, "taken": srv.core.budget.taken}

        held = np.sort(srv.core.tables["emb"].index.items()[0])[:1_000]
        fresh = distinct_keys(1_000, seed=2)
        before = await ps.pull_sparse("emb", held)
        mixed = np.concatenate([held, fresh])
        await ps.push_sparse_grad("emb", mixed, np.ones((len(mixed), DIM), np.float32))
        after = await ps.pull_sparse("emb", held)
        assert (after < before).all()  # every held key's row took its gradient step
        info2 = await ps.table_info("emb")
        assert info2.keys == info.keys and info2.over_budget == info.over_budget + len(fresh)
        assert info2.bytes <= BUDGET


async def test_two_hash_tables_and_a_fixed_table_share_one_budget() -> None:
    fixed = aps.SparseTable("fixed", rows=4_096, dim=64, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
    async with server() as (srv, ps):
        await ps.create_table(fixed)
        await ps.create_table(spec("a"))
        await ps.create_table(spec("b"))
        fixed_bytes = (await ps.table_info("fixed")).bytes
        assert fixed_bytes == 4_096 * 64 * 4
        a_keys, b_keys = distinct_keys(60_000, seed=3), distinct_keys(60_000, seed=4)
        for a_part, b_part in zip(np.array_split(a_keys, 12), np.array_split(b_keys, 12), strict=True):
            await flood(srv, ps, "a", a_part, BUDGET)
            await flood(srv, ps, "b", b_part, BUDGET)
        a, b = await ps.table_info("a"), await ps.table_info("b")
        assert fixed_bytes + a.bytes + b.bytes <= BUDGET
        assert a.over_budget > 0 and b.over_budget > 0 and a.keys > 1_024 and b.keys > 1_024
        # the budget counts the fixed table's bytes and both hash tables' claims, and nothing else
        claims = claim_nbytes(spec(), srv.core.tables["a"].capacity) + claim_nbytes(spec(), srv.core.tables["b"].capacity)
        assert srv.core.budget.taken == fixed_bytes + claims <= BUDGET
        assert a.rejected == a.over_budget == 60_000 - a.keys and b.rejected == b.over_budget == 60_000 - b.keys


async def test_a_capped_table_claims_its_cap_with_the_index_peak_when_created_and_evicts_by_score() -> None:
    cap = budget_keys(spec(), BUDGET)  # the most keys whose slab and settled index fit: what was checked
    alone = HashSparseStore(spec(max_keys=cap))
    for part in np.array_split(distinct_keys(16_300, seed=7), 11):
        alone.push_grad(part, np.ones((len(part), DIM), np.float32))
    burst = distinct_keys(7_000, seed=8)
    alone.push_grad(burst, np.ones((len(burst), DIM), np.float32))  # a resize sized for the burst, the old array beside it
    assert planned_nbytes(spec(), cap) <= BUDGET < alone.nbytes <= claim_nbytes(spec(), cap)
    async with server() as (srv, ps):
        with pytest.raises(aps.ServerError, match="max-tables-bytes"):
            await ps.create_table(spec("big", max_keys=cap))
        await ps.create_table(spec(max_keys=10_000))
        await flood(srv, ps, "emb", distinct_keys(50_000, seed=5), BUDGET)
        info = await ps.table_info("emb")
        assert info.keys <= 10_000 and info.evicted >= 40_000 and info.over_budget == 0 == info.rejected
        assert info.bytes <= srv.core.budget.taken == claim_nbytes(spec(), 10_000) <= BUDGET


def test_the_slab_grows_only_as_far_as_the_budget_has_room_never_doubling_past_it() -> None:
    table = spec()
    limit = claim_nbytes(table, 1_024) + claim_nbytes(table, 20_000) // 2  # room for a bit over 10k rows
    budget = TablesBudget(limit)
    store = HashSparseStore(table)
    store.share_budget(budget)
    keys = distinct_keys(40_000, seed=6)
    capacities = []
    for part in np.array_split(keys, 40):
        store.push_grad(part, np.ones((len(part), DIM), np.float32))
        capacities.append(store.capacity)
        if store.growth_due:
            store.reserve()  # what the server runs ahead of pushes: doubling, mapping, the index's next array
        assert store.nbytes <= claim_nbytes(table, store.capacity) <= limit  # the slab never grew past the budget
    assert budget.taken == claim_nbytes(table, store.capacity)  # what it claimed, before it grew
    assert not store.growth_due  # refused growth is not asked for again until the budget changes
    full = store.capacity
    assert claim_nbytes(table, full) <= limit < claim_nbytes(table, full + 1)  # capped to what fits, not a doubling
    assert 8_192 < full < 16_384  # neither the last doubling (8k) nor the next (16k), which would pass it
    assert capacities == sorted(capacities)
    assert len(store) == full and store.rejected == store.over_budget == len(keys) - full
