"""Unseen days, as the reference's CtrCommonAccessor: a shrink's ``days`` advances the table's
day, a push marks its keys seen that day, and a shrink deletes the keys unseen for more than the
table's ``ttl_days``. Checked against a model of the rule, on one store and over the wire."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aps
from aps.errors import ConfigError
from aps.storage.hash.store import HashSparseStore
from tests.checkpoints.test_hash_checkpoint import cluster, stores

pytestmark = pytest.mark.timeout(60)

DIM = 2


def spec(**fields) -> aps.HashTable:
    return aps.HashTable("emb", dim=DIM, optimizer=aps.SGD(lr=0.1), **fields)


def test_a_shrink_deletes_exactly_the_keys_unseen_for_more_than_ttl_days() -> None:
    rng = np.random.default_rng(11)
    store = HashSparseStore(spec(ttl_days=2))
    seen: dict[int, int] = {}  # the rule's model: key -> day of its last push
    day = 0
    for _ in range(12):
        keys = rng.integers(0, 400, 60).astype(np.int64)
        # many clicks: a score that never falls under the threshold, so only days delete
        store.push_grad(keys, np.ones((60, DIM), np.float32), clicks=np.full(60, 100.0, np.float32))
        seen.update(dict.fromkeys(keys.tolist(), day))
        days = int(rng.integers(0, 3))
        day += days
        evicted = store.shrink(days=days)
        dead = {k for k, d in seen.items() if day - d > 2}
        assert evicted == len(dead)
        seen = {k: d for k, d in seen.items() if k not in dead}
        held, _ = store.index.items()
        assert sorted(held.tolist()) == sorted(seen)
        assert store.day == day
    assert store.evicted > 0


def test_without_ttl_days_no_key_ages_out() -> None:
    store = HashSparseStore(spec())
    store.push_grad(np.arange(10, dtype=np.int64), np.ones((10, DIM), np.float32), clicks=np.full(10, 100.0, np.float32))
    assert store.shrink(days=1000) == 0 and len(store) == 10 and store.day == 1000


@pytest.mark.slow
async def test_days_through_the_client_and_across_a_reshard(tmp_path: Path) -> None:
    old = np.arange(0, 500, dtype=np.int64) * 7919
    new = np.arange(500, 1000, dtype=np.int64) * 7919
    clicks = np.full(500, 100.0, np.float32)
    async with cluster(2, tmp_path) as (servers, ps):
        await ps.create_table(spec(ttl_days=1))
        await ps.push_sparse_grad("emb", old, np.ones((500, DIM), np.float32), clicks=clicks)
        assert await ps.shrink("emb", days=1) == 0  # day 1: old keys unseen for 1 day
        await ps.push_sparse_grad("emb", new, np.ones((500, DIM), np.float32), clicks=clicks)
        assert [s.day for s in stores(servers)] == [1, 1]
        await ps.save("ckpt")
        with pytest.raises(ConfigError, match="days"):
            await ps.shrink("emb", days=-1)
    async with cluster(3, tmp_path) as (servers, ps):
        await ps.load("ckpt")
        assert [s.day for s in stores(servers)] == [1, 1, 1]  # the day and each key's last day come back
        assert await ps.shrink("emb", days=1) == len(old)  # day 2: old keys unseen for 2 > 1 days
        held = np.sort(np.concatenate([s.index.items()[0] for s in stores(servers)]))
        assert held.tolist() == new.tolist()
        assert await ps.shrink("emb") == 0  # no day passed: nothing more ages out


def test_ttl_days_is_checked() -> None:
    with pytest.raises(ConfigError, match="ttl_days"):
        spec(ttl_days=-1)
    assert aps.specs.spec_from_dict(aps.specs.spec_to_dict(spec(ttl_days=30))).ttl_days == 30
